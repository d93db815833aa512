"""Paper-style reports of one or more runs: per-group tables with Wins, gain over base, costs, plots.

Everything here reads the run directory contract (``results.jsonl``, ``costs.jsonl``; docs/outputs.md) and
nothing else, so a report can be rebuilt from finished runs, and several runs (e.g. one per seed or per
method) can be merged into one report.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeft.core.errors import UserError

Budget = int | str | None
Record = dict[str, Any]

RESULTS_FILE = "results.jsonl"
COSTS_FILE = "costs.jsonl"
SUMMARY_FILE = "summary.md"
BASE_METHOD = "base"
MEAN_COLUMN = "Mean"
POOL_ORDER = ("seen", "unseen", "all")
METRIC_LABELS = {"accuracy": "Accuracy", "meteor": "METEOR", "rouge1": "ROUGE-1", "rougeL": "ROUGE-L"}
GENERATION_METRICS = ("meteor", "rouge1", "rougeL")
# A method wins a group of a generation benchmark when it is best in at least this many of GENERATION_METRICS.
GENERATION_MIN_BEST = 2

_RESULT_KEY = ("method", "budget", "pool", "client", "seed", "split", "metric")
_COST_KEY = ("method", "budget", "seed", "phase", "metric")  # budget: per-tier compute records


# ----------------------------------------------------------------------------------------------------------
# Reading and merging runs


def _read_jsonl(path: Path) -> list[Record]:
    records = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise UserError(
                f"{path} line {line_number} is not valid JSON ({error.msg}); fix or remove that line."
            ) from None
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
        results.update(_deduplicate(_read_jsonl(results_path), _RESULT_KEY, by_round=True))
        costs_path = run_dir / COSTS_FILE
        if costs_path.is_file():
            costs.update(_deduplicate(_read_jsonl(costs_path), _COST_KEY, by_round=False))
    return list(results.values()), list(costs.values())


# ----------------------------------------------------------------------------------------------------------
# Orders and labels


def _first_seen(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def method_order(records: Iterable[Record]) -> list[str]:
    """Methods in first-seen order, ``"base"`` first."""
    methods = _first_seen(record["method"] for record in records)
    return sorted(methods, key=lambda method: method != BASE_METHOD)


def budget_order(records: Iterable[Record]) -> list[Budget]:
    """Budgets other than ``None``: ranks ascending, then tier names in first-seen order."""
    budgets = _first_seen(record.get("budget") for record in records)
    ranks = sorted(b for b in budgets if isinstance(b, int) and not isinstance(b, bool))
    tiers = [b for b in budgets if b is not None and b not in ranks]
    return [*ranks, *tiers]


def _pool_order(records: Iterable[Record]) -> list[str]:
    pools = _first_seen(record["pool"] for record in records)
    return sorted(pools, key=lambda pool: POOL_ORDER.index(pool) if pool in POOL_ORDER else len(POOL_ORDER))


def _metric_order(records: Iterable[Record]) -> list[str]:
    metrics = _first_seen(record["metric"] for record in records)
    known = list(METRIC_LABELS)
    return sorted(metrics, key=lambda metric: known.index(metric) if metric in known else len(known))


def budget_label(budget: Budget) -> str:
    """``r = 8`` for a rank, the tier name for a tier, ``no budget`` for ``None``."""
    if budget is None:
        return "no budget"
    if isinstance(budget, int):
        return f"r = {budget}"
    return str(budget)


def _pool_label(pool: str) -> str:
    return "All clients" if pool == "all" else f"{pool.capitalize()} pool"


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def _is_test(record: Record) -> bool:
    return record.get("split", "test") == "test" and record.get("value") is not None


# ----------------------------------------------------------------------------------------------------------
# Statistics over seeds


@dataclass(frozen=True)
class Cell:
    """Mean and sample SD (ddof = 1) over seeds; ``sd`` is ``None`` with a single seed."""

    mean: float
    sd: float | None
    seeds: int


def over_seeds(values: Sequence[float]) -> Cell:
    """Mean and sample SD of per-seed values."""
    sd = statistics.stdev(values) if len(values) > 1 else None
    return Cell(statistics.fmean(values), sd, len(values))


def _display_key(cell: Cell) -> float:
    # Best and ties are decided on the printed number (x100, 2 decimals), so that the bold cells and the Wins
    # agree with what a reader sees.
    return round(cell.mean * 100, 2)


# ----------------------------------------------------------------------------------------------------------
# Per-group tables


@dataclass
class GroupTable:
    """One paper table: a row per method, a column per group plus ``Mean``; cells over seeds.

    Attributes:
        pool, metric, budget: what the table shows.
        methods: row order (``"base"`` first).
        row_budgets: the budget each row's records have (``None`` for budget-independent rows).
        groups: group columns in first-seen order (``Mean`` is not among them).
        cells: ``(method, column) -> Cell`` where column is a group or ``Mean``; missing when no data.
        best: ``column -> methods`` with the best printed mean among the non-base rows (all of them on a tie).
        wins: ``method -> number of groups it is best in``, for the non-base rows.
    """

    pool: str
    metric: str
    budget: Budget
    methods: list[str]
    row_budgets: dict[str, Budget]
    groups: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    best: dict[str, set[str]] = field(default_factory=dict)
    wins: dict[str, int] = field(default_factory=dict)


def _rows_for_budget(records: Sequence[Record], budget: Budget) -> tuple[dict[str, list[Record]], dict[str, Budget]]:
    """Each method's records at ``budget``, falling back to its budget-independent (``None``) records."""
    by_method: dict[str, dict[Budget, list[Record]]] = {}
    for record in records:
        by_method.setdefault(record["method"], {}).setdefault(record.get("budget"), []).append(record)
    rows: dict[str, list[Record]] = {}
    row_budgets: dict[str, Budget] = {}
    for method in method_order(records):
        for candidate in (budget, None):
            if candidate in by_method[method]:
                rows[method] = by_method[method][candidate]
                row_budgets[method] = candidate
                break
    return rows, row_budgets


