"""The server step of an asynchronous schedule: staleness-weighted updates mixed into the current global state.

With global tensors g, the buffered updates x_k (their example counts n_k, staleness u_k, staleness function s)
and the schedule's rate eta (``server_lr``), the step is, by default,

    g' = g + eta * sum_k (n_k s(u_k) / sum_j n_j) (x_k - g)        (j over the step's updates)

FedBuff buffers K updates per step; FedAsync is the case K = 1 with n_k / sum_j n_j = 1 and eta the mixing weight
alpha: g' = (1 - alpha s(u)) g + alpha s(u) x. This is the step of APPFL's ``FedBuffAggregator`` and
``FedAsyncAggregator`` (``src/appfl/algorithm/aggregator/`` of github.com/APPFL/APPFL) with these of its choices
changed; the schedule's settings select APPFL's instead (docs/async.md lists each):

- the client weight w_k (``client_weights``): fedpeft's ``buffer`` is n_k / sum_j n_j over the step's updates (1
  under FedAsync); APPFL weighs a client 1/N (``equal``, its default, N the clients of the federation) or n_k over
  the examples of all N (``sample_size``). With those the step is g' = g + eta * sum_k w_k s(u_k) (x_k - g), with
  no normalisation over the step's updates (:attr:`ClientUpdate.share` carries w_k, set by the server);
- the difference (``delta_from``): fedpeft's ``global`` takes x_k - g, as APPFL does with updates sent as models;
  APPFL's clients sending gradients (``send_gradient: True``, as its example configs do) give x_k - g_k, g_k the
  state client k trained from: ``start``. The asynchronous loop then hands the step x_k + (g - g_k) in place of
  x_k (:func:`rebase`), whose difference from g is x_k - g_k;
- the rate: fedpeft's FedBuff takes eta = 1 by default, APPFL's ``alpha`` 0.9 (``server_lr: 0.9``). FedAsync's
  default is APPFL's, 0.9.

It is computed as g + c (m - g), with m the weighted mean of the x_k at weights n_k s(u_k) (w_k s(u_k) with APPFL's
client weights; the step inside, which is where a robust rule would see the reweighted updates) and
c = eta sum_k n_k s(u_k) / sum_k n_k (c = eta sum_k w_k s(u_k)); when c is exactly 1 (every update fresh, eta = 1)
the step is m itself, so FedBuff with K = C = the clients of a round gives the synchronous weighted mean bit for
bit. Integer tensors (buffers, counters) take m.
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


def rebase(tensors: StateDict, start: StateDict, now: StateDict) -> StateDict:
    """x + (now - start) for each floating tensor x of ``tensors`` that ``start`` and ``now`` hold at its shape
    (computed in float64, returned in x's dtype): an update trained from ``start`` moved onto ``now`` with its
    difference kept, so that a step taking differences from ``now`` takes the update's from ``start``
    (``schedule.delta_from: start``). Other tensors stay as they are."""
    moved: StateDict = {}
    for key, x in tensors.items():
        before, after = start.get(key), now.get(key)
        if (
            before is None
            or after is None
            or not x.is_floating_point()
            or before.shape != x.shape
            or after.shape != x.shape
        ):
            moved[key] = x
            continue
        shift = after.detach().to(torch.float64) - before.detach().to(torch.float64)
        moved[key] = (x.detach().to(torch.float64) + shift).to(x.dtype)
    return moved


class StalenessMixing:
    """Wraps a server step (the weighted mean, or a robust rule around it): reweights each update by the staleness
    function of ``ClientUpdate.staleness`` and mixes the result into the state's tensors (module docstring)."""

    def __init__(self, inner: ServerStep, schedule: ScheduleConfig) -> None:
        self.inner = inner
        self.schedule = schedule

    def __call__(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult:
        if self.schedule.client_weights != "buffer":
            return self._federation_weighted(state, updates)
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

    def _federation_weighted(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult:
        """The step with APPFL's client weights w_k (``ClientUpdate.share``): the mean inside at weights
        w_k s(u_k), mixed in by eta sum_k w_k s(u_k) (module docstring)."""
        staled = 0.0
        reweighted = []
        for update in updates:
            if update.share is None:
                raise ValueError(
                    f"schedule.client_weights={self.schedule.client_weights} weighs each update by its client's share "
                    f"of the federation, which the server did not set on {update.client_id}'s"
                )
            weight = update.share * self.schedule.weight(update.staleness)
            staled += weight
            reweighted.append(dataclasses.replace(update, weight=weight))
        result = self.inner(state, reweighted)
        if not result.tensors or staled <= 0:
            return result
        return dataclasses.replace(result, tensors=mix(state.tensors, result.tensors, self.schedule.mixing * staled))
