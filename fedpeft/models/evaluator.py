"""The runtime's predictions and task metrics: labels or generated responses, accuracy or METEOR / ROUGE."""

from __future__ import annotations

from typing import Any

import torch

from fedpeft.core.types import Metrics
from fedpeft.data.types import Example
from fedpeft.models.text import TextEncoder
from fedpeft.models.weights import ModelWeights, parameter_adapters_formed


class Evaluator:
    """Prediction (classification labels, greedy generation) and evaluation with a runtime's model.

    Args:
        weights: the model and its adapters; predictions use the active adapter (or the base alone).
        text: how examples (and generation prompts) become tensors.
        eval_batch_size: examples per forward pass.
        max_new_tokens: generation length.
        max_batches: the most batches of one evaluation (``eval.max_batches``; ``None``: every example); a
            rehearsal cuts every evaluation with it.
    """

    def __init__(
        self,
        weights: ModelWeights,
        text: TextEncoder,
        *,
        eval_batch_size: int = 64,
        max_new_tokens: int = 32,
        max_batches: int | None = None,
    ) -> None:
        self.weights = weights
        self.text = text
        self.eval_batch_size = eval_batch_size
        self.max_new_tokens = max_new_tokens
        self.max_batches = max_batches

    @torch.no_grad()
    def predict(self, examples: list[Example]) -> list[Any]:
        """Predicted labels (classification) or generated responses (generation); a LoRA on a parameter (a
        mixture of experts' fused experts) formed once for all of them (:func:`parameter_adapters_formed`)."""
        model = self.weights.model()
        was_training = model.training
        model.eval()
        outputs: list[Any] = []
        try:
            with self.weights.forward_context(), parameter_adapters_formed(model):
                for start in range(0, len(examples), self.eval_batch_size):
                    chunk = examples[start : start + self.eval_batch_size]
                    if self.text.task == "classification":
                        batch = self._to_device(self.text.encode(chunk))
                        batch.pop("labels")
                        logits = model(**batch).logits
                        outputs.extend(logits.argmax(-1).tolist())
                    else:
                        outputs.extend(self.generate(model, chunk))
        finally:
            model.train(was_training)
        return outputs

    def generate(self, model: torch.nn.Module, examples: list[Example]) -> list[str]:
        """Greedy responses of ``model`` to the prompts of ``examples`` (:meth:`TextEncoder.prompt_batch`)."""
        tok = self.text.tokenizer
        inputs = self._to_device(self.text.prompt_batch(examples))
        width = inputs["input_ids"].shape[1]
        generate = model.generate
        assert callable(generate), f"{type(model).__name__} cannot generate"
        generated = generate(
            **inputs,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        return [tok.decode(row[width:], skip_special_tokens=True).strip() for row in generated]

    def evaluation_examples(self, examples: list[Example]) -> list[Example]:
        """The examples an evaluation scores: all of them, or the first ``max_batches`` batches."""
        return examples if self.max_batches is None else examples[: self.max_batches * self.eval_batch_size]

    def evaluate(self, examples: list[Example]) -> Metrics:
        """Task metrics on ``examples`` (accuracy, or METEOR / ROUGE-1 / ROUGE-L); on the first ``max_batches``
        batches of them when that is set."""
        from fedpeft import evaluation

        examples = self.evaluation_examples(examples)
        predictions = self.predict(examples)
        if self.text.task == "classification":
            return {"accuracy": evaluation.accuracy(predictions, [int(ex["label"]) for ex in examples])}
        metrics = evaluation.generation_metrics(predictions, [ex["response"] for ex in examples])
        if examples and all("answer" in ex for ex in examples):  # multiple choice answered in words
            answers, options = [ex["answer"] for ex in examples], [ex.get("options", [ex["answer"]]) for ex in examples]
            metrics["accuracy"] = evaluation.answer_accuracy(predictions, answers, options)
        return metrics

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.weights.device) for k, v in batch.items()}
