"""The settings of FedSA-LoRA (:mod:`fedpeft.methods.fedsa_lora`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import FederatedLoraConfig


class FedSALoraConfig(FederatedLoraConfig):
    lr: float = 1e-4
    finetune_steps: int = Field(0, ge=0)
