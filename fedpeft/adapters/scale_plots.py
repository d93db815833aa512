"""The plots of the clients' BayesTune rank scales (FedP2EFT paper, Section 4.5), for ``fedp2eft`` and
``bayestune_lora``: the rank structure per budget and the language-distance matrix.

Called by ``BayesTuneMethod.report_plots``; the data come from :mod:`fedpeft.adapters.scale_analysis`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from pathlib import Path

from fedpeft.adapters.scale_analysis import ScaleRecord, language_distances, rank_structure, read_scales

STRUCTURE_BUDGETS = (2, 16)


def _heatmap(axes, matrix, rows, columns, *, fmt: str, cmap: str, vmin=None, vmax=None):  # noqa: ANN001, ANN202
    image = axes.imshow(matrix, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax)
    axes.set_xticks(range(len(columns)), columns, rotation=45, ha="right", fontsize="small")
    axes.set_yticks(range(len(rows)), rows, fontsize="small")
    if len(rows) * len(columns) <= 400:
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    red, green, blue, _ = image.cmap(image.norm(value))
                    color = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"
                    axes.text(j, i, format(value, fmt), ha="center", va="center", fontsize=7, color=color)
    return image


def plot_rank_structure(records: Sequence[ScaleRecord], budgets: Sequence[int], path: Path, title: str) -> None:
    """Heatmaps (one per budget) of the mean ranks kept per layer and module type."""
    from matplotlib.figure import Figure

    r_init = int(records[0].scales.shape[1])
    figure = Figure(figsize=(5.0 * len(budgets) + 1.0, 4.5))
    for column, budget in enumerate(budgets):
        layers, kinds, matrix = rank_structure(records, budget)
        axes = figure.add_subplot(1, len(budgets), column + 1)
        image = _heatmap(axes, matrix, [f"layer {x}" for x in layers], kinds, fmt=".1f", cmap="viridis", vmin=0,
                         vmax=r_init)  # fmt: skip
        axes.set_title(f"r = {budget}", fontsize="medium")
        figure.colorbar(image, ax=axes, label="kept ranks (mean over clients)")
    figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot_language_distances(records: Sequence[ScaleRecord], path: Path, title: str) -> None:
    """Heatmap of :func:`language_distances` (smaller: more similar scales)."""
    from matplotlib.figure import Figure

    groups, matrix = language_distances(records)
    figure = Figure(figsize=(max(4.0, 0.55 * len(groups) + 2.5), max(3.5, 0.5 * len(groups) + 1.5)))
    axes = figure.add_subplot()
    image = _heatmap(axes, matrix, groups, groups, fmt=".2f", cmap="magma_r")
    figure.colorbar(image, ax=axes, label="log(d(j,k) / sqrt(d(j,j) d(k,k)))")
    axes.set_title(title, fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def write_scale_plots(
    run_dirs: Sequence[Path] | Path, out_dir: Path, methods: Collection[str] | None = None
) -> list[Path]:
    """Per method with saved scales (of ``methods`` only, when given): ``rank_structure_<method>.png`` and
    ``lambda_distance_<method>.png`` in ``out_dir``; returns the files written."""
    dirs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs]
    records = [r for d in dirs for r in read_scales(d) if methods is None or r.method in methods]
    written: list[Path] = []
    for method in dict.fromkeys(r.method for r in records):
        mine = [r for r in records if r.method == method]
        budgets = [b for b in STRUCTURE_BUDGETS if b <= mine[0].r_max] or [mine[0].r_max]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", method)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"rank_structure_{name}.png"
        plot_rank_structure(mine, budgets, path, f"{method}: rank structure ({len(mine)} client scales)")
        written.append(path)
        path = out_dir / f"lambda_distance_{name}.png"
        plot_language_distances(mine, path, f"{method}: distance of the clients' lambda between groups")
        written.append(path)
    return written
