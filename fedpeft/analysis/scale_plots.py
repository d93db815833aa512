"""The plots of the clients' BayesTune rank scales (FedP2EFT paper, Section 4.5), for ``fedp2eft`` and
``bayestune_lora``: the rank structure per budget and the language-distance matrix.

The reporting hook both methods declare (their ``report_plots`` is :func:`rank_scale_plots`); the data
come from :mod:`fedpeft.analysis.scales`. numpy and matplotlib only, no torch.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import numpy as np

from fedpeft.analysis.scales import ScaleRecord, language_distances, rank_structure, read_scales
from fedpeft.core.figures import save_figure

MAX_COLUMNS = 4  # rank-structure panels per row
UNDEFINED = "n/a"


def _title(text: str, width_inches: float) -> str:
    """``text`` wrapped to the figure's width (about 11 characters of a medium font per inch), so it is never cut."""
    return textwrap.fill(text, width=max(20, int(width_inches * 11)))


def _heatmap(axes, matrix, rows, columns, *, fmt: str, cmap: str, vmin=None, vmax=None):  # noqa: ANN001, ANN202
    """A heatmap with the values written in its cells; undefined (NaN or infinite) cells gray, marked ``n/a``."""
    from matplotlib import colormaps

    values = np.ma.masked_invalid(np.asarray(matrix, dtype=float))
    colors = colormaps[cmap].with_extremes(bad="#d9d9d9")
    if values.count() == 0:  # nothing defined: a neutral scale instead of matplotlib's empty one
        vmin, vmax = (0.0, 1.0) if vmin is None or vmax is None else (vmin, vmax)
    image = axes.imshow(values, aspect="auto", cmap=colors, vmin=vmin, vmax=vmax)
    axes.set_xticks(range(len(columns)), columns, rotation=45, ha="right", fontsize="small")
    axes.set_yticks(range(len(rows)), rows, fontsize="small")
    if len(rows) * len(columns) <= 400:
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                if not math.isfinite(value):
                    axes.text(j, i, UNDEFINED, ha="center", va="center", fontsize=7, color="#555555")
                    continue
                red, green, blue, _ = image.cmap(image.norm(value))
                color = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"
                axes.text(j, i, format(value, fmt), ha="center", va="center", fontsize=7, color=color)
    return image


def plot_rank_structure(records: Sequence[ScaleRecord], budgets: Sequence[int], path: Path, title: str) -> list[Path]:
    """Heatmaps (one per budget, at most four in a row) of the mean ranks kept per layer and module type; returns
    the files written (one per plot format)."""
    from matplotlib.figure import Figure

    r_init = int(records[0].scales.shape[1])
    columns = min(MAX_COLUMNS, len(budgets))
    rows = math.ceil(len(budgets) / columns)
    width = 5.0 * columns + 1.0
    figure = Figure(figsize=(width, 4.5 * rows))
    for index, budget in enumerate(budgets):
        layers, kinds, matrix = rank_structure(records, budget)
        axes = figure.add_subplot(rows, columns, index + 1)
        image = _heatmap(axes, matrix, [f"layer {x}" for x in layers], kinds, fmt=".1f", cmap="viridis", vmin=0,
                         vmax=r_init)  # fmt: skip
        axes.set_title(f"r = {budget}", fontsize="medium")
        figure.colorbar(image, ax=axes, label="kept ranks (mean over clients)")
    figure.suptitle(_title(title, width), fontsize="medium")
    figure.tight_layout()
    return save_figure(figure, path)


DISTANCE_LABEL = "distance between groups' scales, relative to within groups (log; lower = more similar)"
"""The colour bar of the lambda-distance plot: 0 is as far apart as two clients of the same group."""


