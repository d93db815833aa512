"""Robust aggregation of client updates: norm clipping, coordinate-wise median, trimmed mean.

Every rule works on the clients' updates relative to the global tensors the server sent,
``delta_k = u_k - g`` (a key the reference lacks is taken with reference 0), in float64, and gives the new
global tensors ``g + aggregate(delta_1 .. delta_K)`` in each upload's dtype. The norm of an update is the L2 norm
of all its tensors together (the flattened concatenation).

- ``clip``: ``delta_k * min(1, C / ||delta_k||)``, then the usual data-size weighted mean.
- ``median``: coordinate-wise median of the K clients' values, unweighted; for an even K the mean of the two
  middle values.
- ``trimmed_mean``: coordinate-wise, the ``floor(beta K)`` largest and ``floor(beta K)`` smallest values
  dropped and the rest averaged, unweighted (D. Yin et al., "Byzantine-Robust Distributed Learning: Towards
  Optimal Statistical Rates", ICML 2018).

Median and trimmed mean are translation-equivariant, so on deltas they give the same result as on the uploads
themselves (up to float64 rounding). A tensor only some clients upload is aggregated over those clients.

:class:`RobustRule` is the rule as a part of a method's server step (:mod:`fedpeft.merging.server_step`): it
replaces the float tensors of the mean the step inside it gives. See docs/privacy.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import torch

from fedpeft.core.types import ClientUpdate, ServerState, StateDict
from fedpeft.merging.server_step import ServerStep, StepResult, float_uploads
from fedpeft.settings.server import AggregationConfig

_EXACT = torch.float64
Delta = dict[str, torch.Tensor]


def union_keys(states: Sequence[Mapping[str, torch.Tensor]]) -> list[str]:
    """Every key any of ``states`` has, in first-seen order."""
    return list(dict.fromkeys(key for state in states for key in state))


def deltas(states: Sequence[Mapping[str, torch.Tensor]], reference: Mapping[str, torch.Tensor]) -> list[Delta]:
    """Each client's update relative to ``reference`` (``u_k - g``, float64; a key ``g`` lacks: ``u_k``)."""
    out = []
    for state in states:
        delta = {}
        for key, tensor in state.items():
            value = tensor.detach().to(_EXACT)
            if key in reference:
                ref = reference[key].detach().to(device=value.device, dtype=_EXACT)
                if ref.shape != value.shape:
                    raise ValueError(f"upload {key!r} has shape {tuple(value.shape)}, the global {tuple(ref.shape)}")
                value = value - ref
            delta[key] = value
        out.append(delta)
    return out


def update_norm(delta: Mapping[str, torch.Tensor]) -> float:
    """The L2 norm of all tensors of one update together."""
    return math.sqrt(sum(float(t.to(_EXACT).pow(2).sum()) for t in delta.values()))


def clip_update(delta: Mapping[str, torch.Tensor], clip_norm: float) -> tuple[Delta, bool]:
    """``delta * min(1, C / ||delta||)`` and whether it was scaled down."""
    norm = update_norm(delta)
    if norm <= clip_norm:
        return dict(delta), False
    factor = clip_norm / norm
    return {k: v * factor for k, v in delta.items()}, True


def apply_deltas(
    reference: Mapping[str, torch.Tensor],
    delta: Mapping[str, torch.Tensor],
    states: Sequence[Mapping[str, torch.Tensor]],
) -> StateDict:
    """``g + delta`` for every key of ``delta``, in the dtype that key has in the first of ``states`` holding it."""
    dtypes: dict[str, torch.dtype] = {}
    for state in states:
        for key, tensor in state.items():
            dtypes.setdefault(key, tensor.dtype)
    out: StateDict = {}
    for key, value in delta.items():
        if key in reference:
            value = reference[key].detach().to(device=value.device, dtype=_EXACT) + value
        out[key] = value.to(dtypes[key])
    return out


def _check(states: Sequence[Mapping[str, torch.Tensor]]) -> None:
    if not states:
        raise ValueError("nothing to aggregate")


