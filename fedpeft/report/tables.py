"""The paper tables of results: statistics over seeds, per-group tables with best cells and Wins (a best cell counts
where its 95 % interval against the next best method lies above 0, :mod:`.intervals`), gain over base, and their
markdown."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fedpeft.report.intervals import ClientDifference, Interval, PairKey, interval_over, paired_clients
from fedpeft.report.records import (
    BASE_METHOD,
    Budget,
    Record,
    budget_label,
    budget_order,
    first_seen,
    is_test,
    method_order,
    metric_order,
    pool_order,
)

MEAN_COLUMN = "Mean"
WINS_COLUMN = "Wins"
NOT_SIGNIFICANT = "n.s."
GENERATION_METRICS = ("meteor", "rouge1", "rougeL")
# A method wins a group of a generation benchmark when it is best in at least this many of GENERATION_METRICS.
GENERATION_MIN_BEST = 2


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
    sd = sample_sd(values) if len(values) > 1 else None
    return Cell(statistics.fmean(values), sd, len(values))


# Bits kept by the square root before its one rounding: twice a float's mantissa and 3 guard bits (Python's own).
_SQRT_BITS = 2 * sys.float_info.mant_dig + 3


def sample_sd(values: Sequence[float]) -> float:
    """The sample SD (ddof = 1) of two or more values: the correctly rounded square root of their exact sample
    variance, the number ``statistics.stdev`` gives (Python 3.11 on), in integer arithmetic. A report of thousands
    of clients takes tens of thousands of them, where the Fractions of ``statistics`` cost seconds."""
    if not all(math.isfinite(value) for value in values):
        return statistics.stdev(values)
    ratios = [float(value).as_integer_ratio() for value in values]
    scale = max(denominator for _, denominator in ratios)  # a float's denominator is a power of two
    scaled = [numerator * (scale // denominator) for numerator, denominator in ratios]
    count = len(scaled)
    # The exact variance is numerator / denominator: sums of squares are exact in integers.
    numerator = count * sum(x * x for x in scaled) - sum(scaled) ** 2
    denominator = count * (count - 1) * scale * scale
    # Round to odd at _SQRT_BITS bits, then once to a float: a correctly rounded square root of the fraction.
    shift = (numerator.bit_length() - denominator.bit_length() - _SQRT_BITS) // 2
    if shift >= 0:
        root = math.isqrt(numerator // (denominator << 2 * shift))
        exact = root * root * (denominator << 2 * shift) == numerator
        return float((root | (not exact)) << shift)
    root = math.isqrt((numerator << -2 * shift) // denominator)
    exact = root * root * denominator == numerator << -2 * shift
    return (root | (not exact)) / (1 << -shift)


def display_key(cell: Cell) -> float:
    """The value a cell is ranked by: its mean as printed (x100, two decimals)."""
    # Best and ties are decided on the printed number (x100, 2 decimals), so that the bold cells and the Wins
    # agree with what a reader sees.
    return round(cell.mean * 100, 2)


# ----------------------------------------------------------------------------------------------------------
# Per-group tables

# More groups than this and a table prints, per method, the distribution over its groups (quantiles, the lowest and
# highest group named) instead of a column per group: 16 columns of ``12.34 ± 1.23`` fill a page's width.
MAX_GROUP_COLUMNS = 16


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
        values: ``method -> (client, seed) -> value``, what the intervals pair.
        client_groups: ``client -> group``.
        group_clients: ``group -> clients`` (first-seen order), the same the other way round.
        against: ``(method, column) -> (reference, interval)`` for the non-base rows: the method minus the best
            other method of the column (:func:`best_other`; ``base`` when no other method competes), paired over
            the column's clients (:meth:`interval`); missing without a pair.
        bold: ``column -> methods`` of ``best`` whose interval in ``against`` lies above 0 (a tie never does).
        wins: ``method -> number of groups it is bold in``, for the non-base rows.
    """

    pool: str
    metric: str
    budget: Budget
    methods: list[str]
    row_budgets: dict[str, Budget]
    groups: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    best: dict[str, set[str]] = field(default_factory=dict)
    values: dict[str, dict[PairKey, float]] = field(default_factory=dict)
    client_groups: dict[str, str] = field(default_factory=dict)
    group_clients: dict[str, list[str]] = field(default_factory=dict)
    against: dict[tuple[str, str], tuple[str, Interval]] = field(default_factory=dict)
    bold: dict[str, set[str]] = field(default_factory=dict)
    wins: dict[str, int] = field(default_factory=dict)
    # (method, reference) -> each client's paired difference: computed once, then read by every column.
    _paired: dict[tuple[str, str], dict[str, ClientDifference]] = field(default_factory=dict, repr=False)

    def clients_of(self, column: str) -> set[str] | None:
        """The clients of a group column; ``None`` (every client of the pool) for ``Mean``."""
        if column == MEAN_COLUMN:
            return None
        return set(self.group_clients.get(column, ()))

    def interval(self, method: str, reference: str, column: str) -> Interval | None:
        """The paired interval of ``method`` minus ``reference`` over the clients of ``column`` (every client of
        the pool for ``Mean``; :func:`~fedpeft.report.intervals.interval_over`); ``None`` without a pair. The
        clients' differences are paired once per pair of rows, so a table's every column costs what its own
        clients do."""
        key = (method, reference)
        if key not in self._paired:
            self._paired[key] = paired_clients(self.values[method], self.values[reference])
        clients = None if column == MEAN_COLUMN else self.group_clients.get(column, [])
        return interval_over(self._paired[key], clients)

    @property
    def summarized(self) -> bool:
        """Whether the table has more groups than :data:`MAX_GROUP_COLUMNS`: it then prints the distribution over
        its groups instead of a column per group (:func:`render_group_distribution`)."""
        return len(self.groups) > MAX_GROUP_COLUMNS


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