def _per_seed_means(records: Sequence[Record]) -> dict[str, dict[Any, float]]:
    """``column -> seed -> mean over that column's clients`` for one method."""
    values: dict[str, dict[Any, list[float]]] = {}
    for record in records:
        for column in (record["group"], MEAN_COLUMN):
            values.setdefault(column, {}).setdefault(record["seed"], []).append(float(record["value"]))
    return {column: {seed: statistics.fmean(v) for seed, v in seeds.items()} for column, seeds in values.items()}


def _best_methods(cells: Mapping[tuple[str, str], Cell], methods: Sequence[str], column: str) -> set[str]:
    scored = {m: _display_key(cells[m, column]) for m in methods if m != BASE_METHOD and (m, column) in cells}
    if not scored:
        return set()
    top = max(scored.values())
    return {method for method, score in scored.items() if score == top}


def group_table(records: Sequence[Record], *, pool: str, metric: str, budget: Budget) -> GroupTable:
    """The per-group table of one pool, metric and budget.

    Rows are the methods evaluated at ``budget`` plus the budget-independent ones (``budget`` null, e.g.
    ``"base"``). Cell = mean over seeds of (mean over the group's clients) +- sample SD over seeds; ``Mean`` =
    the same over all clients of the pool. ``"base"`` is the reference and competes for neither best nor Wins.

    Args:
        records: result records (e.g. from :func:`read_records`); only the ``test`` split is used.
        pool: ``"seen"``, ``"unseen"`` or ``"all"``.
        metric: metric name (``"accuracy"``, ``"meteor"``, ...).
        budget: rank, tier name, or ``None`` for runs without budgets.

    Returns:
        The table, with values in [0, 1] (rendering multiplies by 100).
    """
    selected = [r for r in records if r["pool"] == pool and r["metric"] == metric and _is_test(r)]
    rows, row_budgets = _rows_for_budget(selected, budget)
    groups = _first_seen(r["group"] for method_records in rows.values() for r in method_records)
    table = GroupTable(pool, metric, budget, list(rows), row_budgets, groups)
    for method, method_records in rows.items():
        for column, per_seed in _per_seed_means(method_records).items():
            table.cells[method, column] = over_seeds(list(per_seed.values()))
    for column in [*groups, MEAN_COLUMN]:
        table.best[column] = _best_methods(table.cells, table.methods, column)
    table.wins = {
        method: sum(method in table.best[group] for group in groups)
        for method in table.methods
        if method != BASE_METHOD
    }
    return table


