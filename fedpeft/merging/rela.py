"""RELA, relevance-guided aggregation (FedMosaic, Sec. 4.1): the pure tensor functions.

Each client measures what its task "looks like" by the gradient of the task loss with respect to one weight
matrix of a small frozen model W_s (the same model for every client), averaged over a round, smoothed across
rounds by an EMA, noised and cut to a fixed random 40 % of its coordinates shared by all clients. The server
turns these vectors into relevance weights ``w_ij = softmax_j(cos(g_i, g_j) / tau)`` and builds for each client
its own global adapter ``G_i = sum_j w_ij L_j``; a tensor only some clients have (ordinary LoRA of one
architecture) is averaged over those clients with their weights renormalized.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import torch

from fedpeft.core.types import StateDict


@functools.lru_cache(maxsize=4)
def shared_mask(size: int, keep: float, seed: int) -> torch.Tensor:
    """The sorted coordinates kept by every client: ``round(keep * size)`` of ``size``, drawn from ``seed``.

    Remembered per process (every client of a run asks for the same one, and a permutation of a gradient matrix's
    millions of coordinates takes most of a second): index with it, never write to it."""
    count = max(1, round(keep * size))
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(size, generator=generator)[:count].sort().values


def ema(previous: torch.Tensor | None, current: torch.Tensor, rate: float) -> torch.Tensor:
    """``(1 - rate) * previous + rate * current``; a missing previous value counts as zero."""
    if previous is None:
        return rate * current
    return (1 - rate) * previous + rate * current


def sanitize(decayed: torch.Tensor, noise: float, generator: torch.Generator) -> torch.Tensor:
    """``decayed + noise * eps`` with eps ~ N(0, I), on the kept coordinates (``decayed`` is already masked)."""
    return decayed + noise * torch.randn(decayed.shape, generator=generator, dtype=decayed.dtype)


def relevance_weights(vectors: torch.Tensor, tau: float = 0.5) -> torch.Tensor:
    """``w[i, j] = softmax_j(cos(v_i, v_j) / tau)`` for the rows of ``vectors`` (n x d); rows sum to 1."""
    unit = torch.nn.functional.normalize(vectors.to(torch.float64), dim=1)
    return torch.softmax(unit @ unit.T / tau, dim=1)


def customized_global(weights: torch.Tensor, adapters: Sequence[Mapping[str, torch.Tensor]]) -> StateDict:
    """``G = sum_j w_j L_j`` per tensor name, over the adapters that have that name (weights renormalized).

    Args:
        weights: one client's relevance weights over the n adapters (n).
        adapters: the n clients' adapters (name -> tensor); ordinary LoRA names exist only in the adapters of
            one architecture, PQ-LoRA names in all.
    """
    sums: dict[str, torch.Tensor] = {}
    totals: dict[str, float] = {}
    dtypes: dict[str, torch.dtype] = {}
    for weight, adapter in zip(weights.tolist(), adapters, strict=True):
        for name, tensor in adapter.items():
            dtypes.setdefault(name, tensor.dtype)
            contribution = tensor.detach().to(torch.float64) * weight
            sums[name] = sums[name] + contribution if name in sums else contribution
            totals[name] = totals.get(name, 0.0) + weight
    return {name: (value / totals[name]).to(dtypes[name]) for name, value in sums.items()}
