"""Base models: the table of registered models, hub and local checkpoints, and where LoRA goes on them."""

from fedpeft.models.table import LoadedModel, ModelSpec, load_model, model_names
from fedpeft.models.targets import (
    FAMILY_LORA_TARGETS,
    count_lora_modules,
    discover_lora_targets,
    lora_modules,
    max_rank,
)

__all__ = [
    "FAMILY_LORA_TARGETS",
    "LoadedModel",
    "ModelSpec",
    "count_lora_modules",
    "discover_lora_targets",
    "load_model",
    "lora_modules",
    "max_rank",
    "model_names",
]
