"""The arithmetic of comparing the two FedP2EFT pipelines on one federation: pairing, intervals, rank structures.

``compare.py`` runs both pipelines and reads their outputs; this module holds what it computes from them, on plain
Python values, so that it is tested without either pipeline (``tests/test_official_fedp2eft_compare.py``). It
imports numpy and fedpeft's report and analysis modules, which import no torch.

- **Accuracies.** A side's values are ``(client, position) -> accuracy``: ``client`` is fedpeft's client id (the
  authors' ids are mapped through the export's ``clients.json``) and ``position`` the seed's index, so that
  fedpeft's seed k pairs with the authors' k-th seed (42, 52, 62 in their ``run_xnli.sh``). The difference
  fedpeft - authors is taken per client as the mean over the seeds both sides have, and its 95 % t interval is over
  the clients (``fedpeft.report.intervals``, as every fedpeft summary computes them).
- **Rank structures.** The ranks a client keeps at budget r, counted per LoRA module. fedpeft keeps the top
  r x L of its L = 12 modules' scales (``fedpeft.analysis.scales.kept_ranks``); the authors' code keeps the top
  r x 14 over its 14 modules (all-linear puts LoRA on the pooler and the classifier as well). Their structure is
  compared on the 12 modules both have, with fedpeft's rule applied to their scales there
  (:func:`restricted_counts`); how many of their kept ranks went to the two extra modules is counted apart
  (:func:`outside_share`).
- **Scales.** The PSG's (or BayesTune-LoRA's) scales of each client, clamped to [1e-4, 1000] as both pipelines use
  them: each side's mean, and the correlation over the 12 shared modules of the per-module means (ranks are not
  matched one to one across the pipelines: rank j of a module has no counterpart in the other's LoRA).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from fedpeft.analysis.scales import SCALE_MAX, SCALE_MIN, kept_ranks
from fedpeft.report.intervals import paired_clients, t_interval

THEIR_FIRST_SEED = 42
THEIR_SEED_STEP = 10
"""Their ``run_xnli.sh`` seeds: ``SEED=(42 52 62)``."""

THEIR_PREFIX = "base_model.model."
"""What PEFT's wrapper adds in front of a module's name in their model (fedpeft names the bare model's modules)."""

Values = Mapping[tuple[str, int], float]


def their_seed(position: int) -> int:
    """The authors' seed at ``position`` (0, 1, 2 -> 42, 52, 62), paired with fedpeft's seed at that position."""
    return THEIR_FIRST_SEED + THEIR_SEED_STEP * position


def fedpeft_values(records: Iterable[Mapping], method: str, pool: str, budget: int, seeds: Sequence[int]) -> dict:
    """``(client, position) -> accuracy`` of fedpeft's test records of ``method`` at ``pool`` and ``budget``;
    ``position`` is the record's seed's index in ``seeds`` (records of other seeds are left out)."""
    found = {}
    for record in records:
        if (
            record.get("method") == method
            and record.get("metric") == "accuracy"
            and record.get("split") == "test"
            and record.get("pool") == pool
            and record.get("budget") == budget
            and record.get("seed") in seeds
        ):
            found[(record["client"], list(seeds).index(record["seed"]))] = float(record["value"])
    return found


def authors_values(metrics_by_position: Mapping[int, Mapping[str, float]], clients: Iterable[Mapping]) -> dict:
    """``(client, position) -> accuracy`` from their runs' metrics (patch 04's ``client<cid>_accuracy``), one
    metrics mapping per seed position; ``clients`` are the export's ``clients.json`` rows (``cid`` ->
    ``client_id``). A metric of an id the export does not list is an error: the runs read another federation."""
    names = {int(row["cid"]): row["client_id"] for row in clients}
    found = {}
    for position, metrics in metrics_by_position.items():
        for key, value in metrics.items():
            if key.startswith("client") and key.endswith("_accuracy"):
                cid = int(key[len("client") : -len("_accuracy")])
                if cid not in names:
                    raise KeyError(f"client id {cid} of their results is not in the export's clients.json")
                found[(names[cid], position)] = float(value)
    return found


def compare_accuracies(fedpeft: Values, authors: Values) -> dict:
    """The paired comparison of one method, pool and budget, in accuracy units (not x100).

    Returns:
        ``clients`` (paired), ``pairs`` ((client, position) pairs), ``fedpeft`` and ``authors`` (the mean over the
        paired clients of each client's mean over its paired seeds), ``difference`` (their difference, fedpeft -
        authors), ``low`` and ``high`` (its 95 % t interval over the clients; ``None`` with fewer than 2 clients),
        ``only_fedpeft`` and ``only_authors`` (clients one side has and the other not).
    """
    differences = paired_clients(fedpeft, authors)
    positions: dict[str, list[int]] = {}
    for client, position in fedpeft:
        if (client, position) in authors:
            positions.setdefault(client, []).append(position)
    low, high = t_interval([difference.mean for difference in differences.values()])

    def side_mean(values: Values) -> float | None:
        if not positions:
            return None
        return statistics.fmean(
            statistics.fmean(values[(client, position)] for position in found) for client, found in positions.items()
        )

    return {
        "clients": len(positions),
        "pairs": sum(len(found) for found in positions.values()),
        "fedpeft": side_mean(fedpeft),
        "authors": side_mean(authors),
        "difference": statistics.fmean(d.mean for d in differences.values()) if differences else None,
        "low": low,
        "high": high,
        "only_fedpeft": sorted({client for client, _ in fedpeft} - set(positions)),
        "only_authors": sorted({client for client, _ in authors} - set(positions)),
    }


def format_difference(cell: Mapping) -> str:
    """``+1.23 [-0.50, +2.96]`` (x100), ``*`` where the interval excludes 0; the mean alone with one client."""
    if cell.get("difference") is None:
        return "—"
    text = f"{cell['difference'] * 100:+.2f}"
    if cell.get("low") is not None and cell.get("high") is not None:
        text += f" [{cell['low'] * 100:+.2f}, {cell['high'] * 100:+.2f}]"
        if cell["low"] > 0 or cell["high"] < 0:
            text += " *"
    return text


def shared_name(name: str) -> str:
    """A module's name in their model as fedpeft names it (``base_model.model.bert.encoder...`` ->
    ``bert.encoder...``)."""
    return name[len(THEIR_PREFIX) :] if name.startswith(THEIR_PREFIX) else name


def module_counts(kept: Iterable[int], modules: Sequence[str], ranks_per_module: int) -> dict[str, int]:
    """Ranks kept per module from the kept positions of the flat scales (module-major, ``ranks_per_module`` each)."""
    counts = {name: 0 for name in modules}
    for index in kept:
        module = int(index) // ranks_per_module
        if not 0 <= module < len(modules):
            raise IndexError(f"kept rank {index} is outside {len(modules)} modules x {ranks_per_module} ranks")
        counts[modules[module]] += 1
    return counts


def scales_by_module(scales: Sequence[float], modules: Sequence[str]) -> dict[str, np.ndarray]:
    """Flat module-major scales as ``module -> its ranks' scales`` (names as fedpeft gives them)."""
    flat = np.asarray(scales, dtype=np.float32).reshape(-1)
    if flat.size % len(modules):
        raise ValueError(f"{flat.size} scales do not split into {len(modules)} modules")
    rows = flat.reshape(len(modules), -1)
    return {shared_name(name): rows[index] for index, name in enumerate(modules)}


def kept_counts(scales: Mapping[str, np.ndarray], budget: int) -> dict[str, int]:
    """fedpeft's structure of ``budget`` from ``module -> scales``: ranks kept per module (0 included)."""
    structure = kept_ranks(scales, budget)
    return {name: int(structure[name].size) if name in structure else 0 for name in scales}


def restricted_counts(scales: Mapping[str, np.ndarray], shared: Sequence[str], budget: int) -> dict[str, int]:
    """fedpeft's rule (top budget x len(shared), ties to the earlier module and rank) applied to the ``shared``
    modules' scales of their model: the structure their scales give on the modules both models adapt."""
    missing = [name for name in shared if name not in scales]
    if missing:
        raise KeyError(f"their scales have no module {missing[0]}")
    return kept_counts({name: scales[name] for name in shared}, budget)


def outside_share(counts: Mapping[str, int], shared: Sequence[str]) -> float:
    """The share of the kept ranks that went to modules outside ``shared`` (their pooler and classifier)."""
    total = sum(counts.values())
    outside = sum(count for name, count in counts.items() if name not in set(shared))
    return outside / total if total else 0.0


def compare_structures(ours: Mapping[str, int], theirs: Mapping[str, int]) -> dict:
    """``same`` (equal counts on every module) and ``overlap`` (sum over modules of min(count, count) over the
    kept ranks: 1 for the same structure, the share of ranks placed alike otherwise) of two structures of one
    budget on the same modules."""
    if set(ours) != set(theirs):
        raise ValueError("structures on different modules")
    total = sum(ours.values())
    if total != sum(theirs.values()):
        raise ValueError(f"structures of different sizes: {total} and {sum(theirs.values())} ranks")
    shared = sum(min(ours[name], theirs[name]) for name in ours)
    return {"same": all(ours[name] == theirs[name] for name in ours), "overlap": shared / total if total else 1.0}


def tie_at_cut(scales: Mapping[str, np.ndarray], budget: int) -> bool:
    """Whether keeping the top ``budget`` x L of these scales cuts through equal values: the largest scale left out
    equals the smallest kept, so the structure is decided by how ties are broken, not by the scales (their PSG's
    bfloat16 outputs can be all equal)."""
    flat = np.sort(np.concatenate([np.asarray(row, dtype=np.float32).reshape(-1) for row in scales.values()]))[::-1]
    total = budget * len(scales)
    return bool(0 < total < flat.size and flat[total - 1] == flat[total])


def distinct(structures: Iterable[Mapping[str, int]]) -> int:
    """How many different structures ``structures`` holds."""
    return len({tuple(sorted(structure.items())) for structure in structures})


def clamped(values: np.ndarray) -> np.ndarray:
    """The scales as both pipelines use them: clamped to [1e-4, 1000]."""
    return np.clip(np.asarray(values, dtype=np.float64), SCALE_MIN, SCALE_MAX)


def compare_scales(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray], shared: Sequence[str]) -> dict:
    """One client's scales on the ``shared`` modules: each side's mean (clamped) and the Pearson correlation of
    the per-module means (``None`` where a side's module means do not vary)."""
    our_means = np.array([clamped(ours[name]).mean() for name in shared])
    their_means = np.array([clamped(theirs[name]).mean() for name in shared])
    correlation = None
    if our_means.std() > 0 and their_means.std() > 0:
        correlation = float(np.corrcoef(our_means, their_means)[0, 1])
    return {
        "fedpeft_mean": float(np.mean([clamped(ours[name]) for name in shared])),
        "authors_mean": float(np.mean([clamped(theirs[name]) for name in shared])),
        "module_correlation": correlation,
    }


def mean_or_none(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not ``None`` (``None`` when there are none)."""
    found = [value for value in values if value is not None and not math.isnan(value)]
    return statistics.fmean(found) if found else None
