"""The report's plots: pool means per method and budget, and heatmaps of every method by group."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from fedpeft.core.figures import DEFAULT_FORMATS, plot_formats, save_figure
from fedpeft.core.io import staged_files
from fedpeft.report.continual import read_round_records
from fedpeft.report.method_hooks import method_hook_calls
from fedpeft.report.records import (
    METRIC_LABELS,
    Budget,
    Record,
    budget_label,
    budget_order,
    file_part,
    first_seen,
    is_test,
    method_order,
    metric_label,
    metric_order,
    pool_order,
    read_records,
)
from fedpeft.report.schedules import clock_metrics, write_schedule_plot
from fedpeft.report.sweeps import write_sweep_plots
from fedpeft.report.tables import MEAN_COLUMN, Cell, GroupTable, group_spread, group_table, group_unit

HIGHER_IS_BETTER = frozenset(METRIC_LABELS)  # accuracy, METEOR, ROUGE-1, ROUGE-L


PoolTables = Mapping[tuple[str, Budget], GroupTable]
"""``(metric, budget) -> GroupTable`` of one pool, built once for both of its plots."""


def _pool_tables(results: Sequence[Record], pool: str, metrics: Sequence[str]) -> dict[tuple[str, Budget], GroupTable]:
    budgets: list[Budget] = budget_order(results) or [None]
    return {(m, b): group_table(results, pool=pool, metric=m, budget=b) for m in metrics for b in budgets}


def _plot_pool_means(
    results: Sequence[Record], tables: PoolTables, pool: str, metrics: Sequence[str], path: Path
) -> list[Path]:
    from matplotlib.figure import Figure

    methods = method_order(results)
    budgets: list[Budget] = budget_order(results) or [None]
    figure = Figure(figsize=(max(6.0, 0.5 * (len(budgets) + 1) * max(1, len(methods)) + 2.0), 3.5 * len(metrics)))
    width = 0.8 / max(1, len(methods))
    for row, metric in enumerate(metrics):
        axes = figure.add_subplot(len(metrics), 1, row + 1)
        # Budget-independent rows get their own slot instead of one bar per budget.
        slots: dict[Budget, dict[str, Cell]] = {}
        for budget in budgets:
            table = tables[metric, budget]
            for method in table.methods:
                if (method, MEAN_COLUMN) in table.cells:
                    slots.setdefault(table.row_budgets[method], {})[method] = table.cells[method, MEAN_COLUMN]
        slot_order = [b for b in budgets if b in slots] + ([None] if None in slots and None not in budgets else [])
        labelled: set[str] = set()
        for position, budget in enumerate(slot_order):
            present = [method for method in methods if method in slots[budget]]
            for offset, method in enumerate(present):
                cell = slots[budget][method]
                axes.bar(
                    position + (offset - (len(present) - 1) / 2) * width,
                    cell.mean * 100,
                    width,
                    yerr=None if cell.sd is None else cell.sd * 100,
                    capsize=3,
                    color=f"C{methods.index(method) % 10}",
                    label=None if method in labelled else method,
                )
                labelled.add(method)
        axes.set_xticks(range(len(slot_order)), [budget_label(b) for b in slot_order])
        axes.set_ylabel(f"{metric_label(metric)} (x100)")
        # Error bars only where there is a spread over seeds to show.
        spread = "± SD over seeds" if len(first_seen(r["seed"] for r in results)) > 1 else _seed_words(results)
        axes.set_title(f"{pool} pool: mean over clients, {spread}")
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return save_figure(figure, path)


def colour_label(metric: str) -> str:
    """The words of a heatmap's colour bar: the metric, its scale, and which way is better where known."""
    label = f"{metric_label(metric)} x100"
    return f"{label} (higher = better)" if metric in HIGHER_IS_BETTER else label


def _seed_words(results: Sequence[Record]) -> str:
    """``mean over 3 seeds`` or ``one seed (0)``: what the plotted means are taken over."""
    seeds = first_seen(r["seed"] for r in results)
    return f"mean over {len(seeds)} seeds" if len(seeds) > 1 else f"one seed ({seeds[0]})"


