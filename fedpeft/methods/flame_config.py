"""The settings of FLAME (:mod:`fedpeft.methods.flame`), importable without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedpeft.settings.methods import TieredConfig


class FlameConfig(TieredConfig):
    server_parts = ()  # per-tier rescaled aggregation of the experts' LoRAs

    rank: int = Field(default=20, ge=1)
    temperature: float = Field(default=2.0, ge=0.0)
    rescaler: Literal["learned", "static", "none"] = "learned"
    rescaler_init: Literal["one", "ratio"] = "one"
    # The paper trains s_i in the client's one Adam at lr 1.5e-4; None keeps that, a value gives s_i its own rate.
    rescaler_lr: float | None = Field(default=None, gt=0.0)
