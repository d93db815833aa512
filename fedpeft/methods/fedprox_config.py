"""The settings of FedProx (:mod:`fedpeft.methods.fedprox`), importable without torch."""

from __future__ import annotations

from fedpeft.methods.fedit_config import FedITConfig


class FedProxConfig(FedITConfig):
    mu: float = 0.01
