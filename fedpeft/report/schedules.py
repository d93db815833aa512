"""Methods on the virtual clock (docs/async.md): each method's metric against virtual time, and its time to a target.

A run whose clients have speeds (``clients.speed``) or that has a method with an asynchronous ``schedule`` records,
for every server step (a round of a synchronous method), the ``virtual_time`` of the clock after it (split
``train``). With evaluations during training (``eval.every``), each evaluated round gives a point of a curve: per
seed, the mean over the pool's clients of the metric at that round, at the round's virtual time. The section
compares the methods by their final value and by the virtual time at which their curve first reaches a target:
the lowest final value among them (mean over seeds), which every method reaches by its end.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from fedpeft.report.records import Record, first_seen, metric_label, metric_order
from fedpeft.report.tables import markdown_table

VIRTUAL_TIME = "virtual_time"
"""The metric (split ``train``) holding the virtual clock after each server step."""

Curve = dict[int, tuple[float, float]]
"""round -> (virtual time, mean metric over the pool's clients) of one method and seed."""


def seed_curves(round_records: Sequence[Record], metric: str, pool: str = "seen") -> dict[tuple[str, int], Curve]:
    """``(method, seed) -> curve`` of the methods that kept the virtual clock and were evaluated during training
    (rounds with both a virtual time and test records of ``metric`` in ``pool``)."""
    times: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    values: dict[tuple[str, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in round_records:
        key, round_ = (record["method"], record["seed"]), int(record["round"])
        if record.get("split") == "train" and record["metric"] == VIRTUAL_TIME:
            times[key][round_] = float(record["value"])
        elif record.get("split") == "test" and record["metric"] == metric and record.get("pool") == pool:
            values[key][round_].append(float(record["value"]))
    curves: dict[tuple[str, int], Curve] = {}
    for key, by_round in values.items():
        clock = times.get(key, {})
        points = {r: (clock[r], statistics.fmean(v)) for r, v in sorted(by_round.items()) if r in clock}
        if points:
            curves[key] = points
    return curves


def _mean_sd(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def schedule_table(round_records: Sequence[Record], metric: str, pool: str = "seen") -> tuple[str, float] | None:
    """The markdown table of each method's final ``metric`` (x100), its virtual time at the end and its time to the
    target, with the target (x100); ``None`` when no method kept the virtual clock and was evaluated during
    training."""
    curves = seed_curves(round_records, metric, pool)
    if not curves:
        return None
    methods = first_seen(method for method, _ in curves)
    finals = {m: [c[max(c)][1] for (method, _), c in curves.items() if method == m] for m in methods}
    target = min(statistics.fmean(v) for v in finals.values())
    rows = []
    for method in methods:
        mine = [c for (m, _), c in curves.items() if m == method]
        reached = [next((t for _, (t, v) in sorted(c.items()) if v >= target - 1e-12), None) for c in mine]
        done = [t for t in reached if t is not None]
        to_target = (
            _mean_sd(done) if len(done) == len(reached) else f"not reached in {len(reached) - len(done)} seed(s)"
        )
        rows.append(
            [
                method,
                _mean_sd([100 * v for v in finals[method]]),
                _mean_sd([c[max(c)][0] for c in mine]),
                to_target,
            ]
        )
    header = ["Method", f"final {metric_label(metric)}", "virtual time at the end", "virtual time to the target"]
    return markdown_table(header, rows), target


def clock_metrics(round_records: Sequence[Record], pool: str = "seen") -> list[str]:
    """The metrics evaluated during training in ``pool`` of methods that kept the virtual clock, in report order."""
    clocked = {(r["method"], r["seed"]) for r in round_records if r["metric"] == VIRTUAL_TIME}
    return metric_order(
        r
        for r in round_records
        if r.get("split") == "test" and r.get("pool") == pool and (r["method"], r["seed"]) in clocked
    )


def schedule_sections(round_records: Sequence[Record], pool: str = "seen") -> list[str]:
    """summary.md's section on the virtual clock, one table per metric evaluated during training, or nothing when
    no method kept the clock and was evaluated during training (module docstring)."""
    parts: list[str] = []
    for metric in clock_metrics(round_records, pool):
        found = schedule_table(round_records, metric, pool)
        if found is None:
            continue
        table, target = found
        parts += [f"### {metric_label(metric)}: target {100 * target:.2f}", table]
    if not parts:
        return []
    intro = (
        f"Methods on the virtual clock (docs/async.md), {pool} pool, per metric: the final value (x100, the mean over "
        "clients at the last evaluated round, mean ± SD over seeds), the virtual time of the last server step, and "
        "the virtual time at which the mean over clients first reached the target, the lowest final value among "
        "these methods (evaluated every `eval.every` rounds, so a time is that of the first evaluation at or above "
        "it). Virtual time counts each client's local steps times its speed factor; a synchronous round lasts as "
        "long as its slowest client."
    )
    return ["## Virtual time", intro, *parts]


def write_schedule_plot(round_records: Sequence[Record], metric: str, path: Path, pool: str = "seen") -> list[Path]:
    """``path``: each method's mean ``metric`` over clients against virtual time (one line per method, the mean
    over seeds at each evaluated round); nothing when no method kept the virtual clock and was evaluated."""
    curves = seed_curves(round_records, metric, pool)
    if not curves:
        return []
    from matplotlib.figure import Figure

    from fedpeft.core.figures import save_figure

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    for method in first_seen(m for m, _ in curves):
        mine = [c for (m, _), c in curves.items() if m == method]
        rounds = sorted(set.intersection(*(set(c) for c in mine)))
        times = [statistics.fmean(c[r][0] for c in mine) for r in rounds]
        values = [100 * statistics.fmean(c[r][1] for c in mine) for r in rounds]
        ax.plot(times, values, marker="o", markersize=3, label=method)
    seeds = len({seed for _, seed in curves})
    ax.set_xlabel("virtual time (local steps x speed factor)")
    ax.set_ylabel(f"{metric_label(metric)} (x100), mean over clients")
    ax.set_title(f"{metric_label(metric)} against virtual time, {pool} pool ({seeds} seed{'s' if seeds > 1 else ''})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
