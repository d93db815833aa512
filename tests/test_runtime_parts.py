"""The runtime's parts: the one prompt builder (fedpeft.models.text) that training and generation share."""

from __future__ import annotations

import pytest
import torch

from fedpeft.core.config import ModelConfig
from fedpeft.models import load_model
from fedpeft.models.runtime import ModelRuntime
from fedpeft.models.text import TextEncoder

VOCAB = {word: 3 + i for i, word in enumerate("a b c d e f g h".split())}  # a=3 ... h=10
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = "the a cat dog sees runs red blue small big house tree river sky bird fish".split()


class WordTokenizer:
    """One id per word, by hand: pad 0, bos 1 (or none), eos 2."""

    pad_token_id = 0
    eos_token_id = 2

    def __init__(self, bos: bool = True) -> None:
        self.bos_token_id = 1 if bos else None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        assert not add_special_tokens
        return {"input_ids": [VOCAB[word] for word in text.split()]}


def encoder(max_length: int, bos: bool = True) -> TextEncoder:
    return TextEncoder(WordTokenizer(bos), "generation", max_length=max_length)


# ------------------------------------------------------------------------------------------- the prompt builder


def test_prompt_is_bos_then_the_prompt_cut_to_half_the_length():
    assert encoder(8).prompt("a b c d e").ids == [1, 3, 4, 5]
    assert encoder(9).prompt("a b c d e").ids == [1, 3, 4, 5]  # 9 // 2
    assert encoder(8).prompt("a b").ids == [1, 3, 4]
    assert encoder(8).prompt("a b c d e").text == "a b c d e"  # plain prompts are cut as ids, not as text


def test_prompt_without_bos_is_the_prompt_alone():
    assert encoder(8, bos=False).prompt("a b c d e").ids == [3, 4, 5, 6]
    assert encoder(8, bos=False).prompt("a").ids == [3]


def test_training_encodes_the_prompt_then_the_response_with_loss_on_the_response():
    batch = encoder(8).encode([{"prompt": "a b c d e", "response": "f g h"}, {"prompt": "a", "response": "b"}])
    assert batch["input_ids"].tolist() == [[1, 3, 4, 5, 8, 9, 10, 2], [1, 3, 4, 2, 0, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 8, [1, 1, 1, 1, 0, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100] * 4 + [8, 9, 10, 2], [-100, -100, 4, 2] + [-100] * 4]
    cut = encoder(6).encode([{"prompt": "a b c d e", "response": "f g h"}])
    assert cut["input_ids"].tolist() == [[1, 3, 4, 8, 9, 10]]  # the prompt keeps 3, the whole 6
    assert cut["labels"].tolist() == [[-100] * 3 + [8, 9, 10]]


def test_generation_reads_the_same_prompts_left_padded():
    text = encoder(8)
    examples = [{"prompt": "a b c d e", "response": "f"}, {"prompt": "a", "response": "b"}]
    batch = text.prompt_batch(examples)
    assert batch["input_ids"].tolist() == [[1, 3, 4, 5], [0, 0, 1, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    training = text.encode(examples)
    for row, ex in enumerate(examples):
        prompt = text.prompt(ex["prompt"]).ids
        assert batch["input_ids"][row, batch["attention_mask"][row] == 1].tolist() == prompt
        assert training["input_ids"][row, training["labels"][row] == -100][: len(prompt)].tolist() == prompt


# ------------------------------------------------------------------------------------- both paths of a runtime


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDPEFT_CACHE", str(tmp_path_factory.mktemp("fedpeft-cache")))
        sentences = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
        return load_model(
            ModelConfig(name="tiny-llama", vocab_size=300), task="generation", corpus=lambda: sentences * 4
        )


@pytest.mark.parametrize(
    ("chat_template", "max_length", "cut"),
    [(False, 12, True), (False, 256, False), (True, 80, True), (True, 256, False)],
    ids=["plain-cut", "plain-whole", "chat-cut", "chat-whole"],
)
def test_training_and_generation_encode_a_prompt_identically(loaded, monkeypatch, chat_template, max_length, cut):
    if chat_template:
        monkeypatch.setattr(loaded.tokenizer, "chat_template", CHAT_TEMPLATE, raising=False)
    rt = ModelRuntime(loaded, max_length=max_length, max_new_tokens=2, chat_template=chat_template)
    example = {"prompt": " ".join(WORDS), "response": "a red bird"}
    expected = rt.text.prompt(example["prompt"]).ids
    if chat_template:
        assert rt.tokenizer.decode(expected).endswith("<|assistant|>")
    else:
        assert expected[0] == rt.tokenizer.bos_token_id
    assert len(expected) <= max_length // 2
    assert (len(expected) == max_length // 2) == cut

    prompted: list[list[int]] = []

    def generate(input_ids: torch.Tensor, attention_mask: torch.Tensor, **settings) -> torch.Tensor:
        prompted.extend(row[mask == 1].tolist() for row, mask in zip(input_ids, attention_mask, strict=True))
        return torch.cat([input_ids, input_ids[:, -1:]], dim=1)

    monkeypatch.setattr(rt.base_model, "generate", generate)
    rt.predict([example])
    batch = next(rt.batches([example], batch_size=1, seed=0))  # what a training step reads
    trained = batch["input_ids"][0, batch["labels"][0] == -100].tolist()
    assert prompted == [expected]
    assert trained == expected