def plot_language_distances(
    records: Sequence[ScaleRecord], path: Path, title: str, order: Sequence[str] = ()
) -> list[Path]:
    """Heatmap of :func:`language_distances` (smaller: more similar scales), groups in ``order`` (the result
    tables'); returns the files written.

    Undefined entries (a group with a single client, or clients whose scales are all equal, so that a distance
    of 0 divides) are gray cells marked ``n/a``, explained under the plot.
    """
    from matplotlib.figure import Figure

    groups, matrix = language_distances(records, order)
    width = max(6.0, 0.55 * len(groups) + 3.0)
    figure = Figure(figsize=(width, max(4.0, 0.5 * len(groups) + 2.0)))
    axes = figure.add_subplot()
    image = _heatmap(axes, matrix, groups, groups, fmt=".2f", cmap="magma_r")
    if any(math.isfinite(value) for row in matrix for value in row):
        figure.colorbar(image, ax=axes, label=textwrap.fill(DISTANCE_LABEL, 45))
    axes.set_title(_title(title, width * 0.75), fontsize="medium")
    if any(not math.isfinite(value) for row in matrix for value in row):
        if all(np.array_equal(r.scales, records[0].scales) for r in records):
            note = f"{UNDEFINED}: every client has the same scales, so every distance is 0 and no ratio is defined"
        else:
            note = f"{UNDEFINED}: undefined (a group with one client, or a group whose clients' scales are equal)"
        figure.text(0.01, 0.01, _title(note, width * 1.4), fontsize="x-small", color="#555555", va="bottom")
        figure.tight_layout(rect=(0, 0.06, 1, 1))
    else:
        figure.tight_layout()
    return save_figure(figure, path)


def _result_records(run_dirs: Sequence[Path]) -> Iterator[dict]:
    """The records of the runs' ``results.jsonl`` files, in order (lines that are not JSON objects skipped)."""
    for run_dir in run_dirs:
        results = Path(run_dir) / "results.jsonl"
        if results.is_file():
            for line in results.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    yield record


def run_groups(run_dirs: Sequence[Path]) -> list[str]:
    """The groups of the runs' ``results.jsonl`` records in first-seen order: the result tables' column order."""
    groups = (record.get("group") for record in _result_records(run_dirs))
    return list(dict.fromkeys(group for group in groups if isinstance(group, str)))


def run_budgets(run_dirs: Sequence[Path], method: str) -> list[int]:
    """The rank budgets of ``method`` in the runs: its ``results.jsonl`` records' budgets, else the runs'
    ``config.yaml`` ``budgets`` (ascending, integers only)."""
    budgets: set[int] = set()
    for record in _result_records(run_dirs):
        budget = record.get("budget")
        if record.get("method") == method and isinstance(budget, int) and not isinstance(budget, bool):
            budgets.add(budget)
    if budgets:
        return sorted(budgets)
    import yaml

    for run_dir in run_dirs:
        config = Path(run_dir) / "config.yaml"
        if config.is_file():
            given = (yaml.safe_load(config.read_text()) or {}).get("budgets") or []
            budgets.update(b for b in given if isinstance(b, int) and not isinstance(b, bool))
    return sorted(budgets)


def write_scale_plots(
    run_dirs: Sequence[Path] | Path, out_dir: Path, methods: Collection[str] | None = None
) -> list[Path]:
    """Per method with saved scales (of ``methods`` only, when given): ``rank_structure_<method>.png`` (one panel
    per budget of the run, :func:`run_budgets`, up to the scales' ``r_max``) and ``lambda_distance_<method>.png``
    in ``out_dir``, each in every current plot format; returns the files written."""
    dirs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs]
    records = [r for d in dirs for r in read_scales(d) if methods is None or r.method in methods]
    written: list[Path] = []
    for method in dict.fromkeys(r.method for r in records):
        mine = [r for r in records if r.method == method]
        r_max = max(r.r_max for r in mine)
        budgets = [b for b in run_budgets(dirs, method) if 0 < b <= r_max] or [r_max]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", method)
        out_dir.mkdir(parents=True, exist_ok=True)
        title = f"{method}: rank structure ({len(mine)} client scales)"
        written += plot_rank_structure(mine, budgets, out_dir / f"rank_structure_{name}.png", title)
        title = f"{method}: distance of the clients' lambda (rank scales) between groups"
        written += plot_language_distances(mine, out_dir / f"lambda_distance_{name}.png", title, run_groups(dirs))
    return written


def rank_scale_plots(records: Sequence[dict], run_dirs: Sequence[Path], out_dir: Path) -> list[Path]:
    """The ``report_plots`` hook of the BayesTune methods: :func:`write_scale_plots` of the methods (labels) of
    ``records``."""
    return write_scale_plots(run_dirs, out_dir, methods={r["method"] for r in records})