def combined_wins(tables: Sequence[GroupTable], min_best: int = GENERATION_MIN_BEST) -> dict[str, int]:
    """Wins over several metrics of the same pool and budget: groups where a method is best in ``min_best``.

    Generation benchmarks use the three tables of METEOR, ROUGE-1 and ROUGE-L with ``min_best = 2``.
    """
    methods = _first_seen(m for table in tables for m in table.methods if m != BASE_METHOD)
    groups = _first_seen(g for table in tables for g in table.groups)
    return {
        method: sum(sum(method in table.best.get(group, set()) for table in tables) >= min_best for group in groups)
        for method in methods
    }


def _format_cell(cell: Cell | None, *, signed: bool = False) -> str:
    """x100 with two decimals, ``mean ± sd``; ``—`` where there is no data."""
    if cell is None:
        return "—"
    text = f"{cell.mean * 100:+.2f}" if signed else f"{cell.mean * 100:.2f}"
    if cell.sd is not None:
        text += f" ± {cell.sd * 100:.2f}"
    return text


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_group_table(table: GroupTable, wins: Mapping[str, int] | None = None) -> str:
    """Markdown of a :class:`GroupTable`: values x100, best cells in bold, a Wins column.

    Args:
        table: the table.
        wins: Wins to print instead of the table's own (e.g. :func:`combined_wins` for generation).
    """
    wins = table.wins if wins is None else wins
    columns = [*table.groups, MEAN_COLUMN]
    rows = []
    for method in table.methods:
        row = [method]
        for column in columns:
            text = _format_cell(table.cells.get((method, column)))
            row.append(f"**{text}**" if method in table.best.get(column, set()) else text)
        row.append(str(wins[method]) if method in wins else "—")
        rows.append(row)
    return _markdown_table(["Method", *columns, "Wins"], rows)


# ----------------------------------------------------------------------------------------------------------
# Gain over base


def gain_over_base(records: Sequence[Record], *, pool: str, metric: str) -> dict[tuple[str, Budget], Cell]:
    """Personalization gain of every non-base method and budget over ``"base"``.

    Per seed: mean over the pool's clients of (method's metric - base metric of the same client and seed),
    counting only clients that have both; then mean +- sample SD over seeds.

    Returns:
        ``(method, budget) -> Cell`` (values in metric units, not x100); empty without base records.
    """
    selected = [r for r in records if r["pool"] == pool and r["metric"] == metric and _is_test(r)]
    base = {(r["client"], r["seed"]): float(r["value"]) for r in selected if r["method"] == BASE_METHOD}
    differences: dict[tuple[str, Budget], dict[Any, list[float]]] = {}
    for record in selected:
        reference = base.get((record["client"], record["seed"]))
        if record["method"] == BASE_METHOD or reference is None:
            continue
        key = (record["method"], record.get("budget"))
        differences.setdefault(key, {}).setdefault(record["seed"], []).append(float(record["value"]) - reference)
    return {
        key: over_seeds([statistics.fmean(values) for values in per_seed.values()])
        for key, per_seed in differences.items()
    }


def _render_gain_table(gains: Mapping[tuple[str, Budget], Cell], records: Sequence[Record]) -> str:
    methods = [m for m in method_order(records) if any(key[0] == m for key in gains)]
    budgets: list[Budget] = [b for b in budget_order(records) if any(key[1] == b for key in gains)]
    if any(key[1] is None for key in gains):
        budgets.append(None)
    rows = [
        [method, *(_format_cell(gains.get((method, budget)), signed=True) for budget in budgets)] for method in methods
    ]
    return _markdown_table(["Method", *map(budget_label, budgets)], rows)


# ----------------------------------------------------------------------------------------------------------
# Costs


def _format_bytes(value: float) -> str:
    units = ("B", "KiB", "MiB", "GiB")
    power = 0
    while abs(value) >= 1024 and power < len(units) - 1:
        value /= 1024
        power += 1
    return f"{value:.0f} B" if power == 0 else f"{value:.2f} {units[power]}"


def _format_seconds(value: float) -> str:
    return f"{value:.3f}"


def _format_megabytes(value: float) -> str:
    return f"{value:.1f}"


