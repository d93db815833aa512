"""Two LoRA adapters computing together, mixed per instance (FedDPA's global and local adapters).

:func:`mixed_adapters` makes several installed PEFT adapters active at once, each LoRA update scaled by its own
weight (a number, or one weight per batch row); :func:`instance_weights` gives FedDPA's weight of each test
instance from the cosine similarity of its representation (:func:`representations`) to the client's training
instances.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from peft.tuners.tuners_utils import BaseTuner

from fedpeft.data.types import Example
from fedpeft.models.runtime import LoraSpec, ModelRuntime


def instance_weights(
    queries: torch.Tensor, references: torch.Tensor, *, max_weight: float, sample: int, seed: int
) -> torch.Tensor:
    """FedDPA's mixing weight of each query: ``max_weight`` times its mean cosine similarity to ``sample`` random
    references (drawn per query), clamped to [0, max_weight]."""
    chosen = reference_draw(references.shape[0], queries.shape[0], sample=sample, seed=seed)
    return drawn_weights(queries, references, chosen, max_weight=max_weight)


def reference_draw(references: int, queries: int, *, sample: int, seed: int) -> torch.Tensor:
    """The references each query is compared with: ``(queries, min(sample, references))`` indices, a random draw
    per query from ``seed``, known before any representation is computed."""
    generator = torch.Generator().manual_seed(seed)
    count = min(sample, references)
    return torch.stack([torch.randperm(references, generator=generator)[:count] for _ in range(queries)])


def drawn_weights(
    queries: torch.Tensor, references: torch.Tensor, chosen: torch.Tensor, *, max_weight: float
) -> torch.Tensor:
    """:func:`instance_weights` with the draw given: ``chosen`` indexes the rows of ``references``."""
    picked = references[chosen]  # (queries, count, d)
    similarity = torch.nn.functional.cosine_similarity(queries[:, None, :], picked, dim=-1)
    return (max_weight * similarity.mean(dim=1)).clamp(0.0, max_weight)


@contextmanager
def mixed_adapters(
    runtime: ModelRuntime, weights: Mapping[LoraSpec, float | torch.Tensor]
) -> Iterator[dict[str, float | torch.Tensor]]:
    """Make several installed adapters active together, each LoRA update scaled by its weight.

    A weight is a number or a tensor of one weight per batch row; the yielded mapping (adapter name -> weight)
    may be changed between forward passes. The first adapter is the runtime's active one (its head is used).
    """
    specs = list(weights)
    runtime.activate(specs[0])
    assert runtime.peft is not None
    tuner = runtime.peft.base_model
    assert isinstance(tuner, BaseTuner)
    tuner.set_adapter([s.key for s in specs])
    scales = {s.key: w for s, w in weights.items()}

    def hook_for(key: str):  # noqa: ANN202
        def scale(module: torch.nn.Module, inputs: tuple[object, ...], output: torch.Tensor) -> torch.Tensor:
            weight = scales[key]
            if isinstance(weight, torch.Tensor) and weight.dim() == 1:
                weight = weight.to(output).view(-1, *([1] * (output.dim() - 1)))
            return output * weight

        return scale

    handles = [
        module.lora_B[key].register_forward_hook(hook_for(key))
        for module in runtime.peft.modules()
        if hasattr(module, "lora_B") and isinstance(module.lora_B, torch.nn.ModuleDict)
        for key in scales
        if key in module.lora_B
    ]
    try:
        yield scales
    finally:
        for handle in handles:
            handle.remove()
        runtime.activate(specs[0])


@torch.no_grad()
def representations(runtime: ModelRuntime, examples: list[Example]) -> torch.Tensor:
    """Mean-pooled last hidden states of the inputs (prompts, for generation) under the runtime's active model."""
    model = runtime.activate(runtime.active)
    model.eval()
    rows = []
    for start in range(0, len(examples), runtime.eval_batch_size):
        chunk = examples[start : start + runtime.eval_batch_size]
        if runtime.task == "classification":
            batch = runtime.encode(chunk)
            batch.pop("labels")
        else:
            batch = runtime.tokenizer(
                [ex["prompt"] for ex in chunk],
                truncation=True,
                max_length=runtime.max_length // 2,
                padding=True,
                return_tensors="pt",
            )
        batch = {k: v.to(runtime.device) for k, v in batch.items()}
        with runtime.forward_context():
            hidden = model(**batch, output_hidden_states=True).hidden_states[-1]
        # Image inputs (a ViT's patches) have no padding and no attention mask: every position counts.
        attention = batch.get("attention_mask")
        if attention is None:
            attention = torch.ones(hidden.shape[:2], device=hidden.device)
        mask = attention.unsqueeze(-1).to(hidden.dtype)
        rows.append((hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0))
    return torch.cat(rows).float().cpu()
