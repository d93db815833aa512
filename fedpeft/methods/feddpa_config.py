"""The settings of FedDPA-T (:mod:`fedpeft.methods.feddpa`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import FederatedConfig


class FedDPAConfig(FederatedConfig):
    rounds: int = 100
    lr: float = 5e-5
    rank: int = 8
    alpha: float = 8.0
    dropout: float = 0.05
    targets: str | list[str] = "qv"
    local_weight: float = 0.5
    max_weight: float = 0.5
    reference_instances: int = 5
    unseen_local_epochs: float = 1.0