def _format_count(value: float) -> str:
    return f"{value:,.0f}"


def _format_share(value: float) -> str:
    return f"{value * 100:.2f} %"


# (phase, metric, header, formatter) of the per-client cost table (paper Table 5) and of the totals table.
_COST_COLUMNS = (
    ("federated", "wall_s_per_client_round", "Fed. s / client-round", _format_seconds),
    ("federated", "bytes_up_per_client_round", "Fed. up / client-round", _format_bytes),
    ("federated", "bytes_down_per_client_round", "Fed. down / client-round", _format_bytes),
    ("federated", "peak_rss_mb", "Fed. peak RSS MB", _format_megabytes),
    ("federated", "peak_cuda_mb", "Fed. peak CUDA MB", _format_megabytes),
    ("personalization", "wall_s_per_client", "Pers. s / client", _format_seconds),
    ("personalization", "peak_rss_mb", "Pers. peak RSS MB", _format_megabytes),
    ("personalization", "peak_cuda_mb", "Pers. peak CUDA MB", _format_megabytes),
    ("federated", "floats_up_per_client_round", "Floats up / client-round", _format_count),
    ("federated", "bytes_up_per_client", "Up / client (all rounds)", _format_bytes),
    ("personalization", "merge_s_per_client", "Merge s / client", _format_seconds),
    ("personalization", "merge_share", "Merge / training time", _format_share),
)
_TOTAL_COLUMNS = (
    ("bytes_up_total", "Up total", _format_bytes),
    ("bytes_down_total", "Down total", _format_bytes),
    ("wall_s", "Wall s", _format_seconds),
    ("peak_rss_mb", "Peak RSS MB", _format_megabytes),
    ("peak_cuda_mb", "Peak CUDA MB", _format_megabytes),
)
_PHASES = ("base", "federated", "personalization")


def cost_cells(costs: Sequence[Record]) -> dict[tuple[str, str, str], Cell]:
    """``(method, phase, metric) -> Cell`` over seeds of the cost records."""
    per_seed: dict[tuple[str, str, str], list[float]] = {}
    for record in costs:
        if record.get("value") is not None:
            key = (record["method"], record["phase"], record["metric"])
            per_seed.setdefault(key, []).append(float(record["value"]))
    return {key: over_seeds(values) for key, values in per_seed.items()}


def _format_cost(cell: Cell | None, formatter: Any) -> str:
    if cell is None:
        return "—"
    # Byte counts are deterministic, so an SD of 0 would only add noise.
    if cell.sd:
        return f"{formatter(cell.mean)} ± {formatter(cell.sd)}"
    return formatter(cell.mean)


def render_cost_tables(costs: Sequence[Record]) -> str:
    """Markdown of the per-client cost table and the totals table; columns without data are left out."""
    cells = cost_cells(costs)
    methods = method_order(costs)
    columns = [c for c in _COST_COLUMNS if any((m, c[0], c[1]) in cells for m in methods)]
    parts = []
    if columns:
        rows = [
            [
                method,
                *(_format_cost(cells.get((method, phase, metric)), fmt) for phase, metric, _, fmt in columns),
            ]
            for method in methods
            if any((method, phase, metric) in cells for phase, metric, _, _ in columns)
        ]
        parts.append(_markdown_table(["Method", *(c[2] for c in columns)], rows))
    totals = [c for c in _TOTAL_COLUMNS if any(key[2] == c[0] for key in cells)]
    total_rows = [
        [method, phase, *(_format_cost(cells.get((method, phase, metric)), fmt) for metric, _, fmt in totals)]
        for method in methods
        for phase in _PHASES
        if any((method, phase, metric) in cells for metric, _, _ in totals)
    ]
    if total_rows:
        parts.append(_markdown_table(["Method", "Phase", *(c[1] for c in totals)], total_rows))
    return "\n\n".join(parts)


def render_failures(costs: Sequence[Record]) -> str:
    """A warning line per method and seed whose federated phase left clients out because they failed."""
    lines = [
        f"- **{c['method']}**, seed {c['seed']}: {int(c['value'])} client-round(s) failed and were left out of "
        "the aggregation (the run's log names them); its numbers come from fewer updates than configured."
        for c in costs
        if c.get("metric") == "failed_client_rounds" and c.get("value", 0) > 0
    ]
    return "\n".join(lines)


