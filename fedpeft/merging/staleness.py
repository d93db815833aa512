"""The server step of an asynchronous schedule: staleness-weighted updates mixed into the current global state.

With global tensors g, the buffered updates x_k (their example counts n_k, staleness u_k, staleness function s)
and the schedule's rate eta (``server_lr``), the step is

    g' = g + eta * sum_k (n_k s(u_k) / sum_j n_j) (x_k - g)

FedBuff buffers K updates per step; FedAsync is the case K = 1 with n_k / sum_j n_j = 1 and eta the mixing weight
alpha: g' = (1 - alpha s(u)) g + alpha s(u) x. These are the formulas of APPFL's ``FedBuffAggregator`` (with its
``sample_size`` client weights over the buffer's clients and ``alpha`` = eta) and ``FedAsyncAggregator`` (one
client weight of 1), in ``src/appfl/algorithm/aggregator/`` of github.com/APPFL/APPFL; each update's difference is
taken from the current global state, as there.

It is computed as g + c (m - g), with m the weighted mean of the x_k at weights n_k s(u_k) (the step inside,
which is where a robust rule would see the reweighted updates) and c = eta sum_k n_k s(u_k) / sum_k n_k; when c is
exactly 1 (every update fresh, eta = 1) the step is m itself, so FedBuff with K = C = the clients of a round gives
the synchronous weighted mean bit for bit. Integer tensors (buffers, counters) take m.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch

from fedpeft.core.types import ClientUpdate, ServerState, StateDict
from fedpeft.merging.server_step import ServerStep, StepResult
from fedpeft.settings.schedule import ScheduleConfig


def mix(global_tensors: StateDict, mean: StateDict, factor: float) -> StateDict:
    """g + factor (m - g) for each tensor of ``mean`` (computed in float64, returned in m's dtype); m itself where
    g has no such tensor, for integer tensors, and for every tensor when ``factor`` is 1."""
    if factor == 1.0:
        return dict(mean)
    mixed: StateDict = {}
    for key, m in mean.items():
        g = global_tensors.get(key)
        if g is None or not m.is_floating_point() or g.shape != m.shape:
            mixed[key] = m
            continue
        g64 = g.detach().to(torch.float64)
        mixed[key] = (g64 + factor * (m.detach().to(torch.float64) - g64)).to(m.dtype)
    return mixed


class StalenessMixing:
    """Wraps a server step (the weighted mean, or a robust rule around it): reweights each update by the staleness
    function of ``ClientUpdate.staleness`` and mixes the result into the state's tensors (module docstring)."""

    def __init__(self, inner: ServerStep, schedule: ScheduleConfig) -> None:
        self.inner = inner
        self.schedule = schedule

    def __call__(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult:
        weights = 0.0
        staled = 0.0
        reweighted = []
        for update in updates:
            scale = self.schedule.weight(update.staleness)
            weights += float(update.weight)
            staled += float(update.weight) * scale
            reweighted.append(update if scale == 1.0 else dataclasses.replace(update, weight=update.weight * scale))
        result = self.inner(state, reweighted)
        if not result.tensors or weights <= 0:
            return result
        factor = self.schedule.mixing * staled / weights
        return dataclasses.replace(result, tensors=mix(state.tensors, result.tensors, factor))
