"""Tiny models built from transformers configs, and the seeded initialization every fresh weight goes through.

- ``tiny-bert``: a 2-layer BERT with a WordPiece vocabulary trained on the federation's texts. Classification.
- ``tiny-llama``: a 2-layer Llama with a byte-level BPE vocabulary trained on the federation's texts.
  Classification and generation.
- ``tiny-olmoe``: a 2-layer OLMoE (sparse mixture of experts: 16 experts, top-8, gate values not
  renormalized) with a byte-level BPE vocabulary trained on the federation's texts. Generation.
- ``tiny-olmo``: its dense counterpart, a 2-layer OLMo whose MLP is as wide as OLMoE's 8 active experts
  together (same active parameters per token). Generation.
- ``tiny-qwen2``: a 2-layer Qwen2 with its own (larger) byte-level BPE vocabulary, so that Llama and Qwen2
  clients form two families with different tokenizers. Classification and generation.

The builders are registered in :mod:`fedpeft.models.table`. Every freshly initialized weight (all of a tiny
model, the head of a pretrained one) is drawn from :data:`INIT_SEED` inside a forked RNG
(:func:`seeded_init`), so two loads give identical models and the caller's random state is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    OlmoConfig,
    OlmoeConfig,
    OlmoeForCausalLM,
    OlmoForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.data.tokenizer import train_tokenizer

INIT_SEED = 20240601
"""Seed of every freshly initialized weight (tiny models, classification heads)."""

Corpus = Callable[[], list[str]]


@contextlib.contextmanager
def seeded_init(seed: int = INIT_SEED) -> Iterator[None]:
    """Run a block with torch's CPU RNG seeded to ``seed``, restoring the caller's RNG state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def apply_overrides(config: PretrainedConfig, overrides: Mapping[str, object], name: str) -> None:
    """Set ``model.overrides`` on a config, refusing keys the config does not have."""
    for key, value in overrides.items():
        if key == "vocab_size":
            raise UserError(
                f"model.overrides.vocab_size cannot be set for {name}; the vocabulary comes from the "
                "tokenizer (set model.vocab_size to size a trained tokenizer)."
            )
        if not hasattr(config, key):
            raise UserError(
                f"model.overrides.{key} is not a field of {type(config).__name__} ({name}); "
                "check the spelling against the transformers config."
            )
        setattr(config, key, value)


def set_labels(config: PretrainedConfig, task: str, num_labels: int) -> None:
    """Give a classification config its number of labels (a generation config is left alone)."""
    if task == "classification":
        config.num_labels = num_labels


def require_corpus(corpus: Corpus | None, name: str) -> list[str]:
    """The federation's texts, for a model whose tokenizer is trained on them."""
    if corpus is None:
        raise UserError(f"{name} trains its tokenizer on the dataset's texts; pass corpus= to load_model.")
    return corpus()


def seeded_model(model_class: type[PreTrainedModel], config: PretrainedConfig) -> PreTrainedModel:
    """A freshly initialized ``model_class(config)``, its weights drawn inside :func:`seeded_init`."""
    with seeded_init():
        return model_class(config)


# ----------------------------------------------------------------------------------------------- tiny models

TINY_LLAMA_SHAPE: dict[str, int] = {"num_key_value_heads": 2, "intermediate_size": 128}
"""What tiny-llama (and tiny-llava's language model) adds to :func:`tiny_decoder_config`: GQA 4/2, MLP 128."""


def tiny_decoder_config(
    config_class: Callable[..., PretrainedConfig], tokenizer: PreTrainedTokenizerBase, max_length: int, **shape: int
) -> PretrainedConfig:
    """A 2-layer decoder config (hidden 64, 4 heads, untied embeddings) over ``tokenizer``'s vocabulary.

    ``shape`` gives the family's own sizes (key/value heads, MLP width, experts).
    """
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        # Rotary positions have no parameters, so a generous limit costs nothing.
        max_position_embeddings=max(2048, 4 * max_length),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **shape,
    )