def _per_seed_means(records: Sequence[Record]) -> dict[str, dict[int, float]]:
    """``column -> seed -> mean over that column's clients`` for one method."""
    values: dict[str, dict[int, list[float]]] = {}
    for record in records:
        for column in (record["group"], MEAN_COLUMN):
            values.setdefault(column, {}).setdefault(record["seed"], []).append(float(record["value"]))
    return {column: {seed: statistics.fmean(v) for seed, v in seeds.items()} for column, seeds in values.items()}


def _best_methods(cells: Mapping[tuple[str, str], Cell], methods: Sequence[str], column: str) -> set[str]:
    scored = {m: display_key(cells[m, column]) for m in methods if m != BASE_METHOD and (m, column) in cells}
    if not scored:
        return set()
    top = max(scored.values())
    return {method for method, score in scored.items() if score == top}


def best_other(table: GroupTable, method: str, column: str) -> str | None:
    """The non-base method other than ``method`` with the best printed value in ``column`` (the first in row order
    on a tie); ``None`` when no other method has a value there."""
    others = [m for m in table.methods if m not in (BASE_METHOD, method) and (m, column) in table.cells]
    if not others:
        return None
    top = max(display_key(table.cells[m, column]) for m in others)
    return next(m for m in others if display_key(table.cells[m, column]) == top)


def _compare(table: GroupTable, column: str) -> None:
    """Fill ``against`` and ``bold`` of one column."""
    for method in (m for m in table.methods if m != BASE_METHOD and (m, column) in table.cells):
        reference = best_other(table, method, column)
        if reference is None and BASE_METHOD in table.values:
            reference = BASE_METHOD  # no other method competes: is it above the reference at least?
        if reference is None:
            continue
        interval = table.interval(method, reference, column)
        if interval is not None:
            table.against[method, column] = (reference, interval)
    best = table.best.get(column, set())
    supported = {m for m in best if (m, column) in table.against and table.against[m, column][1].above_zero}
    table.bold[column] = best & supported if len(best) == 1 else set()  # a tie on the printed value: no winner


