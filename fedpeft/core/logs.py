"""Which libraries' log messages a fedpeft process shows: without ``-v``, only their errors, in every process of
a run (the worker processes a run starts inherit the levels through the environment)."""

from __future__ import annotations

import logging
import os
import warnings

LIBRARIES = ("transformers", "datasets", "flwr", "peft", "ray", "bitsandbytes")
"""The libraries whose warnings (deprecations, missing optional kernels) are theirs to fix, not the user's."""

LEVELS_VARIABLE = "FEDPEFT_LIBRARY_LEVELS"
"""The environment variable that carries the levels to a started process: ``name=level,...``."""


def quiet_libraries(keep: tuple[str, ...] = ()) -> None:
    """Show only the libraries' errors in this process (all but those of ``keep``, e.g. Flower's own run log)."""
    for name in LIBRARIES:
        if name not in keep:
            logging.getLogger(name).setLevel(logging.ERROR)


def ignore_deprecations() -> None:
    """Hide the libraries' deprecation notices: they are for their users' code, not for fedpeft's."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def hide_library_progress() -> None:
    """Switch off transformers' and datasets' progress bars and advice; imports both libraries."""
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


def levels_for_children() -> str:
    """This process's levels of the libraries' loggers, as :data:`LEVELS_VARIABLE` carries them."""
    return ",".join(f"{name}={logging.getLogger(name).level}" for name in LIBRARIES)


def apply_inherited_levels() -> None:
    """Set the libraries' levels the process that started this one passed in :data:`LEVELS_VARIABLE` (if any)."""
    for item in filter(None, os.environ.get(LEVELS_VARIABLE, "").split(",")):
        name, _, level = item.partition("=")
        if name in LIBRARIES and level.isdigit():
            logging.getLogger(name).setLevel(int(level))
    if logging.getLogger("transformers").level >= logging.ERROR:
        # A quiet run's worker: transformers sets its logger's level from its environment when imported (over
        # the level set here), and progress bars and deprecation notices are no logging at all.
        for variable in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
            os.environ.setdefault(variable, "error" if variable == "TRANSFORMERS_VERBOSITY" else "1")
        ignore_deprecations()


def quiet_library_output(keep: tuple[str, ...] = ()) -> None:
    """For a process without ``-v`` that runs models (the ServerApp of a deployment): only the libraries' errors
    (but those of ``keep``), no deprecation notices, no transformers or datasets progress bars."""
    ignore_deprecations()
    quiet_libraries(keep)
    hide_library_progress()
