"""Registered methods: importing this package registers every method in ``fedpeft.core.registry.METHODS``."""

import fedpeft.methods.adalora  # noqa: F401
import fedpeft.methods.bayestune_lora  # noqa: F401
import fedpeft.methods.dept_spec  # noqa: F401
import fedpeft.methods.ditto  # noqa: F401
import fedpeft.methods.feddat  # noqa: F401
import fedpeft.methods.feddpa  # noqa: F401
import fedpeft.methods.fedit_merged  # noqa: F401
import fedpeft.methods.fedl2p  # noqa: F401
import fedpeft.methods.fedmkt  # noqa: F401
import fedpeft.methods.fedmosaic  # noqa: F401
import fedpeft.methods.fedp2eft  # noqa: F401
import fedpeft.methods.fedsim  # noqa: F401
import fedpeft.methods.perada  # noqa: F401
import fedpeft.methods.sft_rounds  # noqa: F401
import fedpeft.methods.takfl  # noqa: F401
from fedpeft.methods import (  # noqa: F401
    fedalt,
    fedavg_full,
    fedit,
    fedprox,
    fedsa_lora,
    ffa_lora,
    fisher_merge,
    flame,
    flexlora,
    guided,
    hetlora,
    local,
    lora,
    potara,
    trivial_lora,
)
from fedpeft.methods.base import Method, MethodConfig

__all__ = ["Method", "MethodConfig"]
