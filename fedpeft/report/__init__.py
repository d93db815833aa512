"""Paper-style reports of one or more runs: per-group tables with Wins, gain over base, costs, plots.

Everything here reads the run directory contract (``results.jsonl``, ``costs.jsonl``, ``config.yaml``;
docs/outputs.md) and nothing else, so a report can be rebuilt from finished runs, and several runs (e.g. one per
seed or per method) can be merged into one report. Methods add their own sections and plots through the
reporting hooks of their class (``Method.report_sections``, ``Method.report_plots``; :mod:`.method_hooks`).

Modules: :mod:`.records` (reading and merging runs, orders, labels), :mod:`.tables` (statistics over seeds,
per-group tables, Wins, gain over base), :mod:`.costs`, :mod:`.continual`, :mod:`.plots`, :mod:`.sweeps`,
:mod:`.summary` (``summary.md``); :mod:`.merge_plots` and :mod:`.scale_plots` hold the reports of Potara and of
the BayesTune methods, called by their hooks.
"""

from fedpeft.report.continual import continual_cells, continual_sections, read_round_records, render_continual_table
from fedpeft.report.costs import cost_cells, render_compute_table, render_cost_tables, render_failures
from fedpeft.report.plots import write_plots
from fedpeft.report.records import budget_label, budget_order, method_order, metric_label, read_records
from fedpeft.report.summary import render_info, write_summary
from fedpeft.report.sweeps import method_sweeps, write_sweep_plots
from fedpeft.report.tables import (
    Cell,
    GroupTable,
    combined_wins,
    gain_over_base,
    group_table,
    over_seeds,
    render_group_table,
)

__all__ = [
    "Cell",
    "GroupTable",
    "budget_label",
    "budget_order",
    "combined_wins",
    "continual_cells",
    "continual_sections",
    "cost_cells",
    "gain_over_base",
    "group_table",
    "method_order",
    "method_sweeps",
    "metric_label",
    "over_seeds",
    "read_records",
    "read_round_records",
    "render_compute_table",
    "render_continual_table",
    "render_cost_tables",
    "render_failures",
    "render_group_table",
    "render_info",
    "write_plots",
    "write_summary",
    "write_sweep_plots",
]
