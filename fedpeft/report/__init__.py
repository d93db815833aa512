"""Paper-style reports of one or more runs: per-group tables with Wins, gain over base, costs, plots.

Everything here reads the run directory contract (``results.jsonl``, ``costs.jsonl``, ``config.yaml``,
``data.json``; docs/outputs.md) and nothing else, so a report can be rebuilt from finished runs, and several runs
(e.g. one per seed or per method) can be merged into one report. Methods add their own sections and plots through
the reporting hooks their registry declarations name (``report_sections``, ``report_plots``; :mod:`.method_hooks`).
Importing the package imports no torch, and a report of the methods fedpeft ships never does: their hooks are
functions of :mod:`fedpeft.analysis`, imported without the methods.

Modules: :mod:`.records` (reading and merging runs, orders, labels), :mod:`.tables` (statistics over seeds,
per-group tables, Wins, gain over base), :mod:`.intervals` (paired differences over clients and their 95 % t
interval, which decides bold and Wins), :mod:`.differences` (each method against ``base`` and the best other method,
with intervals; the summary's section of them), :mod:`.evidence` (tables that rest on too little to call a winner: one
seed, fewer than ``MIN_TEST_EXAMPLES`` test examples per client; the summary's Evidence note), :mod:`.costs`,
:mod:`.continual`, :mod:`.plots`, :mod:`.sweeps`, :mod:`.summary` (``summary.md``), :mod:`.export` (the result
tables as CSV and LaTeX). Every plot is saved in each
format of :func:`plot_formats` (:mod:`fedpeft.core.figures`). The reports of Potara and of the BayesTune methods
(:mod:`fedpeft.analysis.mixing`, :mod:`fedpeft.analysis.scale_plots`) are called by their hooks.
"""

from fedpeft.core.figures import PLOT_FORMATS, plot_formats, save_figure
from fedpeft.report.continual import (
    continual_cells,
    continual_client_values,
    continual_sections,
    read_round_records,
    render_continual_table,
)
from fedpeft.report.costs import cost_cells, render_compute_table, render_cost_tables, render_failures
from fedpeft.report.differences import comparisons, difference_sections, gain_intervals
from fedpeft.report.evidence import (
    MIN_TEST_EXAMPLES,
    evidence_note,
    judged_tables,
    per_client_test_examples,
)
from fedpeft.report.export import render_csv, render_latex, table_rows, write_csv, write_latex
from fedpeft.report.intervals import Interval, paired_interval
from fedpeft.report.plots import write_plots
from fedpeft.report.records import budget_label, budget_order, method_order, metric_label, read_records
from fedpeft.report.summary import data_sections, render_info, write_summary
from fedpeft.report.sweeps import method_sweeps, write_sweep_plots
from fedpeft.report.tables import (
    Cell,
    GroupTable,
    ResultTable,
    combined_wins,
    gain_over_base,
    group_table,
    over_seeds,
    render_group_table,
    result_tables,
)

__all__ = [
    "MIN_TEST_EXAMPLES",
    "PLOT_FORMATS",
    "Cell",
    "GroupTable",
    "Interval",
    "ResultTable",
    "budget_label",
    "budget_order",
    "combined_wins",
    "comparisons",
    "continual_cells",
    "continual_client_values",
    "continual_sections",
    "cost_cells",
    "data_sections",
    "difference_sections",
    "evidence_note",
    "gain_intervals",
    "gain_over_base",
    "group_table",
    "judged_tables",
    "method_order",
    "method_sweeps",
    "metric_label",
    "over_seeds",
    "paired_interval",
    "per_client_test_examples",
    "plot_formats",
    "read_records",
    "read_round_records",
    "render_compute_table",
    "render_continual_table",
    "render_cost_tables",
    "render_csv",
    "render_failures",
    "render_group_table",
    "render_info",
    "render_latex",
    "result_tables",
    "save_figure",
    "table_rows",
    "write_csv",
    "write_latex",
    "write_plots",
    "write_summary",
    "write_sweep_plots",
]
