"""Data files of the real datasets: finding a split's files and reading JSON, JSON Lines, CSV, TSV and Parquet.

Every function that can fail because of a file raises :class:`~fedpeft.core.errors.UserError` with one sentence
that names the fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from fedpeft.core.errors import UserError

FILE_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
# Accepted file stems per split; ``dev`` is the validation name of some original releases (MasakhaNEWS).
SPLIT_STEMS: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("validation", "dev", "valid"),
    "test": ("test",),
}
# Metadata files that ``save_to_disk`` writes next to the arrow shards; never data.
_METADATA_FILES = {"dataset_info.json", "state.json", "dataset_dict.json"}


def natural_key(value: str) -> tuple[Any, ...]:
    """Sort key that orders ``"2"`` before ``"10"`` (digit runs compare as numbers)."""
    # re.split with a capturing group alternates text (even positions) and digit runs (odd positions).
    return tuple(int(tok) if i % 2 else tok for i, tok in enumerate(re.split(r"(\d+)", str(value))))


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
