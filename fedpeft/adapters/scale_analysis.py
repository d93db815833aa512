"""The clients' BayesTune rank scales as run outputs: files, rank structures and language distances.

``fedp2eft`` and ``bayestune_lora`` write each client's scales to
``lambdas/<method>/seed<k>/<client>.safetensors`` (tensor ``scales``, raw, shape ``(L, r_init)``; metadata: module
names, group, pool, r_max). From them this module computes the data of the two plots of the FedP2EFT paper
(Section 4.5; drawn by :mod:`fedpeft.adapters.scale_plots`):

- the rank structure: ranks kept per layer and module type at a budget (Fig. 6-15);
- the language-distance matrix ``log(d(j, k) / sqrt(d(j, j) d(k, k)))``, where d(j, k) is the mean Euclidean
  distance between the scales of a client of group j and a different client of group k (Fig. 4, 5).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from fedpeft.adapters.bayestune import SCALE_MAX, SCALE_MIN, prune_to_budget
from fedpeft.core.io import write_bytes_atomic

SCALES_DIR = "lambdas"


@dataclass
class ScaleRecord:
    """One client's scales as read back from a run directory."""

    method: str
    seed: int
    client: str
    group: str
    pool: str
    modules: list[str]
    r_max: int
    scales: torch.Tensor


def scales_path(run_dir: Path, method: str, seed: int, client_id: str) -> Path:
    """Where the scales of one client of one method and seed live."""
    return Path(run_dir) / SCALES_DIR / method / f"seed{seed}" / f"{client_id}.safetensors"


def save_client_scales(path: Path, record: ScaleRecord) -> None:
    """Write one client's scales (atomically enough for one writer per client)."""
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
    write_bytes_atomic(
        path, safetensors_bytes({"scales": record.scales.detach().float().contiguous().cpu()}, metadata=meta)
    )


def read_scales(run_dir: Path) -> list[ScaleRecord]:
    """Every client's scales saved in ``run_dir`` (empty when the run has none)."""
    records = []
    for path in sorted((Path(run_dir) / SCALES_DIR).glob("*/seed*/*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
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


def rank_structure(records: Sequence[ScaleRecord], budget: int) -> tuple[list[int], list[str], list[list[float]]]:
    """Mean over ``records`` of the ranks kept per (layer, module type) at ``budget``.

    Returns:
        Layer indices, module types (in model order) and the ``layers x types`` matrix (NaN where no module).
    """
    sums: dict[tuple[int, str], float] = defaultdict(float)
    layers: list[int] = []
    kinds: list[str] = []
    for record in records:
        structure = prune_to_budget(dict(zip(record.modules, record.scales, strict=True)), budget)
        for name in record.modules:
            layer, kind = module_layout(name)
            layers += [layer] if layer not in layers else []
            kinds += [kind] if kind not in kinds else []
            kept = structure.get(name)
            sums[layer, kind] += 0.0 if kept is None else float(kept.numel())
    count = max(1, len(records))
    matrix = [[sums[layer, kind] / count if (layer, kind) in sums else math.nan for kind in kinds] for layer in layers]
    return layers, kinds, matrix


def language_distances(
    records: Sequence[ScaleRecord], order: Sequence[str] = ()
) -> tuple[list[str], list[list[float]]]:
    """The normalized log distance ``log(d(j,k) / sqrt(d(j,j) d(k,k)))`` between the groups of ``records``.

    d(j, k) is the mean Euclidean distance between the (clamped) scales of two different clients of groups j and k,
    within one seed and method (scales of different runs are not comparable), then averaged over those.
    Undefined entries (a group with a single client) are NaN. Groups come in ``order`` (the result tables' order)
    where it names them, the others after it, sorted.
    """
    present = {r.group for r in records}
    groups = [g for g in dict.fromkeys(order) if g in present] + sorted(present - set(order))
    sums = torch.zeros(len(groups), len(groups), dtype=torch.float64)
    counts = torch.zeros_like(sums)
    by_run: dict[tuple[str, int], list[ScaleRecord]] = defaultdict(list)
    for record in records:
        by_run[record.method, record.seed].append(record)
    for run in by_run.values():
        vectors = torch.stack([r.scales.clamp(SCALE_MIN, SCALE_MAX).reshape(-1).double() for r in run])
        distances = torch.cdist(vectors, vectors)
        index = torch.tensor([groups.index(r.group) for r in run])
        distinct = ~torch.eye(len(run), dtype=torch.bool)
        run_sums = torch.zeros_like(sums)
        run_counts = torch.zeros_like(sums)
        rows, cols = distinct.nonzero(as_tuple=True)
        run_sums.index_put_((index[rows], index[cols]), distances[rows, cols], accumulate=True)
        run_counts.index_put_((index[rows], index[cols]), torch.ones(len(rows), dtype=torch.float64), accumulate=True)
        defined = run_counts > 0
        sums[defined] += run_sums[defined] / run_counts[defined]
        counts[defined] += 1
    mean = sums / counts  # NaN where undefined
    diagonal = mean.diagonal()
    normalized = torch.log(mean / torch.sqrt(diagonal[:, None] * diagonal[None, :]))
    return groups, [[float(v) for v in row] for row in normalized]
