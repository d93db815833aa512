"""Pretrained checkpoints: hub ids, local directories and ``.gguf`` files, loaded with their task head.

A name the model table does not register is a Hugging Face hub id or a local directory, loaded with the
``Auto*`` classes (from the local hub cache only when offline or when the hub cannot be reached,
:mod:`fedpeft.core.hub`), or the path of a ``.gguf`` file, de-quantized once
and cached (:mod:`fedpeft.models.gguf`). Image classifiers load through :mod:`fedpeft.models.vision`, LLaVA
checkpoints through :mod:`fedpeft.models.multimodal`. A task head the checkpoint lacks is freshly initialized
inside :func:`~fedpeft.models.tiny.seeded_init`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from huggingface_hub.errors import HFValidationError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
)

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.core.hub import hub_switched_off, offline_reason, unknown_model_sentence
from fedpeft.models.gguf import cached_gguf_checkpoint, local_gguf_source
from fedpeft.models.multimodal import load_image_text_checkpoint
from fedpeft.models.precision import quantization_config, torch_dtype
from fedpeft.models.tiny import apply_overrides, seeded_init, set_labels
from fedpeft.models.vision import Preprocessor, is_image_classifier, load_image_checkpoint


def load_checkpoint(
    source: str,
    cfg: ModelConfig,
    task: str,
    num_labels: int,
    *,
    revision: str | None = None,
    device: str = "cpu",
    local_files_only: bool = False,
) -> tuple[PreTrainedModel, Preprocessor]:
    """Model and tokenizer of a checkpoint; a task head the checkpoint lacks is freshly initialized.

    The weights load in ``cfg.dtype``; with ``cfg.quantization`` the linear layers are quantized by bitsandbytes
    while loading, straight onto ``device`` (checked by :func:`~fedpeft.models.precision.check_quantization`).
    ``local_files_only``: read a hub id from the local cache, never from the hub.
    """
    config = AutoConfig.from_pretrained(source, revision=revision, local_files_only=local_files_only)
    if task == "classification" and is_image_classifier(config):
        return load_image_checkpoint(source, cfg, num_labels, revision, local_files_only=local_files_only)
    apply_overrides(config, cfg.overrides, cfg.name)
    set_labels(config, task, num_labels)
    mapping = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING if task == "classification" else MODEL_FOR_CAUSAL_LM_MAPPING
    if type(config) not in mapping:
        raise UserError(
            f"Model {cfg.name} (model type {config.model_type}) has no {task} head in transformers; "
            f"choose a model that supports {task}."
        )
    auto_class = AutoModelForSequenceClassification if task == "classification" else AutoModelForCausalLM
    quantized: dict[str, object] = {}
    if cfg.quantization is not None:
        quantized = {"quantization_config": quantization_config(cfg), "device_map": {"": device}}
    with seeded_init():
        model = auto_class.from_pretrained(
            source,
            config=config,
            revision=revision,
            local_files_only=local_files_only,
            dtype=torch_dtype(cfg),
            **quantized,
            # A checkpoint with a head for another label count gets a fresh head instead of an error.
            ignore_mismatched_sizes=task == "classification",
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, local_files_only=local_files_only)
    except (OSError, ValueError):
        raise UserError(
            f"Model {cfg.name} has no tokenizer files transformers can read; save its tokenizer next to the "
            "weights (tokenizer.save_pretrained)."
        ) from None
    return model, tokenizer


def load_external(
    cfg: ModelConfig, task: str, num_labels: int, *, device: str = "cpu"
) -> tuple[PreTrainedModel, Preprocessor]:
    """The model ``cfg.name`` names when it is not registered: a ``.gguf`` file, a local directory or a hub id
    (``device``: where a quantized model is loaded)."""
    path = Path(cfg.name).expanduser()
    if path.suffix == ".gguf":
        checkpoint = cached_gguf_checkpoint(local_gguf_source(path))
        return load_checkpoint(str(checkpoint), cfg, task, num_labels)
    if path.exists() and not (path / "config.json").is_file():
        raise UserError(
            f"Local path {cfg.name} is not a transformers checkpoint (it has no config.json); give a directory "
            "written by save_pretrained, or a .gguf file."
        )
    source = str(path) if path.exists() else cfg.name
    # Without the hub, the cache only: a missing checkpoint is refused at once instead of after the hub's retries.
    offline = None if path.exists() else offline_reason()
    revision = f" (revision {cfg.revision})" if cfg.revision else ""
    try:
        config = AutoConfig.from_pretrained(source, revision=cfg.revision, local_files_only=offline is not None)
    except (OSError, HFValidationError):
        raise UserError(unknown_model_sentence(cfg.name, cfg.revision, offline)) from None
    except ValueError as err:
        reason = str(err).splitlines()[0]
        raise UserError(f"Model {cfg.name} cannot be read by this transformers version ({reason}).") from None
    local = offline is not None
    try:
        # Some of transformers' look-ups (a checkpoint's adapter_config.json) do not pass local_files_only on:
        # the hub is switched off for the whole load.
        with hub_switched_off() if local else contextlib.nullcontext():
            if config.model_type == "llava":
                return load_image_text_checkpoint(source, cfg, task, revision=cfg.revision, local_files_only=local)
            return load_checkpoint(
                source, cfg, task, num_labels, revision=cfg.revision, device=device, local_files_only=local
            )
    except OSError:
        if not local:
            raise
        raise UserError(
            f"Model {cfg.name}{revision} is only partly in the Hugging Face cache (its config, not all its weights), "
            f"and {offline}; download it fully first with `huggingface-cli download` on a machine with internet "
            "access."
        ) from None
