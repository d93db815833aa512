"""The runtime's text encoding: examples into token-id tensors, with one prompt builder.

A :class:`TextEncoder` owns the tokenizer and how examples become model inputs: classification texts (and
images) with their labels, and generation prompts with their responses. Training and generation read a prompt
the same way, through :meth:`TextEncoder.prompt`: BOS and the prompt's tokens cut to half of ``max_length`` (or
the prompt as a user turn of the tokenizer's chat template, cut inside the template to the same length).

An example is tokenized once per process: its token ids are kept (up to :data:`CACHED_TOKENS` tokens in all) and
each batch is padded from them, the same tensors the tokenizer's own padding gives.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass
from typing import Any

import torch

from fedpeft.data.types import ClientData, Example

log = logging.getLogger("fedpeft")


@dataclass(frozen=True)
class Prompt:
    """A prompt as the model reads it.

    Attributes:
        ids: its token ids, at most ``max_length // 2``.
        text: the prompt text they encode; under a chat template, the user's text as cut to fit.
    """

    ids: list[int]
    text: str


CACHED_TOKENS = 4_000_000  # token ids a TextEncoder keeps (8 bytes each); past it, the cache starts over
_PADDED_FIELDS = ("input_ids", "attention_mask", "token_type_ids")


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
        self._max_length = max_length
        self._chat_template = chat_template
        self.image_processor = image_processor
        # Each example's token ids, by its texts: field -> ids (classification) or (ids, prompt length) (generation).
        self._cache: dict[tuple[str | None, ...], Any] = {}
        self._cached_tokens = 0

    @property
    def max_length(self) -> int:
        """Truncation length of tokenized inputs (setting it forgets the cached token ids)."""
        return self._max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        self._max_length = value
        self._forget()

    @property
    def chat_template(self) -> bool:
        """Whether generation prompts use the tokenizer's chat template (setting it forgets the cached token ids)."""
        return self._chat_template

    @chat_template.setter
    def chat_template(self, value: bool) -> None:
        self._chat_template = value
        self._forget()

    def _forget(self) -> None:
        self._cache.clear()
        self._cached_tokens = 0

    def prompt(self, text: str) -> Prompt:
        """The one encoding of a generation prompt (:meth:`_prompt`), computed once per text."""
        key = ("prompt", text)
        if key not in self._cache:
            found = self._prompt(text)
            self._keep(key, found, len(found.ids))
        return self._cache[key]

    def _prompt(self, text: str) -> Prompt:
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
            texts = [("text", ex["text"], (ex.get("text_pair") or "") if has_pair else None) for ex in examples]
            # This batch's rows, taken from the cache before any is added (adding may empty it).
            rows = {key: self._cache[key] for key in texts if key in self._cache}
            missing = list(dict.fromkeys(key for key in texts if key not in rows))
            if missing:
                found = self.tokenizer(
                    [text for _, text, _ in missing],
                    [pair for _, _, pair in missing] if has_pair else None,
                    truncation=True,
                    max_length=self.max_length,
                )
                if not set(found) <= set(_PADDED_FIELDS):  # a tokenizer with other fields: its own padding
                    return self._tokenize_batch(texts, examples, has_pair)
                for i, key in enumerate(missing):
                    fields = rows[key] = {name: array("q", found[name][i]) for name in found}
                    self._keep(key, fields, sum(len(ids) for ids in fields.values()))
            batch = self._pad_fields([rows[key] for key in texts])
            batch["labels"] = torch.tensor([int(ex["label"]) for ex in examples])
            return batch
        ids, labels = [], []
        for ex in examples:
            pair = ("pair", ex["prompt"], ex["response"])
            if pair not in self._cache:
                prompt = self.prompt(ex["prompt"])
                full = (prompt.ids + self.response_ids(prompt, ex["response"]))[: self.max_length]
                self._keep(pair, (array("q", full), len(prompt.ids)), len(full))
            full_ids, prompt_length = self._cache[pair]
            ids.append(full_ids.tolist())
            # Loss on the response tokens only.
            labels.append([-100] * prompt_length + ids[-1][prompt_length:])
        return pad_right(ids, labels, self.tokenizer.pad_token_id)

    def unknown_rate(self, examples: list[Example], limit: int = 200) -> float:
        """The share of unknown-token ids (``[UNK]``) among the text tokens of the first ``limit`` of ``examples``
        (special tokens left out); 0 for a tokenizer without an unknown token (byte-level BPE reads anything)."""
        tok = self.tokenizer
        unknown = getattr(tok, "unk_token_id", None)
        if unknown is None or not examples:
            return 0.0
        texts = []
        for ex in examples[:limit]:
            texts += [t for t in (ex.get("text"), ex.get("text_pair"), ex.get("prompt"), ex.get("response")) if t]
        if not texts:
            return 0.0
        ids = [i for row in tok(texts, add_special_tokens=False)["input_ids"] for i in row]
        return sum(i == unknown for i in ids) / len(ids) if ids else 0.0

    def _tokenize_batch(
        self, texts: list[tuple[str, str, str | None]], examples: list[Example], has_pair: bool
    ) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(
            [text for _, text, _ in texts],
            [pair for _, _, pair in texts] if has_pair else None,
            truncation=True,
            max_length=self.max_length,
            padding=True,
            return_tensors="pt",
        )
        batch["labels"] = torch.tensor([int(ex["label"]) for ex in examples])
        return dict(batch)

    def _keep(self, key: tuple[str | None, ...], value: object, tokens: int) -> None:
        if self._cached_tokens + tokens > CACHED_TOKENS:
            self._forget()
        self._cache[key] = value
        self._cached_tokens += tokens

    def _pad_fields(self, rows: list[dict[str, array]]) -> dict[str, torch.Tensor]:
        """Pad each field of ``rows`` to the longest row, on the tokenizer's padding side, as the tokenizer does."""
        tok = self.tokenizer
        pads = {"input_ids": tok.pad_token_id, "attention_mask": 0, "token_type_ids": tok.pad_token_type_id}
        width = max(len(row["input_ids"]) for row in rows)
        left = tok.padding_side == "left"
        batch = {}
        for name in rows[0]:
            padded = torch.full((len(rows), width), pads[name], dtype=torch.long)
            for i, row in enumerate(rows):
                length = len(row[name])
                if not length:
                    continue
                values = torch.frombuffer(row[name], dtype=torch.long)
                if left:
                    padded[i, width - length :] = values
                else:
                    padded[i, :length] = values
            batch[name] = padded
        return batch

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


