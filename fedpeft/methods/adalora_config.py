"""The settings of PEFT's AdaLoRA as a baseline (:mod:`fedpeft.methods.adalora`), importable without torch."""

from __future__ import annotations

from fedpeft.core.method_class import MethodConfig


class AdaLoraBaselineConfig(MethodConfig):
    epochs: float = 2.0
    lr: float = 1e-3
    batch_size: int = 16
    init_rank_multiplier: float = 1.5
    alpha_multiplier: float = 2.0
    dropout: float = 0.0
    delta_t: int = 1
    orth_reg_weight: float = 0.1
    warmup_fraction: float = 0.1
    final_fraction: float = 0.3
    beta1: float = 0.85
    beta2: float = 0.85
