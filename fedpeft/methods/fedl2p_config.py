"""The settings of FedL2P (:mod:`fedpeft.methods.fedl2p`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import FederatedConfig


class FedL2PConfig(FederatedConfig):
    rounds: int = 150
    lr: float = 1e-4  # initial post-multiplier: the fine-tuning rate the multipliers scale
    mlp_lr: float = 1e-4
    post_lr: float = 1e-6
    hidden: int = 100
    max_multiplier: float = 1000.0
    outer_steps: int = 3
    outer_batch_size: int = 16
    neumann_steps: int = 3
    psi: float = 0.1
    clamp: float = 1.0
    val_fraction: float = 0.2
    patience: int = 50
    finetune_epochs: float = 2.0
    alpha_multiplier: float = 2.0
    dropout: float = 0.0
    default_rank: int = 8
