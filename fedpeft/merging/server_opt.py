"""Server optimizers: the round's aggregate taken as a pseudo-gradient for an optimizer step on the global tensors.

With x the global tensors the clients started from, a the round's aggregate (the weighted mean, a robust rule's
result or the DP release) and t the round counted from 1, every tensor moves along the pseudo-gradient
``Delta = a - x``, elementwise, with the optimizer's moments (0 before the first round) kept in the server state:

- ``sgd``: ``x' = x + lr Delta`` (``lr`` 1: x' = a, the plain server step, returned as it is);
- ``avgm`` (FedAvgM: T.-M. H. Hsu, H. Qi, M. Brown, "Measuring the Effects of Non-Identical Data Distribution for
  Federated Visual Classification", 2019): ``u' = mu u + Delta``, ``x' = x + lr u'``;
- ``adam``, ``yogi``, ``adagrad`` (S. J. Reddi et al., "Adaptive Federated Optimization", ICLR 2021):
  ``m' = b1 m + (1 - b1) Delta`` and

  - ``adam``: ``v' = b2 v + (1 - b2) Delta^2``, ``x' = x + lr c_t m' / (sqrt(v') + tau)`` with the bias
    correction ``c_t = sqrt(1 - b2^(t+1)) / (1 - b1^(t+1))``;
  - ``yogi``: ``v' = v - (1 - b2) Delta^2 sign(v - Delta^2)``, ``x' = x + lr m' / (sqrt(v') + tau)``;
  - ``adagrad``: ``v' = v + Delta^2``, ``x' = x + lr Delta / (sqrt(v') + tau)`` (b1 = 0, so m' = Delta).

These are the update rules of Flower's FedAvgM, FedAdam, FedYogi and FedAdagrad strategies
(``flwr.serverapp.strategy``), including their zero initial moments and FedAdam's bias-correction exponent t + 1
(t: Flower's 1-based ``server_round``); the defaults are theirs too, except FedAvgM's momentum (Flower: 0, here
0.9, as in Hsu et al.). The step runs in float64; the new tensors take the aggregate's dtype, the moments at least
float32. A tensor the global tensors lack (or hold with another shape) and a non-float tensor (an integer buffer)
take the aggregate unchanged.

:class:`ServerOptimizer` is the step as the outermost part of a method's server step
(:mod:`fedpeft.merging.server_step`), its moments kept in ``ServerState.server_optimizer``. See
docs/server-optimizers.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch

from fedpeft.core.types import ClientUpdate, ServerState, StateDict
from fedpeft.merging.server_step import OptimizerState, ServerStep, StepResult
from fedpeft.settings.server import DEFAULT_BETAS, DEFAULT_LR, DEFAULT_TAU, ServerOptimizerConfig

_EXACT = torch.float64
# The moments each optimizer keeps between rounds.
MOMENTS: dict[str, tuple[str, ...]] = {
    "sgd": (),
    "avgm": ("momentum",),
    "adam": ("m", "v"),
    "yogi": ("m", "v"),
    "adagrad": ("v",),
}


def _moment_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _step(
    cfg: ServerOptimizerConfig, delta: torch.Tensor, moments: dict[str, torch.Tensor], round_: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The change of one tensor from its pseudo-gradient ``delta`` and its previous ``moments`` (float64, zeros
    before the first round), and its new moments."""
    lr = float(cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.name])
    if cfg.name == "sgd":
        return lr * delta, {}
    if cfg.name == "avgm":
        momentum = float(cfg.momentum or 0.0) * moments["momentum"] + delta
        return lr * momentum, {"momentum": momentum}
    tau = float(cfg.tau if cfg.tau is not None else DEFAULT_TAU)
    squared = delta * delta
    if cfg.name == "adagrad":
        v = moments["v"] + squared
        return lr * delta / (v.sqrt() + tau), {"v": v}
    b1, b2 = cfg.betas or DEFAULT_BETAS
    m = b1 * moments["m"] + (1.0 - b1) * delta
    if cfg.name == "adam":
        v = b2 * moments["v"] + (1.0 - b2) * squared
        lr = lr * (1.0 - b2 ** (round_ + 1)) ** 0.5 / (1.0 - b1 ** (round_ + 1))
    else:  # yogi
        v = moments["v"] - (1.0 - b2) * squared * torch.sign(moments["v"] - squared)
    return lr * m / (v.sqrt() + tau), {"m": m, "v": v}


def server_step(
    cfg: ServerOptimizerConfig,
    reference: Mapping[str, torch.Tensor],
    aggregate: Mapping[str, torch.Tensor],
    state: OptimizerState | None,
    round_: int,
) -> tuple[StateDict, OptimizerState]:
    """The new global tensors: ``cfg``'s optimizer step along ``aggregate - reference``, and its new moments.

    Args:
        cfg: the optimizer.
        reference: x, the global tensors the clients started from.
        aggregate: a, the round's aggregate (weighted mean, robust rule or DP release).
        state: the moments of the previous rounds (``None`` or empty before the first).
        round_: t, the round counted from 1 (Flower's ``server_round``; FedAdam's bias correction reads it).

    Returns:
        The new tensors (the keys of ``aggregate``, each in its dtype) and the moments: those of this round's
        tensors, and the previous ones of tensors this round did not aggregate.
    """
    previous = state or {}
    moments: OptimizerState = {name: dict(previous.get(name, {})) for name in MOMENTS[cfg.name]}
    if cfg.identity:
        return dict(aggregate), moments
    out: StateDict = {}
    for key, value in aggregate.items():
        ref = reference.get(key)
        if ref is None or not value.is_floating_point() or ref.shape != value.shape:
            out[key] = value
            continue
        x = ref.detach().to(device=value.device, dtype=_EXACT)
        delta = value.detach().to(_EXACT) - x
        before = {}
        for name in MOMENTS[cfg.name]:
            held = moments[name].get(key)
            if held is not None and held.shape == delta.shape:
                before[name] = held.to(device=delta.device, dtype=_EXACT)
            else:  # the first round of this tensor, or it changed shape
                before[name] = torch.zeros_like(delta)
        change, after = _step(cfg, delta, before, round_)
        out[key] = (x + change).to(value.dtype)
        for name, moment in after.items():
            moments[name][key] = moment.to(_moment_dtype(value.dtype))
    return out, moments


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
    """A server step that takes the aggregate ``inner`` gives as a pseudo-gradient: :func:`server_step` from
    ``state.tensors`` along ``aggregate - state.tensors``, with the moments ``state.server_optimizer`` holds and
    Flower's 1-based round ``state.round + 1``. The metrics are ``inner``'s; a round that aggregated nothing is
    ``inner``'s result as it is."""

    inner: ServerStep
    cfg: ServerOptimizerConfig

    def __call__(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult:
        aggregate = self.inner(state, updates)
        if not aggregate.tensors:
            return aggregate
        tensors, moments = server_step(
            self.cfg, state.tensors, aggregate.tensors, state.server_optimizer, state.round + 1
        )
        return StepResult(tensors, aggregate.metrics, moments)
