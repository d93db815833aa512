"""The settings of SFT in rounds (:mod:`fedpeft.methods.sft_rounds`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import HeteroConfig


class SftRoundsConfig(HeteroConfig):
    server_parts = ()  # nothing is aggregated
