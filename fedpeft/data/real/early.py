"""The real datasets checked before ``datasets`` and torch are imported.

``fedpeft run`` calls :func:`check_real_data` before it imports torch or loads a model, as it reads a user's
``files`` and checks ``hub`` data (:mod:`fedpeft.data.hub_check`): a ``data.path`` that names nothing, a folder or
file missing from the layout a loader reads, a language, task or group of the config that the local copy lacks,
a column a split lacks, or a hub id that the ``datasets`` cache lacks while the hub is not asked ends the run within
a second or two, in the sentence the build would end it with, naming the folder, file or cache searched.

Each loader's ``check`` refuses what its ``build`` would, from the config, the folders, the start of the data files
(a Parquet schema, a CSV header, the first JSON record) and the ``datasets`` cache's metadata; it reads no rows
(Fed-Aya's, whose languages and clients are known only from its one file, excepted) and imports no ``datasets``.
What the rows alone tell (too few labelled rows for the pools, an empty response) the build still refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fedpeft.core.config import DataConfig
from fedpeft.core.registry import DATASETS
from fedpeft.data.real import alpagasus, cifar100, commonsense, dolly, fedaya, flan, masakhanews, sni, tasks, xnli

EARLY_CHECKS: dict[str, Callable[[DataConfig], None]] = {
    "alpagasus": alpagasus.check,
    "cifar100": cifar100.check,
    "commonsense": commonsense.check,
    "dolly": dolly.check,
    "drake": partial(tasks.check_task_directory, name="drake"),
    "fedaya": fedaya.check,
    "fedscope": partial(tasks.check_task_directory, name="fedscope"),
    "flan": flan.check,
    "hflb": partial(tasks.check_task_directory, name="hflb"),
    "masakhanews": masakhanews.check,
    "sni": sni.check,
    "xnli": xnli.check,
}
"""The check of each real dataset, by its registered name."""


def check_real_data(cfg: DataConfig) -> None:
    """Refuse ``cfg`` where the data it names cannot build (see the module docstring); nothing for a dataset without
    a check (synthetic data, a user's ``files`` and ``hub``, a plugin's).

    Raises:
        UserError: one sentence naming the folder, file or cache searched and what was expected there.
    """
    check = EARLY_CHECKS.get(DATASETS.canonical(cfg.name))
    if check is not None:
        check(cfg)