def render_compute_table(costs: Sequence[Record]) -> str:
    """Markdown of the per-budget compute records (phase ``compute``): per method and budget (a compute tier),
    experts per token, LoRA rank, active parameters, analytic forward FLOPs, their share of the method's first
    budget, and the measured forward milliseconds; mean over seeds. Empty when there are none."""
    values: dict[tuple[str, Any, str], list[float]] = {}
    for record in costs:
        if record.get("phase") == "compute" and record.get("value") is not None:
            values.setdefault((record["method"], record.get("budget"), record["metric"]), []).append(record["value"])
    if not values:
        return ""
    keys = _first_seen((method, budget) for method, budget, _ in values)
    rows = []
    for method, budget in keys:
        cell = {m: statistics.fmean(v) for (me, b, m), v in values.items() if (me, b) == (method, budget)}
        first = next(b for me, b in keys if me == method)
        reference = statistics.fmean(values.get((method, first, "forward_flops"), [float("nan")]))
        flops = cell.get("forward_flops")
        rows.append([
            method,
            budget_label(budget),
            f"{cell['top_k']:.0f}" if "top_k" in cell else "—",
            f"{cell['lora_rank']:.0f}" if "lora_rank" in cell else "—",
            f"{cell['active_params'] / 1e6:.3f} M" if "active_params" in cell else "—",
            f"{flops / 1e9:.4g} G" if flops is not None else "—",
            f"{100 * flops / reference:.1f} %" if flops is not None and reference > 0 else "—",
            f"{cell['forward_ms']:.2f}" if "forward_ms" in cell else "—",
        ])  # fmt: skip
    header = ["Method", "Budget", "top-k", "LoRA rank", "Active params", "Forward FLOPs", "vs first", "Forward ms"]
    return _markdown_table(header, rows)


# ----------------------------------------------------------------------------------------------------------
# The summary


