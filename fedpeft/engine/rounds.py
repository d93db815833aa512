"""The one round loop both engines share: sampling, dispatch, failures, aggregation and callbacks.

An engine only says how a round's client work reaches a worker (:meth:`Engine.train_clients`: in this process,
or as Flower messages) and how other per-client operations run (:meth:`Engine.map_clients`). Everything else
about a round happens here, in this order:

1. ``method.should_stop(state)`` ends the phase early;
2. ``method.sample(client_ids, round_, seed)`` picks the round's clients (sorted by id);
3. ``method.payload(state, client)`` for each of them, dispatched by the engine;
4. the updates stream into ``method.aggregate`` in client-id order, whichever order they arrive in; a client
   whose work fails is left out of the aggregation and recorded in the cost meter's failures;
5. the round check: if no sampled client succeeded, the run stops with an error (whatever aggregating nothing
   gave, or raised, is discarded), since going on would report an untrained model as the method's result;
6. the state's round counter is set, and every callback's ``after_round`` runs (evaluation, checkpoint,
   progress, in the order given); after the last round every callback's ``after_phase``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from fedpeft.core.costs import CostMeter
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, num_bytes, upload_bytes
from fedpeft.methods.base import Method

log = logging.getLogger("fedpeft")

# What an engine yields for each client of a round: its id, its update (or the exception its work raised) and the
# seconds its work took.
ClientOutcome = tuple[str, ClientUpdate | BaseException, float]


class RoundCallback(Protocol):
    """Something that happens after every round of a federated phase, and once after the phase."""

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> None:
        """Called after round ``round_`` (0-based) with the aggregated state and the round's metrics."""

    def after_phase(self, state: ServerState) -> None:
        """Called once after the last round with the final state."""


class AfterRound:
    """A :class:`RoundCallback` from a plain function of ``(state, round_, metrics)``."""

    def __init__(self, fn: Callable[[ServerState, int, Metrics], None]) -> None:
        self.fn = fn

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> None:
        self.fn(state, round_, metrics)

    def after_phase(self, state: ServerState) -> None:
        return None


class Engine:
    """Runs clients' work for the runner. Subclasses implement :meth:`train_clients` and :meth:`map_clients`."""

    name = "engine"

    def start_phase(self, label: str, seed: int) -> None:
        """Called before the rounds of a federated phase (e.g. to make sure every node has the base model)."""

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        """Run one round's local training of ``client_ids`` (sorted); yield each outcome in that order."""
        raise NotImplementedError

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Call the worker operation ``op`` for each client; a failure comes back as the exception."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds (nothing by default)."""

    def run_rounds(
        self,
        label: str,
        method: Method,
        state: ServerState,
        client_ids: list[str],
        *,
        seed: int,
        meter: CostMeter,
        start_round: int = 0,
        callbacks: Sequence[RoundCallback] = (),
    ) -> ServerState:
        """Run rounds ``start_round .. method.rounds - 1`` of ``method`` over ``client_ids`` (see the module
        docstring for the order of what happens in a round); returns the final server state."""
        self.start_phase(label, seed)
        for round_ in range(start_round, method.rounds):
            if method.should_stop(state):
                break
            sampled = sorted(method.sample(client_ids, round_, seed))
            started = time.perf_counter()
            failures: list[str] = []
            updates = self._updates(label, method, state, sampled, seed, round_, meter, failures)
            try:
                new_state, metrics = method.aggregate(state, updates)
            except Exception:
                check_round(round_, len(sampled), failures)  # a round of failures explains the error better
                raise
            check_round(round_, len(sampled), failures)
            state = new_state
            state.round = round_ + 1
            meter.wall_seconds += time.perf_counter() - started
            for callback in callbacks:
                callback.after_round(state, round_, metrics)
        for callback in callbacks:
            callback.after_phase(state)
        return state

    def _updates(
        self,
        label: str,
        method: Method,
        state: ServerState,
        sampled: list[str],
        seed: int,
        round_: int,
        meter: CostMeter,
        failures: list[str],
    ) -> Iterator[ClientUpdate]:
        bytes_down: dict[str, int] = {}

        def payload_of(client_id: str) -> Payload:
            payload = method.payload(state, client_id)
            bytes_down[client_id] = num_bytes(payload.tensors)
            return payload

        for client_id, outcome, seconds in self.train_clients(label, seed, round_, sampled, payload_of):
            if isinstance(outcome, BaseException):
                message = f"round {round_}: client {client_id} failed and was left out ({outcome!r})"
                log.warning(message)
                failures.append(message)
                meter.failures.append(message)
                continue
            meter.record_round(seconds, bytes_down.get(client_id, 0), upload_bytes(outcome))
            yield outcome


def check_round(round_: int, sampled: int, failures: list[str]) -> None:
    """Stop the run when every client sampled in round ``round_`` failed (``failures``: that round's messages):
    a round without a single update means the method cannot train (a configuration or code error), and going
    on would report the untrained model as the method's result."""
    if sampled and len(failures) >= sampled:
        raise RuntimeError(f"round {round_}: all {sampled} sampled clients failed; the first: {failures[0]}")
