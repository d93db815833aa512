"""Data files of the real datasets: finding a split's files and reading JSON, JSON Lines, CSV, TSV and Parquet.

Every function that can fail because of a file raises :class:`~fedpeft.core.errors.UserError` with one sentence
that names the fix.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias, cast

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject, JSONValue
from fedpeft.core.textfiles import read_text

FILE_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")
# Accepted file stems per split; ``dev`` is the validation name of some original releases (MasakhaNEWS).
SPLIT_STEMS: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("validation", "dev", "valid"),
    "test": ("test",),
}
# How to fix a file of a packaged dataset's release that is not UTF-8 (those releases are).
SAVE_AS_UTF8 = "save it as UTF-8"
# Metadata files that ``save_to_disk`` writes next to the arrow shards; never data.
_METADATA_FILES = {"dataset_info.json", "state.json", "dataset_dict.json"}
# How much of a text file quick_columns reads to find its header or first record.
_QUICK_BYTES = 1 << 20

Row: TypeAlias = dict[str, object]
"""One row of a data file, column -> value: JSON's values, or the Python values arrow reads from a table."""


def natural_key(value: str) -> tuple[int | str, ...]:
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


def quick_columns(path: Path) -> list[str] | None:
    """The columns of one data file as far as its start tells them, without reading it: a Parquet file's schema, a
    CSV or TSV file's header, the keys of the first record of JSON Lines or of a JSON list. Every column named is
    one :func:`read_table` gives; a JSON file's later records may add others. ``None`` where the start tells
    nothing (a first record longer than :data:`_QUICK_BYTES`, a file that does not parse)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return list(pq.read_schema(path).names)
        with path.open(encoding="utf-8-sig", newline="") as stream:
            start = stream.read(_QUICK_BYTES)
        if suffix in (".csv", ".tsv"):
            header = next(csv.reader(io.StringIO(start, newline=""), delimiter="\t" if suffix == ".tsv" else ","))
            return header if "\n" in start or len(start) < _QUICK_BYTES else None
        text = start.lstrip()
        position = 1 if text.startswith("[") else 0  # the first object of a JSON list, or the first line
        while position < len(text) and text[position].isspace():
            position += 1
        record, _ = json.JSONDecoder().raw_decode(text, position)
    except (OSError, ValueError, StopIteration, csv.Error, pa.ArrowException):
        return None
    return list(record) if isinstance(record, dict) else None


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


def read_table(path: Path, encoding: str = "utf-8", fix: str = SAVE_AS_UTF8, option: str = "the encoding") -> pa.Table:
    """Read one data file into an arrow table, chosen by its extension.

    Args:
        path: a ``.jsonl``, ``.json``, ``.csv``, ``.tsv`` or ``.parquet`` file.
        encoding: the encoding of a text file (``utf-8`` reads one with or without a byte order mark).
        fix: the end of the sentence refusing a byte that does not decode (see
            :func:`~fedpeft.core.textfiles.decode_text`).
        option: where ``encoding`` was given (``data.encoding``), for the message of an unknown encoding.
    """
    suffix = _suffix(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    text = read_text(path, encoding, fix, option)
    if suffix in (".csv", ".tsv"):
        return read_delimited(text, path)
    if suffix == ".jsonl":
        try:
            return pajson.read_json(pa.BufferReader(text.encode("utf-8")))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # read line by line below, which names a bad line
    columns, rows, _ = json_rows(text, path)
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise UserError(_mixed_types(path, columns, rows) or _unreadable(path, err)) from None


def read_rows(
    path: Path, encoding: str = "utf-8", fix: str = SAVE_AS_UTF8, option: str = "the encoding"
) -> tuple[list[str], list[Row], list[int] | None]:
    """The column names, the rows (dicts with every column) and, for JSON Lines, each row's line of one data file.

    Unlike :func:`read_table`, JSON values keep their Python types: a column may mix numbers and strings (the caller
    decides what it accepts). Arguments as for :func:`read_table`.
    """
    suffix = _suffix(path)
    if suffix in (".jsonl", ".json"):
        return json_rows(read_text(path, encoding, fix, option), path)
    table = read_table(path, encoding, fix, option)
    return list(table.column_names), table.to_pylist(), None


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in FILE_EXTENSIONS:
        raise UserError(f"{path} has an unsupported extension; use one of {', '.join(FILE_EXTENSIONS)}.")
    return suffix


def _read_parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
        raise UserError(_unreadable(path, err)) from None


def _unreadable(path: Path, err: Exception) -> str:
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (
        f"Could not read {path} ({reason}); check that it is valid {path.suffix.lower()[1:]} with the columns "
        "listed in docs/real-data.md."
    )


def read_delimited(text: str, path: Path) -> pa.Table:
    """A CSV (or, for a ``.tsv`` path, tab-separated) text as an arrow table, column types inferred.

    Where arrow cannot read it, a row whose number of fields differs from the header's is refused by its line and
    row; a column whose type arrow inferred wrongly (numbers, then text further down) is read as text.
    """
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    parse = pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True)
    data = text.encode("utf-8")
    try:
        return pacsv.read_csv(pa.BufferReader(data), parse_options=parse)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        arrow_error = err
    header = _check_fields(text, path, delimiter)
    as_text = pacsv.ConvertOptions(column_types=dict.fromkeys(header, pa.string()), strings_can_be_null=True)
    try:
        return pacsv.read_csv(pa.BufferReader(data), parse_options=parse, convert_options=as_text)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise UserError(_unreadable(path, arrow_error)) from None


def _check_fields(text: str, path: Path, delimiter: str) -> list[str]:
    """The header of a delimited text; a row with another number of fields is a ``UserError`` naming it."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header: list[str] | None = None
    row_number = 0
    separator = "a tab" if delimiter == "\t" else "a comma"
    try:
        for fields in reader:
            if not fields:
                continue  # arrow skips empty lines too
            if header is None:
                header = fields
                continue
            row_number += 1
            if len(fields) != len(header):
                raise UserError(
                    f"{path} line {reader.line_num} (row {row_number}) has {len(fields)} fields where the header has "
                    f"{len(header)}; quote values that hold {separator} or fix that row."
                )
    except csv.Error as err:
        raise UserError(f"{path} line {reader.line_num} is not valid {path.suffix[1:]} ({err}); fix it.") from None
    return header or []


