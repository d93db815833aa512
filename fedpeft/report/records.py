"""Reading run directories: results and costs merged across runs, and the orders and labels of their values."""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.records import Budget
from fedpeft.core.textfiles import decode_text, read_text

Record = dict[str, Any]
"""A record read back from a run's file: a ``results.jsonl`` line (written as a ``core.records.ResultRecord``),
or a ``costs.jsonl`` row."""
H = TypeVar("H", bound=Hashable)  # a value that can be a dict key: one of a record's values, or a tuple of them

RESULTS_FILE = "results.jsonl"
COSTS_FILE = "costs.jsonl"
CONFIG_FILE = "config.yaml"  # the resolved config a run wrote beside its records
DATA_FILE = "data.json"  # the run's data overview (fedpeft.runner.data_overview), the summary's Data section
BASE_METHOD = "base"
# The end of the sentence refusing a run's file that does not decode: fedpeft writes them as UTF-8.
DAMAGED_FIX = "fedpeft writes it as UTF-8, so fix or remove that line"
POOL_ORDER = ("seen", "unseen", "all")
METRIC_LABELS = {"accuracy": "Accuracy", "meteor": "METEOR", "rouge1": "ROUGE-1", "rougeL": "ROUGE-L"}

RESULT_KEY = ("method", "budget", "pool", "client", "seed", "split", "metric")
RECORD_FIELDS = ("method", "pool", "seed", "split", "metric", "value")  # what every result record the reports read has
TEST_RECORD_FIELDS = ("client", "group")  # and a test record besides: the tables' rows and columns
# budget: per-tier compute records; round and client: the events of untrusted updates (rejections, faults).
_COST_KEY = ("method", "budget", "seed", "phase", "metric", "round", "client", "step")


# ----------------------------------------------------------------------------------------------------------
# Reading and merging runs


def read_jsonl(path: Path) -> list[Record]:
    """The records of one JSONL file (blank lines skipped); a line that is not UTF-8, not JSON or not a JSON object
    is a ``UserError`` naming it."""
    return [record for _, record in _numbered_records(path)]


def read_results(path: Path) -> list[Record]:
    """The records of a results file (:func:`read_jsonl`), each checked to be a fedpeft result record: a
    ``UserError`` names the first line without one of :data:`RECORD_FIELDS` (a file that is not fedpeft's), or a
    test record without a client, a group, or a finite number as its value (a NaN: the tables cannot rank it)."""
    records = []
    for line_number, record in _numbered_records(path):
        needed = RECORD_FIELDS + (TEST_RECORD_FIELDS if record.get("split") == "test" else ())
        missing = ", ".join(repr(name) for name in needed if name not in record)
        if missing:
            raise UserError(
                f"{path} line {line_number} is not a fedpeft result record (it has no {missing}); pass the "
                "results.jsonl of a run written by `fedpeft run`."
            )
        value = record["value"]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if record["split"] == "test" and not (number and math.isfinite(value)):
            raise UserError(
                f"{path} line {line_number} holds a test value that is not a finite number ({value!r}), which no "
                "result table can rank; fix or remove that line."
            )
        records.append(record)
    return records


def _numbered_records(path: Path) -> list[tuple[int, Record]]:
    """The records of a JSONL file with their line numbers (:func:`read_jsonl`)."""
    records = []
    if path.suffix == ".gz":  # a run's records kept compressed beside a results page
        try:
            text = decode_text(gzip.decompress(path.read_bytes()), path, "utf-8", DAMAGED_FIX)
        except (OSError, EOFError, zlib.error) as err:
            raise UserError(
                f"Could not read {path} as gzip ({err}); pass a results.jsonl or results.jsonl.gz file."
            ) from None
    else:
        text = read_text(path, "utf-8", DAMAGED_FIX)
    # Lines end at "\n" only: splitlines() would also cut at characters JSON strings may hold (U+2028, ...).
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(
                f"{path} line {line_number} is not valid JSON ({error.msg}); fix or remove that line."
            ) from None
        if not isinstance(record, dict):
            raise UserError(f"{path} line {line_number} is not a JSON object; fix or remove that line.")
        records.append((line_number, record))
    return records


def _round_rank(record: Record) -> int:
    value = record.get("round")
    return -1 if value is None else int(value)


def _deduplicate(records: Iterable[Record], key_fields: Sequence[str], *, by_round: bool) -> dict[tuple, Record]:
    unique: dict[tuple, Record] = {}
    for record in records:
        key = tuple(record.get(name) for name in key_fields)
        previous = unique.get(key)
        # Within one run a later evaluation of the same thing supersedes an earlier round's.
        if previous is None or not by_round or _round_rank(record) >= _round_rank(previous):
            unique[key] = record
    return unique


