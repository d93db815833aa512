"""The report's differences with 95 % intervals: each method against ``base`` and against the best other method of
its table, paired over clients and seeds (:mod:`.intervals`); the summary's section of them and its headline line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedpeft.report.intervals import CONFIDENCE, Interval, PairKey, format_interval, paired_interval
from fedpeft.report.records import (
    BASE_METHOD,
    Budget,
    Record,
    budget_label,
    is_test,
    metric_label,
    pool_label,
)
from fedpeft.report.tables import MEAN_COLUMN, GroupTable, ResultTable, best_other, format_cell, markdown_table

DIFFERENCES_SECTION = f"Differences with {CONFIDENCE * 100:.0f} % intervals"


@dataclass(frozen=True)
class Comparison:
    """One method of a per-group table against ``base`` and against the best other method of the table, over all
    the pool's clients (the ``Mean`` column); an interval is ``None`` where there is no such row or no pair."""

    method: str
    over_base: Interval | None
    best_other: str | None
    over_best_other: Interval | None


def comparisons(table: GroupTable) -> list[Comparison]:
    """A :class:`Comparison` per non-base row of ``table``, in row order."""
    base = table.values.get(BASE_METHOD)
    found = []
    for method in (m for m in table.methods if m != BASE_METHOD):
        values = table.values[method]
        other = best_other(table, method, MEAN_COLUMN)
        found.append(
            Comparison(
                method,
                None if base is None else paired_interval(values, base),
                other,
                None if other is None else paired_interval(values, table.values[other]),
            )
        )
    return found


def gain_intervals(records: Sequence[Record], *, pool: str, metric: str) -> dict[tuple[str, Budget], Interval]:
    """The interval of each (method, budget)'s gain over ``base`` (:func:`~fedpeft.report.tables.gain_over_base`'s
    cells), paired over the pool's clients and seeds; empty without base records."""
    selected = [r for r in records if r["pool"] == pool and r["metric"] == metric and is_test(r)]
    rows: dict[tuple[str, Budget], dict[PairKey, float]] = {}
    for record in selected:
        rows.setdefault((record["method"], record.get("budget")), {})[record["client"], record["seed"]] = float(
            record["value"]
        )
    base = rows.pop((BASE_METHOD, None), None)
    if base is None:
        return {}
    found = {key: paired_interval(values, base) for key, values in rows.items() if key[0] != BASE_METHOD}
    return {key: interval for key, interval in found.items() if interval is not None}


def _clients(interval: Interval | None) -> str:
    return "—" if interval is None else str(interval.clients)


def render_difference_table(table: GroupTable) -> str:
    """Markdown of :func:`comparisons`: per method its ``Mean``, the difference with ``base`` and with the best
    other method, each with its interval and n (clients), x100; the columns of a comparison the table has no row
    for (no ``base``, a single method) left out."""
    found = comparisons(table)
    with_base = any(c.over_base is not None for c in found)
    with_other = any(c.best_other is not None for c in found)
    header = ["Method", MEAN_COLUMN]
    header += ["− base [95 % CI]", "n"] if with_base else []
    header += ["Best other", "− best other [95 % CI]", "n"] if with_other else []
    rows = []
    for comparison in found:
        row = [comparison.method, format_cell(table.cells.get((comparison.method, MEAN_COLUMN)))]
        if with_base:
            row += [format_interval(comparison.over_base), _clients(comparison.over_base)]
        if with_other:
            row += [comparison.best_other or "—", format_interval(comparison.over_best_other)]
            row.append(_clients(comparison.over_best_other))
        rows.append(row)
    return markdown_table(header, rows)


def table_heading(table: GroupTable) -> str:
    """A table's heading: its pool, budget (where it has one) and metric."""
    where = pool_label(table.pool)
    if table.budget is not None:
        where += f", {budget_label(table.budget)}"
    return f"{where} — {metric_label(table.metric)}"


DIFFERENCES_INTRO = (
    "Per table of the results, each method minus `base` and minus the best other method of the table (the highest "
    "`Mean`; for the best method, the runner-up), x100: the mean over the pool's clients of each client's mean "
    "difference over the seeds both were measured on, and its 95 % t interval over those clients (n clients, "
    "n - 1 degrees of freedom; no interval with one client). An interval that excludes 0 is a difference the "
    "clients support; one that straddles 0 is not. The intervals measure how the difference varies from client to "
    "client; a shift one seed gives every client together is averaged, not measured (the ± SD over seeds shows it)."
)


def difference_sections(tables: Sequence[ResultTable]) -> list[str]:
    """The summary's ``Differences with 95 % intervals`` section: its note, then a table per per-group table that
    has a method besides ``base``; empty when none has."""
    sections = []
    for found in tables:
        if any(method != BASE_METHOD for method in found.table.methods):
            sections += [f"### {table_heading(found.table)}", render_difference_table(found.table)]
    return [f"## {DIFFERENCES_SECTION}", DIFFERENCES_INTRO, *sections] if sections else []


def headline_intervals(tables: Sequence[ResultTable]) -> str:
    """The headline's line of intervals: per budget of the first pool and metric, the method with the highest
    ``Mean`` minus the runner-up and minus ``base``, with their 95 % intervals; ``""`` when there is none."""
    if not tables:
        return ""
    first = tables[0].table
    clauses = []
    for table in (t.table for t in tables if (t.table.pool, t.table.metric) == (first.pool, first.metric)):
        top = next((m for m in table.methods if m in table.best.get(MEAN_COLUMN, set())), None)
        if top is None:
            continue
        found = next(c for c in comparisons(table) if c.method == top)
        parts = [
            f"over {name} {format_interval(interval)} (n = {interval.clients})"
            for name, interval in ((found.best_other, found.over_best_other), (BASE_METHOD, found.over_base))
            if interval is not None
        ]
        if parts:
            clause = f"{top} {', '.join(parts)}"
            clauses.append(clause if table.budget is None else f"{budget_label(table.budget)}: {clause}")
    if not clauses:
        return ""
    return (
        f"**{CONFIDENCE * 100:.0f} % intervals** (x100, paired differences over the pool's clients, n clients; a "
        f"difference is supported where its interval excludes 0): {'; '.join(clauses)}."
    )
