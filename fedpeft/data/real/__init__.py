"""Loaders of the real benchmarks: XNLI, MasakhaNEWS, Fed-Aya, Dolly-15k, AlpaGasus, SNI, commonsense-8, FLAN,
CIFAR-100, and the multi-modal task directories (DRAKE, HFLB, Fed-Scope).

Each loader module registers its builders in :data:`fedpeft.core.registry.DATASETS` when imported, which the
registry does on first use of a name (:mod:`fedpeft.catalog.datasets`); each takes a
:class:`~fedpeft.core.config.DataConfig` and returns a :class:`~fedpeft.data.types.FederatedData`. Directory
layouts and options are described in docs/real-data.md.

The package imports no loader itself, and a loader imports ``datasets`` (a second or two) only when it builds: its
``check`` (:mod:`fedpeft.data.real.early`) and the reading of a user's own files
(:mod:`fedpeft.data.real.readers`) stay quick. The names below are imported from their module when first read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedpeft.data.real import fedaya, masakhanews, sni, xnli
    from fedpeft.data.real.fedaya import FEDAYA_LANGUAGES
    from fedpeft.data.real.fedaya import build as build_fedaya
    from fedpeft.data.real.masakhanews import MASAKHANEWS_LABELS, MASAKHANEWS_LANGUAGES
    from fedpeft.data.real.masakhanews import build as build_masakhanews
    from fedpeft.data.real.xnli import XNLI_LABELS, XNLI_LANGUAGES
    from fedpeft.data.real.xnli import build as build_xnli

_EXPORTS = {
    "FEDAYA_LANGUAGES": ("fedaya", "FEDAYA_LANGUAGES"),
    "MASAKHANEWS_LABELS": ("masakhanews", "MASAKHANEWS_LABELS"),
    "MASAKHANEWS_LANGUAGES": ("masakhanews", "MASAKHANEWS_LANGUAGES"),
    "XNLI_LABELS": ("xnli", "XNLI_LABELS"),
    "XNLI_LANGUAGES": ("xnli", "XNLI_LANGUAGES"),
    "build_fedaya": ("fedaya", "build"),
    "build_masakhanews": ("masakhanews", "build"),
    "build_xnli": ("xnli", "build"),
}

__all__ = [
    "FEDAYA_LANGUAGES",
    "MASAKHANEWS_LABELS",
    "MASAKHANEWS_LANGUAGES",
    "XNLI_LABELS",
    "XNLI_LANGUAGES",
    "build_fedaya",
    "build_masakhanews",
    "build_xnli",
    "fedaya",
    "masakhanews",
    "sni",
    "xnli",
]


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    if name in ("fedaya", "masakhanews", "sni", "xnli"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
