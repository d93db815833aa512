"""Merge operators: pure functions from K tensors of one shape (plus weights and options) to one tensor.

Every operator takes ``tensors`` (a list of same-shaped tensors, the clients' task vectors), optional
``weights`` (one per tensor; ``None`` = the operator's neutral weights) and its own keyword options. The pruning,
sign election and disjoint mean are PEFT's (:mod:`peft.utils.merge_utils`); DARE's random drops come from an
explicit seed.

- ``mean``: sum_k w_k t_k with the weights normalized to sum 1 (FedAvg; uniform when ``weights`` is None).
- ``task_arithmetic``: sum_k w_k t_k (Ilharco et al., ICLR 2023); weights default to 1.
- ``ties``: keep the ``density`` largest-magnitude entries of each tensor, elect each entry's sign by the sum,
  average the entries that agree with it (Yadav et al., NeurIPS 2023); weights default to 1.
- ``dare_linear``: drop entries at random with probability 1 - density, rescale by 1 / density, then the
  weighted sum (Yu et al., ICML 2024); weights default to 1 / K.
- ``dare_ties``: DARE's random drop, then TIES's sign election and disjoint mean; weights default to 1.
- ``iso_c``: the task-arithmetic sum M = U S V^T made isotropic, mean(S) U V^T (Marczak et al., ICML 2025);
  weights default to 1. Singular values below ``rank_tol`` times the largest are treated as zero, so a
  low-rank sum stays in its own subspace.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from peft.utils import merge_utils

from fedpeft.settings.server import OPERATOR_NAMES

Weights = Sequence[float] | torch.Tensor | None
Operator = Callable[..., torch.Tensor]


def _weights(weights: Weights, count: int, like: torch.Tensor, default: float) -> torch.Tensor:
    if weights is None:
        return torch.full((count,), default, dtype=like.dtype, device=like.device)
    w = torch.as_tensor(weights, dtype=like.dtype, device=like.device).reshape(-1)
    if w.numel() != count:
        raise ValueError(f"{w.numel()} weights for {count} tensors")
    return w


def _check(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if not tensors:
        raise ValueError("nothing to merge")
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors):
        raise ValueError(f"tensors to merge differ in shape: {sorted({tuple(t.shape) for t in tensors})}")
    return list(tensors)


def mean(tensors: Sequence[torch.Tensor], weights: Weights = None) -> torch.Tensor:
    """Weighted mean (weights normalized to sum 1; uniform by default)."""
    tensors = _check(tensors)
    w = _weights(weights, len(tensors), tensors[0], 1.0)
    if float(w.sum()) <= 0:
        raise ValueError("mean weights must have a positive sum")
    return merge_utils.task_arithmetic(tensors, w / w.sum())


def task_arithmetic(tensors: Sequence[torch.Tensor], weights: Weights = None) -> torch.Tensor:
    """Weighted sum sum_k w_k t_k (weights default to 1)."""
    tensors = _check(tensors)
    return merge_utils.task_arithmetic(tensors, _weights(weights, len(tensors), tensors[0], 1.0))


def _call_quietly(density: float, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    with warnings.catch_warnings():
        if density >= 1:
            warnings.simplefilter("ignore", UserWarning)
        return fn()


def ties(
    tensors: Sequence[torch.Tensor],
    weights: Weights = None,
    *,
    density: float = 0.2,
    majority_sign: Literal["total", "frequency"] = "total",
) -> torch.Tensor:
    """TIES-Merging: trim to ``density``, elect signs (by sum: ``total``), disjoint mean (weights default 1)."""
    tensors = _check(tensors)
    w = _weights(weights, len(tensors), tensors[0], 1.0)
    return _call_quietly(density, lambda: merge_utils.ties(tensors, w, density, majority_sign))


def _seeded(seed: int, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn()


def dare_linear(
    tensors: Sequence[torch.Tensor], weights: Weights = None, *, density: float = 0.2, seed: int = 0
) -> torch.Tensor:
    """DARE: random drop to ``density`` with 1 / density rescaling, then the weighted sum (weights 1 / K)."""
    tensors = _check(tensors)
    w = _weights(weights, len(tensors), tensors[0], 1.0 / len(tensors))
    return _call_quietly(density, lambda: _seeded(seed, lambda: merge_utils.dare_linear(tensors, w, density)))


def dare_ties(
    tensors: Sequence[torch.Tensor],
    weights: Weights = None,
    *,
    density: float = 0.2,
    majority_sign: Literal["total", "frequency"] = "total",
    seed: int = 0,
) -> torch.Tensor:
    """DARE's random drop and rescaling, then TIES's sign election and disjoint mean (weights default 1)."""
    tensors = _check(tensors)
    w = _weights(weights, len(tensors), tensors[0], 1.0)
    return _call_quietly(
        density, lambda: _seeded(seed, lambda: merge_utils.dare_ties(tensors, w, density, majority_sign))
    )


def isotropic(matrix: torch.Tensor, rank_tol: float = 1e-6) -> torch.Tensor:
    """mean(S) U V^T of ``matrix`` = U S V^T, over its singular values above ``rank_tol`` * the largest."""
    if matrix.dim() != 2:
        return matrix
    U, S, Vh = torch.linalg.svd(matrix, full_matrices=False)
    if S.numel() == 0 or float(S[0]) == 0.0:
        return torch.zeros_like(matrix)
    keep = S > rank_tol * S[0]
    return S[keep].mean() * (U[:, keep] @ Vh[keep])


def iso_c(tensors: Sequence[torch.Tensor], weights: Weights = None, *, rank_tol: float = 1e-6) -> torch.Tensor:
    """Iso-C: the weighted sum (weights default 1) with its singular value spectrum flattened to its mean.

    Tensors that are not matrices (biases) have no spectrum and get the plain weighted sum.
    """
    return isotropic(task_arithmetic(tensors, weights), rank_tol)


OPERATORS: dict[str, Operator] = {
    "mean": mean,
    "task_arithmetic": task_arithmetic,
    "ties": ties,
    "dare_linear": dare_linear,
    "dare_ties": dare_ties,
    "iso_c": iso_c,
}

# How client sample counts n_k become an operator's weights: normalized to sum 1 ("sum") for the averaging
# operators, to mean 1 ("mean") for the summing / disjoint-mean ones, so that uniform data gives each operator's
# neutral weights (1 / K or 1).
WEIGHT_NORMALIZATION: dict[str, Literal["sum", "mean"]] = {
    "mean": "sum",
    "dare_linear": "sum",
    "task_arithmetic": "mean",
    "ties": "mean",
    "dare_ties": "mean",
    "iso_c": "mean",
}


# Operators whose output is a (weighted) sum of the inputs rather than an average: their scale grows with K.
SUMMING_OPERATORS = frozenset({"task_arithmetic", "iso_c"})


def operator_weights(name: str, sizes: Sequence[float]) -> list[float]:
    """The weights operator ``name`` gets for clients with ``sizes`` samples (see WEIGHT_NORMALIZATION)."""
    total = float(sum(sizes))
    if total <= 0:
        raise ValueError("client sizes must have a positive sum")
    scale = 1.0 if WEIGHT_NORMALIZATION[name] == "sum" else float(len(sizes))
    return [scale * float(s) / total for s in sizes]


def apply_operator(
    name: str,
    tensors: Sequence[torch.Tensor],
    weights: Weights = None,
    *,
    density: float = 0.2,
    majority_sign: Literal["total", "frequency"] = "total",
    seed: int = 0,
) -> torch.Tensor:
    """Run operator ``name`` with the options it takes (the others are ignored)."""
    if name in ("ties", "dare_ties"):
        options: dict = {"density": density, "majority_sign": majority_sign}
        if name == "dare_ties":
            options["seed"] = seed
        return OPERATORS[name](tensors, weights, **options)
    if name == "dare_linear":
        return dare_linear(tensors, weights, density=density, seed=seed)
    if name not in OPERATORS:
        raise KeyError(f"unknown merge operator {name!r}; choose one of {', '.join(OPERATOR_NAMES)}")
    return OPERATORS[name](tensors, weights)
