"""The runtime's text encoding: examples into token-id tensors, with one prompt builder.

A :class:`TextEncoder` owns the tokenizer and how examples become model inputs: classification texts (and
images) with their labels, and generation prompts with their responses. Training and generation read a prompt
the same way, through :meth:`TextEncoder.prompt`: BOS and the prompt's tokens cut to half of ``max_length`` (or
the prompt as a user turn of the tokenizer's chat template, cut inside the template to the same length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedpeft.data.types import Example


@dataclass(frozen=True)
class Prompt:
    """A prompt as the model reads it.

    Attributes:
        ids: its token ids, at most ``max_length // 2``.
        text: the prompt text they encode; under a chat template, the user's text as cut to fit.
    """

    ids: list[int]
    text: str


class TextEncoder:
    """Tokenization of a runtime's examples.

    Args:
        tokenizer: the model's tokenizer (``None`` for a vision model, whose examples are images).
        task: ``"classification"`` or ``"generation"``.
        max_length: truncation length of tokenized inputs; a prompt keeps at most half of it.
        chat_template: format generation prompts (and training responses) with the tokenizer's chat template.
        image_processor: the image processor of a vision classification model.
    """

    def __init__(
        self,
        tokenizer: Any,
        task: str,
        *,
        max_length: int = 64,
        chat_template: bool = False,
        image_processor: Any = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.task = task
        self.max_length = max_length
        self.chat_template = chat_template
        self.image_processor = image_processor

    def prompt(self, text: str) -> Prompt:
        """The one encoding of a generation prompt, for training and generation alike.

        Plain: BOS (when the tokenizer has one), then the prompt's tokens, cut to ``max_length // 2``. With
        ``chat_template``: the prompt as a user turn rendered by the tokenizer's chat template, with the generation
        prompt that opens the assistant's turn; when that is longer than ``max_length // 2`` the user's text is cut,
        keeping the template's tokens around it.
        """
        tok = self.tokenizer
        limit = self.max_length // 2
        if not self.chat_template:
            bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
            return Prompt((bos + tok(text, add_special_tokens=False)["input_ids"])[:limit], text)
        ids = self._render([_user(text)], generation_prompt=True)
        if len(ids) > limit:
            content = tok(text, add_special_tokens=False)["input_ids"]
            keep = max(0, len(content) - (len(ids) - limit))
            text = tok.decode(content[:keep], skip_special_tokens=True)
            ids = self._render([_user(text)], generation_prompt=True)[:limit]
        return Prompt(ids, text)

    def response_ids(self, prompt: Prompt, response: str) -> list[int]:
        """Token ids of ``response`` as it follows ``prompt`` in training.

        Plain: the response's tokens and eos. With ``chat_template``: what the full conversation (the prompt's user
        turn and the response as the assistant's) adds after the prompt, its end-of-turn tokens included; for a
        template whose conversation does not start with the prompt's rendering, the plain ids.
        """
        tok = self.tokenizer
        if self.chat_template:
            turns = [_user(prompt.text), {"role": "assistant", "content": response}]
            full = self._render(turns, generation_prompt=False)
            if full[: len(prompt.ids)] == prompt.ids:
                return full[len(prompt.ids) :]
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        return list(tok(response, add_special_tokens=False)["input_ids"]) + eos

    def _render(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> list[int]:
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def encode(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Tokenize examples into padded tensors (labels included)."""
        if self.task == "classification" and examples and "image" in examples[0]:
            from fedpeft.models.vision import encode_images

            return encode_images(self.image_processor, examples)
        if self.task == "classification":
            pairs = [ex.get("text_pair") for ex in examples]
            has_pair = any(p is not None for p in pairs)
            batch = self.tokenizer(
                [ex["text"] for ex in examples],
                [p or "" for p in pairs] if has_pair else None,
                truncation=True,
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
            batch["labels"] = torch.tensor([int(ex["label"]) for ex in examples])
            return dict(batch)
        ids, labels = [], []
        for ex in examples:
            prompt = self.prompt(ex["prompt"])
            full = (prompt.ids + self.response_ids(prompt, ex["response"]))[: self.max_length]
            ids.append(full)
            # Loss on the response tokens only.
            labels.append([-100] * len(prompt.ids) + full[len(prompt.ids) :])
        return pad_right(ids, labels, self.tokenizer.pad_token_id)

    def prompt_batch(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """The generation inputs of ``examples``: their prompts (:meth:`prompt`), left-padded."""
        return pad_left([self.prompt(ex["prompt"]).ids for ex in examples], self.tokenizer.pad_token_id)


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def pad_right(ids: list[list[int]], labels: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    """Training inputs: ``input_ids``, ``attention_mask`` and ``labels`` (-100 where padded), padded on the right."""
    width = max(len(x) for x in ids)
    return {
        "input_ids": torch.tensor([x + [pad] * (width - len(x)) for x in ids]),
        "attention_mask": torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
        "labels": torch.tensor([y + [-100] * (width - len(y)) for y in labels]),
    }


def pad_left(prompts: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    """Generation inputs: ``input_ids`` and ``attention_mask``, padded on the left so that every prompt ends at the
    same position."""
    width = max(len(p) for p in prompts)
    return {
        "input_ids": torch.tensor([[pad] * (width - len(p)) + p for p in prompts]),
        "attention_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
    }
