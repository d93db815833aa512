"""A rerun against its reference run: how far the records moved, and which differences the reference's clients
supported still hold (``fedpeft compare``).

A run made again on another machine (another CPU's float kernels, a GPU), with another engine or at another commit
need not give the same bits: sums round differently, and training carries a last-bit difference forward. What a
result can promise across machines is therefore not its numbers but its supported differences. For two runs of one
config this module matches their final test records on the result key and measures how far they moved, next to the
seeds' spread; then it recomputes every paired difference of every table in both runs (each pair of rows of a
per-group table's ``Mean`` column and of each column of the continual personalization table: the pool's clients,
95 % t intervals, :mod:`.intervals`) and sorts each into:

- ``holds``: supported in both runs, with the same sign;
- ``lost``: supported in the reference, not in the rerun;
- ``reversed``: supported in both, with opposite signs;
- ``new``: supported in the rerun only;
- ``level``: supported in neither.

A pair whose interval cannot be computed in one of the runs (one client, or a row the other run lacks) is counted
as untested.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONMapping, JSONObject, JSONValue
from fedpeft.core.records import Budget
from fedpeft.report.continual import (
    CONTINUAL_SPLITS,
    column_best,
    continual_cells,
    continual_client_values,
    continual_differences,
    round_records,
)
from fedpeft.report.differences import table_heading
from fedpeft.report.intervals import CONFIDENCE, Interval, PairKey, format_interval, paired_interval
from fedpeft.report.records import (
    RESULT_KEY,
    Record,
    final_results,
    is_test,
    method_order,
    metric_label,
    metric_order,
    read_results,
    rehearsal_of,
    results_file,
)
from fedpeft.report.tables import MEAN_COLUMN, GroupTable, markdown_table, result_tables

STATUSES = ("holds", "lost", "reversed", "new", "level")
CHANGED = ("lost", "reversed", "new")
ENV_FILE = "env.json"
COMPARISON_HEADING = "# A rerun against its reference"
"""The first line of what ``fedpeft compare`` writes, by which ``--out`` knows a file it may replace."""


@dataclass(frozen=True)
class Shift:
    """How far the final test records both runs have moved, in metric units (values in [0, 1]).

    Attributes:
        matched: records in both runs (same result key).
        identical: of those, the ones with the same value.
        only_reference, only_rerun: records one run has and the other lacks.
        median, high, largest: the median, 90th percentile and largest ``|rerun - reference|`` over the matched
            records (0 when none is matched).
        largest_key: the result key of the largest difference (``None`` when every value is identical).
        cell_median, cell_largest: the same over the tables' ``Mean`` cells (mean over the pool's clients and the
            seeds), where both runs have the cell.
        seed_sd: the median over those cells of the reference's SD over seeds (``None`` with one seed): the spread
            that a cell's shift is to be read against.
    """

    matched: int
    identical: int
    only_reference: int
    only_rerun: int
    median: float
    high: float
    largest: float
    largest_key: tuple[JSONValue, ...] | None
    cell_median: float
    cell_largest: float
    seed_sd: float | None


@dataclass(frozen=True)
class PairVerdict:
    """One paired difference ``method - other`` of a table's column (a per-group table's ``Mean``, or a column of
    the continual table), in both runs.

    ``method`` is the row with the higher reference mean, so a reference difference reads as a gain."""

    heading: str
    method: str
    other: str
    reference: Interval
    rerun: Interval
    status: str

    @property
    def margin(self) -> float:
        """How far the reference's difference lies from 0 in half-widths of its interval: above 1 it is supported
        (``inf`` for an interval without spread)."""
        assert self.reference.low is not None and self.reference.high is not None  # only tested pairs are verdicts
        half = (self.reference.high - self.reference.low) / 2
        return abs(self.reference.mean) / half if half > 0 else math.inf


@dataclass(frozen=True)
class TopMethod:
    """The best non-base row of a table by its ``Mean`` cell in each run; ``supported``: whether the reference
    prints it bold (its interval against the runner-up above 0)."""

    heading: str
    reference: str | None
    rerun: str | None
    supported: bool


@dataclass(frozen=True)
class Reproduction:
    """What :func:`compare_results` found."""

    shift: Shift
    verdicts: list[PairVerdict]
    tops: list[TopMethod]
    untested: int

    def count(self, status: str) -> int:
        """The pairs of one status (one of :data:`STATUSES`)."""
        return sum(1 for verdict in self.verdicts if verdict.status == status)


def _sign(interval: Interval) -> int:
    if interval.above_zero:
        return 1
    return -1 if interval.excludes_zero else 0


def status_of(reference: Interval, rerun: Interval) -> str:
    """The :data:`STATUSES` entry of a difference with these intervals in the reference and in the rerun."""
    before, after = _sign(reference), _sign(rerun)
    if before and after:
        return "holds" if before == after else "reversed"
    if before:
        return "lost"
    return "new" if after else "level"


def _percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted ``values`` (0 when empty)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(fraction * len(values)) - 1))]


def _test_values(records: Sequence[Record]) -> dict[tuple[JSONValue, ...], float]:
    return {tuple(r.get(k) for k in RESULT_KEY): float(r["value"]) for r in records if is_test(r)}


def record_shift(
    reference: Sequence[Record], rerun: Sequence[Record], tables: Sequence[tuple[GroupTable, GroupTable]] | None = None
) -> Shift:
    """The :class:`Shift` between two runs' final test records (tables' cells included); ``tables``: their
    :func:`paired_tables`, when the caller has them already."""
    before, after = _test_values(reference), _test_values(rerun)
    common = [key for key in before if key in after]
    differences = sorted(abs(after[key] - before[key]) for key in common)
    largest_key = max(common, key=lambda key: abs(after[key] - before[key]), default=None)
    if largest_key is not None and after[largest_key] == before[largest_key]:
        largest_key = None
    cell_shifts, seed_sds = [], []
    for table, other in paired_tables(reference, rerun) if tables is None else tables:
        for method in table.methods:
            cell, moved = table.cells.get((method, MEAN_COLUMN)), other.cells.get((method, MEAN_COLUMN))
            if cell is not None and moved is not None:
                cell_shifts.append(abs(moved.mean - cell.mean))
                if cell.sd is not None:
                    seed_sds.append(cell.sd)
    return Shift(
        matched=len(common),
        identical=sum(1 for key in common if after[key] == before[key]),
        only_reference=len(before) - len(common),
        only_rerun=len(after) - len(common),
        median=statistics.median(differences) if differences else 0.0,
        high=_percentile(differences, 0.9),
        largest=differences[-1] if differences else 0.0,
        largest_key=largest_key,
        cell_median=statistics.median(cell_shifts) if cell_shifts else 0.0,
        cell_largest=max(cell_shifts, default=0.0),
        seed_sd=statistics.median(seed_sds) if seed_sds else None,
    )


def paired_tables(reference: Sequence[Record], rerun: Sequence[Record]) -> list[tuple[GroupTable, GroupTable]]:
    """The per-group tables of the reference (in the summary's order), each with the rerun's table of the same
    pool, metric and budget; tables one run lacks are left out."""
    return _paired([found.table for found in result_tables(reference)], [t.table for t in result_tables(rerun)])


def _paired(reference: Sequence[GroupTable], rerun: Sequence[GroupTable]) -> list[tuple[GroupTable, GroupTable]]:
    def key(table: GroupTable) -> tuple[str, str, Budget]:
        return table.pool, table.metric, table.budget

    found = {key(table): table for table in rerun}
    return [(table, found[key(table)]) for table in reference if key(table) in found]


def _tested(interval: Interval) -> bool:
    return interval.low is not None and interval.high is not None


def _negated(interval: Interval) -> Interval:
    """The interval of ``other - method`` from that of ``method - other``."""
    low, high = interval.low, interval.high
    return Interval(
        -interval.mean, None if high is None else -high, None if low is None else -low, interval.clients, interval.pairs
    )


def _verdict(heading: str, method: str, other: str, reference: Interval, rerun: Interval) -> PairVerdict:
    return PairVerdict(heading, method, other, reference, rerun, status_of(reference, rerun))


@dataclass(frozen=True)
class RowSet:
    """The rows of one table that a comparison pairs: ``row -> (client, seed) -> value``, with the rows of the
    highest printed mean (``best``, base left out) and whether the table prints that best bold (``supported``).

    ``sources`` names the records behind each row: a row without a budget appears in the table of every budget,
    and a pair of such rows is compared once."""

    heading: str
    values: Mapping[str, Mapping[PairKey, float]]
    best: tuple[str, ...]
    supported: bool
    sources: Mapping[str, Hashable]


def group_row_sets(tables: Sequence[GroupTable]) -> dict[str, RowSet]:
    """A :class:`RowSet` per per-group table (its ``Mean`` column), by heading, in the given order."""
    found = {}
    for table in tables:
        best = tuple(sorted(table.best.get(MEAN_COLUMN, set())))
        sources = {m: (table.pool, table.metric, m, table.row_budgets[m]) for m in table.methods}
        found[table_heading(table)] = RowSet(
            table_heading(table), table.values, best, bool(table.bold.get(MEAN_COLUMN)), sources
        )
    return found


def continual_row_sets(round_records: Sequence[Record]) -> dict[str, RowSet]:
    """A :class:`RowSet` per column of each continual personalization table (Self / Others x A_last / A_AUC), the
    rows and values its intervals pair (:mod:`.continual`); empty without evaluations during training."""
    found = {}
    for metric in metric_order(round_records):
        cells = continual_cells(round_records, metric)
        values = continual_client_values(round_records, metric)
        methods = [m for m in method_order(round_records) if any(key[0] == m for key in cells)]
        differences = continual_differences(cells, values, methods)
        for split, name in CONTINUAL_SPLITS.items():
            for stat in ("last", "auc"):
                present = [m for m in methods if (m, split, stat) in cells]
                if not present:
                    continue
                best = column_best(cells, present, split, stat)
                against = differences.get((best[0], split, stat))
                heading = f"Continual, {name} A_{stat.replace('auc', 'AUC')} — {metric_label(metric)}"
                found[heading] = RowSet(
                    heading,
                    {m: values[m, split, stat] for m in present},
                    best,
                    len(best) == 1 and against is not None and against[1].above_zero,
                    {m: (metric, split, stat, m) for m in present},
                )
    return found


def compare_row_sets(
    reference: RowSet, rerun: RowSet, seen: set[frozenset[Hashable]] | None = None
) -> tuple[list[PairVerdict], int]:
    """The :class:`PairVerdict` of every pair of rows both have (the reference's higher row first), and how many
    pairs had no interval in one of the runs; pairs of records already in ``seen`` are skipped (and new ones added
    to it)."""
    verdicts, untested = [], 0
    seen = set() if seen is None else seen
    rows = [row for row in reference.values if row in rerun.values]
    for i, first in enumerate(rows):
        for second in rows[i + 1 :]:
            pair = frozenset((reference.sources[first], reference.sources[second]))
            if pair in seen:
                continue
            seen.add(pair)
            before = paired_interval(reference.values[first], reference.values[second])
            after = paired_interval(rerun.values[first], rerun.values[second])
            if before is None or after is None or not (_tested(before) and _tested(after)):
                untested += 1
            elif before.mean < 0:
                verdicts.append(_verdict(reference.heading, second, first, _negated(before), _negated(after)))
            else:
                verdicts.append(_verdict(reference.heading, first, second, before, after))
    return verdicts, untested


def compare_results(
    reference: Sequence[Record],
    rerun: Sequence[Record],
    reference_rounds: Sequence[Record] = (),
    rerun_rounds: Sequence[Record] = (),
) -> Reproduction:
    """Every paired difference between two rows of each table both runs have, in both runs, with its
    :data:`STATUSES` entry; the best row of each table in both; the :class:`Shift` of their records.

    Args:
        reference, rerun: each run's final records (:func:`~fedpeft.report.records.final_results`): the per-group
            tables.
        reference_rounds, rerun_rounds: each run's records with a round
            (:func:`~fedpeft.report.continual.round_records`): the continual personalization tables, where the
            runs evaluated during training.
    """
    reference_tables = [found.table for found in result_tables(reference)]
    rerun_tables = [found.table for found in result_tables(rerun)]
    before = {**group_row_sets(reference_tables), **continual_row_sets(reference_rounds)}
    after = {**group_row_sets(rerun_tables), **continual_row_sets(rerun_rounds)}
    verdicts: list[PairVerdict] = []
    tops: list[TopMethod] = []
    untested = 0
    seen: set[frozenset[Hashable]] = set()
    for heading, rows in before.items():
        if heading not in after:
            continue
        found, missing = compare_row_sets(rows, after[heading], seen)
        verdicts += found
        untested += missing
        tops.append(
            TopMethod(heading, ", ".join(rows.best) or None, ", ".join(after[heading].best) or None, rows.supported)
        )
    shift = record_shift(reference, rerun, _paired(reference_tables, rerun_tables))
    return Reproduction(shift, verdicts, tops, untested)


# ----------------------------------------------------------------------------------------------------------
# Markdown


def _environment(source: Path) -> JSONObject:
    """A run directory's ``env.json`` (or the one beside a results file); empty when there is none or it does not
    parse."""
    folder = source if source.is_dir() else source.parent
    try:
        found = json.loads((folder / ENV_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _mapping(env: JSONMapping, name: str) -> JSONObject:
    found = env.get(name)
    return found if isinstance(found, dict) else {}


def _machine(env: JSONMapping) -> str:
    cpu = _mapping(env, "cpu")
    parts = [env.get("accelerator") or env.get("device"), cpu.get("model"), cpu.get("kernels")]
    if cpu.get("cores"):
        parts.append(f"{cpu['cores']} cores")
    return ", ".join(str(p) for p in parts if p) or "—"


def _versions(env: JSONMapping) -> str:
    versions = _mapping(env, "versions")
    found = [f"{name} {versions[name]}" for name in ("torch", "transformers", "peft") if versions.get(name)]
    return ", ".join(found) or "—"


def kernels_note(reference: Path, rerun: Path) -> str:
    """One line when the two runs' ``env.json`` name different CPU vector kernels (``cpu.kernels``: ``AVX512``,
    ``AVX2``, ...), saying what that means for the comparison; ``""`` when they agree or either is unknown."""
    kernels = [_mapping(_environment(source), "cpu").get("kernels") for source in (reference, rerun)]
    if not all(kernels) or kernels[0] == kernels[1]:
        return ""
    return (
        f"**Other vector kernels:** the reference ran on {kernels[0]} kernels, the rerun on {kernels[1]}. Records "
        "computed with other kernels are not expected to be identical, so the comparison is of the intervals (the "
        "differences below), not of the digits."
    )


def _sources_table(reference: Path, rerun: Path) -> str:
    envs = [_environment(reference), _environment(rerun)]
    rows = [["records", f"`{reference}`", f"`{rerun}`"]]
    if any(envs):
        rows += [
            ["commit", *(str(env.get("git_commit") or "—") for env in envs)],
            ["machine", *(_machine(env) for env in envs)],
            ["libraries", *(_versions(env) for env in envs)],
            ["started (UTC)", *(str(env.get("started_utc") or "—") for env in envs)],
        ]
    return markdown_table(["", "reference", "rerun"], rows)


def _x100(value: float) -> str:
    return f"{value * 100:.2f}"


def _key_text(key: tuple[JSONValue, ...]) -> str:
    named = dict(zip(RESULT_KEY, key, strict=True))
    parts = [
        f"{name} {named[name]}" for name in ("method", "budget", "pool", "client", "seed") if named[name] is not None
    ]
    return f"{', '.join(parts)}, {named['metric']}"


def render_shift(shift: Shift) -> str:
    """The records paragraph of :func:`render_reproduction`."""
    text = (
        f"{shift.matched} final test records in both runs ({shift.only_reference} only in the reference, "
        f"{shift.only_rerun} only in the rerun), {shift.identical} of them identical."
    )
    if shift.identical < shift.matched:
        text += (
            f" |rerun − reference| x100 over the {shift.matched}: median {_x100(shift.median)}, 90th percentile "
            f"{_x100(shift.high)}, largest {_x100(shift.largest)}"
        )
        text += f" ({_key_text(shift.largest_key)})." if shift.largest_key is not None else "."
        text += (
            " The tables' `Mean` cells (mean over the pool's clients and the seeds) moved by "
            f"{_x100(shift.cell_median)} (median) and {_x100(shift.cell_largest)} at most"
        )
        if shift.seed_sd is not None:
            text += f", against a median SD over seeds of {_x100(shift.seed_sd)} in the reference"
        text += "."
    return text


def margin_sentence(verdicts: Sequence[PairVerdict], wide: float = 2.0) -> str:
    """Where the supported differences that did not hold lay in the reference: the largest :attr:`PairVerdict.margin`
    among them, and how many of the differences at least ``wide`` half-widths from 0 held; ``""`` when none was
    supported."""
    supported = [v for v in verdicts if v.status in ("holds", "lost", "reversed")]
    if not supported:
        return ""
    failed = [v.margin for v in supported if v.status != "holds"]
    text = ""
    if failed:
        text = (
            f" The lost and reversed ones lay at most {max(failed):.2f} half-widths of their interval from 0 in the "
            "reference (1: the edge of support)."
        )
    clear = [v for v in supported if v.margin >= wide]
    if clear:
        held = sum(1 for v in clear if v.status == "holds")
        text += f" Of the {len(clear)} at least {wide:g} half-widths from 0, {held} held."
    return text


def render_reproduction(found: Reproduction, reference: Path, rerun: Path, *, every_pair: bool = False) -> str:
    """The markdown ``fedpeft compare`` prints: both runs' sources, the records' shift, the supported differences
    that hold, are lost, reversed or new, and each table's best row in both runs."""
    supported = sum(found.count(s) for s in ("holds", "lost", "reversed"))
    lines = [
        COMPARISON_HEADING,
        _sources_table(reference, rerun),
        *filter(None, [kernels_note(reference, rerun)]),
        "## Records",
        render_shift(found.shift),
        f"## Differences with {CONFIDENCE * 100:.0f} % intervals",
        (
            f"Every paired difference between two rows of a table, `Mean` column (x100, the higher row of the "
            f"reference first; {CONFIDENCE * 100:.0f} % t intervals over the pool's clients, as summary.md computes "
            f"them): {len(found.verdicts)} pairs, {supported} supported in the reference. **{found.count('holds')} "
            f"of the {supported} hold** (supported in the rerun with the same sign), {found.count('lost')} are lost "
            f"(not supported in the rerun), {found.count('reversed')} reversed; {found.count('new')} are supported in "
            f"the rerun only; {found.count('level')} are supported in neither."
        ),
    ]
    if found.untested:
        lines[-1] += f" {found.untested} pairs have no interval in one of the runs (one client, or a missing row)."
    lines[-1] += margin_sentence(found.verdicts)
    shown = found.verdicts if every_pair else [v for v in found.verdicts if v.status in CHANGED]
    if shown:
        lines += [
            "### Every pair" if every_pair else "### Changed",
            markdown_table(
                ["table", "difference", "reference", "rerun", "status"],
                [
                    [
                        v.heading,
                        f"{v.method} − {v.other}",
                        format_interval(v.reference),
                        format_interval(v.rerun),
                        v.status,
                    ]
                    for v in sorted(shown, key=lambda v: STATUSES.index(v.status))
                ],
            ),
        ]
    same = sum(1 for top in found.tops if top.reference == top.rerun)
    lines += [
        "## Best row of each table",
        f"The same in {same} of {len(found.tops)} tables (bold: supported against the runner-up in the reference).",
        markdown_table(
            ["table", "reference", "rerun"],
            [
                [top.heading, f"**{top.reference}**" if top.supported else str(top.reference or "—"), top.rerun or "—"]
                for top in found.tops
            ],
        ),
    ]
    return "\n\n".join(lines) + "\n"


def compare_runs(reference: Path, rerun: Path, *, every_pair: bool = False) -> str:
    """Read two runs (run directories or results files) and return :func:`render_reproduction`'s markdown.

    Raises:
        UserError: a source that is neither, or two runs without a test record in common.
    """
    for source in (reference, rerun):
        if rehearsal_of(source) is not None:
            raise UserError(f"{source} is a rehearsal, whose numbers are not results; compare two real runs.")
    before, after = (read_results(results_file(source)) for source in (reference, rerun))
    found = compare_results(final_results(before), final_results(after), round_records(before), round_records(after))
    if found.shift.matched == 0:
        raise UserError(
            f"{reference} and {rerun} share no test record (method, pool, client, seed and metric); compare two "
            "runs of one config."
        )
    return render_reproduction(found, reference, rerun, every_pair=every_pair)