UNKNOWN_WARNING = 0.5
"""Above this share of unknown tokens the model cannot read a client's text: :func:`warn_unknown_text` says so."""


def warn_unknown_text(text: TextEncoder, clients: list[ClientData], model: str) -> list[tuple[str, float]]:
    """Warn, once, when most of some ``clients``' training text is unknown to the tokenizer of ``text`` (a
    :class:`~fedpeft.models.text.TextEncoder`): text in another language or script than the model's. Returns
    ``(client, unknown-token share)`` of those clients."""
    unreadable = [(c.client_id, float(text.unknown_rate(c.train))) for c in clients]
    unreadable = [(client, rate) for client, rate in unreadable if rate > UNKNOWN_WARNING]
    if len(unreadable) == 1 and len(clients) == 1:
        client, rate = unreadable[0]
        log.warning(
            "%.0f %% of the tokens of client %s's text are unknown to the tokenizer of %s: the model cannot read "
            "it; check that the data's language and script are the model's.",
            100 * rate,
            client,
            model,
        )
    elif unreadable:
        client, rate = max(unreadable, key=lambda item: item[1])
        log.warning(
            "The text of %d of %d clients is mostly unknown to the tokenizer of %s (over %.0f %% unknown tokens; "
            "%s: %.0f %%): the model cannot read it; check that the data's language and script are the model's.",
            len(unreadable),
            len(clients),
            model,
            100 * UNKNOWN_WARNING,
            client,
            100 * rate,
        )
    return unreadable
