"""Registered methods: importing this package registers every method in ``fedpeft.registry.METHODS``."""

import fedpeft.methods.bayestune_lora  # noqa: F401
import fedpeft.methods.fedp2eft  # noqa: F401
from fedpeft.methods import fedavg_full, fedit, lora  # noqa: F401
from fedpeft.methods.base import Method, MethodConfig

__all__ = ["Method", "MethodConfig"]
