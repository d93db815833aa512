"""Machinery shared by the real-dataset loaders: sources, split files, labels and client pools.

Every function that can fail because of the user's input (a path, a config value, a file) raises
:class:`~fedpeft.core.errors.UserError` with one sentence that names the fix.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import datasets
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq
from datasets.exceptions import DatasetsError
from datasets.table import InMemoryTable

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.seeds import derive_seed
from fedpeft.data.partition import partition_examples
from fedpeft.data.types import POOLS, ClientData, Example

FILE_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
# Accepted file stems per split; ``dev`` is the validation name of some original releases (MasakhaNEWS).
SPLIT_STEMS: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("validation", "dev", "valid"),
    "test": ("test",),
}
# Metadata files that ``save_to_disk`` writes next to the arrow shards; never data.
_METADATA_FILES = {"dataset_info.json", "state.json", "dataset_dict.json"}
# What ``datasets.load_dataset`` raises when a hub id is neither cached nor reachable (or not a dataset).
_HUB_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, RuntimeError, DatasetsError)
_SCRIPT_ERROR = "scripts are no longer supported"


def natural_key(value: str) -> tuple[Any, ...]:
    """Sort key that orders ``"2"`` before ``"10"`` (digit runs compare as numbers)."""
    # re.split with a capturing group alternates text (even positions) and digit runs (odd positions).
    return tuple(int(tok) if i % 2 else tok for i, tok in enumerate(re.split(r"(\d+)", str(value))))


def read_options(cfg: DataConfig, dataset: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``cfg.options`` merged over ``defaults``; unknown keys are a :class:`UserError`."""
    unknown = sorted(set(cfg.options) - set(defaults))
    if unknown:
        raise UserError(
            f"Unknown data.options key(s) {', '.join(unknown)} for dataset {dataset}; "
            f"known keys: {', '.join(sorted(defaults))}."
        )
    return {**defaults, **cfg.options}


def explicitly_set(cfg: DataConfig, field: str) -> bool:
    """Whether ``field`` was given in the config (YAML, override or constructor) rather than defaulted."""
    return field in cfg.model_fields_set


# --------------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """Where a per-language dataset is read from: a local directory or a Hugging Face hub id."""

    kind: Literal["path", "hub"]
    location: str
    revision: str | None = None

    def describe(self) -> str:
        return self.location if self.kind == "path" else f"hub:{self.location}"


