"""A run's outputs once its units are done: ``results.jsonl`` and ``costs.jsonl`` merged from ``parts/`` in the
order of the units, ``data.json``, the summary and the plots; and the check that enough clients have final
results for the run to count as complete."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fedpeft.core.errors import MissingResultsError
from fedpeft.core.io import write_text_atomic
from fedpeft.core.records import ResultRecord
from fedpeft.data.types import FederatedData
from fedpeft.rundir import DATA_FILE
from fedpeft.runner.started import StartedRun


def write_outputs(run: StartedRun, parts: list[str]) -> list[ResultRecord]:
    """Merge the ``parts`` (unit names, in order) into ``results.jsonl`` and ``costs.jsonl``, then write the data
    overview, the summary and the plots; returns the run's records."""
    records, costs = [], []
    for name in parts:
        unit_records, unit_costs = run.directory.read_part(name)
        records += unit_records
        costs += unit_costs
    write_text_atomic(run.out / "results.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    write_text_atomic(run.out / "costs.jsonl", "".join(json.dumps(c) + "\n" for c in costs))
    # The data overview, kept in the run so that `fedpeft report` prints the same Data section.
    write_text_atomic(run.out / DATA_FILE, json.dumps(data_overview(run.data), indent=2, default=str) + "\n")
    from fedpeft import report

    run.progress.stage("summary and plots")
    report.write_summary([run.out], run.out / "summary.md", title=run.cfg.name)
    if run.cfg.output.plots:
        report.write_plots([run.out], run.out / "plots", formats=run.cfg.output.plot_formats)
    return records


def check_result_coverage(
    records: list[ResultRecord],
    clients: list[str],
    min_fraction: float,
    summary: Path,
    *,
    evaluates: Mapping[str, Collection[str]] | None = None,
) -> None:
    """Raise :class:`MissingResultsError` when, for some method, seed and rank budget with results (the tiers of a
    tiered method together), fewer than ``min_fraction`` of the clients it evaluates have a final test record;
    names how many and where the failures are listed (``summary``).

    Args:
        clients: the clients with test data, which a method evaluates unless ``evaluates`` says otherwise.
        evaluates: method label -> the clients it evaluates (e.g. a tiered method's ``eval_tiers``' clients).
    """
    if not clients:
        return
    have: dict[tuple[str, int, Any], set[str]] = {}
    for record in records:
        if record["split"] == "test" and record["client"] is not None:
            # A rank budget evaluates every client; a tier (a named budget) only its own clients: pooled.
            budget = record["budget"] if isinstance(record["budget"], int) else None
            have.setdefault((record["method"], record["seed"], budget), set()).add(record["client"])
    short = []
    for (method, seed, budget), present in have.items():
        expected = set(clients if evaluates is None else evaluates.get(method, clients))
        if len(present & expected) < min_fraction * len(expected):
            at = f", budget {budget}" if budget is not None else ""
            short.append(f"{len(expected - present)} of {len(expected)} clients for {method} (seed {seed}{at})")
    if short:
        more = f" and {len(short) - 1} more" if len(short) > 1 else ""
        raise MissingResultsError(
            f"the run completed without final results of {short[0]}{more}, fewer than validation.min_result_fraction="
            f"{min_fraction:g} asks; the failures are listed under Failed clients in {summary}."
        )


def data_overview(data: FederatedData) -> dict[str, Any]:
    """The data facts a summary states (the run's ``data.json``): the dataset, task and class names, the dataset's
    scalar facts; ``groups``: one row per group (clients and samples per pool, and every per-group fact the dataset
    reports, such as resource level or script); then the dataset's other tables (e.g. the generator's edit mix).
    Keys read as words (``resource level``, not ``resource_level``)."""
    per_group: dict[str, dict[str, Any]] = {g: {} for g in data.groups}
    for pool in ("seen", "unseen"):
        for group in data.groups:
            clients = [c for c in data.pool(pool) if c.group == group]
            row = per_group[group]
            row[f"{pool} clients"] = len(clients)
            if clients:
                row[f"{pool} train/client"] = round(sum(len(c.train) for c in clients) / len(clients), 1)
                row[f"{pool} test/client"] = round(sum(len(c.test) for c in clients) / len(clients), 1)
    overview: dict[str, Any] = {"dataset": data.name, "task": data.task}
    if data.label_names:
        overview["labels"] = list(data.label_names)
    tables: dict[str, Any] = {}
    for key, value in data.info.items():
        name = key.replace("_", " ")
        if isinstance(value, dict) and value and set(value) <= set(data.groups):
            if all(not isinstance(v, dict) for v in value.values()):
                for group, fact in value.items():
                    per_group[group][name] = fact
                continue
        if isinstance(value, dict):
            if value:
                tables[name] = value
        else:
            overview[name] = value
    return {**overview, "groups": per_group, **tables}
