"""Continual personalization: per-round evaluations of each client's model, Self / Others x A_last / A_AUC."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fedpeft.core.jsontypes import JSONValue
from fedpeft.report.evidence import MIN_SEEDS
from fedpeft.report.intervals import Interval, PairKey, format_interval, paired_interval
from fedpeft.report.records import (
    RESULT_KEY,
    RESULTS_FILE,
    Record,
    method_order,
    metric_label,
    metric_order,
    read_results,
)
from fedpeft.report.tables import Cell, display_key, format_cell, markdown_table, over_seeds

CONTINUAL_SPLITS = {"test": "Self", "others": "Others"}


def read_round_records(run_dirs: Sequence[Path]) -> list[Record]:
    """Every evaluation record that has a round, one per (key, round): the per-round curve of each client.

    Within a directory the later line wins on an equal (key, round); across directories the later directory
    replaces every round of a (method, seed) it has.
    """
    merged: dict[tuple, Record] = {}
    for run_dir in map(Path, run_dirs):
        path = run_dir / RESULTS_FILE
        if not path.is_file():
            continue
        rows = round_records(read_results(path))
        replaced = {(r["method"], r["seed"]) for r in rows}
        merged = {k: v for k, v in merged.items() if (v["method"], v["seed"]) not in replaced}
        merged.update((_round_key(record), record) for record in rows)
    return list(merged.values())


def _round_key(record: Record) -> tuple[JSONValue, ...]:
    return tuple(record.get(name) for name in RESULT_KEY) + (record["round"],)


def round_records(rows: Iterable[Record]) -> list[Record]:
    """The evaluation records of one results file that have a round, one per (key, round): the later line wins."""
    found = {_round_key(r): r for r in rows if r.get("round") is not None and r.get("value") is not None}
    return list(found.values())


def continual_cells(records: Sequence[Record], metric: str = "accuracy") -> dict[tuple[str, str, str], Cell]:
    """``(method, split, "last" | "auc") -> Cell`` of the methods evaluated during training (``others`` split).

    Per seed and split: the mean over clients at each evaluated round gives a curve; A_last is its value at
    the last round, A_AUC its mean over the evaluation points (area under the curve per round evaluated).
    Then mean +- SD over seeds.
    """
    chosen = [r for r in records if r["metric"] == metric and r.get("split") in CONTINUAL_SPLITS]
    evaluated = {r["method"] for r in chosen if r["split"] == "others"}
    curves: dict[tuple[str, str, int], dict[int, list[float]]] = {}
    for record in chosen:
        if record["method"] in evaluated:
            key = (record["method"], record["split"], record["seed"])
            curves.setdefault(key, {}).setdefault(int(record["round"]), []).append(float(record["value"]))
    per_seed: dict[tuple[str, str, str], list[float]] = {}
    for (method, split, _), by_round in curves.items():
        means = {r: statistics.fmean(v) for r, v in sorted(by_round.items())}
        per_seed.setdefault((method, split, "last"), []).append(means[max(means)])
        per_seed.setdefault((method, split, "auc"), []).append(statistics.fmean(means.values()))
    return {key: over_seeds(values) for key, values in per_seed.items()}


def continual_client_values(
    records: Sequence[Record], metric: str = "accuracy"
) -> dict[tuple[str, str, str], dict[PairKey, float]]:
    """``(method, split, "last" | "auc") -> (client, seed) -> value``: each client's A_last (its value at the last
    round it was evaluated) and A_AUC (its mean over the rounds it was evaluated), the values the paired intervals
    compare (the methods evaluated during training, as :func:`continual_cells`)."""
    chosen = [r for r in records if r["metric"] == metric and r.get("split") in CONTINUAL_SPLITS]
    evaluated = {r["method"] for r in chosen if r["split"] == "others"}
    curves: dict[tuple[str, str, str, int], dict[int, float]] = {}
    for record in chosen:
        if record["method"] in evaluated:
            key = (record["method"], record["split"], record["client"], record["seed"])
            curves.setdefault(key, {})[int(record["round"])] = float(record["value"])
    values: dict[tuple[str, str, str], dict[PairKey, float]] = {}
    for (method, split, client, seed), by_round in curves.items():
        values.setdefault((method, split, "last"), {})[client, seed] = by_round[max(by_round)]
        values.setdefault((method, split, "auc"), {})[client, seed] = statistics.fmean(by_round.values())
    return values


def continual_differences(
    cells: Mapping[tuple[str, str, str], Cell],
    values: Mapping[tuple[str, str, str], Mapping[PairKey, float]],
    methods: Sequence[str],
) -> dict[tuple[str, str, str], tuple[str, Interval]]:
    """``(method, split, stat) -> (best other method, interval of method - it)``: in each column, each method
    against the other method with the best printed value (paired on client and seed, clients as the unit)."""
    differences = {}
    for split in CONTINUAL_SPLITS:
        for stat in ("last", "auc"):
            present = [m for m in methods if (m, split, stat) in cells]
            for method in present:
                others = [m for m in present if m != method]
                if not others:
                    continue
                top = max(display_key(cells[m, split, stat]) for m in others)
                reference = next(m for m in others if display_key(cells[m, split, stat]) == top)
                interval = paired_interval(values[method, split, stat], values[reference, split, stat])
                if interval is not None:
                    differences[method, split, stat] = (reference, interval)
    return differences


def column_best(
    cells: Mapping[tuple[str, str, str], Cell], methods: Sequence[str], split: str, stat: str
) -> tuple[str, ...]:
    """The methods of one column (``split``, ``stat``) with its highest printed value, in ``methods`` order (more
    than one on a tie, which marks no best value)."""
    present = [m for m in methods if (m, split, stat) in cells]
    if not present:
        return ()
    top = max(display_key(cells[m, split, stat]) for m in present)
    return tuple(m for m in present if display_key(cells[m, split, stat]) == top)


def render_continual_table(
    cells: Mapping[tuple[str, str, str], Cell],
    methods: Sequence[str],
    *,
    emphasis: bool = True,
    differences: Mapping[tuple[str, str, str], tuple[str, Interval]] | None = None,
) -> str:
    """Markdown: one row per method, Self / Others x A_last / A_AUC (x100). The best value of a column is bold
    where its method's interval against the runner-up (``differences``) lies above 0 (none with
    ``emphasis=False``: on one seed; none without ``differences``)."""
    columns = [(split, stat) for split in CONTINUAL_SPLITS for stat in ("last", "auc")]
    rows = []
    for method in methods:
        row = [method]
        for split, stat in columns:
            cell = cells.get((method, split, stat))
            text = format_cell(cell)
            best = cell is not None and column_best(cells, methods, split, stat) == (method,)
            against = (differences or {}).get((method, split, stat))
            supported = against is not None and against[1].above_zero
            row.append(f"**{text}**" if emphasis and best and supported else text)
        rows.append(row)
    return markdown_table(["Method", *_headers(columns)], rows)


def render_continual_differences(
    differences: Mapping[tuple[str, str, str], tuple[str, Interval]], methods: Sequence[str]
) -> str:
    """Markdown: per method and column, its difference from the column's best other method, x100, with the 95 %
    interval and that method's name."""
    columns = [(split, stat) for split in CONTINUAL_SPLITS for stat in ("last", "auc")]
    rows = []
    for method in methods:
        row = [method]
        for split, stat in columns:
            against = differences.get((method, split, stat))
            row.append("—" if against is None else f"{format_interval(against[1])} vs {against[0]}")
        rows.append(row)
    return markdown_table(["Method", *(f"{h} − best other [95 % CI]" for h in _headers(columns))], rows)


