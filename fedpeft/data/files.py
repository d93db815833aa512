"""Generic federated datasets built from a user's own data: ``files`` (local files) and ``hub`` (a dataset read
with :func:`datasets.load_dataset`).

Both read rows with the columns named in ``data.columns`` (``text``, ``text_pair``, ``label`` for
classification; ``prompt``, ``response`` for generation; ``client`` and ``split`` for either) and build the
federation the same way:

1. **Clients.** ``natural``: one client per value of the client column. ``dirichlet`` (label skew, classification
   only) and ``iid``: ``data.num_clients`` clients drawn by flwr-datasets' partitioners, seeded by ``data.seed``.
   When ``data.partition`` is not given it is ``natural`` unless ``data.num_clients`` is set, which selects
   ``dirichlet`` for classification and ``iid`` for generation.
2. **Test sets.** Rows marked ``test`` in the split column form each client's test set (``validation`` rows are
   left out); without a split column each client's rows are shuffled (seeded) and ``data.test_fraction`` of them
   held out. Every client needs at least one training and one test example.
3. **Pools.** ``data.unseen_fraction`` of the clients (drawn with ``data.seed``; at least one when above 0) form
   the unseen pool, evaluated only; the others are the seen pool.

Labels are class names mapped through ``data.label_names`` (or integer ids into it); without ``label_names`` the
names are the hub's ``ClassLabel`` names, else the distinct values of the label column, sorted (integer labels
``0..max`` keep their ids; integer ids beside class names index into the sorted names). Every client is its own
group, so the summary's per-group tables are per client.

Text files are decoded from ``data.encoding`` (UTF-8 by default, with or without a byte order mark). A number in a
text column is read as its text; binary data, lists and objects in a column read are refused.

Every problem with the input (path, file, column, label, client) is a :class:`~fedpeft.core.errors.UserError`
of one sentence naming the file, row, column or key to fix. Progress bars of ``datasets`` are switched off
while the data is read, unless logging is at INFO (``fedpeft run --verbose``).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import random
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeGuard, TypeVar, cast

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options
from fedpeft.data.partition import split_train_test
from fedpeft.data.real.readers import FILE_EXTENSIONS, Row, natural_key, read_rows
from fedpeft.data.types import ClientData, Example, FederatedData, TaskKind

Scheme = Literal["natural", "dirichlet", "iid"]
T = TypeVar("T")

# Split values of the split column (case-insensitive); validation rows are left out.
TRAIN_SPLITS = ("train",)
TEST_SPLITS = ("test",)
VALIDATION_SPLITS = ("validation", "valid", "dev")
_GLOB_CHARACTERS = "*?["
# The end of the sentence refusing a data file that does not decode (see fedpeft.core.textfiles.decode_text).
_ENCODING_FIX = "set data.encoding to {encoding}"
_COLUMN_ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "classification": (("text", "label"), ("text_pair",)),
    "generation": (("prompt", "response"), ()),
}


@dataclass
class Table:
    """Rows read from one source: a data file, or one split of a hub dataset.

    Attributes:
        source: the file path or ``hub:<id> split <name>``, for messages.
        columns: the source's column names.
        rows: the rows, as dicts.
        split: the hub split the rows come from (``None`` for files); used when the data has no split column.
        class_names: names of the label column's ``ClassLabel`` feature (hub datasets), when it has one.
        lines: the line of each row in its file (JSON Lines), for messages.
    """

    source: str
    columns: list[str]
    rows: list[Row]
    split: str | None = None
    class_names: dict[str, list[str]] = field(default_factory=dict)
    lines: list[int] | None = None

    def where(self, index: int) -> str:
        """``Row <n> of <source>`` for the row at ``index``, with its line where that differs."""
        line = self.lines[index] if self.lines is not None else index + 1
        return f"Row {index + 1} of {self.source}" + (f" (line {line})" if line != index + 1 else "")


class Options(DatasetOptions):
    """``files`` and ``hub`` take no ``data.options``: what they read are fields of ``data`` itself."""


@DATASETS.register("files")
def build_files(cfg: DataConfig) -> FederatedData:
    """Build a federation from local files: ``cfg.path`` is a file, a directory (searched recursively) or a glob
    of ``.jsonl``, ``.json``, ``.csv``, ``.tsv`` or ``.parquet`` files, concatenated in sorted order."""
    parse_options(cfg, Options)
    if not cfg.path:
        hint = " (data.hub_id is read by data.name=hub)" if cfg.hub_id else ""
        raise UserError(
            f"data.name=files needs data.path{hint}: a file, directory or glob of {', '.join(FILE_EXTENSIONS)} files."
        )
    files = find_data_files(cfg.path)
    tables = [_read_file(f, cfg.encoding) for f in files]
    return build_federation(cfg, "files", tables, {"source": [str(f) for f in files]})


@DATASETS.register("hub")
def build_hub(cfg: DataConfig) -> FederatedData:
    """Build a federation from ``datasets.load_dataset(cfg.hub_id, cfg.subset, revision=cfg.revision)``: a hub id
    (read from the local cache when offline) or a local dataset directory (of data files, or written by
    ``DatasetDict.save_to_disk``). Every split is read; a ``test`` split gives the test sets when the data has no
    split column."""
    parse_options(cfg, Options)
    if not cfg.hub_id:
        hint = " (data.path is read by data.name=files)" if cfg.path else ""
        raise UserError(
            f"data.name=hub needs data.hub_id{hint}: a Hugging Face dataset id or a local dataset directory."
        )
    with quiet_progress():
        tables = load_hub_tables(cfg.hub_id, cfg.subset, cfg.revision)
        info = {"source": f"hub:{cfg.hub_id}", "subset": cfg.subset, "revision": cfg.revision}
        return build_federation(cfg, "hub", tables, info)


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Switch off the progress bars of ``datasets`` inside the block (unless logging is at INFO), then restore."""
    import datasets

    if logging.getLogger().isEnabledFor(logging.INFO):
        yield
        return
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


