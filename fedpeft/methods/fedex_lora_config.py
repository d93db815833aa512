"""The settings of FedEX-LoRA (:mod:`fedpeft.methods.fedex_lora`), importable without torch."""

from __future__ import annotations

from typing import Literal

from fedpeft.settings.methods import FederatedLoraConfig


class FedExLoraConfig(FederatedLoraConfig):
    """FedEX-LoRA's knobs: the LoRA shape, the clients' weights in the means, optional local fine-tuning."""

    server_parts = ()  # the residual needs the plain mean of the factors and of their products

    # uniform: 1/K per client, as the authors' aggregate_models_ours; examples: by training examples (FedAvg).
    weighting: Literal["uniform", "examples"] = "uniform"
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None
