"""The settings of FedAvg of all weights (:mod:`fedpeft.methods.fedavg_full`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import FederatedConfig


class FedAvgFullConfig(FederatedConfig):
    rounds: int = 100
    lr: float = 5e-5