# ----------------------------------------------------------------------------------------------- reading


def find_data_files(path: str) -> list[Path]:
    """The data files named by ``path`` (a file, a directory searched recursively, or a glob), sorted.

    Files of other extensions in a directory or glob are skipped; hidden files and directories are too.
    """
    expanded = os.path.expanduser(path)
    supported = ", ".join(FILE_EXTENSIONS)
    if any(c in expanded for c in _GLOB_CHARACTERS):
        matches = [Path(p) for p in glob.glob(expanded, recursive=True)]
        files = [p for p in matches if p.is_file() and p.suffix.lower() in FILE_EXTENSIONS]
        if not files:
            raise UserError(
                f"data.path {path} matches no {supported} file{_searched(Path(expanded))}; fix the pattern."
            )
        return sorted(files, key=lambda p: natural_key(str(p)))
    root = Path(expanded)
    if not root.exists():
        raise UserError(
            f"data.path {path} does not exist{_searched(root)}; give a file, directory or glob of {supported} files."
        )
    if root.is_file():
        if root.suffix.lower() not in FILE_EXTENSIONS:
            raise UserError(f"data.path {path} has an unsupported extension; use one of {supported}.")
        return [root]
    files = [
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix.lower() in FILE_EXTENSIONS
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    if not files:
        raise UserError(f"data.path {path} is a directory without any {supported} file; add your data files.")
    return sorted(files, key=lambda p: natural_key(str(p.relative_to(root))))


def _searched(path: Path) -> str:
    """Where a data.path that names nothing was looked for, as the middle of a sentence: a relative one (given with
    ``--set``, or to :func:`build_files` directly) from the working directory; one of a config file is absolute,
    resolved from the file's folder (:func:`fedpeft.core.config.resolve_file_paths`)."""
    if not path.is_absolute():
        return f" in the working directory {Path.cwd()}, where a relative data.path given with --set resolves from"
    folder = next(p for p in path.parents if not any(c in p.name for c in _GLOB_CHARACTERS))
    where = f"the folder {folder}" if folder.is_dir() else f"{folder}, which does not exist either"
    return f" (searched {where}; a relative data.path in a config file resolves from the file's folder)"


def _read_file(path: Path, encoding: str) -> Table:
    columns, rows, lines = read_rows(path, encoding, _ENCODING_FIX, option="data.encoding")
    return Table(str(path), columns, rows, lines=lines)


def is_saved_dataset_dict(folder: Path) -> bool:
    """Whether ``folder`` was written by ``DatasetDict.save_to_disk`` (its ``dataset_dict.json`` lists the splits)."""
    return (folder / "dataset_dict.json").is_file()


def load_hub_tables(hub_id: str, subset: str | None, revision: str | None) -> list[Table]:
    """Every split of a dataset loaded with :func:`datasets.load_dataset` (a folder written by
    ``DatasetDict.save_to_disk`` with :func:`datasets.load_from_disk`), one :class:`Table` per split."""
    import datasets
    from datasets.exceptions import DatasetsError

    kwargs: dict[str, str] = {"revision": revision} if revision else {}
    try:
        if is_saved_dataset_dict(Path(hub_id)):  # load_dataset would read its state.json files as the rows
            loaded = datasets.load_from_disk(hub_id)
        else:
            loaded = datasets.load_dataset(hub_id, subset, **kwargs)
    # What load_dataset raises when a dataset is neither cached nor reachable, or cannot be read.
    except (OSError, ValueError, RuntimeError, DatasetsError) as err:
        raise UserError(
            f"Could not load {hub_id}{f' (subset {subset})' if subset else ''} from the Hugging Face cache, the Hub "
            "or a local directory "
            f"({type(err).__name__}); download it once with network access or use data.name=files with data.path."
        ) from err
    splits = loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    tables = []
    for split, ds in splits.items():
        if not isinstance(ds, datasets.Dataset):
            raise UserError(f"{hub_id} split {split} is not a map-style dataset; give a dataset that is not streamed.")
        class_names = {
            name: list(feature.names)
            for name, feature in ds.features.items()
            if isinstance(feature, datasets.ClassLabel)
        }
        tables.append(Table(f"hub:{hub_id} split {split}", list(ds.column_names), ds.to_list(), split, class_names))
    return tables


# ---------------------------------------------------------------------------------------------- building


def build_federation(cfg: DataConfig, name: str, tables: list[Table], info: Mapping[str, object]) -> FederatedData:
    """Turn the rows of ``tables`` into a federation as ``cfg`` says (see the module docstring)."""
    if not any(t.rows for t in tables):
        raise UserError(f"{_describe(tables)} holds no rows; give data with at least one row per client.")
    tables = [t for t in tables if t.rows]
    reading = plan_reading(cfg, tables)
    task, scheme, columns, use_hub_splits = reading.task, reading.scheme, reading.columns, reading.use_hub_splits
    records, label_names, left_out = _records(cfg, task, columns, tables, use_hub_splits)
    if not records:
        raise UserError(f"{_describe(tables)} holds no train or test rows; mark rows train or test.")
    has_splits = "split" in columns or use_hub_splits
    shards = _shard(cfg, name, scheme, records)
    clients = []
    for client_id, shard in shards:
        examples = [{k: v for k, v in r.items() if not k.startswith("_")} for r in shard]
        for example in examples:
            example["group"] = client_id
        if has_splits:
            train = [e for e, r in zip(examples, shard, strict=True) if r["_split"] == "train"]
            test = [e for e, r in zip(examples, shard, strict=True) if r["_split"] == "test"]
        else:
            seed = derive_seed(cfg.seed, name, client_id, "test", stream="files")
            train, test = split_train_test(examples, cfg.test_fraction, seed)
        _check_client(client_id, train, test, has_splits, columns, scheme)
        clients.append(ClientData(client_id, client_id, "seen", train, test))

    unseen = choose_unseen(cfg, name, [c.client_id for c in clients])
    for client in clients:
        if client.client_id in unseen:
            client.pool = "unseen"
    clients.sort(key=lambda c: (c.pool != "seen", natural_key(c.client_id)))
    info = {
        **info,
        "task": task,
        "columns": columns,
        "partition": scheme,
        "test_sets": ("split column" if "split" in columns else "hub test split")
        if has_splits
        else f"test_fraction {cfg.test_fraction}",
        "num_clients": len(clients),
        "unseen_clients": sorted(unseen, key=natural_key),
        "samples_per_client": {c.client_id: len(c.train) + len(c.test) for c in clients},
        "rows_left_out": left_out,
    }
    if scheme == "dirichlet":
        info["dirichlet_alpha"] = cfg.dirichlet_alpha
    return FederatedData(
        name=name,
        task=task,
        label_names=label_names if task == "classification" else None,
        groups=sorted((c.client_id for c in clients), key=natural_key),
        clients=clients,
        base_train=[],
        info=info,
    )


@dataclass(frozen=True)
class Reading:
    """What a config reads from its sources, decided from their columns alone.

    Attributes:
        task: ``data.task``, or the task the columns say.
        scheme: the partition (``data.partition``, or the one ``data.num_clients`` selects).
        columns: role -> column name of every column read.
        use_hub_splits: whether the hub's ``test`` split gives the test sets (the data has no split column).
    """

    task: TaskKind
    scheme: Scheme
    columns: dict[str, str]
    use_hub_splits: bool


def plan_reading(cfg: DataConfig, tables: list[Table]) -> Reading:
    """What ``cfg`` reads from ``tables``, each setting checked against their columns; no row is read, so a look at
    the data's metadata (:mod:`fedpeft.data.hub_check`) refuses the same settings before any row is loaded.

    Raises:
        UserError: no task the columns say, a partition setting that does not fit the task, a column a source
            lacks, or the test sets given twice.
    """
    task = _task(cfg, tables)
    scheme = _scheme(cfg, task)
    columns = _columns(cfg, task, scheme, tables)
    use_hub_splits = "split" not in columns and any(t.split in TEST_SPLITS for t in tables)
    if ("split" in columns or use_hub_splits) and "test_fraction" in cfg.model_fields_set:
        where = f"the split column {columns['split']!r}" if "split" in columns else "the hub's test split"
        raise UserError(
            f"Both data.test_fraction and {where} give the test sets; remove data.test_fraction "
            "(or set data.columns.split: null to use it)."
        )
    return Reading(task, scheme, columns, use_hub_splits)


def _describe(tables: list[Table]) -> str:
    return tables[0].source if len(tables) == 1 else f"{tables[0].source} (and {len(tables) - 1} more)"


def _task(cfg: DataConfig, tables: list[Table]) -> TaskKind:
    """``data.task``, or the task the columns of the first source suggest."""
    if cfg.task is not None:
        return cfg.task
    first = tables[0]
    if cfg.columns.label is not None and cfg.columns.label in first.columns:
        return "classification"
    if cfg.columns.prompt in first.columns and cfg.columns.response in first.columns:
        return "generation"
    raise UserError(
        f"{first.source} has neither a label column {cfg.columns.label!r} nor prompt and response columns "
        f"{cfg.columns.prompt!r}, {cfg.columns.response!r} (its columns: {', '.join(first.columns)}); "
        "set data.task and data.columns."
    )


def _scheme(cfg: DataConfig, task: TaskKind) -> Scheme:
    """The partition: ``data.partition`` when given, else natural, or with ``data.num_clients`` a drawn one."""
    if "partition" in cfg.model_fields_set:
        scheme: Scheme = cfg.partition
    elif cfg.num_clients is not None:
        scheme = "dirichlet" if task == "classification" else "iid"
    else:
        scheme = "natural"
    if scheme == "natural" and cfg.num_clients is not None:
        raise UserError(
            "data.num_clients sets the number of clients of the dirichlet and iid partitions, but "
            "data.partition=natural makes one client per value of the client column; remove one of them."
        )
    if scheme != "natural" and cfg.num_clients is None:
        raise UserError(f"data.partition={scheme} needs data.num_clients, the number of clients to draw.")
    if scheme == "dirichlet" and task == "generation":
        raise UserError(
            "data.partition=dirichlet skews labels, which generation data does not have; use iid or natural."
        )
    return scheme


def _columns(cfg: DataConfig, task: TaskKind, scheme: Scheme, tables: list[Table]) -> dict[str, str]:
    """Role -> column name of every column used, each checked to be in every source."""
    required, optional = _COLUMN_ROLES[task]
    required = (*required, "client") if scheme == "natural" else required
    optional = (*optional, "split")
    used: dict[str, str] = {}
    for role in (*required, *optional):
        column = getattr(cfg.columns, role)
        if column is None:
            if role in required:
                why = "the natural partition" if role == "client" else task
                raise UserError(f"data.columns.{role} is null, but {why} needs a {role} column; name it.")
            continue
        given = role in cfg.columns.model_fields_set
        if role in required or given or any(column in t.columns for t in tables):
            used[role] = column
    for role, column in used.items():
        for table in tables:
            if column not in table.columns:
                fix = (
                    "add it, or set data.num_clients to draw clients instead"
                    if role == "client" and "partition" not in cfg.model_fields_set
                    else f"add it or set data.columns.{role} to the column that holds the {role}"
                )
                raise UserError(
                    f"{table.source} has no column {column!r} (data.columns.{role}); its columns are "
                    f"{', '.join(table.columns) or 'none'}; {fix}."
                )
    return used


def _records(
    cfg: DataConfig, task: TaskKind, columns: dict[str, str], tables: list[Table], use_hub_splits: bool
) -> tuple[list[Example], list[str], int]:
    """Every row as an example with ``_client`` and ``_split`` marks; the label names; the rows left out."""
    raw: list[tuple[Example, object]] = []
    left_out = 0
    class_names: list[str] | None = None
    for table in tables:
        names = table.class_names.get(columns.get("label", ""))
        class_names = class_names or names
        for index, row in enumerate(table.rows):
            where = table.where(index)
            split = _split_of(row, table, columns, use_hub_splits, where)
            if split is None:
                left_out += 1
                continue
            label: object = None
            if task == "classification":
                label = row[columns["label"]]
                if names is not None and isinstance(label, int) and not isinstance(label, bool):
                    if label == -1:  # the hub's mark of an unlabelled row (e.g. a hidden test set)
                        left_out += 1
                        continue
                    label = names[label] if 0 <= label < len(names) else label
                if label is None or (isinstance(label, float) and label != label):
                    raise UserError(f"{where} has no label in column {columns['label']!r}; fill it in.")
                check_scalar(label, columns["label"], where, "a class name or an integer id")
                example: Example = {
                    "text": _text(row, columns["text"], where),
                    "text_pair": _optional_text(row, columns.get("text_pair"), where),
                }
            else:
                example = {
                    "prompt": _text(row, columns["prompt"], where),
                    "response": _text(row, columns["response"], where),
                }
            example["_split"] = split
            example["_client"] = _client_of(row, columns.get("client"), where)
            example["_where"] = where
            raw.append((example, label))
    if task == "generation":
        return [e for e, _ in raw], [], left_out
    if cfg.label_names is None and class_names is None:
        _check_names_beside_ids(raw, columns["label"])
    label_names = _label_names(cfg, [label for _, label in raw], class_names)
    lookup = {name: i for i, name in enumerate(label_names)}
    records = []
    for example, label in raw:
        example["label"] = _label_id(label, lookup, label_names, example["_where"], columns["label"], cfg)
        records.append(example)
    return records, label_names, left_out


def _split_of(
    row: Row, table: Table, columns: dict[str, str], use_hub_splits: bool, where: str
) -> Literal["train", "test", ""] | None:
    """``"train"``, ``"test"``, ``None`` (a validation row, left out) or ``""`` (no split information)."""
    if "split" in columns:
        value = row[columns["split"]]
        text = "" if value is None else str(value).strip().lower()
        if text in TRAIN_SPLITS:
            return "train"
        if text in TEST_SPLITS:
            return "test"
        if text in VALIDATION_SPLITS:
            return None
        raise UserError(
            f"{where} has {value!r} in the split column {columns['split']!r}; use train or test "
            "(validation rows are left out)."
        )
    if use_hub_splits:
        split = str(table.split).lower()
        if split in VALIDATION_SPLITS:
            return None
        return "test" if split in TEST_SPLITS else "train"
    return ""


def check_scalar(value: T, column: str, where: str, expected: str) -> T:
    """``value``, unless it is binary data, a list or an object, which no column of examples holds.

    Args:
        value: a value of ``column`` in the row ``where`` (``Row 3 of reviews.jsonl``), for the message.
        expected: what the column holds (``text``, ``a client id``), for the message.
    """
    if isinstance(value, (bytes, bytearray)):
        raise UserError(
            f"{where} has binary data in column {column!r}, expected {expected}; store the column as UTF-8 text."
        )
    if isinstance(value, (list, tuple, dict)):
        kind = "an object" if isinstance(value, dict) else "a list"
        raise UserError(f"{where} has {kind} in column {column!r}, expected {expected}; fix the row.")
    return value


def _text(row: Row, column: str, where: str) -> str:
    """The text of ``column``; a number (or another scalar) is read as its text, as a CSV file holds it."""
    value = row[column]
    if value is None or (isinstance(value, float) and value != value):
        raise UserError(f"{where} has no value in column {column!r}; fill it in or drop the row.")
    return str(check_scalar(value, column, where, "text"))


def _optional_text(row: Row, column: str | None, where: str) -> str | None:
    if column is None:
        return None
    value = row[column]
    if value is None or (isinstance(value, float) and value != value):
        return None
    return str(check_scalar(value, column, where, "text"))


def _client_of(row: Row, column: str | None, where: str) -> str:
    if column is None:
        return ""
    value = check_scalar(row[column], column, where, "a client id")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = "" if value is None or (isinstance(value, float) and value != value) else str(value).strip()
    if not text:
        raise UserError(f"{where} has an empty client in column {column!r}; give every row its client.")
    return text


def _is_int(value: object) -> TypeGuard[int | float]:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _id_of(label: object) -> int | None:
    """The integer id a label is (a whole number, or digits as a CSV file holds them), else ``None``."""
    if _is_int(label):
        return int(label)
    if isinstance(label, str) and label.strip().isascii() and label.strip().isdigit():
        return int(label)
    return None


def _check_names_beside_ids(raw: list[tuple[Example, object]], column: str) -> None:
    """Refuse integer ids beside a single class name: they index into the class names, which it cannot list."""
    named = [(example["_where"], label) for example, label in raw if _id_of(label) is None]
    if len({str(label).strip() for _, label in named}) == 1 and len(named) < len(raw):
        where, label = named[0]
        raise UserError(
            f"{where} has the class name {label!r} in column {column!r}, the only one beside integer ids, which "
            "index into the class names; list every class in data.label_names."
        )


def _label_names(cfg: DataConfig, labels: list[object], class_names: list[str] | None) -> list[str]:
    """``data.label_names``, the ``ClassLabel`` names, or the labels found (ids ``0..max``, else names sorted;
    integer ids beside class names index into the sorted names)."""
    if cfg.label_names is not None:
        names = [str(n) for n in cfg.label_names]
        if len(names) < 2 or len(set(names)) != len(names):
            raise UserError(f"data.label_names {names} must list at least 2 distinct class names.")
        return names
    if class_names is not None:
        return class_names
    if labels and all(_is_int(v) for v in labels):
        ids = cast(list[float], labels)  # whole numbers, as checked
        top = int(max(ids))
        if min(ids) < 0:
            raise UserError(
                f"The label column holds the negative label {int(min(ids))}; labels must be ids from 0 or "
                "class names (set data.label_names)."
            )
        return [str(i) for i in range(max(top + 1, 2))]
    named = {str(v).strip() for v in labels if _id_of(v) is None}
    names = sorted(named or {str(v).strip() for v in labels}, key=natural_key)
    if len(names) < 2:
        raise UserError(
            f"The label column holds one class only ({', '.join(names)}); classification needs at least 2 "
            "(list them in data.label_names)."
        )
    return names


def _label_id(value: object, lookup: dict[str, int], names: list[str], where: str, column: str, cfg: DataConfig) -> int:
    text = str(value).strip()
    if text in lookup:
        return lookup[text]
    index = _id_of(value)
    if index is not None and 0 <= index < len(names):
        return index
    known = f"data.label_names ({', '.join(names)})" if cfg.label_names is not None else f"the labels {names}"
    raise UserError(f"{where} has the label {value!r} in column {column!r}, which is not in {known}; fix the row.")


def _shard(cfg: DataConfig, name: str, scheme: Scheme, records: list[Example]) -> list[tuple[str, list[Example]]]:
    """The clients' ids and rows: by the client column, or drawn by a flwr-datasets partitioner."""
    if scheme == "natural":
        by_client: dict[str, list[Example]] = {}
        for record in records:
            by_client.setdefault(record["_client"], []).append(record)
        return sorted(by_client.items(), key=lambda item: natural_key(item[0]))
    num_clients = int(cfg.num_clients or 0)
    if len(records) < 2 * num_clients:
        raise UserError(
            f"{len(records)} rows are too few for data.num_clients={num_clients} clients with a training and a test "
            "row each; lower data.num_clients."
        )
    seed = derive_seed(cfg.seed, name, "partition", stream="files")
    if scheme == "dirichlet":
        # The Dirichlet partitioner cuts each class's rows in order: shuffle so the rows of the files interleave.
        records = list(records)
        random.Random(seed).shuffle(records)
    from fedpeft.data.partition import partition_examples  # imports datasets and flwr-datasets (a second or two)

    with quiet_progress(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # flwr warns on every Dirichlet re-draw
        try:
            shards = partition_examples(
                records, num_clients, scheme, alpha=cfg.dirichlet_alpha, seed=seed, min_partition_size=2
            )
        except ValueError as err:
            raise UserError(
                f"{len(records)} rows could not be split over data.num_clients={num_clients} clients with at least "
                f"2 rows each under Dirichlet alpha {cfg.dirichlet_alpha}; lower data.num_clients or raise "
                "data.dirichlet_alpha."
            ) from err
    width = max(2, len(str(num_clients - 1)))
    return [(f"client-{i:0{width}d}", shard) for i, shard in enumerate(shards)]


def _check_client(
    client_id: str, train: list[Example], test: list[Example], has_splits: bool, columns: dict[str, str], scheme: str
) -> None:
    """Refuse a client without training or test examples, with the fix that fits how its rows were found."""
    drawn = scheme != "natural"
    if not train and not test:
        fix = "lower data.num_clients" if drawn else "give it rows"
        raise UserError(f"Client {client_id!r} has no examples; {fix}.")
    for kind, rows, split in (("training", train, "train"), ("test", test, "test")):
        if rows:
            continue
        if drawn:
            fix = "lower data.num_clients" + (" or raise data.dirichlet_alpha" if scheme == "dirichlet" else "")
        elif "split" in columns:
            fix = f"give it rows marked {split} in the split column {columns['split']!r}"
        elif has_splits:
            fix = f"give it rows in the hub's {split} split"
        else:
            total = len(train) + len(test)
            fix = f"its {total} row{'s are' if total != 1 else ' is'} too few for a training and a test set; add rows"
        raise UserError(f"Client {client_id!r} has no {kind} examples; {fix}.")


def choose_unseen(cfg: DataConfig, name: str, client_ids: list[str]) -> set[str]:
    """The clients of the unseen pool: those ``data.unseen_clients`` names, or ``data.unseen_fraction`` of them (at
    least one when above 0), drawn from the sorted ids with a seed of their own.

    With site-local data (``data.sites``) a site holds some of the clients only: the server draws the pool over
    every site's clients and names it in ``unseen_clients`` (so the pools equal a run over the union of the data),
    and a site keeps the names among its own clients.
    """
    if cfg.unseen_clients is not None:
        if "unseen_fraction" in cfg.model_fields_set and cfg.unseen_fraction:
            raise UserError("Give either data.unseen_clients or data.unseen_fraction, not both.")
        unknown = sorted(set(cfg.unseen_clients) - set(client_ids), key=natural_key)
        if unknown and cfg.sites is None:
            raise UserError(f"data.unseen_clients names {unknown}, which the data does not hold; check the ids.")
        chosen = set(cfg.unseen_clients) & set(client_ids)
        count = len(chosen)
    else:
        if cfg.unseen_fraction == 0 or not cfg.unseen_pool:
            return set()
        count = max(1, round(len(client_ids) * cfg.unseen_fraction))
        chosen = set()
    if count >= len(client_ids) and cfg.sites is None:
        setting = "unseen_clients" if cfg.unseen_clients is not None else f"unseen_fraction={cfg.unseen_fraction}"
        raise UserError(f"data.{setting} leaves no seen client among {len(client_ids)}; lower it.")
    if cfg.unseen_clients is not None:
        return chosen
    ordered = sorted(client_ids, key=natural_key)
    return set(random.Random(derive_seed(cfg.seed, name, "unseen", stream="files")).sample(ordered, count))
