"""The settings of FedP2EFT (:mod:`fedpeft.methods.fedp2eft`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    BayesTuneSettings,
    MeanServerConfigMixin,
    PsgLoss,
)


class FedP2EFTConfig(BayesTuneSettings, MeanServerConfigMixin):  # the PSG's server step is a weighted mean
    rounds: int = 150
    fraction: float = 0.1
    min_clients: int = 1
    psg_lr: float = 1e-4
    psg_steps: int = Field(default=10, ge=0)
    psg_loss: PsgLoss = "sum"
    psg_gain: float = 1e-6
    psg_bias: float = 1e-4
    stats_batch_size: int = 64
