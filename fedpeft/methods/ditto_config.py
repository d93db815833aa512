"""The settings of Ditto (:mod:`fedpeft.methods.ditto`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    PAPER_COMPUTE_SCALE,
    HeteroConfig,
)


class DittoConfig(HeteroConfig):
    lam: float = 0.1
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["ditto"], gt=0)
