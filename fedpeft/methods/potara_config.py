"""The settings of Potara (:mod:`fedpeft.methods.potara`), importable without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedpeft.settings.methods import FederatedLocalConfig

GRID = [round(0.1 * i, 1) for i in range(11)]
"""Potara's mixing weights tried by ``grid_search`` (0, 0.1, ..., 1) unless ``grid`` gives others."""


class PotaraConfig(FederatedLocalConfig):
    granularity: Literal["global", "ab", "module"] = "global"
    grid_search: bool = False
    grid: list[float] = Field(default_factory=lambda: list(GRID))
    grid_holdout: float = Field(0.2, ge=0.0, lt=0.9)
