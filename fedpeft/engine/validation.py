"""The server's checks of every client update before it is aggregated.

A client is not trusted: its upload may be corrupted, crafted, or sent by a device that lies about its data. The
round loop (:mod:`fedpeft.engine.rounds`) passes every update through :meth:`UpdateChecks.reject_reason` first; an
update that fails a check is rejected (never aggregated, counted as a failed client of that round, recorded with
its reason). The checks, in order:

1. the keys and shapes of the uploaded tensors are the ones the method declares for the payload it sent
   (``Method.update_spec``; by default exactly the payload's tensors);
2. every value is finite (no NaN, no infinity), in the tensors and in the tensors among the extras;
3. the weight (the client's number of training examples) is a positive finite number, no larger than the size of
   that client's training set the server knows (when it knows one);
4. with ``validation.max_norm`` set, the L2 norm of the update (its distance from what the server sent, over all
   its tensors together; a tensor the payload did not hold counts whole) is at most that bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fedpeft.core.types import ClientUpdate, Payload

Shapes = Mapping[str, torch.Size | tuple[int, ...]]


class UpdateRejectedError(Exception):
    """An update rejected where it was checked before it reached the server (on its node, under secure
    aggregation); the message is the reason."""


def update_norm(update: ClientUpdate, payload: Payload) -> float:
    """The L2 norm of ``update``'s change to ``payload``, over all its tensors together (float64)."""
    total = 0.0
    for key, tensor in update.tensors.items():
        sent = payload.tensors.get(key)
        value = tensor.detach().to(torch.float64)
        if sent is not None and sent.shape == tensor.shape:
            value = value - sent.detach().to(torch.float64)
        total += float(value.pow(2).sum())
    return math.sqrt(total)


class UpdateChecks:
    """The checks of the module docstring, for one federated phase.

    Args:
        sizes: the training-set size of every client the server knows (client id -> examples); a client it does
            not list has only the positive-weight check.
        max_norm: the bound on an update's norm (``None``: no bound).
    """

    def __init__(self, sizes: Mapping[str, int] | None = None, max_norm: float | None = None) -> None:
        self.sizes = dict(sizes or {})
        self.max_norm = max_norm

    def reject_reason(
        self, update: ClientUpdate, payload: Payload, spec: Shapes | None, sum_of: list[str] | None = None
    ) -> str | None:
        """Why ``update`` (the answer to ``payload``) must not be aggregated; ``None`` when it passes.

        ``spec``: the keys and shapes the method expects (``None``: not checked). ``sum_of``: the clients whose
        updates ``update`` is the securely aggregated mean of (their nodes checked each one; here the example
        count is checked against their total, and the norm bound, which holds per client, is not)."""
        if spec is not None:
            missing = sorted(set(spec) - set(update.tensors))
            extra = sorted(set(update.tensors) - set(spec))
            if missing:
                return f"missing tensors {_some(missing)}"
            if extra:
                return f"unexpected tensors {_some(extra)}"
            for key, shape in spec.items():
                got = tuple(update.tensors[key].shape)
                if got != tuple(shape):
                    return f"tensor {key!r} has shape {list(got)}, expected {list(shape)}"
        extras = {f"extras.{k}": v for k, v in update.extras.items() if isinstance(v, torch.Tensor)}
        for key, tensor in {**update.tensors, **extras}.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return f"tensor {key!r} holds non-finite values"
        weight = update.weight
        if not math.isfinite(weight) or weight <= 0:
            return f"its example count {weight!r} is not a positive number"
        clients = sum_of or [update.client_id]
        known = sum(self.sizes[c] for c in clients) if all(c in self.sizes for c in clients) else None
        if known is not None and weight > known:
            return f"its example count {weight:g} exceeds the {known} examples the server knows it holds"
        if self.max_norm is not None and sum_of is None:
            norm = update_norm(update, payload)
            if norm > self.max_norm:
                return f"its norm {norm:.4g} exceeds the bound {self.max_norm:g}"
        return None


def _some(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
