"""Registered methods: importing this package registers every method in ``fedpeft.registry.METHODS``."""

from fedpeft.methods import fedavg_full, fedit, flame, flexlora, hetlora, lora, trivial_lora  # noqa: F401  # noqa: F401
from fedpeft.methods.base import Method, MethodConfig

__all__ = ["Method", "MethodConfig"]
