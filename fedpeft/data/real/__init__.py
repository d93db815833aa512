"""Loaders of the real benchmarks: XNLI, MasakhaNEWS, Fed-Aya, Dolly-15k, AlpaGasus, SNI, commonsense-8, FLAN,
CIFAR-100, and the multi-modal task directories (DRAKE, HFLB, Fed-Scope).

Importing this package registers every builder in
:data:`fedpeft.core.registry.DATASETS`; each takes a :class:`~fedpeft.core.config.DataConfig` and returns a
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
    tasks,
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
