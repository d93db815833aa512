"""Continual personalization: per-round evaluations of each client's model, Self / Others x A_last / A_AUC."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedpeft.report.evidence import MIN_SEEDS
from fedpeft.report.records import (
    RESULT_KEY,
    RESULTS_FILE,
    Record,
    method_order,
    metric_label,
    metric_order,
    read_jsonl,
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
        rows = [r for r in read_jsonl(path) if r.get("round") is not None and r.get("value") is not None]
        replaced = {(r["method"], r["seed"]) for r in rows}
        merged = {k: v for k, v in merged.items() if (v["method"], v["seed"]) not in replaced}
        for record in rows:
            key = tuple(record.get(name) for name in RESULT_KEY) + (record["round"],)
            merged[key] = record
    return list(merged.values())


def continual_cells(records: Sequence[Record], metric: str = "accuracy") -> dict[tuple[str, str, str], Cell]:
    """``(method, split, "last" | "auc") -> Cell`` of the methods evaluated during training (``others`` split).

    Per seed and split: the mean over clients at each evaluated round gives a curve; A_last is its value at
    the last round, A_AUC its mean over the evaluation points (area under the curve per round evaluated).
    Then mean +- SD over seeds.
    """
    chosen = [r for r in records if r["metric"] == metric and r.get("split") in CONTINUAL_SPLITS]
    evaluated = {r["method"] for r in chosen if r["split"] == "others"}
    curves: dict[tuple[str, str, Any], dict[int, list[float]]] = {}
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


def render_continual_table(
    cells: Mapping[tuple[str, str, str], Cell], methods: Sequence[str], *, emphasis: bool = True
) -> str:
    """Markdown: one row per method, Self / Others x A_last / A_AUC (x100), best value of a column in bold (none
    with ``emphasis=False``: on one seed)."""
    columns = [(split, stat) for split in CONTINUAL_SPLITS for stat in ("last", "auc")]
    best = {
        c: max((display_key(cells[(m, c[0], c[1])]) for m in methods if (m, c[0], c[1]) in cells), default=None)
        for c in columns
    }
    rows = []
    for method in methods:
        row = [method]
        for column in columns:
            cell = cells.get((method, *column))
            text = format_cell(cell)
            is_best = emphasis and cell is not None and display_key(cell) == best[column]
            row.append(f"**{text}**" if is_best else text)
        rows.append(row)
    header = [f"{CONTINUAL_SPLITS[split]} A_{stat.replace('auc', 'AUC')}" for split, stat in columns]
    return markdown_table(["Method", *header], rows)


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
        sections += [f"### {metric_label(metric)}", render_continual_table(cells, methods, emphasis=emphasis)]
    if not sections:
        return []
    intro = (
        "Each client's model evaluated during federated training (`eval.every`): Self = on its own test data of "
        "the tasks seen so far, Others = on the other clients' test data. A_last = at the last round, A_AUC = "
        "mean over the evaluation rounds; x100, mean ± sample SD over seeds of the mean over clients."
    )
    if one_seed:
        intro += " On one seed no value is bold: differences between methods may be noise."
    return ["## Continual personalization", intro, *sections]