def group_table(records: Sequence[Record], *, pool: str, metric: str, budget: Budget) -> GroupTable:
    """The per-group table of one pool, metric and budget.

    Rows are the methods evaluated at ``budget`` plus the budget-independent ones (``budget`` null, e.g.
    ``"base"``). Cell = mean over seeds of (mean over the group's clients) +- sample SD over seeds; ``Mean`` =
    the same over all clients of the pool. ``"base"`` is the reference and competes for neither best nor Wins. A
    best cell is bold, and a Win, only where the 95 % interval of its method minus the next best method (paired
    differences over the column's clients, :mod:`.intervals`) lies above 0.

    Args:
        records: result records (e.g. from :func:`read_records`); only the ``test`` split is used.
        pool: ``"seen"``, ``"unseen"`` or ``"all"``.
        metric: metric name (``"accuracy"``, ``"meteor"``, ...).
        budget: rank, tier name, or ``None`` for runs without budgets.

    Returns:
        The table, with values in [0, 1] (rendering multiplies by 100).
    """
    selected = [r for r in records if r["pool"] == pool and r["metric"] == metric and is_test(r)]
    rows, row_budgets = _rows_for_budget(selected, budget)
    groups = first_seen(r["group"] for method_records in rows.values() for r in method_records)
    table = GroupTable(pool, metric, budget, list(rows), row_budgets, groups)
    for method, method_records in rows.items():
        for column, per_seed in _per_seed_means(method_records).items():
            table.cells[method, column] = over_seeds(list(per_seed.values()))
        table.values[method] = {(r["client"], r["seed"]): float(r["value"]) for r in method_records}
        table.client_groups.update((r["client"], r["group"]) for r in method_records)
    for client, group in table.client_groups.items():
        table.group_clients.setdefault(group, []).append(client)
    for column in [*groups, MEAN_COLUMN]:
        table.best[column] = _best_methods(table.cells, table.methods, column)
        _compare(table, column)
    table.wins = {
        method: sum(method in table.bold[group] for group in groups)
        for method in table.methods
        if method != BASE_METHOD
    }
    return table


@dataclass(frozen=True)
class ResultTable:
    """One per-group table of a report as printed: its table, the Wins it prints (``wins``: the combined Wins
    of a generation benchmark's METEOR, ROUGE-1 and ROUGE-L tables, else ``None`` for the table's own) and why it
    rests on too little to call a winner (``thin``, set by :func:`fedpeft.report.evidence.judged_tables`; empty:
    enough, and its bold cells, :attr:`GroupTable.bold`, print bold)."""

    table: GroupTable
    wins: Mapping[str, int] | None = None
    thin: tuple[str, ...] = ()

    @property
    def printed_wins(self) -> Mapping[str, int]:
        """The Wins column: ``wins`` when given, else the table's own."""
        return self.table.wins if self.wins is None else self.wins

    @property
    def emphasis(self) -> bool:
        """Whether its :attr:`GroupTable.bold` cells print bold and its Wins as findings (not on thin evidence)."""
        return not self.thin


def result_tables(results: Sequence[Record]) -> list[ResultTable]:
    """Every per-group table of a report, in the summary's order: per pool, per budget (``None`` when there is no
    budget), per metric; tables without rows left out. With METEOR, ROUGE-1 and ROUGE-L all measured, their tables
    print the combined Wins (:func:`combined_wins`)."""
    metrics = metric_order(results)
    combined = list(GENERATION_METRICS) if set(GENERATION_METRICS) <= set(metrics) else []
    found = []
    for pool in pool_order(results):
        pool_records = [r for r in results if r["pool"] == pool]
        for budget in budget_order(pool_records) or [None]:
            tables = {m: group_table(pool_records, pool=pool, metric=m, budget=budget) for m in metrics}
            wins = combined_wins([tables[m] for m in combined]) if combined else None
            for metric, table in tables.items():
                if table.methods:
                    found.append(ResultTable(table, wins if metric in combined else None))
    return found


