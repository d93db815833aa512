"""Registered methods: importing this package registers every method in ``fedpeft.registry.METHODS``."""

from fedpeft.methods import fedavg_full, fedit, guided, lora  # noqa: F401
from fedpeft.methods.base import Method, MethodConfig

__all__ = ["Method", "MethodConfig"]
