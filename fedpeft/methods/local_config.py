"""The settings of the local baseline (:mod:`fedpeft.methods.local`), importable without torch."""

from __future__ import annotations

from fedpeft.core.method_class import MethodConfig
from fedpeft.settings.methods import LoraConfigMixin


class LocalConfig(MethodConfig, LoraConfigMixin):
    rounds: int = 10
    local_steps: int = 10
    lr: float = 1e-4
    batch_size: int = 16