def combined_wins(tables: Sequence[GroupTable], min_best: int = GENERATION_MIN_BEST) -> dict[str, int]:
    """Wins over several metrics of the same pool and budget: groups where a method is bold (best, its interval
    against the next best above 0) in ``min_best``.

    Generation benchmarks use the three tables of METEOR, ROUGE-1 and ROUGE-L with ``min_best = 2``.
    """
    methods = first_seen(m for table in tables for m in table.methods if m != BASE_METHOD)
    groups = first_seen(g for table in tables for g in table.groups)
    return {
        method: sum(sum(method in table.bold.get(group, set()) for table in tables) >= min_best for group in groups)
        for method in methods
    }


def format_cell(cell: Cell | None, *, signed: bool = False) -> str:
    """x100 with two decimals, ``mean ± sd``; ``—`` where there is no data."""
    if cell is None:
        return "—"
    text = f"{cell.mean * 100:+.2f}" if signed else f"{cell.mean * 100:.2f}"
    if cell.sd is not None:
        text += f" ± {cell.sd * 100:.2f}"
    return text


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table of ``header`` and ``rows`` (cells as given)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def wins_header(emphasis: bool = True) -> str:
    """The Wins column's heading: ``Wins``, or ``Wins (n.s.)`` (not significant) on thin evidence."""
    return WINS_COLUMN if emphasis else f"{WINS_COLUMN} ({NOT_SIGNIFICANT})"


def render_group_table(table: GroupTable, wins: Mapping[str, int] | None = None, *, emphasis: bool = True) -> str:
    """Markdown of a :class:`GroupTable`: values x100, bold cells (:attr:`GroupTable.bold`), a Wins column; a
    table of more than :data:`MAX_GROUP_COLUMNS` groups as :func:`render_group_distribution`.

    Args:
        table: the table.
        wins: Wins to print instead of the table's own (e.g. :func:`combined_wins` for generation).
        emphasis: ``False`` on thin evidence (:attr:`ResultTable.emphasis`): no cell bold, the Wins column headed
            ``Wins (n.s.)``; the numbers stay.
    """
    if table.summarized:
        return render_group_distribution(table, wins, emphasis=emphasis)
    wins = table.wins if wins is None else wins
    columns = [*table.groups, MEAN_COLUMN]
    rows = []
    for method in table.methods:
        row = [method]
        for column in columns:
            text = format_cell(table.cells.get((method, column)))
            row.append(f"**{text}**" if emphasis and method in table.bold.get(column, set()) else text)
        row.append(str(wins[method]) if method in wins else "—")
        rows.append(row)
    return markdown_table(["Method", *columns, wins_header(emphasis)], rows)


# ----------------------------------------------------------------------------------------------------------
# Tables of many groups: the distribution over the groups


@dataclass(frozen=True)
class GroupSpread:
    """The distribution of one row's group cells (each the mean over seeds of the group's mean), in metric units:
    the 10th percentile, median and 90th percentile over the groups (linearly interpolated, as ``numpy.quantile``),
    and the lowest and highest group with its value (the first in column order on a tie)."""

    groups: int
    p10: float
    median: float
    p90: float
    lowest: tuple[str, float]
    highest: tuple[str, float]


def _quantile(ordered: Sequence[float], fraction: float) -> float:
    position = fraction * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def group_spread(table: GroupTable, method: str) -> GroupSpread | None:
    """The :class:`GroupSpread` of ``method``'s row of ``table``; ``None`` where it has no group cell."""
    found = [(group, table.cells[method, group].mean) for group in table.groups if (method, group) in table.cells]
    if not found:
        return None
    ordered = sorted(value for _, value in found)
    lowest = min(found, key=lambda item: item[1])
    highest = max(found, key=lambda item: item[1])
    return GroupSpread(
        len(found), _quantile(ordered, 0.1), _quantile(ordered, 0.5), _quantile(ordered, 0.9), lowest, highest
    )


