"""The server step of a weighted-mean method: a round's updates in, the new global tensors out.

A server step is anything with the :class:`ServerStep` call: it reads the server state the round started from (the
global tensors g the clients trained from, the round, the server optimizer's moments) and the round's updates,
and gives a :class:`StepResult`. The innermost step is :class:`WeightedMean`, the streaming data-size weighted
mean of the uploads (:func:`weighted_mean`) with the mean of the clients' metrics (:func:`metric_mean`). Every
other part wraps the step inside it, each in its own module:

1. :class:`~fedpeft.merging.dp.DifferentialPrivacy` (clip each update, add noise: the DP-FedAvg release) or
   :class:`~fedpeft.merging.robust.RobustRule` (``clip``, ``median``, ``trimmed_mean``) replaces the float
   tensors of the mean (the config never asks for both);
2. :class:`~fedpeft.merging.server_opt.ServerOptimizer` takes that aggregate as a pseudo-gradient and keeps its
   moments.

:func:`fedpeft.merging.parts.build_server_step` builds them in the order a method's config names them. A wrapper
passes the updates to the step inside it, so a part that changes the updates themselves (e.g. a staleness
weighting of asynchronous rounds, which rescales each update's weight) wraps the rule, and the rule and the mean
then both receive what it changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

from fedpeft.core.types import ClientUpdate, Metrics, ServerState, StateDict

OptimizerState = dict[str, StateDict]  # moment name ("momentum", "m", "v") -> tensor name -> moment


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What a server step gives.

    Attributes:
        tensors: the new global tensors; empty when nothing was aggregated (the state then stays as it was).
        metrics: the round's metrics (the clients' mean metrics and the step's own, e.g. ``dp_clipped_fraction``).
        moments: the server optimizer's moments for ``ServerState.server_optimizer`` (the state's own when no
            optimizer steps).
    """

    tensors: StateDict
    metrics: Metrics
    moments: OptimizerState | None


class ServerStep(Protocol):
    """A round's server step: ``state`` is the server state the round started from, ``updates`` the valid
    updates in client-id order (an iterator: a step that can stream does not hold them)."""

    def __call__(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult: ...


class MetricMean:
    """The running mean of the clients' numeric metrics (``train_<name>``) and their count (``clients``).

    A round whose weights do not sum to a positive number aggregates nothing and reports its count only.
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0
        self.total_weight = 0.0

    def add(self, update: ClientUpdate) -> None:
        self.count += 1
        self.total_weight += float(update.weight)
        for key, value in update.metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)

    def observe(self, updates: Iterable[ClientUpdate]) -> Iterator[ClientUpdate]:
        """``updates`` as they are, each counted as it passes (to take the metric mean of a stream that another
        function consumes)."""
        for update in updates:
            self.add(update)
            yield update

    def result(self) -> Metrics:
        if self.count == 0 or self.total_weight <= 0:
            return {"clients": float(self.count)}
        metrics = {f"train_{k}": v / self.count for k, v in self.sums.items()}
        metrics["clients"] = float(self.count)
        return metrics


def metric_mean(updates: Iterable[ClientUpdate]) -> Metrics:
    """The clients' numeric metrics averaged over the clients (``train_<name>``), and their count (``clients``)."""
    metrics = MetricMean()
    for update in updates:
        metrics.add(update)
    return metrics.result()


def weighted_mean(updates: Iterable[ClientUpdate]) -> StateDict:
    """The streaming weighted mean of the clients' tensors (each tensor over the clients that upload it, weighted
    by ``update.weight``); empty when there are no updates or their weights do not sum to a positive number.

    Runs in float64 and returns the tensors in their original dtype, so the result does not depend on how many
    clients were folded in before a given one beyond float64 rounding.
    """
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    total = 0.0
    for update in updates:
        w = float(update.weight)
        total += w
        for key, tensor in update.tensors.items():
            dtypes.setdefault(key, tensor.dtype)
            # In place on a copy of its own: the same products and sums as ``sum + tensor.double() * w``, without
            # two more model-sized float64 temporaries per client (the full model's mean took twice as long).
            contribution = tensor.detach().to(torch.float64, copy=True).mul_(w)
            if key in sums:
                sums[key].add_(contribution)
            else:
                sums[key] = contribution
    if total <= 0:
        return {}
    return {k: v.div_(total).to(dtypes[k]) for k, v in sums.items()}


class WeightedMean:
    """The innermost server step: :func:`weighted_mean` of the uploads, streaming, and :func:`metric_mean` of
    their metrics; the server optimizer's moments stay as the state holds them."""

    def __call__(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult:
        metrics = MetricMean()
        tensors = weighted_mean(metrics.observe(updates))
        return StepResult(tensors, metrics.result(), state.server_optimizer)


def float_uploads(updates: Iterable[ClientUpdate]) -> list[StateDict]:
    """Each update's floating-point tensors (what a robust rule or DP replaces; integer buffers keep the mean)."""
    return [{k: v for k, v in update.tensors.items() if v.is_floating_point()} for update in updates]