def _mixed_types(path: Path, columns: list[str], rows: list[Row]) -> str | None:
    """The sentence naming the first row whose value in some column has another type than the column's first."""
    for column in columns:
        first: tuple[int, str] | None = None
        for number, row in enumerate(rows, start=1):
            value = row.get(column)
            if value is None:
                continue
            kind = _json_kind(value)
            if first is None:
                first = (number, kind)
            elif kind != first[1]:
                return (
                    f"Row {number} of {path} has {kind} in column {column!r}, but row {first[0]} has {first[1]}; "
                    "give every value of a column the same type."
                )
    return None


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object"


def json_rows(text: str, path: Path) -> tuple[list[str], list[Row], list[int] | None]:
    """The columns, rows and (for JSON Lines) row lines of a JSON list of objects or of JSON Lines.

    Every row gets every column (``None`` where it lacks one); a row that is not an object is a ``UserError``.
    """
    data = _json_document(text, path)
    lines: list[int] | None = None
    if data is None:
        data, lines = json_lines(text, path)
    elif not isinstance(data, list):
        raise UserError(f"{path} must hold a JSON list of objects or one JSON object per line.")
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            where = f"{path} line {lines[index]}" if lines is not None else f"Item {index + 1} of {path}"
            raise UserError(
                f"{where} is {_json_kind(row)}, not a JSON object; write each example as an object of its columns."
            )
    objects = cast(list[JSONObject], data)  # every item checked above
    columns = list(dict.fromkeys(key for row in objects for key in row))
    return columns, [{column: row.get(column) for column in columns} for row in objects], lines


def read_json_records(path: Path) -> list[Row]:
    """A JSON list of objects or JSON Lines (UTF-8), as a list of dicts."""
    return json_rows(read_text(path, "utf-8", SAVE_AS_UTF8), path)[1]


def load_json_or_lines(path: Path) -> JSONValue:
    """Parse ``path`` (UTF-8) as one JSON document, or as JSON Lines (always for ``.jsonl``)."""
    text = read_text(path, "utf-8", SAVE_AS_UTF8)
    data = _json_document(text, path)
    return json_lines(text, path)[0] if data is None else data


def _json_document(text: str, path: Path) -> JSONValue:
    """``text`` parsed as one JSON document; ``None`` for a ``.jsonl`` path or text that is not one document."""
    if path.suffix.lower() == ".jsonl":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def json_lines(text: str, path: Path) -> tuple[list[JSONValue], list[int]]:
    """The values of the JSON Lines ``text`` (of ``path``; blank lines skipped) and the line of each."""
    values: list[JSONValue] = []
    numbers: list[int] = []
    # Lines end at "\n" only: splitlines() would also cut at characters JSON strings may hold (U+2028, ...).
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise UserError(
                f"{path} line {number} is not valid JSON ({err.msg} at column {err.colno}); give one JSON document "
                "or one JSON object per line."
            ) from None
        numbers.append(number)
    return values, numbers
