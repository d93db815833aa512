"""Dolly-15k (databricks/databricks-dolly-15k) for FLAME's experiments (paper 004), from the hub or a local copy.

Records carry ``instruction``, ``context`` (may be empty), ``response`` and ``category`` (open_qa, general_qa,
classification, closed_qa, brainstorming, information_extraction, summarization, creative_writing). Each becomes
an Alpaca-template prompt (``context`` as the input) and its response; clients come from a Dirichlet partition
over the categories and an 80/10/10 split per client (:func:`fedpeft.data.instruct.category_clients`).

Sources: ``data.path`` (a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file such as the release's
``databricks-dolly-15k.jsonl``, a directory holding one such file or ``train.*`` files, or a
``save_to_disk`` directory), else ``data.hub_id`` (default ``databricks/databricks-dolly-15k``, read from the
local Hugging Face cache when offline). Options: ``num_clients`` (4), ``categories`` (all), ``max_samples``
(all; a seeded subset otherwise).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.hub_check import saved_parts, searched_path
from fedpeft.data.instruct import category_clients, instruction_example
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.real.labels import require_schema
from fedpeft.data.real.readers import FILE_EXTENSIONS, find_split_files, read_tables
from fedpeft.data.real.sources import check_file_columns, check_hub_splits, load_hub_splits
from fedpeft.data.types import Example, FederatedData

DOLLY_HUB_ID = "databricks/databricks-dolly-15k"
DOLLY_CATEGORIES = (
    "open_qa", "general_qa", "classification", "closed_qa", "brainstorming", "information_extraction",
    "summarization", "creative_writing",
)  # fmt: skip
DOLLY_FIELDS = ("instruction", "context", "response", "category")


class Options(DatasetOptions):
    """``data.options`` of ``dolly``."""

    num_clients: int = 4
    categories: list[str] | None = None
    max_samples: int | None = None


def read_records(cfg: DataConfig, title: str, default_hub_id: str, columns: tuple[str, ...]) -> tuple[list[dict], str]:
    """Every record of an instruction dataset (one ``train`` split) and where it was read from.

    ``columns`` are required; a missing one is a :class:`UserError` naming the columns found.
    """
    if cfg.path:
        path = Path(cfg.path).expanduser()
        _require_path(path, title)
        if path.is_dir() and (path / "dataset_dict.json").is_file():
            import datasets

            saved = datasets.load_from_disk(str(path))
            if "train" not in saved:
                raise UserError(_NO_TRAIN_SPLIT.format(path=path, title=title))
            table = saved["train"]
            rows, source = table.to_list(), str(path)
        else:
            files = _data_files(path, title)
            rows, source = read_tables(files).to_pylist(), ", ".join(str(f) for f in files)
    else:
        hub_id = cfg.hub_id or default_hub_id
        rows, source = load_hub_splits(hub_id, None, ["train"])["train"].to_list(), f"hub:{hub_id}"
    if not rows:
        raise UserError(f"{source} holds no {title} records.")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise UserError(
            f"{source} lacks column(s) {', '.join(missing)} (it has {', '.join(rows[0])}); {title} records need "
            f"{', '.join(columns)}."
        )
    return rows, source


def check_records(cfg: DataConfig, title: str, default_hub_id: str, columns: tuple[str, ...]) -> None:
    """Refuse what :func:`read_records` would before reading a record: a ``data.path`` that names nothing, a
    directory without a data file or ``train`` split, a column ``columns`` lists that the files lack (or, offline,
    a hub id the ``datasets`` cache lacks)."""
    schema = tuple((column,) for column in columns)
    expected = f"the columns of {title} records, {', '.join(columns)}"
    if not cfg.path:
        check_hub_splits(cfg.hub_id or default_hub_id, None, ["train"], [schema], expected)
        return
    path = Path(cfg.path).expanduser()
    _require_path(path, title)
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        parts = {part.split: part for part in saved_parts(path) or []}
        if parts and "train" not in parts:
            raise UserError(_NO_TRAIN_SPLIT.format(path=path, title=title))
        if parts:
            require_schema(parts["train"].columns, [schema], parts["train"].source, expected)
        return
    check_file_columns(_data_files(path, title), [schema], f"{title} records", expected)


_NO_TRAIN_SPLIT = "{path} (save_to_disk) has no train split; save {title} with its train split."


def _require_path(path: Path, title: str) -> None:
    if not path.exists():
        raise UserError(
            f"data.path {path} does not exist (searched {searched_path(path)}); point it at your copy of {title}."
        )


def check_max_samples(max_samples: int | None) -> None:
    """Refuse a ``data.options.max_samples`` below 10."""
    if max_samples is not None and max_samples < 10:
        raise UserError("data.options.max_samples must be an integer of at least 10, or null for all.")


def _data_files(path: Path, title: str) -> list[Path]:
    if path.is_file():
        if path.suffix not in FILE_EXTENSIONS:
            raise UserError(f"{path} is not a data file; give a {', '.join(FILE_EXTENSIONS)} file of {title}.")
        return [path]
    files = find_split_files(path, "train")
    if files:
        return files
    candidates = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in FILE_EXTENSIONS)
    if len(candidates) == 1:
        return candidates
    raise UserError(
        f"{path} holds {len(candidates)} data files and no train.* file; point data.path at the {title} file."
    )


def build_instruction_federation(
    cfg: DataConfig,
    name: str,
    examples: list[Example],
    *,
    num_clients: int,
    max_samples: int | None,
    info: Mapping[str, object],
) -> FederatedData:
    """Subsample (``max_samples``), split over ``num_clients`` clients by category and wrap as a federation."""
    check_max_samples(max_samples)
    if max_samples is not None and max_samples < len(examples):
        examples = random.Random(derive_seed(cfg.seed, name, "subset", stream="files")).sample(examples, max_samples)
    partition = setting(cfg, "partition", "dirichlet")
    alpha = setting(cfg, "dirichlet_alpha", 5.0)
    clients, facts = category_clients(
        examples,
        num_clients,
        scheme=partition,
        alpha=alpha,
        seed=derive_seed(cfg.seed, name, "partition", stream="files"),
        where=name,
    )
    counts = Counter(ex["group"] for ex in examples)
    groups = sorted({c.group for c in clients}, key=lambda g: (-counts[g], g))
    info = {
        **info,
        "samples": len(examples),
        "samples_per_category": dict(sorted(counts.items())),
        "partition": f"{partition} over categories (alpha {alpha}), then 80/10/10 per client",
        **facts,
    }
    return FederatedData(name, "generation", None, groups, clients, [], info)


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading a record (:func:`check_records`)."""
    check_max_samples(parse_options(cfg, Options).max_samples)
    check_records(cfg, "Dolly-15k", DOLLY_HUB_ID, DOLLY_FIELDS)


@DATASETS.register("dolly")
def build(cfg: DataConfig) -> FederatedData:
    """Build the Dolly-15k federation (see the module docstring for sources and options)."""
    opts = parse_options(cfg, Options)
    rows, source = read_records(cfg, "Dolly-15k", DOLLY_HUB_ID, DOLLY_FIELDS)
    wanted = opts.categories
    if wanted is not None:
        unknown = sorted(set(wanted) - {str(r["category"]) for r in rows})
        if unknown or not wanted:
            raise UserError(f"data.options.categories names {unknown or 'nothing'} not in {source}; choose from "
                            f"{', '.join(DOLLY_CATEGORIES)}.")  # fmt: skip
    examples = [
        instruction_example(str(r["instruction"]), str(r["context"] or ""), str(r["response"]), str(r["category"]))
        for r in rows
        if wanted is None or r["category"] in wanted
    ]
    return build_instruction_federation(
        cfg, "dolly", examples, num_clients=opts.num_clients, max_samples=opts.max_samples, info={"source": source}
    )
