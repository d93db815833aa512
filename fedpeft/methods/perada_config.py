"""The settings of PerAda (:mod:`fedpeft.methods.perada`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    PAPER_COMPUTE_SCALE,
    DistillationConfig,
)


class PerAdaConfig(DistillationConfig):
    lam: float = 0.1
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["perada"], gt=0)
