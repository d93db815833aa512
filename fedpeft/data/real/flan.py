"""Eight FLAN tasks, one per client (the extreme task heterogeneity of FedDPA, FedALT and Potara's FLAN-8).

Tasks: ``arc_challenge`` (closed-book QA), ``cosmos_qa`` (reading comprehension with commonsense),
``definite_pronoun_resolution`` (coreference), ``glue_qqp`` (paraphrase), ``hellaswag`` (commonsense), ``mnli``
(NLI), ``squad_v1`` (reading comprehension), ``sst2`` (sentiment). Examples are FLAN's templated instruction
(``inputs``) and answer (``targets``) as generation prompt and response; scored with ROUGE (the paper reports
ROUGE-1). Each client gets ``train_per_group`` / ``test_per_group`` examples (2,000 / 300) of its task.

Sources: ``data.path`` with one directory per task holding ``train`` and ``test`` files with columns ``inputs``
and ``targets`` (also accepted: ``input``/``output``, ``prompt``/``response``), e.g. exported from the FLAN
collection; or ``data.hub_id`` (default ``Muennighoff/flan``, FLAN 2021 with 10 templates per task), read with
``datasets.load_dataset(hub_id, data_files=...)`` from the files ``options.hub_files`` names (default
``{split}/{task}_10templates.json``); ``options.hub_task_names`` maps our task names to the file names of a copy
(default: ``mnli`` -> ``mnli_matched``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.real.labels import text_of
from fedpeft.data.real.sources import check_hub_splits, check_local_splits, load_local_splits, require_directory
from fedpeft.data.types import ClientData, Example, FederatedData

if TYPE_CHECKING:
    import datasets

TASKS = (
    "arc_challenge", "cosmos_qa", "definite_pronoun_resolution", "glue_qqp", "hellaswag", "mnli", "squad_v1", "sst2",
)  # fmt: skip
DEFAULT_HUB_ID = "Muennighoff/flan"
COLUMN_PAIRS = (("inputs", "targets"), ("input", "output"), ("prompt", "response"))
SCHEMAS = [((prompt,), (response,)) for prompt, response in COLUMN_PAIRS]
EXPECTED = "inputs and targets (or input and output, or prompt and response)"
DEFAULT_TRAIN, DEFAULT_TEST = 2000, 300
LAYOUT = "<path>/<task>/{train,test}.{jsonl,json,csv,tsv,parquet} with columns inputs and targets"


class Options(DatasetOptions):
    """``data.options`` of ``flan``: where a hub copy keeps each task's files."""

    hub_files: str = "{split}/{task}_10templates.json"
    hub_task_names: dict[str, str] = {"mnli": "mnli_matched"}
    test_split: str = "test"


def _hub_splits(cfg: DataConfig, opts: Options, task: str) -> dict[str, datasets.Dataset]:
    import datasets

    name = opts.hub_task_names.get(task, task)
    hub_id = cfg.hub_id or DEFAULT_HUB_ID
    files = {
        "train": opts.hub_files.format(split="train", task=name),
        "test": opts.hub_files.format(split=opts.test_split, task=name),
    }
    try:
        loaded = datasets.load_dataset(hub_id, data_files=files)
    except (OSError, ValueError, RuntimeError, datasets.exceptions.DatasetsError) as err:
        raise UserError(
            f"Could not load {task} of {hub_id} (files {files['train']}, {files['test']}) from the Hugging Face "
            f"cache or the Hub ({type(err).__name__}); set data.options.hub_files / hub_task_names to the copy's "
            "file names, or data.path to a local copy (see docs/real-data.md)."
        ) from err
    return {"train": loaded["train"], "test": loaded["test"]}


def _examples(ds: datasets.Dataset, task: str, where: str) -> list[Example]:
    pair = next(((a, b) for a, b in COLUMN_PAIRS if a in ds.column_names and b in ds.column_names), None)
    if pair is None:
        raise UserError(f"{where} has columns {', '.join(ds.column_names)}; expected inputs and targets.")
    examples = []
    for row in ds:
        prompt, response = text_of(row[pair[0]]).strip(), text_of(row[pair[1]]).strip()
        if prompt and response:
            examples.append({"prompt": prompt, "response": response, "group": task})
    return examples


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading a row: the options, the tasks, each task's directory,
    split files and columns (or, offline, a hub id the ``datasets`` cache lacks)."""
    parse_options(cfg, Options)
    tasks = _tasks(cfg)
    if not cfg.path:
        check_hub_splits(cfg.hub_id or DEFAULT_HUB_ID, None)
        return
    for task in tasks:
        check_local_splits(_task_dir(cfg.path, task), ("train", "test"), f"FLAN {task}", LAYOUT, SCHEMAS, EXPECTED)


def _tasks(cfg: DataConfig) -> list[str]:
    tasks = list(cfg.groups) if cfg.groups else list(TASKS)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise UserError(f"Unknown FLAN task(s) {', '.join(unknown)} in data.groups; choose from: {', '.join(TASKS)}.")
    return tasks


def _task_dir(path: str, task: str) -> Path:
    root = require_directory(path, LAYOUT)
    if not (root / task).is_dir():
        raise UserError(f"{root} has no directory {task}/; expected {LAYOUT}.")
    return root / task


@DATASETS.register("flan")
def build(cfg: DataConfig) -> FederatedData:
    """Build the FLAN-8 federation (one task per client).

    Args:
        cfg: ``groups`` (tasks; default all eight), ``train_per_group`` / ``test_per_group`` (per client, 2,000 /
            300), ``seed``, ``path`` or ``hub_id``; ``options``: ``hub_files``, ``hub_task_names``, ``test_split``.
    """
    opts = parse_options(cfg, Options)
    tasks = _tasks(cfg)
    n_train = setting(cfg, "train_per_group", DEFAULT_TRAIN)
    n_test = setting(cfg, "test_per_group", DEFAULT_TEST)
    clients = []
    for task in tasks:
        if cfg.path:
            splits, _ = load_local_splits(_task_dir(cfg.path, task), ("train", "test"), LAYOUT)
        else:
            splits = _hub_splits(cfg, opts, task)
        drawn = {}
        for split, size in (("train", n_train), ("test", n_test)):
            pool = _examples(splits[split], task, f"FLAN {task} {split}")
            random.Random(derive_seed(cfg.seed, "flan", task, split, stream="files")).shuffle(pool)
            if not pool:
                raise UserError(f"FLAN {task} {split} has no usable example (empty inputs or targets).")
            drawn[split] = pool[:size]
        clients.append(ClientData(f"{task}-seen-00", task, "seen", drawn["train"], drawn["test"]))
    info = {
        "source": cfg.path or (cfg.hub_id or DEFAULT_HUB_ID),
        "train_per_client": {c.group: len(c.train) for c in clients},
        "test_per_client": {c.group: len(c.test) for c in clients},
    }
    return FederatedData("flan", "generation", None, tasks, clients, [], info)
