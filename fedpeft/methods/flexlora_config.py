"""The settings of FlexLoRA (:mod:`fedpeft.methods.flexlora`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import RankTieredConfig


class FlexLoraConfig(RankTieredConfig):
    """FlexLoRA's settings: those of every rank-tiered baseline."""

    server_parts = ()  # SVD of the mean of the full-size updates
