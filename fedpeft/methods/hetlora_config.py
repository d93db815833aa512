"""The settings of HetLoRA (:mod:`fedpeft.methods.hetlora`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import RankTieredConfig


class HetLoraConfig(RankTieredConfig):
    server_parts = ()  # zero-padded, sparsity-weighted aggregation across ranks

    self_pruning: bool = False
    prune_gamma: float = Field(default=0.9, gt=0.0, lt=1.0)
    prune_lambda: float = Field(default=1e-3, ge=0.0)
    min_rank: int = Field(default=1, ge=1)
