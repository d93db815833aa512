"""The summary's result tables as files for papers and further analysis: one tidy CSV, and LaTeX tables.

Both hold the tables of ``summary.md``'s results, computed the same way (:func:`~fedpeft.report.evidence.judged_tables`
and :func:`~fedpeft.report.tables.gain_over_base`): every per-group table (pool, budget, metric) and every gain
over base table (pool, metric). The CSV also gives each cell's paired difference with its reference and the 95 %
interval (:mod:`.intervals`). ``fedpeft report --csv`` and ``--latex`` write them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedpeft.core.errors import UserError
from fedpeft.core.io import write_text_atomic
from fedpeft.report.differences import gain_intervals
from fedpeft.report.evidence import judged_tables, per_client_test_examples
from fedpeft.report.intervals import Interval
from fedpeft.report.records import (
    BASE_METHOD,
    Budget,
    Record,
    budget_label,
    is_test,
    metric_label,
    metric_order,
    pool_label,
    pool_order,
    read_records,
)
from fedpeft.report.tables import (
    MEAN_COLUMN,
    Cell,
    distribution_cells,
    distribution_header,
    format_cell,
    gain_layout,
    gain_over_base,
    group_unit,
    over_seeds,
    wins_header,
)

CSV_FILE = "summary.csv"
# Every client's value beside summary.md, where a table has too many groups to print a column each.
CLIENTS_FILE = "clients.csv"
CLIENT_FIELDS = ("pool", "metric", "budget", "method", "group", "client", "mean", "sd", "seeds")
LATEX_FILE = "summary.tex"
LATEX_FIRST_LINE = "% fedpeft result tables; needs \\usepackage{booktabs} and \\usepackage{graphicx}"
CSV_FIELDS = (
    "table", "pool", "metric", "budget", "method", "column", "mean", "sd", "seeds", "best", "wins", "text", "evidence",
    "reference", "difference", "low", "high", "clients",
)  # fmt: skip
# Shrinks a tabular wider than the text to the text's width, and leaves a narrower one at its natural size.
FIT_TO_PAGE = r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%"


def _budget_value(budget: Budget) -> str:
    return "" if budget is None else str(budget)


def _number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _cell_fields(cell: Cell | None, *, signed: bool = False) -> dict[str, str]:
    if cell is None:
        return {"mean": "", "sd": "", "seeds": "", "text": "—"}
    return {
        "mean": _number(cell.mean * 100),
        "sd": _number(None if cell.sd is None else cell.sd * 100),
        "seeds": str(cell.seeds),
        "text": format_cell(cell, signed=signed),
    }


def _interval_fields(reference: str | None, interval: Interval | None) -> dict[str, str]:
    if reference is None or interval is None:
        return {"reference": "", "difference": "", "low": "", "high": "", "clients": ""}
    return {
        "reference": reference,
        "difference": _number(interval.mean * 100),
        "low": _number(None if interval.low is None else interval.low * 100),
        "high": _number(None if interval.high is None else interval.high * 100),
        "clients": str(interval.clients),
    }


def table_rows(results: Sequence[Record], test_per_client: Mapping[str, float] | None = None) -> list[dict[str, str]]:
    """The result tables as tidy rows (:data:`CSV_FIELDS`), one per printed cell, values x100.

    Per-group tables give ``table = results``, the table's ``budget`` (empty without one), one row per method and
    column (a group or ``Mean``), with ``best`` (``1`` for a bold cell), the row's ``wins`` (empty for ``base``) and
    ``evidence``: why the table rests on too little to call a winner (``one seed``, ``few test examples``, joined
    with ``; ``; empty when it does not; such a table has no bold cell). Gain tables give ``table = gain``,
    ``budget`` and ``column`` the budget of the cell (``no budget`` for budget-less methods). ``mean`` and ``sd``
    are unrounded; ``text`` is the cell as ``summary.md`` prints it (without bold). ``reference``, ``difference``,
    ``low``, ``high`` and ``clients``: the paired difference of the row's method minus ``reference`` over the
    column's clients, its 95 % interval and n (:mod:`.intervals`), x100, unrounded; the reference is the best other
    method of the column (:attr:`~fedpeft.report.tables.GroupTable.against`, what decides bold) in the per-group
    tables and ``base`` in the gain tables; all empty for ``base`` and without a pair, ``low`` and ``high`` with
    one client.

    Args:
        results: result records.
        test_per_client: the runs' test examples per client per pool
            (:func:`~fedpeft.report.evidence.per_client_test_examples`); ``None`` judges the evidence on seeds alone.
    """
    rows: list[dict[str, str]] = []
    for found in judged_tables(results, test_per_client):
        table = found.table
        wins = found.printed_wins
        for method in table.methods:
            for column in [*table.groups, MEAN_COLUMN]:
                rows.append(
                    {
                        "table": "results",
                        "pool": table.pool,
                        "metric": table.metric,
                        "budget": _budget_value(table.budget),
                        "method": method,
                        "column": column,
                        **_cell_fields(table.cells.get((method, column))),
                        "best": "1" if found.emphasis and method in table.bold.get(column, set()) else "0",
                        "wins": str(wins[method]) if method in wins else "",
                        "evidence": "; ".join(found.thin),
                        **_interval_fields(*table.against.get((method, column), (None, None))),
                    }
                )
    for pool in pool_order(results):  # as summary.md's gain section
        for metric in metric_order(results):
            gains = gain_over_base(results, pool=pool, metric=metric)
            intervals = gain_intervals(results, pool=pool, metric=metric)
            methods, budgets = gain_layout(gains, results)
            for method in methods:
                for budget in budgets:
                    rows.append(
                        {
                            "table": "gain",
                            "pool": pool,
                            "metric": metric,
                            "budget": _budget_value(budget),
                            "method": method,
                            "column": budget_label(budget),
                            **_cell_fields(gains.get((method, budget)), signed=True),
                            "best": "",
                            "wins": "",
                            "evidence": "",
                            **_interval_fields(BASE_METHOD, intervals.get((method, budget))),
                        }
                    )
    return rows


def render_csv(results: Sequence[Record], test_per_client: Mapping[str, float] | None = None) -> str:
    """The CSV text of :func:`table_rows` (a header line, then one line per cell)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table_rows(results, test_per_client))
    return buffer.getvalue()


