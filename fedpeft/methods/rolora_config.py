"""The settings of RoLoRA (:mod:`fedpeft.methods.rolora`), importable without torch."""

from __future__ import annotations

from typing import Literal

from fedpeft.settings.methods import FederatedLoraConfig

Factor = Literal["A", "B"]
"""A LoRA factor: RoLoRA trains one of them each round."""


class RoLoraConfig(FederatedLoraConfig):
    """RoLoRA's knobs: the LoRA shape, the factor of the first round, optional local fine-tuning."""

    first: Factor = "B"
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None
