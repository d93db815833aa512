"""Synthetic multilingual benchmarks, generated from a seed and cached.

Importing this package registers the builders in :data:`fedpeft.core.registry.DATASETS`:

- ``synthetic-xnli``: sentence-pair classification (entailment / neutral / contradiction), XNLI-style;
- ``synthetic-masakhanews``: headline topic classification with quantity skew, MasakhaNEWS-style;
- ``synthetic-fedaya``: instruction following with natural (annotator) clients, Fed-Aya-style;
- ``synthetic-mosaic``: four instruction tasks per client arriving one after another (FedMosaic's PFL setting);
- ``synthetic-vqa``: the same with questions about small drawn images (multi-modal).
- ``synthetic-instructions``: categorized English instructions in the Alpaca template, Dolly-style (FLAME).

See ``docs/data.md`` for how they are generated and which properties of real data they reproduce.
"""

from fedpeft.data.synthetic import (
    fedaya,
    instructions_en,  # noqa: F401
    masakhanews,
    xnli,
)
from fedpeft.data.synthetic import images as images_benchmark  # noqa: F401
from fedpeft.data.synthetic import mosaic as mosaic
from fedpeft.data.synthetic import tasks as tasks_benchmark  # noqa: F401
from fedpeft.data.synthetic import vqa as vqa
from fedpeft.data.synthetic.common import cache_path
from fedpeft.data.synthetic.languages import INVENTORY, Language, language

__all__ = ["INVENTORY", "Language", "cache_path", "fedaya", "language", "masakhanews", "xnli"]