def _plot_group_spread(tables: Sequence[GroupTable], results: Sequence[Record], metric: str, path: Path) -> list[Path]:
    """The heatmap's stand-in for tables of more than ``MAX_GROUP_COLUMNS`` groups: per budget a panel with a row per
    method of the spread of its group cells (:func:`~fedpeft.report.tables.group_spread`: a bar from the 10th to
    the 90th percentile, the median, the ``Mean``, a line from the lowest to the highest group, both named); its
    size does not grow with the groups."""
    from matplotlib.figure import Figure

    heights = [max(1, len(table.methods)) for table in tables]
    figure = Figure(figsize=(9.0, 0.55 * sum(heights) + 1.3 * len(tables) + 0.8), layout="constrained")
    grid = figure.add_gridspec(len(tables), 1, height_ratios=heights)
    unit = group_unit(tables[0])
    for index, table in enumerate(tables):
        axes = figure.add_subplot(grid[index])
        methods = list(reversed(table.methods))  # the first row on top, as in the table
        for position, method in enumerate(methods):
            spread = group_spread(table, method)
            if spread is None:
                continue
            (low_name, low), (high_name, high) = spread.lowest, spread.highest
            axes.hlines(position, low * 100, high * 100, color="0.6", linewidth=1)
            axes.barh(
                position, (spread.p90 - spread.p10) * 100, left=spread.p10 * 100, height=0.5, color="C0", alpha=0.5
            )
            axes.vlines(spread.median * 100, position - 0.25, position + 0.25, color="black")
            if (method, MEAN_COLUMN) in table.cells:
                mean = table.cells[method, MEAN_COLUMN].mean * 100
                axes.plot(mean, position, marker="D", color="C3", linestyle="none")
            for name, value, align in ((low_name, low, "right"), (high_name, high, "left")):
                axes.annotate(f" {name} ", (value * 100, position), ha=align, va="center", fontsize=7, color="0.35")
        axes.set_yticks(range(len(methods)), methods)
        axes.set_xlabel(colour_label(metric))
        axes.margins(x=0.12)
        title = f"{len(table.groups):,} {unit}s"
        axes.set_title(title if table.budget is None else f"{budget_label(table.budget)}: {title}", fontsize="medium")
    what = (
        f"{tables[0].pool} pool: {metric_label(metric)} x100 of each {unit}, {_seed_words(results)}\n"
        f"bar: 10th to 90th percentile, |: median, red ◆: Mean, line: lowest to highest {unit} (named)"
    )
    figure.suptitle(what, fontsize="medium")
    return save_figure(figure, path)


def _plot_group_heatmap(
    results: Sequence[Record], tables: PoolTables, pool: str, metric: str, path: Path
) -> list[Path]:
    from matplotlib.figure import Figure

    # One panel per budget, each with its own colour scale: the budgets' values differ in range, and one scale
    # for all would flatten the differences within a budget. Rows and groups in the order of the summary's tables.
    found = [tables[metric, b] for b in budget_order(results) or [None]]
    found = [table for table in found if table.methods]
    if any(table.summarized for table in found):  # a column per group would be thousands of columns wide
        return _plot_group_spread(found, results, metric, path)
    columns = [*first_seen(g for table in found for g in table.groups), MEAN_COLUMN]
    heights = [max(1, len(table.methods)) for table in found]
    # Each panel's group names stand at 45 degrees below it: about 0.06 in of height per character of the longest
    # (SNI's task names run to 40), without which the panels of one or two methods collapse to nothing.
    labels = 0.06 * max(len(str(c)) for c in columns)
    figure = Figure(
        figsize=(max(5.0, 0.7 * len(columns) + 4.0), 0.4 * sum(heights) + (1.1 + labels) * len(found) + 0.8),
        layout="constrained",
    )
    grid = figure.add_gridspec(len(found), 1, height_ratios=heights)
    for index, table in enumerate(found):
        axes = figure.add_subplot(grid[index])
        rows = [
            [table.cells[m, c].mean * 100 if (m, c) in table.cells else math.nan for c in columns]
            for m in table.methods
        ]
        values = np.ma.masked_invalid(np.asarray(rows, dtype=float))
        vmin, vmax = (None, None) if values.count() else (0.0, 100.0)  # nothing measured: a neutral scale
        image = axes.imshow(values, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
        axes.set_xticks(range(len(columns)), columns, rotation=45, ha="right")
        axes.set_yticks(range(len(table.methods)), table.methods)
        if len(table.methods) * len(columns) <= 400:
            for i, row in enumerate(rows):
                for j, value in enumerate(row):
                    if not math.isnan(value):
                        # Dark text on the light (high) end of viridis, light text on the dark end.
                        shade = float(np.asarray(image.norm(np.asarray(value))))
                        color = "black" if shade > 0.6 else "white"
                        axes.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=7, color=color)
        figure.colorbar(image, ax=axes, label=colour_label(metric))
        if table.budget is not None:
            axes.set_title(f"{budget_label(table.budget)} (its own colour scale)", fontsize="medium")
    what = f"{pool} pool: {metric_label(metric)}, mean over each group's clients, {_seed_words(results)}"
    figure.suptitle(what, fontsize="medium")
    return save_figure(figure, path)


