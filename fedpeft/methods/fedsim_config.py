"""The settings of FedSim (:mod:`fedpeft.methods.fedsim`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    PAPER_COMPUTE_SCALE,
    HeteroConfig,
)


class FedSimConfig(HeteroConfig):
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["fedsim"], gt=0)