def clipped_mean(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    reference: Mapping[str, torch.Tensor],
    clip_norm: float,
) -> tuple[StateDict, float]:
    """``g + sum_k w_k clip_C(delta_k) / sum_k w_k`` and the fraction of updates that were clipped.

    A key only some clients upload is averaged over those clients (their weights normalized among them)."""
    _check(states)
    clipped = [clip_update(d, clip_norm) for d in deltas(states, reference)]
    mean = {}
    for key in union_keys(states):
        held = [(d[key], float(w)) for (d, _), w in zip(clipped, weights, strict=True) if key in d]
        total = sum(w for _, w in held)
        if total <= 0:
            raise ValueError("aggregation weights must have a positive sum")
        mean[key] = torch.stack([d * w for d, w in held]).sum(dim=0) / total
    fraction = sum(was for _, was in clipped) / len(clipped)
    return apply_deltas(reference, mean, states), fraction


def _sorted_values(values: Sequence[Delta], key: str) -> torch.Tensor:
    """The values of ``key`` of the clients that have it, stacked on dim 0 and sorted along it."""
    return torch.stack([d[key] for d in values if key in d]).sort(dim=0).values


def coordinate_median(states: Sequence[Mapping[str, torch.Tensor]], reference: Mapping[str, torch.Tensor]) -> StateDict:
    """``g +`` the coordinate-wise median of the updates (unweighted; even K: mean of the two middle values)."""
    _check(states)
    values = deltas(states, reference)
    median = {}
    for key in union_keys(states):
        ordered = _sorted_values(values, key)
        count, middle = ordered.shape[0], ordered.shape[0] // 2
        median[key] = ordered[middle] if count % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return apply_deltas(reference, median, states)


def trimmed_mean(
    states: Sequence[Mapping[str, torch.Tensor]], reference: Mapping[str, torch.Tensor], trim_fraction: float
) -> StateDict:
    """``g +`` the coordinate-wise mean of the updates without the ``floor(beta K)`` largest and smallest values."""
    if not 0 <= trim_fraction < 0.5:
        raise ValueError(f"trim_fraction must be in [0, 0.5), not {trim_fraction}")
    _check(states)
    values = deltas(states, reference)
    mean = {}
    for key in union_keys(states):
        ordered = _sorted_values(values, key)
        count = ordered.shape[0]
        cut = math.floor(trim_fraction * count)
        mean[key] = ordered[cut : count - cut].mean(dim=0)
    return apply_deltas(reference, mean, states)


def robust_aggregate(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    reference: Mapping[str, torch.Tensor],
    cfg: AggregationConfig,
) -> tuple[StateDict, dict[str, float]]:
    """The new global tensors from the clients' uploads under ``cfg`` (not ``none``), and the rule's metrics.

    Args:
        states: the clients' uploads (the same keys each).
        weights: one per upload (data sizes); used by ``clip`` only.
        reference: the global tensors the clients started from.
        cfg: the rule.

    Returns:
        ``(tensors, metrics)``; ``clip`` reports ``clipped_fraction``, the fraction of updates scaled down.
    """
    if cfg.robust == "clip":
        assert cfg.clip_norm is not None
        tensors, fraction = clipped_mean(states, weights, reference, cfg.clip_norm)
        return tensors, {"clipped_fraction": fraction}
    if cfg.robust == "median":
        return coordinate_median(states, reference), {}
    if cfg.robust == "trimmed_mean":
        return trimmed_mean(states, reference, cfg.trim_fraction), {}
    raise ValueError(f"no robust rule {cfg.robust!r} to apply")


@dataclasses.dataclass(frozen=True)
class RobustRule:
    """A server step whose float tensors are ``cfg``'s rule on the updates relative to ``state.tensors`` (the
    global tensors the clients started from) instead of the mean ``inner`` gives; the other tensors, the metrics
    and the moments are ``inner``'s, the metrics plus the rule's (``robust_<name>``). Holds the round's uploads."""

    inner: ServerStep
    cfg: AggregationConfig

    def __call__(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult:
        received = list(updates)
        mean = self.inner(state, iter(received))
        if not mean.tensors:
            return mean
        weights = [float(u.weight) for u in received]
        robust, extra = robust_aggregate(float_uploads(received), weights, state.tensors, self.cfg)
        tensors = {**mean.tensors, **robust}
        metrics = {**mean.metrics, **{f"robust_{k}": v for k, v in extra.items()}}
        return StepResult(tensors, metrics, mean.moments)