def resolve_source(cfg: DataConfig, title: str, default_hub_id: str, revision: str | None = None) -> Source:
    """``cfg.path`` when given (it must exist), else ``cfg.hub_id`` or ``default_hub_id``."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not path.exists():
            raise UserError(
                f"data.path {cfg.path} does not exist; point it at your local copy of {title} "
                "(layouts in docs/real-data.md) or remove it to read the hub id "
                f"{cfg.hub_id or default_hub_id}."
            )
        if not path.is_dir():
            raise UserError(
                f"data.path {cfg.path} is a file, but {title} is read from a directory with one "
                "sub-directory per language; point data.path at that directory."
            )
        return Source("path", str(path))
    return Source("hub", cfg.hub_id or default_hub_id, revision)


def select_languages(
    requested: list[str] | None, known: Sequence[str], source: Source, title: str, layout: str
) -> list[str]:
    """The languages to build: ``requested`` (validated) or every language the source offers."""
    if requested is not None:
        if not requested:
            raise UserError(f"data.groups is empty; list {title} languages or remove data.groups to use all.")
        unknown = [lang for lang in requested if lang not in known]
        if unknown:
            raise UserError(
                f"Unknown {title} language(s) {', '.join(unknown)} in data.groups; choose from: {', '.join(known)}."
            )
        langs = list(dict.fromkeys(requested))
    elif source.kind == "hub":
        langs = list(known)
    else:
        langs = [lang for lang in known if (Path(source.location) / lang).is_dir()]
        if not langs:
            raise UserError(f"{source.location} holds no {title} language directory; expected {layout}.")
    if source.kind == "path":
        missing = [lang for lang in langs if not (Path(source.location) / lang).is_dir()]
        if missing:
            raise UserError(
                f"{source.location} has no directory for language(s) {', '.join(missing)}; expected {layout}."
            )
    return langs


def load_splits(
    source: Source, lang: str, splits: Sequence[str], title: str, layout: str
) -> tuple[dict[str, datasets.Dataset], str]:
    """The requested splits of one language and their layout (``save_to_disk``, ``files`` or ``hub``)."""
    if source.kind == "hub":
        return load_hub_splits(source.location, lang, splits, source.revision), "hub"
    return load_local_splits(Path(source.location) / lang, splits, layout)


def load_hub_splits(
    hub_id: str, config_name: str, splits: Sequence[str], revision: str | None = None
) -> dict[str, datasets.Dataset]:
    """Load ``hub_id``/``config_name`` with :func:`datasets.load_dataset` (from the cache when offline).

    Hub repositories that still ship a loading script are retried on their parquet export
    (``refs/convert/parquet``), which current ``datasets`` releases can read without running code.
    """
    kwargs: dict[str, Any] = {"revision": revision} if revision else {}
    try:
        try:
            loaded = datasets.load_dataset(hub_id, config_name, **kwargs)
        except RuntimeError as err:
            if _SCRIPT_ERROR not in str(err) or revision:
                raise
            loaded = datasets.load_dataset(hub_id, config_name, revision="refs/convert/parquet")
    except _HUB_ERRORS as err:
        raise UserError(
            f"Could not load {hub_id} (config {config_name}) from the Hugging Face cache or the Hub "
            f"({type(err).__name__}); download it once with network access, or set data.path to a local copy "
            "(see docs/real-data.md)."
        ) from err
    missing = [s for s in splits if s not in loaded]
    if missing:
        raise UserError(
            f"{hub_id} (config {config_name}) has no {', '.join(missing)} split; "
            "set data.hub_id to a copy with the original splits or use data.path."
        )
    return {s: loaded[s] for s in splits}


def load_local_splits(lang_dir: Path, splits: Sequence[str], layout: str) -> tuple[dict[str, datasets.Dataset], str]:
    """Read one language directory: a ``DatasetDict.save_to_disk`` folder or plain split files."""
    if (lang_dir / "dataset_dict.json").is_file():
        saved = datasets.load_from_disk(str(lang_dir))
        if not isinstance(saved, datasets.DatasetDict):
            raise UserError(f"{lang_dir} was not saved from a DatasetDict; expected {layout}.")
        missing = [s for s in splits if s not in saved]
        if missing:
            raise UserError(f"{lang_dir} (save_to_disk) has no {', '.join(missing)} split; expected {layout}.")
        return {s: saved[s] for s in splits}, "save_to_disk"
    out: dict[str, datasets.Dataset] = {}
    for split in splits:
        files = find_split_files(lang_dir, split)
        if not files:
            raise UserError(f"{lang_dir} has no {split} file; expected {layout}.")
        out[split] = datasets.Dataset(InMemoryTable(read_tables(files)))
    return out, "files"


def find_split_files(lang_dir: Path, split: str) -> list[Path]:
    """Files of ``split``: ``<split>.<ext>``, ``*-<split>.<ext>`` or shards ``<split>/*.<ext>``.

    ``<split>`` also matches the aliases of :data:`SPLIT_STEMS` (``dev`` for ``validation``).
    """
    for stem in SPLIT_STEMS[split]:
        for ext in FILE_EXTENSIONS:
            candidate = lang_dir / f"{stem}{ext}"
            if candidate.is_file():
                return [candidate]
        for ext in FILE_EXTENSIONS:
            prefixed = sorted(lang_dir.glob(f"*-{stem}{ext}"))
            if prefixed:
                return prefixed
        shard_dir = lang_dir / stem
        if shard_dir.is_dir():
            shards = sorted(
                p
                for p in shard_dir.iterdir()
                if p.is_file() and p.suffix in FILE_EXTENSIONS and p.name not in _METADATA_FILES
            )
            if shards:
                return shards
    return []


def read_tables(files: Sequence[Path]) -> pa.Table:
    """Read and concatenate data files (JSON Lines, JSON list, CSV, TSV or Parquet) into one arrow table."""
    tables = [read_table(f) for f in files]
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise UserError(
            f"The shards {files[0].parent}/*{files[0].suffix} disagree on their columns; "
            "give every shard the same schema."
        ) from err


def read_table(path: Path) -> pa.Table:
    """Read one data file into an arrow table, chosen by its extension."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.read_table(path)
        if suffix in (".csv", ".tsv"):
            parse = pacsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",", newlines_in_values=True)
            return pacsv.read_csv(path, parse_options=parse)
        if suffix == ".jsonl":
            try:
                return pajson.read_json(path)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                return pa.Table.from_pylist(read_json_records(path))
        if suffix == ".json":
            return pa.Table.from_pylist(read_json_records(path))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, UnicodeDecodeError) as err:
        raise UserError(
            f"Could not read {path} ({type(err).__name__}); check that it is valid {suffix[1:]} "
            "with the columns listed in docs/real-data.md."
        ) from err
    raise UserError(f"{path} has an unsupported extension; use one of {', '.join(FILE_EXTENSIONS)}.")


def read_json_records(path: Path) -> list[dict[str, Any]]:
    """A JSON list of objects or JSON Lines, as a list of dicts."""
    data = load_json_or_lines(path)
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise UserError(f"{path} must hold a JSON list of objects or one JSON object per line.")
    return data


def load_json_or_lines(path: Path) -> Any:
    """Parse ``path`` as one JSON document, or as JSON Lines (always for ``.jsonl``)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() != ".jsonl":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise UserError(
                f"{path} line {number} is not valid JSON; give one JSON document or one JSON object per line."
            ) from err
    return rows


# ---------------------------------------------------------------------------------------------------- labels


def require_columns(ds: datasets.Dataset, columns: Iterable[str], where: str, expected: str) -> None:
    """Raise when ``ds`` lacks any of ``columns``."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise UserError(
            f"{where} lacks column(s) {', '.join(missing)} (it has {', '.join(ds.column_names)}); "
            f"expected the columns {expected}."
        )


def label_ids(ds: datasets.Dataset, column: str, label_names: Sequence[str]) -> list[int | None]:
    """Every row's label as an index into ``label_names`` (``None`` for rows without a usable label).

    Accepts integer ids (through the dataset's ``ClassLabel`` names when it has them), digit strings and
    class names (case-insensitive).
    """
    feature = ds.features.get(column)
    names_in_data = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    lookup = {name.lower(): i for i, name in enumerate(label_names)}

    def convert(value: Any) -> int | None:
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, float):
            if value != value or not value.is_integer():  # NaN or fractional
                return None
            value = int(value)
        if isinstance(value, str):
            text = value.strip()
            if text.lstrip("-").isdigit():
                value = int(text)
            else:
                return lookup.get(text.lower())
        if isinstance(value, int):
            if names_in_data is not None:
                if not 0 <= value < len(names_in_data):
                    return None
                return lookup.get(names_in_data[value].lower())
            return value if 0 <= value < len(label_names) else None
        return None

    return [convert(v) for v in ds[column]]


def text_of(value: Any) -> str:
    """A cell as text (missing values become the empty string)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def draw_pools(
    ds: datasets.Dataset, labels: list[int | None], n_pools: int, per_pool: int, seed: int
) -> list[list[tuple[dict[str, Any], int]]]:
    """``n_pools`` disjoint random blocks of ``per_pool`` labelled rows (row dict, label id)."""
    valid = [i for i, label in enumerate(labels) if label is not None]
    random.Random(seed).shuffle(valid)
    blocks = []
    for p in range(n_pools):
        chosen = valid[p * per_pool : (p + 1) * per_pool]
        rows = ds.select(chosen).to_list() if chosen else []
        blocks.append([(row, int(labels[i] or 0)) for row, i in zip(rows, chosen, strict=True)])
    return blocks


def count_valid(labels: list[int | None]) -> int:
    return sum(label is not None for label in labels)


# ------------------------------------------------------------------------------------------------ federation


def classification_scheme(cfg: DataConfig, title: str) -> Literal["dirichlet", "iid"]:
    """``cfg.partition`` for a dataset without natural client ids."""
    if cfg.partition == "natural":
        raise UserError(
            f"data.partition=natural needs natural client ids, which {title} does not have; "
            "use dirichlet (label skew) or iid."
        )
    return cfg.partition


def active_pools(cfg: DataConfig) -> tuple[str, ...]:
    """``("seen", "unseen")``, or only ``("seen",)`` when ``cfg.unseen_pool`` is off."""
    return POOLS if cfg.unseen_pool else ("seen",)


def partition_pool(
    train: list[Example],
    test: list[Example],
    num_clients: int,
    scheme: Literal["dirichlet", "iid"],
    alpha: float,
    seed: int,
    where: str,
) -> list[tuple[list[Example], list[Example]]]:
    """Split one group's pool over ``num_clients`` clients, each with its own train and test examples.

    Train and test examples are partitioned together, so every client's test set follows the label
    distribution of its training set (roughly ``len(test) / (len(train) + len(test))`` of its samples are
    test samples). A client left without test (or train) samples gets one moved over from the other side.
    """
    total = len(train) + len(test)
    if total < 2 * num_clients:
        raise UserError(
            f"{where} has {total} samples, too few for {num_clients} clients with at least 2 each; "
            "lower data.clients_per_group or use more samples per group."
        )
    marked = [{**e, "_split": "train"} for e in train] + [{**e, "_split": "test"} for e in test]
    # The Dirichlet partitioner cuts each class's rows in order: shuffle so train and test interleave.
    random.Random(seed).shuffle(marked)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # flwr warns on every Dirichlet re-draw
        try:
            shards = partition_examples(marked, num_clients, scheme, alpha=alpha, seed=seed, min_partition_size=2)
        except ValueError as err:
            raise UserError(
                f"{where} ({total} samples) could not be split over {num_clients} clients with at least "
                f"2 samples each under Dirichlet alpha {alpha}; lower data.clients_per_group, raise "
                "data.dirichlet_alpha or use more samples per group."
            ) from err
    rng = random.Random(seed + 1)
    result = []
    for shard in shards:
        client_train = [_unmark(e) for e in shard if e["_split"] == "train"]
        client_test = [_unmark(e) for e in shard if e["_split"] == "test"]
        if not client_test and len(client_train) >= 2:
            client_test.append(client_train.pop(rng.randrange(len(client_train))))
        if not client_train and len(client_test) >= 2:
            client_train.append(client_test.pop(rng.randrange(len(client_test))))
        result.append((client_train, client_test))
    return result


def _unmark(example: Example) -> Example:
    return {k: v for k, v in example.items() if k != "_split"}


def build_classification_clients(
    pools: dict[str, dict[str, tuple[list[Example], list[Example]]]],
    num_clients: int,
    cfg: DataConfig,
    scheme: Literal["dirichlet", "iid"],
    title: str,
) -> list[ClientData]:
    """Clients ``"<group>-<pool>-<index:02d>"`` for every group and pool of ``pools[group][pool]``."""
    clients: list[ClientData] = []
    for pool in POOLS:
        for group, by_pool in pools.items():
            if pool not in by_pool:
                continue
            train, test = by_pool[pool]
            shards = partition_pool(
                train,
                test,
                num_clients,
                scheme,
                cfg.dirichlet_alpha,
                derive_seed(cfg.seed, title, group, pool, "partition", stream="files"),
                f"The {title} {group} {pool} pool",
            )
            for index, (client_train, client_test) in enumerate(shards):
                clients.append(ClientData(f"{group}-{pool}-{index:02d}", group, pool, client_train, client_test))
    return clients
