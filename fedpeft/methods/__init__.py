"""Registered methods: importing this package registers every method in ``fedpeft.registry.METHODS``."""

from fedpeft.methods import fedalt, fedavg_full, fedit, fedsa_lora, ffa_lora, fisher_merge, lora, potara  # noqa: F401
from fedpeft.methods.base import Method, MethodConfig

__all__ = ["Method", "MethodConfig"]