def write_plots(
    run_dirs: Sequence[Path], out_dir: Path, *, formats: str | Iterable[str] = DEFAULT_FORMATS
) -> list[Path]:
    """Write the report's plots into ``out_dir`` (a run's or a report's ``plots/``), each in every ``formats``.

    Per pool, ``mean_<pool>.png``: bars of the pool mean of each metric per method and budget, with
    SD-over-seeds error bars. Per pool and metric, ``groups_<pool>_<metric>.png``: a heatmap of every method
    (and budget) by group, mean over seeds. Per sweep, ``sweep_<method>_<field>.png``
    (:func:`~fedpeft.report.sweeps.write_sweep_plots`). Then each method's own plots, from its declared ``report_plots``
    (e.g. Potara's ``mixing_weight_<method>.png``, BayesTune-LoRA's and FedP2EFT's rank structures).

    Args:
        run_dirs: run directories to merge (see :func:`read_records`).
        out_dir: the directory that receives the files, created if missing.
        formats: file formats among png, pdf and svg (a list or ``"png,pdf"``); each plot is written once per
            format, the methods' own plots too (:func:`~fedpeft.report.figures.save_figure`).

    Returns:
        Paths of the files written.
    """
    run_dirs = [Path(d) for d in run_dirs]
    records, _ = read_records(run_dirs)
    target = Path(out_dir)
    written: list[Path] = []
    # Drawn into a temporary directory, then each file renamed into out_dir: no half-written PNG is ever seen.
    with plot_formats(formats), staged_files(target) as plots_dir:
        results = [r for r in records if is_test(r)]
        for pool in pool_order(results):
            pool_records = [r for r in results if r["pool"] == pool]
            metrics = metric_order(pool_records)
            tables = _pool_tables(pool_records, pool, metrics)
            path = plots_dir / f"mean_{file_part(pool)}.png"
            written += _plot_pool_means(pool_records, tables, pool, metrics, path)
            for metric in metrics:
                path = plots_dir / f"groups_{file_part(pool)}_{file_part(metric)}.png"
                written += _plot_group_heatmap(pool_records, tables, pool, metric, path)
        written += write_sweep_plots(run_dirs, plots_dir)
        round_records = read_round_records(run_dirs)
        for metric in clock_metrics(round_records):  # each method's metric against virtual time (docs/async.md)
            path = plots_dir / f"virtual_time_{file_part(metric)}.png"
            written += write_schedule_plot(round_records, metric, path)
        for hook, method_records in method_hook_calls(records, run_dirs, "report_plots"):
            written += hook(method_records, run_dirs, plots_dir)
        written = [target / Path(p).relative_to(plots_dir) if Path(p).is_relative_to(plots_dir) else p for p in written]
    target.mkdir(parents=True, exist_ok=True)
    return written
