"""What a real-dataset loader reads of its config: ``data.options`` checked against its defaults, set fields."""

from __future__ import annotations

from typing import Any

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError


def read_options(cfg: DataConfig, dataset: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``cfg.options`` merged over ``defaults``; unknown keys are a :class:`UserError`."""
    unknown = sorted(set(cfg.options) - set(defaults))
    if unknown:
        raise UserError(
            f"Unknown data.options key(s) {', '.join(unknown)} for dataset {dataset}; "
            f"known keys: {', '.join(sorted(defaults))}."
        )
    return {**defaults, **cfg.options}


def explicitly_set(cfg: DataConfig, field: str) -> bool:
    """Whether ``field`` was given in the config (YAML, override or constructor) rather than defaulted."""
    return field in cfg.model_fields_set
