"""The ``hub`` dataset checked from its metadata, before ``datasets`` is imported: where
``datasets.load_dataset`` would read ``data.hub_id`` from, which columns it would find there and how many rows.

Building the federation imports ``datasets`` and, for a drawn partition, flwr-datasets (two or three seconds
together), so ``fedpeft run`` calls :func:`check_hub_data` first: a hub id that is neither a local directory nor
in the ``datasets`` cache while the hub cannot be asked, a column the data lacks, or more clients than rows ends
the run within a second, in one sentence naming the folder or file searched. It reads

- a local directory of data files: Parquet and Arrow schemas and row counts from their metadata, JSON Lines, CSV
  and TSV files read with pyarrow; or a folder written by ``DatasetDict.save_to_disk``, the Arrow files of its
  splits;
- the prepared copy of a hub id in the ``datasets`` cache
  (``<cache>/<org>___<name>/<config>/<version>/<hash>/dataset_info.json``, its features and split sizes), which is
  what ``load_dataset`` reads when the hub is not asked.

Data in a layout it does not read (other formats, a dataset card that declares its own configurations, a hub id
while the hub answers) it leaves alone: the build reads it and says what is wrong.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.hub import offline_reason
from fedpeft.core.jsontypes import JSONObject
from fedpeft.data.files import VALIDATION_SPLITS, Table, is_saved_dataset_dict, plan_reading

# The data files read here, by the ``datasets`` builder that reads them (its _EXTENSION_TO_MODULE).
_READERS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".ndjson": "json", ".csv": "csv", ".tsv": "csv"}
# Files load_dataset never takes for data (datasets.data_files.FILES_TO_IGNORE).
_NOT_DATA = {
    "README.md",
    "config.json",
    "dataset_info.json",
    "dataset_infos.json",
    "dummy_data.zip",
    "dataset_dict.json",
}
# A name load_dataset takes for a hub id rather than a path: ``name`` or ``org/name``.
HUB_ID_PATTERN = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class Part:
    """Rows as ``load_dataset`` would read them: one data file, or one split of a saved or cached dataset.

    Attributes:
        source: the file, or ``hub:<id> split <name>`` and where it is, for messages.
        split: the split the rows form (``None`` for a data file: ``load_dataset`` names it from the file's path).
        columns: the column names.
        rows: the number of rows.
    """

    source: str
    split: str | None
    columns: list[str]
    rows: int


@dataclass(frozen=True)
class Layout:
    """What ``load_dataset`` would read: ``place`` names it in messages (the directory, or the hub id and its
    cached copy), ``parts`` are its files or splits."""

    place: str
    parts: list[Part]


def check_hub_data(cfg: DataConfig) -> None:
    """Refuse ``cfg`` (``data.name: hub``) where the data's metadata already shows it cannot build: the hub id
    names nothing readable, a column read is missing, or ``data.num_clients`` draws more clients than the rows
    allow (two each). Imports neither ``datasets`` nor torch.

    Raises:
        UserError: one sentence naming the folder, cache directory or file searched and the fix.
    """
    if not cfg.hub_id:
        return  # build_hub says what to set
    layout = find_layout(cfg.hub_id, cfg.subset)
    if layout is None:
        return
    if not any(part.rows for part in layout.parts):
        raise UserError(f"{layout.place} holds no rows; give data with at least one row per client.")
    parts = [part for part in layout.parts if part.rows]
    reading = plan_reading(cfg, [Table(part.source, part.columns, [], part.split) for part in parts])
    if reading.scheme == "natural":
        return
    # Rows of a validation split are left out where the hub's splits give the test sets (files.build_federation).
    kept = [p for p in parts if not (reading.use_hub_splits and str(p.split).lower() in VALIDATION_SPLITS)]
    rows = sum(part.rows for part in kept)
    num_clients = int(cfg.num_clients or 0)
    if rows < 2 * num_clients:
        outside = " outside its validation split" if len(kept) < len(parts) else ""
        raise UserError(
            f"{layout.place} holds {rows} rows{outside}, too few for data.num_clients={num_clients} clients with a "
            "training and a test row each; lower data.num_clients."
        )


def find_layout(hub_id: str, subset: str | None) -> Layout | None:
    """The rows ``load_dataset(hub_id, subset)`` would read, by file or split; ``None`` where they cannot be told
    from metadata here (a layout read differently, or a hub id while the hub answers).

    Raises:
        UserError: ``hub_id`` is a file, a path to no directory, or a hub id that is not cached while the hub
            cannot be asked; or the cache holds several configurations and ``subset`` names none of them.
    """
    local = Path(hub_id)
    if local.is_dir():
        parts = None if subset else local_parts(local)
        return None if parts is None else Layout(f"The dataset directory {hub_id}", parts)
    if local.is_file():
        raise UserError(
            f"data.hub_id {hub_id} is a file, but load_dataset reads a dataset directory or a hub id; give the "
            f"folder that holds it, or read the file with data.name=files and data.path={hub_id}."
        )
    if os.path.isabs(hub_id) or not HUB_ID_PATTERN.fullmatch(hub_id):
        raise UserError(
            f"data.hub_id {hub_id} is no directory (searched {searched_path(local)}) and no hub id; point it at a "
            "local dataset directory or give a hub id such as my-org/my-reviews."
        )
    return cached_layout(hub_id, subset)


# ------------------------------------------------------------------------------------------- local directories


def local_parts(folder: Path) -> list[Part] | None:
    """The data files of ``folder`` that ``load_dataset`` reads (every file not hidden, not metadata), or the splits
    of a ``save_to_disk`` folder; ``None`` when it holds files of another kind, or of two kinds, or a dataset card
    that lists configurations."""
    if is_saved_dataset_dict(folder):
        return saved_parts(folder)
    files = sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and path.name not in _NOT_DATA
        and not any(part.startswith((".", "__")) for part in path.relative_to(folder).parts)
    )
    if not files:
        raise UserError(
            f"The dataset directory {folder} (data.hub_id) holds no data files; add them (train.jsonl, "
            "test.parquet, ...) or point data.hub_id at the folder that holds them."
        )
    if len({_READERS.get(path.suffix.lower()) for path in files}) != 1 or _declares_configurations(folder):
        return None
    parts = [_file_part(path) for path in files]
    return None if any(part is None for part in parts) else [part for part in parts if part is not None]


def saved_parts(folder: Path) -> list[Part] | None:
    """The splits of a folder written by ``DatasetDict.save_to_disk``: the Arrow files its ``state.json`` lists."""
    try:
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        parts = []
        for split in splits:
            state = json.loads((folder / split / "state.json").read_text())
            files = [folder / split / entry["filename"] for entry in state["_data_files"]]
            read = [_arrow_schema_and_rows(path) for path in files]
            columns = list(read[0][0].names) if read else []
            parts.append(Part(f"{folder / split} (split {split})", split, columns, sum(rows for _, rows in read)))
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None  # not as save_to_disk writes it: load_from_disk says what is wrong
    return parts


def _declares_configurations(folder: Path) -> bool:
    """Whether ``folder``'s dataset card names its own configurations or data files (then load_dataset reads those)."""
    card = folder / "README.md"
    if not card.is_file():
        return False
    text = card.read_text(errors="replace")
    return text.startswith("---") and re.search(r"^(configs|dataset_info):", text, re.M) is not None


def _file_part(path: Path) -> Part | None:
    """One data file's columns and rows, read as the ``datasets`` builder of its kind reads it; ``None`` when
    pyarrow cannot read it (the build says why)."""
    kind = _READERS[path.suffix.lower()]
    try:
        if kind == "parquet":
            parquet = pq.ParquetFile(path)
            schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
        elif kind == "arrow":
            schema, rows = _arrow_schema_and_rows(path)
        elif kind == "json":
            table = pajson.read_json(path)
            schema, rows = table.schema, table.num_rows
        else:
            delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
            table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delimiter))
            schema, rows = table.schema, table.num_rows
    except (OSError, pa.ArrowException):
        return None
    return Part(str(path), None, list(schema.names), rows)