def _render_scalar(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_info(info: Mapping[str, Any]) -> str:
    """Markdown of descriptive facts as given: scalars and lists as a bullet list, mappings as small tables.

    A mapping of mappings (e.g. ``{"sizes": {"en": {"train": 2000, "test": 500}}}``) becomes one table with a
    column per inner key.
    """
    bullets = []
    tables = []
    for key, value in info.items():
        if not isinstance(value, Mapping):
            bullets.append(f"- **{key}**: {_render_scalar(value)}")
        elif value and all(isinstance(inner, Mapping) for inner in value.values()):
            columns = _first_seen(column for inner in value.values() for column in inner)
            rows = [
                [str(name), *(_render_scalar(inner[c]) if c in inner else "—" for c in columns)]
                for name, inner in value.items()
            ]
            tables.append(f"**{key}**\n\n" + _markdown_table(["", *map(str, columns)], rows))
        else:
            rows = [[str(name), _render_scalar(inner)] for name, inner in value.items()]
            tables.append(f"**{key}**\n\n" + _markdown_table(["", "value"], rows))
    return "\n\n".join(part for part in ["\n".join(bullets), *tables] if part)


_NOTES = (
    "Values x100: mean ± sample SD (ddof = 1) over seeds of the mean over the group's clients (no ± with one "
    "seed); Mean = the same over all clients of the pool. Rows without a budget (`base`, the base model "
    "without personalization, and budget-less methods) are budget-independent and repeat in every budget's "
    "table. `base` is the reference: it is never bold and has no Wins. Bold = best printed value among the "
    "other methods; Wins = groups where a method is best{criterion}, every tied method winning."
)


def _result_sections(results: Sequence[Record]) -> list[str]:
    metrics = _metric_order(results)
    combined = list(GENERATION_METRICS) if set(GENERATION_METRICS) <= set(metrics) else []
    labels = ", ".join(map(metric_label, combined))
    criterion = f" in at least {GENERATION_MIN_BEST} of {labels}" if combined else ""
    sections = [_NOTES.format(criterion=criterion)]
    for pool in _pool_order(results):
        pool_records = [r for r in results if r["pool"] == pool]
        sections.append(f"## {_pool_label(pool)}")
        for budget in budget_order(pool_records) or [None]:
            tables = {m: group_table(pool_records, pool=pool, metric=m, budget=budget) for m in metrics}
            wins = combined_wins([tables[m] for m in combined]) if combined else None
            for metric, table in tables.items():
                if not table.methods:
                    continue
                heading = metric_label(metric) if budget is None else f"{budget_label(budget)} — {metric_label(metric)}"
                sections.append(f"### {heading}")
                sections.append(render_group_table(table, wins if metric in combined else None))
    return sections


def _gain_sections(results: Sequence[Record]) -> list[str]:
    sections = []
    for pool in _pool_order(results):
        for metric in _metric_order(results):
            gains = gain_over_base(results, pool=pool, metric=metric)
            if gains:
                sections.append(f"### {_pool_label(pool)} — {metric_label(metric)}")
                sections.append(_render_gain_table(gains, results))
    if not sections:
        return []
    intro = (
        "Per method and budget: mean over the pool's clients of (metric - `base` metric of the same client "
        "and seed), x100, mean ± sample SD over seeds."
    )
    return ["## Gain over base", intro, *sections]


def _summary_path(out: Path) -> Path:
    return out if out.suffix == ".md" else out / SUMMARY_FILE


def write_summary(
    run_dirs: Sequence[Path], out: Path, *, title: str | None = None, info: Mapping[str, Any] | None = None
) -> str:
    """Write the paper-style ``summary.md`` of one or more runs.

    Args:
        run_dirs: run directories to merge (see :func:`read_records`).
        out: a directory (the summary goes to ``out/summary.md``) or a ``.md`` file path.
        title: the heading; defaults to the run directory names.
        info: facts about the data (group sizes, samples per client, resource levels, ...), shown as given.

    Returns:
        The markdown text written.
    """
    run_dirs = [Path(d) for d in run_dirs]
    results, costs = read_records(run_dirs)
    if not results:
        raise UserError(f"No results in {', '.join(map(str, run_dirs))}; run `fedpeft run` to completion first.")
    title = title or "fedpeft results: " + ", ".join(d.name for d in run_dirs)
    seeds = ", ".join(map(str, _first_seen(r["seed"] for r in results)))
    runs = ", ".join(f"`{d}`" for d in run_dirs)
    parts = [f"# {title}", f"Runs: {runs}. Seeds: {seeds}. Methods: {', '.join(method_order(results))}."]
    if info:
        parts += ["## Data", render_info(info)]
    parts += ["## Results", *_result_sections(results), *_gain_sections(results)]
    from fedpeft.report_merge import render_merge_facts

    merge_facts = render_merge_facts(results)
    if merge_facts:
        intro = "Weight of the federated model per client (alpha; fisher_weight_mean: mean per-coordinate weight)."
        parts += ["## Mixing weights", intro, merge_facts]
    parts += continual_sections(read_round_records(run_dirs))
    failures = render_failures(costs)
    if failures:
        parts += ["## Failed clients", failures]
    if costs:
        parts += [
            "## Costs",
            "Mean over seeds (± sample SD where the seeds differ). Federated training per client and round, "
            "personalization per client; then totals per phase.",
            render_cost_tables(costs),
        ]
        compute = render_compute_table(costs)
        if compute:
            parts += [
                "## Compute per budget",
                "Per compute tier, the forward pass of one sequence (`compute_tokens`, default 128): analytic "
                "FLOPs = 2 x active parameters x tokens (LoRA unmerged) and measured wall milliseconds (median, "
                "LoRA merged: the base model at the tier's top-k); mean over seeds.",
                compute,
            ]
    text = "\n\n".join(parts) + "\n"
    path = _summary_path(Path(out))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return text


# ----------------------------------------------------------------------------------------------------------
# Continual personalization: Self / Others x A_last / A_AUC

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
        rows = [r for r in _read_jsonl(path) if r.get("round") is not None and r.get("value") is not None]
        replaced = {(r["method"], r["seed"]) for r in rows}
        merged = {k: v for k, v in merged.items() if (v["method"], v["seed"]) not in replaced}
        for record in rows:
            merged[(*(record.get(name) for name in _RESULT_KEY), record["round"])] = record
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


def render_continual_table(cells: Mapping[tuple[str, str, str], Cell], methods: Sequence[str]) -> str:
    """Markdown: one row per method, Self / Others x A_last / A_AUC (x100), best value of a column in bold."""
    columns = [(split, stat) for split in CONTINUAL_SPLITS for stat in ("last", "auc")]
    best = {c: max((_display_key(cells[(m, *c)]) for m in methods if (m, *c) in cells), default=None) for c in columns}
    rows = []
    for method in methods:
        row = [method]
        for column in columns:
            cell = cells.get((method, *column))
            text = _format_cell(cell)
            row.append(f"**{text}**" if cell is not None and _display_key(cell) == best[column] else text)
        rows.append(row)
    header = [f"{CONTINUAL_SPLITS[split]} A_{stat.replace('auc', 'AUC')}" for split, stat in columns]
    return _markdown_table(["Method", *header], rows)


def continual_sections(records: Sequence[Record]) -> list[str]:
    """The summary section of per-round evaluations (empty when no method was evaluated during training)."""
    sections = []
    for metric in _metric_order(records):
        cells = continual_cells(records, metric)
        if not cells:
            continue
        methods = [m for m in method_order(records) if any(key[0] == m for key in cells)]
        sections += [f"### {metric_label(metric)}", render_continual_table(cells, methods)]
    if not sections:
        return []
    intro = (
        "Each client's model evaluated during federated training (`eval.every`): Self = on its own test data of "
        "the tasks seen so far, Others = on the other clients' test data. A_last = at the last round, A_AUC = "
        "mean over the evaluation rounds; x100, mean ± sample SD over seeds of the mean over clients."
    )
    return ["## Continual personalization", intro, *sections]


# ----------------------------------------------------------------------------------------------------------
# Plots


def _file_part(name: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)).strip("-") or "x"


