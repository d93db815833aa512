"""Which libraries' log messages a fedpeft process shows: without ``-v``, only their errors, in every process of
a run (the worker processes a run starts inherit the levels through the environment)."""

from __future__ import annotations

import logging
import os

LIBRARIES = ("transformers", "datasets", "flwr", "peft", "ray", "bitsandbytes")
"""The libraries whose warnings (deprecations, missing optional kernels) are theirs to fix, not the user's."""

LEVELS_VARIABLE = "FEDPEFT_LIBRARY_LEVELS"
"""The environment variable that carries the levels to a started process: ``name=level,...``."""


def quiet_libraries() -> None:
    """Show only the libraries' errors in this process."""
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.ERROR)


def levels_for_children() -> str:
    """This process's levels of the libraries' loggers, as :data:`LEVELS_VARIABLE` carries them."""
    return ",".join(f"{name}={logging.getLogger(name).level}" for name in LIBRARIES)


def apply_inherited_levels() -> None:
    """Set the libraries' levels the process that started this one passed in :data:`LEVELS_VARIABLE` (if any)."""
    for item in filter(None, os.environ.get(LEVELS_VARIABLE, "").split(",")):
        name, _, level = item.partition("=")
        if name in LIBRARIES and level.isdigit():
            logging.getLogger(name).setLevel(int(level))
