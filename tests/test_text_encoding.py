"""TextEncoder tokenizes each example once: its batches equal the tokenizer's own padding, on either side."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from fedpeft.data.tokenizer import train_tokenizer
from fedpeft.models.text import TextEncoder
from tests.conftest import WORDS, toy_tokenizer


class CountingTokenizer:
    """A tokenizer that counts the texts it is asked to tokenize (everything else goes to the real one)."""

    def __init__(self, tokenizer: Any) -> None:
        self.inner = tokenizer
        self.texts = 0

    def __call__(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        self.texts += len(text) if isinstance(text, list) else 1
        return self.inner(text, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _examples(rng: random.Random, n: int, *, pairs: bool) -> list[dict]:
    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))

    return [{"text": text(), "text_pair": text() if pairs and i % 3 else None, "label": i % 2} for i in range(n)]


def _reference(tokenizer: Any, examples: list[dict], max_length: int) -> dict[str, torch.Tensor]:
    """What one call of the tokenizer with its own padding gives (the encoding before the cache)."""
    pairs = [ex["text_pair"] for ex in examples]
    has_pair = any(p is not None for p in pairs)
    batch = tokenizer(
        [ex["text"] for ex in examples],
        [p or "" for p in pairs] if has_pair else None,
        truncation=True,
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    )
    return {**batch, "labels": torch.tensor([ex["label"] for ex in examples])}


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), name


def _wordpiece() -> Any:
    rng = random.Random(1)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(200)]
    return train_tokenizer(corpus, 120, kind="wordpiece")


@pytest.mark.parametrize("make_tokenizer", [toy_tokenizer, _wordpiece], ids=["wordlevel", "wordpiece"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("pairs", [False, True])
def test_classification_batches_equal_the_tokenizers_padding(make_tokenizer: Any, side: str, pairs: bool) -> None:
    tokenizer = make_tokenizer()
    tokenizer.padding_side = side
    encoder = TextEncoder(tokenizer, "classification", max_length=24)
    examples = _examples(random.Random(0), 40, pairs=pairs)
    rng = random.Random(2)
    for _ in range(3):  # fresh, then from the cache, in other orders and batch sizes
        rng.shuffle(examples)
        size = rng.choice([1, 7, 16])
        for start in range(0, len(examples), size):
            batch = examples[start : start + size]
            _assert_same(encoder.encode(batch), _reference(tokenizer, batch, 24))


def test_each_text_is_tokenized_once_until_max_length_changes() -> None:
    tokenizer = CountingTokenizer(toy_tokenizer())
    encoder = TextEncoder(tokenizer, "classification", max_length=24)
    examples = _examples(random.Random(0), 20, pairs=True)
    encoder.encode(examples[:10] + examples[:5])  # a repeated example is tokenized once
    assert tokenizer.texts == 10
    encoder.encode(examples)
    encoder.encode(list(reversed(examples)))
    assert tokenizer.texts == 20
    encoder.max_length = 6  # cut shorter: every text again
    _assert_same(encoder.encode(examples), _reference(tokenizer.inner, examples, 6))
    assert tokenizer.texts == 40


def test_generation_batches_equal_a_fresh_encoders() -> None:
    rng = random.Random(3)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(200)]
    tokenizer = train_tokenizer(corpus, 320, kind="bpe")
    examples = [{"prompt": c[: rng.randint(3, 60)], "response": c[-rng.randint(3, 60) :]} for c in corpus[:30]]
    cached = TextEncoder(tokenizer, "generation", max_length=20)
    for _ in range(2):
        for start in range(0, len(examples), 8):
            batch = examples[start : start + 8]
            fresh = TextEncoder(tokenizer, "generation", max_length=20)
            _assert_same(cached.encode(batch), fresh.encode(batch))
            _assert_same(cached.prompt_batch(batch), fresh.prompt_batch(batch))
    assert all(len(cached.prompt(ex["prompt"]).ids) <= 10 for ex in examples)


def test_a_full_cache_starts_over_without_changing_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    import fedpeft.models.text as text

    monkeypatch.setattr(text, "CACHED_TOKENS", 40)  # a few examples' ids: the cache empties inside one batch
    tokenizer = CountingTokenizer(toy_tokenizer())
    encoder = TextEncoder(tokenizer, "classification", max_length=24)
    examples = _examples(random.Random(0), 30, pairs=True)
    for _ in range(2):
        _assert_same(encoder.encode(examples), _reference(tokenizer.inner, examples, 24))
    assert encoder._cached_tokens <= 40


def test_text_mostly_unknown_to_the_tokenizer_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    from fedpeft.data.types import ClientData
    from fedpeft.models.text import warn_unknown_text

    encoder = TextEncoder(toy_tokenizer(), "classification", max_length=24)
    known = [{"text": " ".join(WORDS[:4]), "text_pair": None, "label": 0}]
    english = [{"text": "The soup was cold and bland", "text_pair": None, "label": 0}]
    assert encoder.unknown_rate(known) == 0.0
    assert encoder.unknown_rate(english) == 1.0
    assert encoder.unknown_rate([{"text": f"{WORDS[0]} soup", "text_pair": None, "label": 0}]) == 0.5
    with caplog.at_level("WARNING", logger="fedpeft"):
        assert warn_unknown_text(encoder, [ClientData("mine", "g", "local", known, [])], "tiny-bert") == []
        assert not caplog.records
        warn_unknown_text(encoder, [ClientData("mine", "g", "local", english, [])], "tiny-bert")
        mixed = [ClientData(f"c{i}", "g", "local", english if i % 2 else known, []) for i in range(4)]
        assert warn_unknown_text(encoder, mixed, "tiny-bert") == [("c1", 1.0), ("c3", 1.0)]
    assert [r.getMessage() for r in caplog.records] == [
        "100 % of the tokens of client mine's text are unknown to the tokenizer of tiny-bert: the model cannot read "
        "it; check that the data's language and script are the model's.",
        "The text of 2 of 4 clients is mostly unknown to the tokenizer of tiny-bert (over 50 % unknown tokens; c1: "
        "100 %): the model cannot read it; check that the data's language and script are the model's.",
    ]