def _headers(columns: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{CONTINUAL_SPLITS[split]} A_{stat.replace('auc', 'AUC')}" for split, stat in columns]


def continual_sections(records: Sequence[Record]) -> list[str]:
    """The summary section of per-round evaluations (empty when no method was evaluated during training)."""
    sections = []
    one_seed = False
    for metric in metric_order(records):
        cells = continual_cells(records, metric)
        if not cells:
            continue
        methods = [m for m in method_order(records) if any(key[0] == m for key in cells)]
        emphasis = min(cell.seeds for cell in cells.values()) >= MIN_SEEDS
        one_seed |= not emphasis
        differences = continual_differences(cells, continual_client_values(records, metric), methods)
        table = render_continual_table(cells, methods, emphasis=emphasis, differences=differences)
        sections += [f"### {metric_label(metric)}", table]
        if differences:
            sections.append(render_continual_differences(differences, methods))
    if not sections:
        return []
    intro = (
        "Each client's model evaluated during federated training (`eval.every`): Self = on its own test data of "
        "the tasks seen so far, Others = on the other clients' test data. A_last = at the last round, A_AUC = "
        "mean over the evaluation rounds; x100, mean ± sample SD over seeds of the mean over clients. Below each "
        "table: each method minus the column's best other method, the mean over clients of each client's mean "
        "difference over seeds with its 95 % t interval over the clients; a column's best value is bold only where "
        "that interval lies above 0."
    )
    if one_seed:
        intro += " On one seed no value is bold: differences between methods may be noise."
    return ["## Continual personalization", intro, *sections]