def read_records(run_dirs: Sequence[Path]) -> tuple[list[Record], list[Record]]:
    """Results and costs of one or more run directories, merged.

    Within one directory, records of the same (method, budget, pool, client, seed, split, metric) keep the one
    of the latest round (the later line on equal rounds). Across directories the later directory wins: its
    record replaces an earlier directory's for the same key, so re-running a method into a new directory and
    listing it last updates that method. Costs are merged the same way on (method, seed, phase, metric).

    Args:
        run_dirs: run directories, each with ``results.jsonl`` and optionally ``costs.jsonl``.

    Returns:
        ``(results, costs)``: lists of records in first-seen order.
    """
    if not run_dirs:
        raise UserError("No run directory given; pass at least one directory written by `fedpeft run`.")
    results: dict[tuple, Record] = {}
    costs: dict[tuple, Record] = {}
    for run_dir in map(Path, run_dirs):
        results_path = run_dir / RESULTS_FILE
        if not results_path.is_file():
            raise UserError(f"{results_path} does not exist; pass a directory written by `fedpeft run --out`.")
        results.update(_deduplicate(read_results(results_path), RESULT_KEY, by_round=True))
        costs_path = run_dir / COSTS_FILE
        if costs_path.is_file():
            costs.update(_deduplicate(read_jsonl(costs_path), _COST_KEY, by_round=False))
    return list(results.values()), list(costs.values())


def results_file(source: Path) -> Path:
    """The results file of a run directory (its ``results.jsonl``), or ``source`` itself when it is a file
    (``.jsonl``, or ``.jsonl.gz`` as results pages keep them); anything else is a ``UserError``."""
    path = source / RESULTS_FILE if source.is_dir() else source
    if not path.is_file():
        raise UserError(
            f"{source} is neither a run directory with {RESULTS_FILE} nor a results file; pass a directory written "
            "by `fedpeft run` or its results.jsonl(.gz)."
        )
    return path


REHEARSAL_NOTE = (
    "A rehearsal (`fedpeft run --rehearse`, docs/rehearsal.md): stand-in data, random weights, compute cut. Its "
    "numbers measure the pipeline; none of them is a result."
)


def rehearsal_of(source: Path) -> JSONObject | None:
    """The ``rehearse`` section of the run ``source`` (a run directory or a file in one) when it is a rehearsal,
    else ``None``."""
    run_dir = source if source.is_dir() else source.parent
    config = run_dir / "config.yaml"
    if not config.is_file():
        return None
    import yaml

    try:
        section = yaml.safe_load(config.read_text()).get("rehearse")
    except (yaml.YAMLError, AttributeError, OSError, UnicodeDecodeError):
        return None
    return section if isinstance(section, dict) else None


def final_results(rows: Iterable[Record]) -> list[Record]:
    """The records of one results file deduplicated as :func:`read_records` does within a directory: the latest
    round of each key."""
    return list(_deduplicate(rows, RESULT_KEY, by_round=True).values())


# ----------------------------------------------------------------------------------------------------------
# Orders and labels


def first_seen(values: Iterable[H]) -> list[H]:
    """The distinct values in first-seen order."""
    return list(dict.fromkeys(values))


def method_order(records: Iterable[Record]) -> list[str]:
    """Methods in first-seen order, ``"base"`` first."""
    methods = first_seen(record["method"] for record in records)
    return sorted(methods, key=lambda method: method != BASE_METHOD)


def budget_order(records: Iterable[Record]) -> list[Budget]:
    """Budgets other than ``None``: ranks ascending, then tier names in first-seen order."""
    budgets = first_seen(record.get("budget") for record in records)
    ranks = sorted(b for b in budgets if isinstance(b, int) and not isinstance(b, bool))
    tiers = [b for b in budgets if b is not None and b not in ranks]
    return [*ranks, *tiers]


def pool_order(records: Iterable[Record]) -> list[str]:
    """Pools in :data:`POOL_ORDER`, unknown pools last."""
    pools = first_seen(record["pool"] for record in records)
    return sorted(pools, key=lambda pool: POOL_ORDER.index(pool) if pool in POOL_ORDER else len(POOL_ORDER))


def metric_order(records: Iterable[Record]) -> list[str]:
    """Metrics in the order of :data:`METRIC_LABELS`, unknown metrics last (first-seen order)."""
    metrics = first_seen(record["metric"] for record in records)
    known = list(METRIC_LABELS)
    return sorted(metrics, key=lambda metric: known.index(metric) if metric in known else len(known))


def budget_label(budget: Budget) -> str:
    """``r = 8`` for a rank, the tier name for a tier, ``no budget`` for ``None``."""
    if budget is None:
        return "no budget"
    if isinstance(budget, int):
        return f"r = {budget}"
    return str(budget)


def pool_label(pool: str) -> str:
    """``Seen pool``, ``Unseen pool``, ``All clients``."""
    return "All clients" if pool == "all" else f"{pool.capitalize()} pool"


def metric_label(metric: str) -> str:
    """The printed name of a metric (``ROUGE-L`` for ``rougeL``); unknown metrics as they are."""
    return METRIC_LABELS.get(metric, metric)


def is_test(record: Record) -> bool:
    """A measured value of the test split (records without a split are test records)."""
    return record.get("split", "test") == "test" and record.get("value") is not None


def file_part(name: object) -> str:
    """``name`` made safe for a file name: runs of other characters than ``A-Za-z0-9_.-`` become ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)).strip("-") or "x"
