"""Base models: the table of registered models, hub and local checkpoints, and where LoRA goes on them.

The names below are imported on first use, so that a torch-free submodule (:mod:`.paper_configs`) can be
imported without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedpeft.models.table import LoadedModel as LoadedModel
    from fedpeft.models.table import ModelSpec as ModelSpec
    from fedpeft.models.table import load_model as load_model
    from fedpeft.models.table import model_names as model_names
    from fedpeft.models.targets import FAMILY_LORA_TARGETS as FAMILY_LORA_TARGETS
    from fedpeft.models.targets import count_lora_modules as count_lora_modules
    from fedpeft.models.targets import discover_lora_targets as discover_lora_targets
    from fedpeft.models.targets import lora_modules as lora_modules
    from fedpeft.models.targets import max_rank as max_rank

_HOMES = {
    "LoadedModel": "table",
    "ModelSpec": "table",
    "load_model": "table",
    "model_names": "table",
    "FAMILY_LORA_TARGETS": "targets",
    "count_lora_modules": "targets",
    "discover_lora_targets": "targets",
    "lora_modules": "targets",
    "max_rank": "targets",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