def _arrow_schema_and_rows(path: Path) -> tuple[pa.Schema, int]:
    """An Arrow file's schema and row count, from its record batches' headers (memory-mapped: no data is read).
    ``datasets`` writes the streaming format; the file format is read too."""
    with pa.memory_map(str(path)) as source:
        try:
            stream = pa.ipc.open_stream(source)
            return stream.schema, sum(batch.num_rows for batch in stream)
        except pa.ArrowInvalid:
            source.seek(0)
            file = pa.ipc.open_file(source)
            return file.schema, sum(file.get_batch(i).num_rows for i in range(file.num_record_batches))


def searched_path(path: Path) -> str:
    """``path`` made absolute, and its first part that does not exist: ``/data/x/y: /data holds no x``."""
    absolute = Path(os.path.abspath(path.expanduser()))
    missing = absolute
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    return f"{absolute}: {missing.parent} holds no {missing.name}"


# ------------------------------------------------------------------------------------------- the datasets cache


def datasets_cache() -> Path:
    """The folder ``datasets`` keeps prepared datasets in: its ``config.HF_DATASETS_CACHE`` once imported, else the
    same path worked out from the environment (``HF_DATASETS_CACHE``, ``HF_HOME``, ``XDG_CACHE_HOME``)."""
    loaded = sys.modules.get("datasets")
    config = getattr(loaded, "config", None)
    if config is not None:
        return Path(config.HF_DATASETS_CACHE).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.environ.get("HF_DATASETS_CACHE") or os.path.join(os.path.expanduser(home), "datasets")).expanduser()


