"""LLM-scale settings of a loaded model: its dtype, bitsandbytes quantization and gradient checkpointing.

``model.dtype`` loads the base weights in float32, bfloat16 or float16; ``model.quantization`` (``4bit``: NF4
with double quantization and the model's dtype as compute dtype, the QLoRA recipe; ``8bit``: LLM.int8) loads a
checkpoint's linear layers through bitsandbytes, which needs the package and a CUDA device (or a bitsandbytes
build that runs on the CPU: 0.46 and later);
``model.gradient_checkpointing`` recomputes each layer's activations in the backward pass (non-reentrant
checkpointing). See docs/models.md, "Training at LLM scale".
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from typing import TYPE_CHECKING

import torch

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError

if TYPE_CHECKING:
    from transformers import BitsAndBytesConfig

__all__ = ["DTYPES", "check_quantization", "prepare_model", "quantization_config", "runs_on_cpu", "torch_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""``model.dtype`` names and their torch dtypes."""


def torch_dtype(cfg: ModelConfig) -> torch.dtype:
    """The torch dtype of ``cfg.dtype``."""
    return DTYPES[cfg.dtype]


def check_quantization(cfg: ModelConfig, device: str) -> None:
    """Refuse ``model.quantization`` where bitsandbytes cannot run it: package missing, or a device it does not
    serve (CUDA always; the CPU where the installed build runs the quantized layers there).

    Args:
        cfg: the model config (nothing is checked when ``quantization`` is not set).
        device: the resolved torch device string the model will run on.

    Raises:
        UserError: one sentence naming what is missing.
    """
    if cfg.quantization is None:
        return
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(
            f"model.quantization {cfg.quantization} needs the bitsandbytes package, which is not installed; "
            "run `pip install 'fedpeft[quantization]'`, or drop model.quantization."
        )
    kind = torch.device(device).type
    if kind == "cuda" and torch.cuda.is_available():
        return
    if kind == "cpu" and runs_on_cpu(cfg.quantization):
        return
    raise UserError(
        f"model.quantization {cfg.quantization} needs a CUDA device, or the CPU with a bitsandbytes build that runs "
        f"there (0.46 or later; this run's device is {device}); set device: cuda on a machine with an NVIDIA GPU, "
        "or drop model.quantization."
    )


@functools.cache
def runs_on_cpu(quantization: str) -> bool:
    """Whether the installed bitsandbytes quantizes and runs a linear layer of ``quantization`` on the CPU (tried
    once per process on a 64 x 64 layer; older builds raise)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import bitsandbytes as bnb

            layer: torch.nn.Module
            if quantization == "4bit":
                layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4")
            else:
                layer = bnb.nn.Linear8bitLt(64, 64, bias=False, has_fp16_weights=False)
            output = layer.to("cpu")(torch.ones(2, 64))
    except Exception:  # any failure means: not on this CPU
        return False
    return output.shape == (2, 64) and bool(torch.isfinite(output).all())


def quantization_config(cfg: ModelConfig) -> BitsAndBytesConfig | None:
    """The ``BitsAndBytesConfig`` of ``cfg.quantization`` (``None`` when not set).

    ``4bit``: NF4 weights, double quantization of the block constants, compute in ``model.dtype`` (bfloat16 in
    the QLoRA recipe); ``8bit``: LLM.int8 with its default outlier threshold.
    """
    if cfg.quantization is None:
        return None
    from transformers import BitsAndBytesConfig

    if cfg.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch_dtype(cfg),
    )


def prepare_model(model: torch.nn.Module, cfg: ModelConfig) -> None:
    """Apply ``model.dtype`` (casting weights not already in it), prepare a quantized model for k-bit training
    and switch on gradient checkpointing, in place.

    Raises:
        UserError: gradient checkpointing on a model that does not support it.
    """
    dtype = torch_dtype(cfg)
    quantized = getattr(model, "is_quantized", False) is True
    if not quantized and any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
        model.to(dtype)
    checkpointing = {"use_reentrant": False}
    if quantized:
        from peft import prepare_model_for_kbit_training

        prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=cfg.gradient_checkpointing,
            gradient_checkpointing_kwargs=checkpointing,
        )
        return
    if cfg.gradient_checkpointing:
        from transformers import PreTrainedModel

        if not isinstance(model, PreTrainedModel) or not model.supports_gradient_checkpointing:
            raise UserError(
                f"Model {cfg.name} does not support gradient checkpointing; drop model.gradient_checkpointing."
            )
        # Non-reentrant checkpointing needs no input that requires grad, so frozen embeddings are fine.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing)
