"""Registered methods: importing this package registers every method in ``fedpeft.registry.METHODS``."""

import fedpeft.methods.ditto  # noqa: F401
import fedpeft.methods.feddat  # noqa: F401
import fedpeft.methods.fedmkt  # noqa: F401
import fedpeft.methods.fedmosaic  # noqa: F401
import fedpeft.methods.fedsim  # noqa: F401
import fedpeft.methods.perada  # noqa: F401
import fedpeft.methods.sft_rounds  # noqa: F401
import fedpeft.methods.takfl  # noqa: F401
from fedpeft.methods import fedavg_full, fedit, lora  # noqa: F401
from fedpeft.methods.base import Method, MethodConfig

__all__ = ["Method", "MethodConfig"]