def cache_folder(hub_id: str) -> Path:
    """Where ``datasets`` prepares ``hub_id``: ``<cache>/<org>___<name in snake case>`` (as its
    ``camelcase_to_snakecase`` spells the name)."""
    parts = hub_id.split("/")
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", parts[-1])
    parts[-1] = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()
    return datasets_cache() / "___".join(parts)


def cached_layout(hub_id: str, subset: str | None) -> Layout | None:
    """The splits of ``hub_id``'s prepared copy in the ``datasets`` cache (of configuration ``subset``, else the one
    cached), as ``load_dataset`` reads it offline (its ``packaged_modules.cache``: the latest modified copy);
    ``None`` while the hub answers, since ``load_dataset`` then asks it."""
    offline = datasets_offline_reason()
    if offline is None:
        return None
    root = cache_folder(hub_id)
    infos = {}
    for folder in root.glob(f"{subset or '*'}/*/*"):
        info = read_info(folder / "dataset_info.json")
        if info is not None and info.get("config_name") == folder.parts[-3]:
            infos[folder] = info
    if not infos:
        cached = sorted({folder.parts[-3] for folder in root.glob("*/*/*") if folder.is_dir()})
        if subset and cached:
            raise UserError(
                f"Dataset {hub_id} is in the datasets cache ({root}) without the subset {subset!r}, only "
                f"{', '.join(cached)}, and {offline}; set data.subset to one of them or download the subset once "
                "with network access."
            )
        raise UserError(
            f"Dataset {hub_id} is neither a directory (searched {searched_path(Path(hub_id))}) nor in the datasets "
            f"cache (searched {root}), and {offline}; download it once with network access "
            f"(datasets.load_dataset({hub_id!r}), then copy the cache over) or set data.hub_id to a local dataset "
            "directory."
        )
    latest = max(infos, key=lambda folder: folder.stat().st_mtime)
    configurations = sorted(folder.parts[-3] for folder in infos if folder.parts[-2:] == latest.parts[-2:])
    if subset is None and len(configurations) > 1:
        raise UserError(
            f"Dataset {hub_id} has several configurations in the datasets cache ({root}): "
            f"{', '.join(configurations)}; set data.subset to the one to read."
        )
    features, splits = infos[latest].get("features"), infos[latest].get("splits")
    if not isinstance(features, dict) or not isinstance(splits, dict):
        return None
    parts = [
        Part(f"hub:{hub_id} split {name} (cached in {latest})", name, list(features), count)
        for name, split in splits.items()
        if isinstance(split, dict) and isinstance(count := split.get("num_examples"), int)
    ]
    return Layout(f"hub:{hub_id} (cached in {latest})", parts)


def read_info(path: Path) -> JSONObject | None:
    """A cached copy's ``dataset_info.json`` as a dict; ``None`` where it is missing or not a JSON object."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def datasets_offline_reason() -> str | None:
    """Why ``load_dataset`` will not ask the hub, as the end of a sentence (``HF_DATASETS_OFFLINE``, which it reads
    first, or :func:`fedpeft.core.hub.offline_reason`); ``None`` when it asks."""
    flag = os.environ.get("HF_DATASETS_OFFLINE")
    if flag is not None:
        return "HF_DATASETS_OFFLINE is set" if flag.strip().upper() in _TRUE else None
    return offline_reason()