def _plot_pool_means(results: Sequence[Record], pool: str, metrics: Sequence[str], path: Path) -> None:
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
            table = group_table(results, pool=pool, metric=metric, budget=budget)
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
                    yerr=(cell.sd or 0.0) * 100,
                    capsize=3,
                    color=f"C{methods.index(method) % 10}",
                    label=None if method in labelled else method,
                )
                labelled.add(method)
        axes.set_xticks(range(len(slot_order)), [budget_label(b) for b in slot_order])
        axes.set_ylabel(f"{metric_label(metric)} (x100)")
        axes.set_title(f"{pool} pool: mean over clients, ± SD over seeds")
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _plot_group_heatmap(results: Sequence[Record], pool: str, metric: str, path: Path) -> None:
    from matplotlib.figure import Figure

    labels: list[str] = []
    rows: list[list[float]] = []
    groups: list[str] = []
    seen_rows: set[tuple[str, Budget]] = set()
    for budget in budget_order(results) or [None]:
        table = group_table(results, pool=pool, metric=metric, budget=budget)
        groups = groups or table.groups
        for method in table.methods:
            row_key = (method, table.row_budgets[method])
            if row_key in seen_rows:
                continue
            seen_rows.add(row_key)
            labels.append(method if row_key[1] is None else f"{method} ({budget_label(row_key[1])})")
            rows.append(
                [
                    table.cells[method, column].mean * 100 if (method, column) in table.cells else math.nan
                    for column in [*groups, MEAN_COLUMN]
                ]
            )
    columns = [*groups, MEAN_COLUMN]
    figure = Figure(figsize=(max(4.0, 0.7 * len(columns) + 2.5), max(2.5, 0.4 * len(labels) + 1.5)))
    axes = figure.add_subplot()
    image = axes.imshow(rows, aspect="auto", cmap="viridis")
    axes.set_xticks(range(len(columns)), columns, rotation=45, ha="right")
    axes.set_yticks(range(len(labels)), labels)
    if len(labels) * len(columns) <= 400:
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    # Dark text on the light (high) end of viridis, light text on the dark end.
                    color = "black" if image.norm(value) > 0.6 else "white"
                    axes.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=7, color=color)
    figure.colorbar(image, ax=axes, label=f"{metric_label(metric)} (x100)")
    axes.set_title(f"{pool} pool: {metric_label(metric)}, mean over seeds", fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def write_plots(run_dirs: Sequence[Path], out_dir: Path) -> list[Path]:
    """Write the report's plots as PNG files into ``out_dir`` (a run's or a report's ``plots/``).

    Per pool, ``mean_<pool>.png``: bars of the pool mean of each metric per method and budget, with
    SD-over-seeds error bars. Per pool and metric, ``groups_<pool>_<metric>.png``: a heatmap of every method
    (and budget) by group, mean over seeds. Per merging method run with a grid search,
    ``mixing_weight_<method>.png`` (:mod:`fedpeft.report_merge`).

    Args:
        run_dirs: run directories to merge (see :func:`read_records`).
        out_dir: the directory that receives the files, created if missing.

    Returns:
        Paths of the files written.
    """
    results, _ = read_records([Path(d) for d in run_dirs])
    from fedpeft.report_merge import write_mixing_weight_plots

    plots_dir = Path(out_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = write_mixing_weight_plots(results, plots_dir)
    results = [r for r in results if _is_test(r)]
    for pool in _pool_order(results):
        pool_records = [r for r in results if r["pool"] == pool]
        metrics = _metric_order(pool_records)
        path = plots_dir / f"mean_{_file_part(pool)}.png"
        _plot_pool_means(pool_records, pool, metrics, path)
        written.append(path)
        for metric in metrics:
            path = plots_dir / f"groups_{_file_part(pool)}_{_file_part(metric)}.png"
            _plot_group_heatmap(pool_records, pool, metric, path)
            written.append(path)
    written += write_sweep_plots(run_dirs, plots_dir)
    return written


# ----------------------------------------------------------------------------------------------------------
# Sweeps


def method_sweeps(run_dirs: Sequence[Path]) -> dict[tuple[str, str], dict[str, float]]:
    """Settings swept across entries of one method in the runs' ``config.yaml``.

    A sweep is a method name listed at least three times whose resolved settings (defaults filled in) differ in
    exactly one numeric field, e.g. FLAME at ``temperature`` 0, 1, 2, 4, 8. Returns ``(method name, field) -> {row
    label: value}``.
    """
    import yaml

    from fedpeft.worker import build_method

    entries: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for run_dir in run_dirs:
        config = Path(run_dir) / "config.yaml"
        if not config.is_file():
            continue
        for entry in (yaml.safe_load(config.read_text()) or {}).get("methods", []):
            try:
                method = build_method(dict(entry))
            except UserError:
                continue
            settings = method.cfg.model_dump(exclude={"label", "name"})
            entries.setdefault(method.name, []).append((method.label, settings))
    sweeps: dict[tuple[str, str], dict[str, float]] = {}
    for name, rows in entries.items():
        if len(rows) < 3:
            continue
        varying = [k for k in rows[0][1] if len({json.dumps(s.get(k), sort_keys=True) for _, s in rows}) > 1]
        if len(varying) != 1:
            continue
        key = varying[0]
        values = {label: s[key] for label, s in rows}
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()):
            sweeps[name, key] = {label: float(v) for label, v in values.items()}
    return sweeps


def write_sweep_plots(run_dirs: Sequence[Path], out_dir: Path) -> list[Path]:
    """Per sweep (see :func:`method_sweeps`), ``sweep_<method>_<field>.png``: every metric's mean over the
    pool's clients (mean over seeds, SD error bars) against the swept value, one line per budget."""
    from matplotlib.figure import Figure

    sweeps = method_sweeps(run_dirs)
    if not sweeps:
        return []
    results, _ = read_records([Path(d) for d in run_dirs])
    results = [r for r in results if _is_test(r)]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for (name, key), values in sweeps.items():
        rows = [r for r in results if r["method"] in values]
        metrics = _metric_order(rows)
        if not rows or not metrics:
            continue
        figure = Figure(figsize=(6.0, 3.2 * len(metrics)))
        for index, metric in enumerate(metrics):
            axes = figure.add_subplot(len(metrics), 1, index + 1)
            for budget in budget_order(rows) or [None]:
                points = []
                for label, x in sorted(values.items(), key=lambda item: item[1]):
                    per_seed: dict[Any, list[float]] = {}
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
        path = Path(out_dir) / f"sweep_{_file_part(name)}_{_file_part(key)}.png"
        figure.savefig(path, dpi=120)
        written.append(path)
    return written
