"""The settings of Trivial LoRA (:mod:`fedpeft.methods.trivial_lora`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import RankTieredConfig


class TrivialLoraConfig(RankTieredConfig):
    rank: int | None = None