def group_unit(table: GroupTable) -> str:
    """``client`` when every group of ``table`` is one client (a dataset whose groups are its clients), else
    ``group``: what a summarized table's columns speak of."""
    one_each = all(len(clients) == 1 for clients in table.group_clients.values())
    return "client" if table.group_clients and one_each else "group"


def distribution_header(table: GroupTable) -> list[str]:
    """The columns of a summarized table between ``Mean`` and Wins (:func:`distribution_cells`)."""
    unit = group_unit(table)
    return ["p10", "median", "p90", f"lowest {unit}", f"highest {unit}"]


def distribution_cells(table: GroupTable, method: str) -> list[str]:
    """A summarized table's cells of ``method`` between ``Mean`` and Wins: its :class:`GroupSpread`, x100 with two
    decimals, the lowest and highest group named (``c00017 31.20``); ``—`` without group cells."""
    spread = group_spread(table, method)
    if spread is None:
        return ["—"] * 5
    quantiles = [f"{value * 100:.2f}" for value in (spread.p10, spread.median, spread.p90)]
    return [*quantiles, *(f"{name} {value * 100:.2f}" for name, value in (spread.lowest, spread.highest))]


def render_group_distribution(
    table: GroupTable, wins: Mapping[str, int] | None = None, *, emphasis: bool = True
) -> str:
    """Markdown of a table of more than :data:`MAX_GROUP_COLUMNS` groups: per method its ``Mean`` (bold as in
    :func:`render_group_table`), the distribution over its groups (:func:`distribution_cells`) and its Wins.
    Its width does not grow with the groups."""
    wins = table.wins if wins is None else wins
    rows = []
    for method in table.methods:
        text = format_cell(table.cells.get((method, MEAN_COLUMN)))
        bold = emphasis and method in table.bold.get(MEAN_COLUMN, set())
        rows.append(
            [
                method,
                f"**{text}**" if bold else text,
                *distribution_cells(table, method),
                str(wins[method]) if method in wins else "—",
            ]
        )
    return markdown_table(["Method", MEAN_COLUMN, *distribution_header(table), wins_header(emphasis)], rows)


# ----------------------------------------------------------------------------------------------------------
# Gain over base


def gain_over_base(records: Sequence[Record], *, pool: str, metric: str) -> dict[tuple[str, Budget], Cell]:
    """Personalization gain of every non-base method and budget over ``"base"``.

    Per seed: mean over the pool's clients of (method's metric - base metric of the same client and seed),
    counting only clients that have both; then mean +- sample SD over seeds.

    Returns:
        ``(method, budget) -> Cell`` (values in metric units, not x100); empty without base records.
    """
    selected = [r for r in records if r["pool"] == pool and r["metric"] == metric and is_test(r)]
    base = {(r["client"], r["seed"]): float(r["value"]) for r in selected if r["method"] == BASE_METHOD}
    differences: dict[tuple[str, Budget], dict[int, list[float]]] = {}
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


def gain_layout(gains: Mapping[tuple[str, Budget], Cell], records: Sequence[Record]) -> tuple[list[str], list[Budget]]:
    """The rows (methods) and columns (budgets, ``None`` last for budget-less methods) of a gain table."""
    methods = [m for m in method_order(records) if any(key[0] == m for key in gains)]
    budgets: list[Budget] = [b for b in budget_order(records) if any(key[1] == b for key in gains)]
    if any(key[1] is None for key in gains):
        budgets.append(None)
    return methods, budgets


def render_gain_table(gains: Mapping[tuple[str, Budget], Cell], records: Sequence[Record]) -> str:
    """Markdown of :func:`gain_over_base`: a row per method, a column per budget (x100, signed)."""
    methods, budgets = gain_layout(gains, records)
    rows = [
        [method, *(format_cell(gains.get((method, budget)), signed=True) for budget in budgets)] for method in methods
    ]
    return markdown_table(["Method", *map(budget_label, budgets)], rows)
