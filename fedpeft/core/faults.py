"""Faults injected into clients' work on purpose, from the experiment config's ``faults`` list.

They exercise what a real federation meets (a crashing device, a corrupted or malicious upload, a straggler, a
client that never answers) on either engine, through the same worker code as a normal round: the fault is applied
where the client computes, so the broken update travels (and, on the Flower engine, is encoded and decoded) like
a real one and meets the server's update validation (:mod:`fedpeft.engine.validation`).

Kinds (``value`` where it applies):

- ``raise``: the client's work raises an error (a crash);
- ``drop``: the client never answers (no update; recorded as dropped);
- ``nan`` / ``inf``: one entry of every uploaded tensor becomes NaN / +inf;
- ``wrong_shape``: the first uploaded tensor gets an extra row of zeros;
- ``scale``: the update moves ``value`` times as far from what the server sent (a boosted, poisoned update);
- ``slow``: the client waits ``value`` seconds before it trains (a straggler); its update is normal.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, model_validator

if TYPE_CHECKING:  # the config imports this module, and reading a config needs no torch
    from fedpeft.core.types import ClientUpdate, Payload

FaultKind = Literal["raise", "nan", "inf", "wrong_shape", "scale", "slow", "drop"]

# The key of ``ClientUpdate.extras`` that names a fault injected into an update that still reaches the server.
FAULT_EXTRA = "injected_fault"


class InjectedFaultError(RuntimeError):
    """The error an injected ``raise`` fault raises in a client's work."""


class ClientDroppedError(RuntimeError):
    """An injected ``drop`` fault: the client never answered this round."""


class FaultConfig(BaseModel):
    """One fault: ``kind`` in the rounds ``rounds`` (0-based; empty: every round) of the clients ``clients``
    (empty: every client) of the methods ``methods`` (row labels; empty: every method, the base stage included)."""

    model_config = ConfigDict(extra="forbid")

    kind: FaultKind
    clients: list[str] = []
    rounds: list[int] = []
    methods: list[str] = []
    value: float | None = None

    @model_validator(mode="after")
    def _check_value(self) -> FaultConfig:
        if self.kind == "scale" and self.value is None:
            raise ValueError("a `scale` fault needs `value`, the factor that multiplies the update")
        if self.kind == "slow" and (self.value is None or self.value < 0):
            raise ValueError("a `slow` fault needs `value`, the seconds (0 or more) the client waits")
        if any(r < 0 for r in self.rounds):
            raise ValueError("fault `rounds` are 0-based round numbers, 0 or more")
        return self

    def applies(self, label: str, client_id: str, round_: int) -> bool:
        """Whether this fault hits ``client_id`` in round ``round_`` of the method labelled ``label``."""
        return (
            (not self.methods or label in self.methods)
            and (not self.clients or client_id in self.clients)
            and (not self.rounds or round_ in self.rounds)
        )


def before_work(faults: list[FaultConfig]) -> None:
    """Act out the faults that strike before a client trains: ``raise``, ``drop`` and ``slow``."""
    for fault in faults:
        if fault.kind == "raise":
            raise InjectedFaultError("injected fault: the client's work raised")
        if fault.kind == "drop":
            raise ClientDroppedError("injected fault: the client dropped out and never answered")
        if fault.kind == "slow":
            time.sleep(float(fault.value or 0.0))


def corrupt(faults: list[FaultConfig], update: ClientUpdate, payload: Payload) -> ClientUpdate:
    """The update as the faults that corrupt an upload (``nan``, ``inf``, ``wrong_shape``, ``scale``) leave it;
    ``extras[FAULT_EXTRA]`` names every fault that struck (``slow`` included), so the server can record it."""
    import torch

    from fedpeft.core.types import ClientUpdate

    kinds = [f.kind for f in faults if f.kind not in ("raise", "drop")]
    if not kinds:
        return update
    extras = {**update.extras, FAULT_EXTRA: ",".join(kinds)}
    if kinds == ["slow"] * len(kinds):
        return ClientUpdate(update.client_id, update.tensors, update.weight, update.metrics, extras)
    tensors = {k: v.detach().clone() for k, v in update.tensors.items()}
    for fault in faults:
        if fault.kind in ("nan", "inf"):
            bad = float("nan") if fault.kind == "nan" else float("inf")
            for tensor in tensors.values():
                if tensor.numel() and tensor.is_floating_point():
                    tensor.view(-1)[0] = bad
        elif fault.kind == "wrong_shape" and tensors:
            key = next(iter(tensors))
            tensor = tensors[key].reshape(tensors[key].shape or (1,))
            tensors[key] = torch.cat([tensor, torch.zeros_like(tensor[:1])])
        elif fault.kind == "scale":
            factor = float(fault.value or 1.0)
            for key, tensor in tensors.items():
                sent = payload.tensors.get(key)
                if sent is not None and sent.shape == tensor.shape:
                    tensors[key] = sent + factor * (tensor - sent)
                else:
                    tensors[key] = tensor * factor
    return ClientUpdate(update.client_id, tensors, update.weight, update.metrics, extras)
