"""The settings of FedDAT (:mod:`fedpeft.methods.feddat`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    PAPER_COMPUTE_SCALE,
    HeteroConfig,
)


class FedDATConfig(HeteroConfig):
    kd_weight: float = 1.0
    kd_temperature: float = 1.0
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["feddat"], gt=0)
