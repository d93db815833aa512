"""Sweeps: one method listed several times with one numeric setting varied, and its metrics plotted against it."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fedpeft.core.figures import save_figure
from fedpeft.report.method_hooks import config_method_entries
from fedpeft.report.records import (
    budget_label,
    budget_order,
    file_part,
    is_test,
    metric_label,
    metric_order,
    read_records,
)
from fedpeft.report.tables import over_seeds

SWEEP_MIN_ENTRIES = 3  # a method listed this many times, one numeric setting varied, is a sweep


def method_sweeps(run_dirs: Sequence[Path]) -> dict[tuple[str, str], dict[str, float]]:
    """Settings swept across entries of one method in the runs' ``config.yaml``.

    A sweep is a method name listed at least three times whose resolved settings (defaults filled in by the
    method's pydantic ``Config``; invalid entries and unknown names are skipped) differ in exactly one numeric
    field, e.g. FLAME at ``temperature`` 0, 1, 2, 4, 8. Returns ``(method name, field) -> {row label: value}``.
    """
    from pydantic import ValidationError

    from fedpeft.core.config import MethodConfig
    from fedpeft.core.registry import METHODS

    listed = [e for e in config_method_entries(run_dirs) if str(e.get("name")) in METHODS]
    # Told from the names alone, and the configs read from fedpeft.settings: no method class (nor torch) imported.
    counts = Counter(METHODS.canonical(str(e["name"])) for e in listed)
    entries: dict[str, list[tuple[str, dict[str, object]]]] = {}
    for entry in (e for e in listed if counts[METHODS.canonical(str(e["name"]))] >= SWEEP_MIN_ENTRIES):
        name = METHODS.canonical(str(entry["name"]))
        config_class = METHODS.config_class(name)  # from fedpeft.settings, without the method (nor torch)
        if not issubclass(config_class, MethodConfig):
            continue
        try:
            # Validated as build_method does (under the canonical name), never instantiated.
            cfg = config_class.model_validate({**entry, "name": name})
        except ValidationError:
            continue
        settings = cfg.model_dump(exclude={"label", "name"})
        entries.setdefault(name, []).append((str(entry.get("label") or entry["name"]), settings))
    sweeps: dict[tuple[str, str], dict[str, float]] = {}
    for name, rows in entries.items():
        if len(rows) < SWEEP_MIN_ENTRIES:
            continue
        varying = [k for k in rows[0][1] if len({json.dumps(s.get(k), sort_keys=True) for _, s in rows}) > 1]
        if len(varying) != 1:
            continue
        key = varying[0]
        values = {label: s[key] for label, s in rows}
        numbers = {label: v for label, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if len(numbers) == len(values):
            sweeps[name, key] = {label: float(v) for label, v in numbers.items()}
    return sweeps


def write_sweep_plots(run_dirs: Sequence[Path], out_dir: Path) -> list[Path]:
    """Per sweep (see :func:`method_sweeps`), ``sweep_<method>_<field>.png``: every metric's mean over the
    pool's clients (mean over seeds, SD error bars) against the swept value, one line per budget."""
    from matplotlib.figure import Figure

    sweeps = method_sweeps(run_dirs)
    if not sweeps:
        return []
    results, _ = read_records([Path(d) for d in run_dirs])
    results = [r for r in results if is_test(r)]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for (name, key), values in sweeps.items():
        rows = [r for r in results if r["method"] in values]
        metrics = metric_order(rows)
        if not rows or not metrics:
            continue
        figure = Figure(figsize=(6.0, 3.2 * len(metrics)))
        for index, metric in enumerate(metrics):
            axes = figure.add_subplot(len(metrics), 1, index + 1)
            for budget in budget_order(rows) or [None]:
                points = []
                for label, x in sorted(values.items(), key=lambda item: item[1]):
                    per_seed: dict[int, list[float]] = {}
                    for r in rows:
                        if r["method"] == label and r["metric"] == metric and r.get("budget") == budget:
                            per_seed.setdefault(r["seed"], []).append(float(r["value"]))
                    if per_seed:
                        points.append((x, over_seeds([statistics.fmean(v) for v in per_seed.values()])))
                if points:
                    axes.errorbar(
                        [x for x, _ in points],
                        [c.mean * 100 for _, c in points],
                        yerr=[(c.sd or 0.0) * 100 for _, c in points],
                        marker="o",
                        capsize=3,
                        label=budget_label(budget),
                    )
            axes.set_xlabel(key)
            axes.set_ylabel(f"{metric_label(metric)} x100")
            axes.set_title(f"{name}: {metric_label(metric)} vs {key}")
            axes.legend(fontsize="small")
        figure.tight_layout()
        written += save_figure(figure, Path(out_dir) / f"sweep_{file_part(name)}_{file_part(key)}.png")
    return written
