"""The settings of TAKFL (:mod:`fedpeft.methods.takfl`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    PAPER_COMPUTE_SCALE,
    DistillationConfig,
)


class TAKFLConfig(DistillationConfig):
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["takfl"], gt=0)
