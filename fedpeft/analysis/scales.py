"""The clients' BayesTune rank scales as run outputs: files, pruning to a budget, rank structures, language distances.

``fedp2eft`` and ``bayestune_lora`` write each client's scales to
``lambdas/<method>/seed<k>/<client>.safetensors`` (tensor ``scales``, raw, float32, shape ``(L, r_init)``;
metadata: module names, group, pool, r_max). From them this module computes the data of the two plots of the
FedP2EFT paper (Section 4.5; drawn by :mod:`fedpeft.analysis.scale_plots`):

- the rank structure: ranks kept per layer and module type at a budget (Fig. 6-15), kept as
  :func:`kept_ranks` decides, the pruning the methods train with (:func:`fedpeft.adapters.bayestune.prune_to_budget`
  calls it on torch tensors);
- the language-distance matrix ``log(d(j, k) / sqrt(d(j, j) d(k, k)))``, where d(j, k) is the mean Euclidean
  distance between the scales of a client of group j and a different client of group k (Fig. 4, 5).

numpy and ``safetensors.numpy`` only, no torch: the report reads these files without importing it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedpeft.core.io import write_bytes_atomic

SCALES_DIR = "lambdas"
SCALE_MIN = 1e-4
"""The scales are clamped to ``[SCALE_MIN, SCALE_MAX]`` wherever they act (training, pruning's kept scales, the
distances)."""
SCALE_MAX = 1000.0


@dataclass
class ScaleRecord:
    """One client's scales, as saved in and read back from a run directory."""

    method: str
    seed: int
    client: str
    group: str
    pool: str
    modules: list[str]
    r_max: int
    scales: NDArray[np.float32]
    """Raw (unclamped) scales, shape ``(L, r_init)``, one row per module of ``modules``."""


def scales_path(run_dir: Path, method: str, seed: int, client_id: str) -> Path:
    """Where the scales of one client of one method and seed live."""
    return Path(run_dir) / SCALES_DIR / method / f"seed{seed}" / f"{client_id}.safetensors"


def save_client_scales(path: Path, record: ScaleRecord) -> None:
    """Write one client's scales, as float32 (atomically enough for one writer per client)."""
    from safetensors.numpy import save

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "method": record.method,
        "seed": str(record.seed),
        "client": record.client,
        "group": record.group,
        "pool": record.pool,
        "r_max": str(record.r_max),
        "modules": json.dumps(record.modules),
    }
    scales = np.ascontiguousarray(record.scales, dtype=np.float32)
    write_bytes_atomic(path, save({"scales": scales}, metadata=meta))


def read_scales(run_dir: Path) -> list[ScaleRecord]:
    """Every client's scales saved in ``run_dir`` (empty when the run has none)."""
    from safetensors import safe_open

    records = []
    for path in sorted((Path(run_dir) / SCALES_DIR).glob("*/seed*/*.safetensors")):
        with safe_open(str(path), framework="numpy") as handle:
            meta = handle.metadata()
            scales = handle.get_tensor("scales")
        records.append(
            ScaleRecord(
                method=meta["method"],
                seed=int(meta["seed"]),
                client=meta["client"],
                group=meta["group"],
                pool=meta["pool"],
                modules=json.loads(meta["modules"]),
                r_max=int(meta["r_max"]),
                scales=scales,
            )
        )
    return records


