"""Loaders of the real benchmarks: XNLI, MasakhaNEWS, Fed-Aya, Dolly-15k and AlpaGasus.

Importing this package registers the builders ``xnli``, ``masakhanews``, ``fedaya``, ``dolly`` and ``alpagasus`` in
:data:`fedpeft.registry.DATASETS`; each takes a :class:`~fedpeft.config.DataConfig` and returns a
:class:`~fedpeft.data.types.FederatedData`. Directory layouts and options are described in docs/real-data.md.
"""

from fedpeft.data.real import (  # noqa: F401
    alpagasus,
    cifar100,
    commonsense,
    dolly,
    fedaya,
    flan,
    masakhanews,
    sni,
    xnli,
)
from fedpeft.data.real.fedaya import FEDAYA_LANGUAGES
from fedpeft.data.real.fedaya import build as build_fedaya
from fedpeft.data.real.masakhanews import MASAKHANEWS_LABELS, MASAKHANEWS_LANGUAGES
from fedpeft.data.real.masakhanews import build as build_masakhanews
from fedpeft.data.real.xnli import XNLI_LABELS, XNLI_LANGUAGES
from fedpeft.data.real.xnli import build as build_xnli

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
