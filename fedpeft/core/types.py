"""Small shared types of the method contract."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

StateDict = dict[str, torch.Tensor]
Metrics = dict[str, float]
ClientId = str
T = TypeVar("T")


def on_cpu(value: T) -> T:
    """``value`` with every tensor in it (inside dicts, lists, tuples and dataclasses) on the CPU: what a client
    sends and keeps between rounds, whatever device it trained on. CPU tensors are kept as they are (no copy)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(on_cpu(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: on_cpu(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


@dataclass
class Payload:
    """What the server sends one client in one round (may differ per client)."""

    tensors: StateDict = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What one client uploads after a round.

    Attributes:
        client_id: who sent it.
        tensors: named tensors to aggregate (adapter weights, model weights, PSG weights, ...).
        weight: the client's aggregation weight (its number of training samples by default).
        metrics: training metrics (loss, steps, ...).
        extras: uploads besides tensors to average (activation counts, gradient sketches, ...).
        staleness: the server steps since the client got the state it trained from, set by the server under an
            asynchronous schedule (0 in synchronous rounds).
        share: the client's weight in an asynchronous server step with APPFL's client weights
            (``schedule.client_weights``: 1/N, or its examples over those of the phase's N clients), set by the
            server; ``None`` otherwise (the step weights ``weight`` over the step's updates).
    """

    client_id: ClientId
    tensors: StateDict
    weight: float
    metrics: Metrics = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    staleness: int = 0
    share: float | None = None


@dataclass
class ServerState:
    """The server's state between rounds: named tensors and the rounds done.

    A method that keeps more subclasses it (a dataclass whose fields all have defaults and hold only tensors,
    numbers, strings, ``None``, lists, tuples and dicts of these, or other server states), so that it
    checkpoints and travels in Flower messages; ``dataclasses.replace`` keeps the subclass.

    ``server_optimizer`` holds the moments of the config's server optimizer (moment name -> tensor name ->
    tensor; ``None`` without one; docs/server-optimizers.md), ``clock`` the virtual time at which an asynchronous
    schedule made the state (docs/async.md). Both are keyword-only, so subclasses' fields keep their positions.
    """

    tensors: StateDict = field(default_factory=dict)
    round: int = 0
    server_optimizer: dict[str, StateDict] | None = field(default=None, kw_only=True)
    clock: float = field(default=0.0, kw_only=True)


@dataclass
class TrainResult:
    """What a worker's ``train`` operation gives back for one client's round: the method's update, and the kinds of
    the injected faults (the config's ``faults``) that struck it and still let it reach the server (``slow``,
    ``nan``, ...), which the server records."""

    update: ClientUpdate
    faults: list[str] = field(default_factory=list)


def num_bytes(tensors: StateDict) -> int:
    """Bytes of a set of named tensors as they travel (element size times count)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def upload_bytes(update: ClientUpdate) -> int:
    """Bytes one client's update carries: its tensors plus the tensors among its extras (e.g. RELA vectors)."""
    extra = {str(k): v for k, v in update.extras.items() if isinstance(v, torch.Tensor)}
    return num_bytes(update.tensors) + num_bytes(extra)