def module_layout(name: str) -> tuple[int, str]:
    """``(layer, module type)`` of a name: ``...layer.3.attention.self.query`` -> ``(3, "attention.self.query")``."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return int(part), ".".join(parts[index + 1 :]) or name
    return 0, name


def descending_order(values: NDArray[np.float32]) -> NDArray[np.intp]:
    """The indices of ``values`` from the largest to the smallest, ties in index order; NaN first (as the largest,
    as ``torch.sort(descending=True, stable=True)`` puts them)."""
    missing = np.isnan(values)
    present = np.flatnonzero(~missing)
    return np.concatenate([np.flatnonzero(missing), present[np.argsort(-values[present], kind="stable")]])


def kept_ranks(scores_by_module: Mapping[str, ArrayLike], budget: int) -> dict[str, NDArray[np.intp]]:
    """The rank structure of budget r: the top-(r * L) scores over the concatenation of every module's scores
    (as float32).

    Ties go to the earlier module and rank, so the structures of growing budgets are nested.

    Args:
        scores_by_module: module name -> scores of its ranks (in module order).
        budget: r, the average rank per module.

    Returns:
        module name -> sorted indices of its kept ranks, only for modules that keep at least one rank.
    """
    names = list(scores_by_module)
    rows = [np.asarray(scores_by_module[name], dtype=np.float32).reshape(-1) for name in names]
    flat = np.concatenate(rows)
    total = min(budget * len(names), flat.size)
    keep = np.zeros(flat.size, dtype=bool)
    keep[descending_order(flat)[:total]] = True
    structure: dict[str, NDArray[np.intp]] = {}
    start = 0
    for name, row in zip(names, rows, strict=True):
        kept = np.flatnonzero(keep[start : start + row.size])
        if kept.size:
            structure[name] = kept
        start += row.size
    return structure


def rank_structure(records: Sequence[ScaleRecord], budget: int) -> tuple[list[int], list[str], list[list[float]]]:
    """Mean over ``records`` of the ranks kept per (layer, module type) at ``budget``.

    Returns:
        Layer indices, module types (in model order) and the ``layers x types`` matrix (NaN where no module).
    """
    sums: dict[tuple[int, str], float] = defaultdict(float)
    layers: list[int] = []
    kinds: list[str] = []
    for record in records:
        structure = kept_ranks(dict(zip(record.modules, record.scales, strict=True)), budget)
        for name in record.modules:
            layer, kind = module_layout(name)
            layers += [layer] if layer not in layers else []
            kinds += [kind] if kind not in kinds else []
            kept = structure.get(name)
            sums[layer, kind] += 0.0 if kept is None else float(kept.size)
    count = max(1, len(records))
    matrix = [[sums[layer, kind] / count if (layer, kind) in sums else math.nan for kind in kinds] for layer in layers]
    return layers, kinds, matrix


def clamped(scales: ArrayLike) -> NDArray[np.float32]:
    """Scales as they act: float32, clamped to ``[SCALE_MIN, SCALE_MAX]``."""
    return np.clip(np.asarray(scales, dtype=np.float32), np.float32(SCALE_MIN), np.float32(SCALE_MAX))


def pairwise_distances(vectors: NDArray[np.float64]) -> NDArray[np.float64]:
    """The Euclidean distance between every two rows of ``vectors``, computed directly (0 between equal rows)."""
    return np.stack([np.sqrt(((vectors - row) ** 2).sum(axis=1)) for row in vectors])


def language_distances(
    records: Sequence[ScaleRecord], order: Sequence[str] = ()
) -> tuple[list[str], list[list[float]]]:
    """The normalized log distance ``log(d(j,k) / sqrt(d(j,j) d(k,k)))`` between the groups of ``records``.

    d(j, k) is the mean Euclidean distance between the (clamped) scales of two different clients of groups j and k,
    within one seed and method (scales of different runs are not comparable), then averaged over those.
    Undefined entries (a group with a single client, or one whose clients' scales are equal) are NaN. Groups come in
    ``order`` (the result tables' order) where it names them, the others after it, sorted.
    """
    present = {r.group for r in records}
    groups = [g for g in dict.fromkeys(order) if g in present] + sorted(present - set(order))
    sums = np.zeros((len(groups), len(groups)))
    counts = np.zeros_like(sums)
    by_run: dict[tuple[str, int], list[ScaleRecord]] = defaultdict(list)
    for record in records:
        by_run[record.method, record.seed].append(record)
    for run in by_run.values():
        distances = pairwise_distances(np.stack([clamped(r.scales).reshape(-1).astype(np.float64) for r in run]))
        index = np.array([groups.index(r.group) for r in run])
        rows, cols = np.nonzero(~np.eye(len(run), dtype=bool))  # pairs of different clients
        run_sums = np.zeros_like(sums)
        run_counts = np.zeros_like(sums)
        np.add.at(run_sums, (index[rows], index[cols]), distances[rows, cols])
        np.add.at(run_counts, (index[rows], index[cols]), 1.0)
        defined = run_counts > 0
        sums[defined] += run_sums[defined] / run_counts[defined]
        counts[defined] += 1
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = sums / counts  # NaN where undefined
        diagonal = mean.diagonal()
        normalized = np.log(mean / np.sqrt(diagonal[:, None] * diagonal[None, :]))
    return groups, [[float(v) for v in row] for row in normalized]
