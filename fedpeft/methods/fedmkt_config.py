"""The settings of FedMKT (:mod:`fedpeft.methods.fedmkt`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    PAPER_COMPUTE_SCALE,
    DistillationConfig,
)


class FedMKTConfig(DistillationConfig):
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["fedmkt"], gt=0)
