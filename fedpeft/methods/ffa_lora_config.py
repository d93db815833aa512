"""The settings of FFA-LoRA (:mod:`fedpeft.methods.ffa_lora`), importable without torch."""

from __future__ import annotations

from fedpeft.settings.methods import FederatedLoraConfig


class FFALoraConfig(FederatedLoraConfig):
    lr: float = 1e-4
