"""Registered methods: importing this package registers every method in ``fedpeft.registry.METHODS``."""

import fedpeft.methods.fedmosaic  # noqa: F401  (FedMosaic and its baselines)
from fedpeft.methods import fedavg_full, fedit, lora  # noqa: F401
from fedpeft.methods.base import Method, MethodConfig

__all__ = ["Method", "MethodConfig"]