def client_rows(results: Sequence[Record]) -> list[dict[str, str]]:
    """Every client's value per pool, metric, method and budget (:data:`CLIENT_FIELDS`): its mean over seeds and
    sample SD (x100, unrounded; ``sd`` empty with one seed) and the seeds; the test split only. Pools and metrics in
    the summary's order, then methods, budgets and clients in first-seen order."""
    per_client: dict[tuple[str, str, str, Budget, str], list[float]] = {}
    groups: dict[str, str] = {}
    for record in (r for r in results if is_test(r)):
        key = (record["pool"], record["metric"], record["method"], record.get("budget"), record["client"])
        per_client.setdefault(key, []).append(float(record["value"]))
        groups[record["client"]] = record["group"]
    pools = {pool: index for index, pool in enumerate(pool_order(results))}
    metrics = {metric: index for index, metric in enumerate(metric_order(results))}
    keys = sorted(per_client, key=lambda key: (pools[key[0]], metrics[key[1]]))  # stable: first-seen order within
    rows = []
    for pool, metric, method, budget, client in keys:
        cell = over_seeds(per_client[pool, metric, method, budget, client])
        rows.append(
            {
                "pool": pool,
                "metric": metric,
                "budget": _budget_value(budget),
                "method": method,
                "group": str(groups[client]),
                "client": client,
                "mean": _number(cell.mean * 100),
                "sd": _number(None if cell.sd is None else cell.sd * 100),
                "seeds": str(cell.seeds),
            }
        )
    return rows


