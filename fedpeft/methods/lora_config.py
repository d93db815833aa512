"""The settings of the LoRA baseline (:mod:`fedpeft.methods.lora`), importable without torch."""

from __future__ import annotations

from fedpeft.core.method_class import MethodConfig


class LoraBaselineConfig(MethodConfig):
    epochs: float = 2.0
    lr: float = 1e-4
    batch_size: int = 16
    alpha_multiplier: float = 2.0
    dropout: float = 0.0