def _tiny_decoder(
    config_class: type[PretrainedConfig],
    cfg: ModelConfig,
    task: str,
    num_labels: int,
    corpus: Corpus | None,
    *,
    vocab_size: int | None = None,
    **shape: int,
) -> tuple[PretrainedConfig, PreTrainedTokenizerBase]:
    """A tiny decoder's config (``model.overrides`` applied) and its BPE tokenizer trained on the corpus."""
    tokenizer = train_tokenizer(require_corpus(corpus, cfg.name), vocab_size or cfg.vocab_size, kind="bpe")
    config = tiny_decoder_config(config_class, tokenizer, cfg.max_length, **shape)
    apply_overrides(config, cfg.overrides, cfg.name)
    set_labels(config, task, num_labels)
    return config, tokenizer


def build_tiny_bert(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """tiny-bert and its WordPiece tokenizer trained on the corpus."""
    tokenizer = train_tokenizer(require_corpus(corpus, cfg.name), cfg.vocab_size, kind="wordpiece")
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=max(128, cfg.max_length),
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    apply_overrides(config, cfg.overrides, cfg.name)
    set_labels(config, task, num_labels)
    return seeded_model(BertForSequenceClassification, config), tokenizer


def build_tiny_llama(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """tiny-llama (classifier or causal LM) and its BPE tokenizer trained on the corpus."""
    config, tokenizer = _tiny_decoder(LlamaConfig, cfg, task, num_labels, corpus, **TINY_LLAMA_SHAPE)
    model_class = LlamaForSequenceClassification if task == "classification" else LlamaForCausalLM
    return seeded_model(model_class, config), tokenizer


TINY_OLMOE_EXPERTS = 16
TINY_OLMOE_TOP_K = 8
TINY_OLMOE_EXPERT_WIDTH = 32


def build_tiny_olmoe(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """tiny-olmoe (causal LM) and its BPE tokenizer trained on the corpus."""
    config, tokenizer = _tiny_decoder(
        OlmoeConfig,
        cfg,
        task,
        num_labels,
        corpus,
        intermediate_size=TINY_OLMOE_EXPERT_WIDTH,
        num_key_value_heads=4,
        num_experts=TINY_OLMOE_EXPERTS,
        num_experts_per_tok=TINY_OLMOE_TOP_K,
        norm_topk_prob=False,
    )
    return seeded_model(OlmoeForCausalLM, config), tokenizer


def build_tiny_olmo(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """tiny-olmo (causal LM) and its BPE tokenizer trained on the corpus."""
    config, tokenizer = _tiny_decoder(
        OlmoConfig,
        cfg,
        task,
        num_labels,
        corpus,
        # As wide as the tiny OLMoE's active experts together: the same active parameters per token.
        intermediate_size=TINY_OLMOE_TOP_K * TINY_OLMOE_EXPERT_WIDTH,
        num_key_value_heads=4,
    )
    return seeded_model(OlmoForCausalLM, config), tokenizer


QWEN2_VOCAB_FACTOR = 1.25
"""tiny-qwen2's vocabulary is this multiple of ``model.vocab_size``: a family of its own, tokenizing differently
from tiny-llama (Qwen2.5's real vocabulary is also larger than Llama 3's)."""


def build_tiny_qwen2(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """tiny-qwen2 (classifier or causal LM) and its own, larger BPE tokenizer trained on the corpus."""
    vocab_size = round(QWEN2_VOCAB_FACTOR * cfg.vocab_size)
    config, tokenizer = _tiny_decoder(
        Qwen2Config,
        cfg,
        task,
        num_labels,
        corpus,
        vocab_size=vocab_size,
        num_key_value_heads=2,
        intermediate_size=128,
        use_sliding_window=False,
    )
    # The per-layer attention kinds are derived from the depth at construction; an overridden depth needs them anew.
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    model_class = Qwen2ForSequenceClassification if task == "classification" else Qwen2ForCausalLM
    return seeded_model(model_class, config), tokenizer