def render_client_csv(results: Sequence[Record]) -> str:
    """The CSV text of :func:`client_rows` (a header line, then one line per client, method and budget)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CLIENT_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(client_rows(results))
    return buffer.getvalue()


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_LATEX_SPECIAL.get(char, char) for char in str(text))


def _latex_cell(text: str, *, bold: bool = False) -> str:
    if text == "—":
        return "---"
    cell = latex_escape(text).replace(" ± ", r" $\pm$ ")
    return rf"\textbf{{{cell}}}" if bold else cell


def _latex_table(caption: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        r"\begin{table}[ht]",
        r"\centering",
        rf"\caption{{{caption}}}",
        FIT_TO_PAGE,
        r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in header) + r" \\",
        r"\midrule",
        *(" & ".join(row) + r" \\" for row in rows),
        r"\bottomrule",
        r"\end{tabular}}",
        r"\end{table}",
    ]
    return "\n".join(lines)


def render_latex(results: Sequence[Record], test_per_client: Mapping[str, float] | None = None) -> str:
    """LaTeX of the result tables: one ``table`` with a booktabs ``tabular`` per per-group table and per gain
    table, the cells as ``summary.md`` prints them (x100, ``mean $\\pm$ SD``, best in bold, ``---`` for no data).

    Each tabular sits in a ``\\resizebox`` that shrinks it to ``\\linewidth`` when it is wider (many groups) and
    leaves it as it is otherwise, so every table fits the page. A table on thin evidence (``test_per_client``: as
    for :func:`table_rows`) has no bold cell, a ``Wins (n.s.)`` column and a caption that says why. Needs
    ``\\usepackage{booktabs}`` and ``\\usepackage{graphicx}``."""
    parts = [LATEX_FIRST_LINE]
    for found in judged_tables(results, test_per_client):
        table = found.table
        wins = found.printed_wins
        # More groups than a page holds: the Mean and the distribution over the groups, as summary.md prints them.
        columns = [MEAN_COLUMN] if table.summarized else [*table.groups, MEAN_COLUMN]
        rows = []
        for method in table.methods:
            row = [latex_escape(method)]
            for column in columns:
                bold = found.emphasis and method in table.bold.get(column, set())
                row.append(_latex_cell(format_cell(table.cells.get((method, column))), bold=bold))
            if table.summarized:
                row += [_latex_cell(text) for text in distribution_cells(table, method)]
            row.append(str(wins[method]) if method in wins else "---")
            rows.append(row)
        if table.summarized:
            columns += distribution_header(table)
        where = pool_label(table.pool)
        if table.budget is not None:
            where += f", {budget_label(table.budget)}"
        caption = f"{where}: {metric_label(table.metric)} (x100, mean ± SD over seeds)."
        if table.summarized:
            caption += f" Over its {len(table.groups)} {group_unit(table)}s: 10th percentile, median, 90th percentile."
        if found.thin:
            reasons = ", ".join(found.thin)
            caption += f" Too little evidence to call a winner ({reasons}): no bold; Wins not significant."
        header = ["Method", *columns, wins_header(found.emphasis)]
        parts.append(_latex_table(latex_escape(caption).replace("±", r"$\pm$"), header, rows))
    for pool in pool_order(results):  # as summary.md's gain section
        for metric in metric_order(results):
            gains = gain_over_base(results, pool=pool, metric=metric)
            if not gains:
                continue
            methods, budgets = gain_layout(gains, results)
            rows = [
                [latex_escape(m), *(_latex_cell(format_cell(gains.get((m, b)), signed=True)) for b in budgets)]
                for m in methods
            ]
            caption = latex_escape(f"{pool_label(pool)}: gain over base, {metric_label(metric)} (x100).")
            parts.append(_latex_table(caption, ["Method", *map(budget_label, budgets)], rows))
    return "\n\n".join(parts) + "\n"


def table_file(out: Path, suffix: str) -> Path:
    """The file ``--csv`` (``suffix`` ``.csv``) or ``--latex`` (``.tex``) writes for ``out``: ``out`` itself when it
    ends in ``suffix``, else ``summary.csv`` or ``summary.tex`` in the directory ``out``."""
    return _target(out, CSV_FILE if suffix == ".csv" else LATEX_FILE, suffix)


def is_table_file(first_line: str) -> bool:
    """Whether a file beginning with ``first_line`` is one :func:`write_csv` or :func:`write_latex` wrote."""
    return first_line in (",".join(CSV_FIELDS), LATEX_FIRST_LINE)


def _target(out: Path, default_name: str, suffix: str) -> Path:
    out = Path(out)
    if out.suffix == suffix:
        return out
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file; give a directory or a path ending in {suffix}.")
    return out / default_name


def write_csv(run_dirs: Sequence[Path], out: Path) -> Path:
    """Write :func:`render_csv` of the merged runs to ``out`` (a ``.csv`` file, or a directory that receives
    ``summary.csv``); returns the file."""
    run_dirs = [Path(d) for d in run_dirs]
    results, _ = read_records(run_dirs)
    target = _target(out, CSV_FILE, ".csv")
    write_text_atomic(target, render_csv(results, per_client_test_examples(run_dirs)))
    return target


def write_latex(run_dirs: Sequence[Path], out: Path) -> Path:
    """Write :func:`render_latex` of the merged runs to ``out`` (a ``.tex`` file, or a directory that receives
    ``summary.tex``); returns the file."""
    run_dirs = [Path(d) for d in run_dirs]
    results, _ = read_records(run_dirs)
    target = _target(out, LATEX_FILE, ".tex")
    write_text_atomic(target, render_latex(results, per_client_test_examples(run_dirs)))
    return target
