"""The report of merging methods (Potara, Fisher merging): the mixing weights per client and the mixing-weight plot.

Their reporting hooks, which both declare: ``report_sections`` is :func:`mixing_report_sections`,
``report_plots`` :func:`mixing_report_plots`. A merging method reports per client the weight
it chose (``alpha``, or per factor / module; Fisher merging ``fisher_weight_mean``) as ``personalize`` records of
``results.jsonl``; run with ``grid_search: true`` it also reports the test metric of the merged model at every grid
weight (``test_<metric>@<alpha>``) and the weight the grid search picked on held-out data (``alpha_grid``). The plot
(Potara's paper Fig. 3c / 4) has one panel per client, metric against alpha, the closed-form alpha dashed.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from fedpeft.core.figures import save_figure

_GRID_METRIC = re.compile(r"^test_(?P<metric>.+)@(?P<alpha>[0-9.eE+-]+)$")


class GridCurve(TypedDict):
    """One client's merged model on the grid: the test ``metric`` at each of the ``alphas`` (``values``, means over
    seeds), and the closed-form ``alpha`` and the grid search's ``alpha_grid`` (NaN where not reported)."""

    metric: str
    alphas: list[float]
    values: list[float]
    alpha: float
    alpha_grid: float


def grid_curves(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, GridCurve]]:
    """``method -> client -> {"metric", "alphas", "values", "alpha", "alpha_grid"}`` (means over seeds)."""
    raw: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        if r.get("split") != "personalize":
            continue
        entry = raw.setdefault(r["method"], {}).setdefault(r["client"], {"points": {}, "alpha": [], "alpha_grid": []})
        match = _GRID_METRIC.match(r["metric"])
        if match:
            entry["metric"] = match["metric"]
            entry["points"].setdefault(float(match["alpha"]), []).append(float(r["value"]))
        elif r["metric"] in ("alpha", "alpha_grid"):
            entry[r["metric"]].append(float(r["value"]))
    curves: dict[str, dict[str, GridCurve]] = {}
    for method, clients in raw.items():
        for client, entry in clients.items():
            if not entry["points"]:
                continue
            alphas = sorted(entry["points"])
            curves.setdefault(method, {})[client] = {
                "metric": entry["metric"],
                "alphas": alphas,
                "values": [statistics.fmean(entry["points"][a]) for a in alphas],
                "alpha": statistics.fmean(entry["alpha"]) if entry["alpha"] else math.nan,
                "alpha_grid": statistics.fmean(entry["alpha_grid"]) if entry["alpha_grid"] else math.nan,
            }
    return curves


def write_mixing_weight_plots(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """``mixing_weight_<method>.png`` for every method with grid-search records; returns the files written."""
    from matplotlib.figure import Figure

    written = []
    for method, clients in grid_curves(records).items():
        columns = min(4, len(clients))
        rows = math.ceil(len(clients) / columns)
        figure = Figure(figsize=(3.2 * columns, 2.6 * rows))
        for index, (client, curve) in enumerate(sorted(clients.items())):
            axes = figure.add_subplot(rows, columns, index + 1)
            axes.plot(curve["alphas"], [v * 100 for v in curve["values"]], marker="o", markersize=3)
            if not math.isnan(curve["alpha"]):
                axes.axvline(curve["alpha"], color="C3", linestyle="--", label=f"closed form {curve['alpha']:.2f}")
            if not math.isnan(curve["alpha_grid"]):
                axes.axvline(curve["alpha_grid"], color="C2", linestyle=":", label=f"grid {curve['alpha_grid']:.2f}")
            axes.set_title(client, fontsize="small")
            axes.set_xlabel("alpha (weight of the federated model)", fontsize="x-small")
            axes.set_ylabel(f"test {curve['metric']} (x100)", fontsize="x-small")
            axes.legend(fontsize="xx-small")
        figure.suptitle(f"{method}: merged model against the mixing weight (mean over seeds)", fontsize="small")
        figure.tight_layout()
        path = Path(out_dir) / f"mixing_weight_{re.sub(r'[^A-Za-z0-9_.-]+', '-', method)}.png"
        written += save_figure(figure, path, dpi=110)  # in every plot format of the report
    return written


def render_merge_facts(records: Sequence[dict[str, Any]]) -> str:
    """Markdown: the mixing weights merging methods chose, per client (mean over seeds); empty without any."""
    facts = ("alpha", "alpha_A", "alpha_B", "alpha_module_mean", "alpha_grid", "fisher_weight_mean")
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in records:
        if r.get("split") == "personalize" and r["metric"] in facts:
            values.setdefault((r["method"], r["client"]), {}).setdefault(r["metric"], []).append(float(r["value"]))
    if not values:
        return ""
    columns = [f for f in facts if any(f in v for v in values.values())]
    lines = ["| Method | Client | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for (method, client), by_fact in values.items():
        cells = [f"{statistics.fmean(by_fact[f]):.3f}" if f in by_fact else "—" for f in columns]
        lines.append(f"| {method} | {client} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mixing_weight_sections(records: Sequence[dict[str, Any]]) -> list[str]:
    """The ``Mixing weights`` section of ``summary.md`` (:func:`render_merge_facts`); empty without any weight."""
    facts = render_merge_facts(records)
    if not facts:
        return []
    intro = "Weight of the federated model per client (alpha; fisher_weight_mean: mean per-coordinate weight)."
    return ["## Mixing weights", intro, facts]


def mixing_report_sections(records: Sequence[dict[str, Any]], run_dirs: Sequence[Path]) -> list[str]:
    """The ``report_sections`` hook of the merging methods: :func:`mixing_weight_sections`."""
    return mixing_weight_sections(records)


def mixing_report_plots(records: Sequence[dict[str, Any]], run_dirs: Sequence[Path], out_dir: Path) -> list[Path]:
    """The ``report_plots`` hook of the merging methods: ``mixing_weight_<label>.png`` of every row run with
    ``grid_search: true`` (paper Fig. 3c; :func:`write_mixing_weight_plots`)."""
    return write_mixing_weight_plots(records, out_dir)
