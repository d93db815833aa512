"""Faults injected into clients' work on purpose, from the experiment config's ``faults`` list.

They exercise what a real federation meets (a crashing device, a corrupted or malicious upload, a straggler, a
client that never answers) on either engine, through the same worker code as a normal round: the fault is applied
where the client computes, so the broken update travels (and, on the Flower engine, is encoded and decoded) like
a real one and meets the server's update validation (:mod:`fedpeft.engine.validation`). The server records every
fault that strikes as an ``injected_fault`` event (``raise`` and ``drop`` by the error they raise,
:data:`INJECTED_ERRORS`; the others as the worker reports them beside the update, ``TrainResult.faults``).

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

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from fedpeft.core.errors import UserError

if TYPE_CHECKING:  # the config imports this module, and reading a config needs no torch
    from fedpeft.core.types import ClientUpdate, Payload

FaultKind = Literal["raise", "nan", "inf", "wrong_shape", "scale", "slow", "drop"]


class InjectedFaultError(RuntimeError):
    """The error an injected ``raise`` fault raises in a client's work."""


class ClientDroppedError(RuntimeError):
    """The client never answered this round: an injected ``drop`` fault, or its node dropped out of secure
    aggregation."""


class InjectedDropError(ClientDroppedError):
    """The error an injected ``drop`` fault raises in a client's work."""


# The error each fault that strikes by raising raises (the Flower engine rebuilds them from a node's report).
INJECTED_ERRORS: dict[type[RuntimeError], FaultKind] = {InjectedFaultError: "raise", InjectedDropError: "drop"}


class FaultConfig(BaseModel):
    """One fault: ``kind`` in the rounds ``rounds`` (counted from 1 as the log, results.jsonl and costs.jsonl count
    them; empty: every round) of the clients ``clients`` (empty: every client) of the methods ``methods`` (row
    labels; empty: every method, the base stage included)."""

    model_config = ConfigDict(extra="forbid")

    kind: FaultKind
    clients: list[str] = []
    rounds: list[int] = []
    methods: list[str] = []
    value: float | None = None

    @field_validator("rounds")
    @classmethod
    def _check_rounds(cls, rounds: list[int]) -> list[int]:
        below = [r for r in rounds if r < 1]
        if below:
            raise ValueError(
                f"fault rounds count from 1, as the log does, so {below[0]} names no round; write 1 for the first"
            )
        return rounds

    @model_validator(mode="after")
    def _check_value(self) -> FaultConfig:
        if self.kind == "scale" and self.value is None:
            raise ValueError("a `scale` fault needs `value`, the factor that multiplies the update")
        if self.kind == "slow" and (self.value is None or self.value < 0):
            raise ValueError("a `slow` fault needs `value`, the seconds (0 or more) the client waits")
        return self

    def applies(self, label: str, client_id: str, round_: int) -> bool:
        """Whether this fault hits ``client_id`` in round ``round_`` (0-based, as the engine counts: the config's
        round ``round_ + 1``) of the method labelled ``label``."""
        return (
            (not self.methods or label in self.methods)
            and (not self.clients or client_id in self.clients)
            and (not self.rounds or round_ + 1 in self.rounds)
        )


def before_work(faults: list[FaultConfig]) -> None:
    """Act out the faults that strike before a client trains: ``raise``, ``drop`` and ``slow``."""
    for fault in faults:
        if fault.kind == "raise":
            raise InjectedFaultError("injected fault: the client's work raised")
        if fault.kind == "drop":
            raise InjectedDropError("injected fault: the client dropped out and never answered")
        if fault.kind == "slow":
            time.sleep(float(fault.value or 0.0))


def reaching_faults(faults: list[FaultConfig]) -> list[str]:
    """The kinds of the ``faults`` striking a client that still let its update reach the server (all but
    ``raise`` and ``drop``), which the server records."""
    return [f.kind for f in faults if f.kind not in ("raise", "drop")]


def corrupt(faults: list[FaultConfig], update: ClientUpdate, payload: Payload) -> ClientUpdate:
    """The update as the faults that corrupt an upload (``nan``, ``inf``, ``wrong_shape``, ``scale``) leave it."""
    import torch

    from fedpeft.core.types import ClientUpdate

    if not any(f.kind in ("nan", "inf", "wrong_shape", "scale") for f in faults):
        return update
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
    return ClientUpdate(update.client_id, tensors, update.weight, update.metrics, update.extras)


def check_fault_methods(faults: list[FaultConfig], labels: list[str], absent: dict[str, str] | None = None) -> None:
    """Refuse a fault aimed at a method the config does not run, so that it cannot silently strike nothing.

    Args:
        faults: the config's ``faults``.
        labels: the labels of the config's methods (and of the base stage, when it is federated).
        absent: labels that other configs have, each with why this one lacks it (said when a fault names it).

    Raises:
        UserError: one sentence naming the entry's key, the unknown label and the known ones.
    """
    for i, fault in enumerate(faults):
        for name in fault.methods:
            if name not in labels:
                why = f" ({name}: {absent[name]})" if absent and name in absent else ""
                raise UserError(
                    f"faults.{i}.methods names {name!r}, which is the label of no method of this config{why}; name "
                    f"one of: {_some(labels)}."
                )


def check_fault_clients(faults: list[FaultConfig], pools: dict[str, str]) -> None:
    """Refuse a fault aimed at a client that never trains, once the data's client ids are known.

    Args:
        faults: the config's ``faults``.
        pools: the pool of every client of the data, by id; the clients of the ``seen`` pool train in federated
            rounds.

    Raises:
        UserError: one sentence naming the entry's key, the client and (some of) the clients that train.
    """
    trained = [client for client, pool in pools.items() if pool == "seen"]
    for i, fault in enumerate(faults):
        for name in fault.clients:
            if name not in trained:
                what = (
                    f"a client of the {pools[name]} pool, which never trains"
                    if name in pools
                    else "which is no client of the data"
                )
                raise UserError(
                    f"faults.{i}.clients names {name!r}, {what}; name clients of the seen pool: {_some(trained)}."
                )


def _some(names: list[str], shown: int = 6) -> str:
    """``names`` sorted and comma-separated, the first ``shown`` of a longer list followed by how many there are."""
    ordered = sorted(names)
    if len(ordered) <= shown:
        return ", ".join(ordered) or "(none)"
    return f"{', '.join(ordered[:shown])}, ... ({len(ordered)} in all)"
