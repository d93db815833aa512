"""The one round loop both engines share: sampling, dispatch, failures, aggregation and callbacks.

An engine only says how a round's client work reaches a worker (:meth:`Engine.train_clients`: in this process,
or as Flower messages) and how other per-client operations run (:meth:`Engine.map_clients`). Everything else
about a round happens here, in this order:

1. ``method.should_stop(state)`` ends the phase early;
2. ``method.sample(client_ids, round_, seed)`` picks the round's clients (sorted by id);
3. ``method.payload(state, client)`` for each of them, dispatched by the engine;
4. the updates stream into ``method.aggregate`` in client-id order, whichever order they arrive in; a client
   whose work fails is left out of the aggregation and recorded in the cost meter's failures (and as a
   ``failed_client`` event naming its error), and so is an update that fails the server's checks
   (:mod:`fedpeft.engine.validation`: the keys and shapes ``method.update_spec`` declares, finite values, a
   plausible example count, the norm bound), recorded with its reason in the meter's events;
5. the round check: if every sampled client failed (raised or dropped), the run stops with
   :class:`~fedpeft.core.errors.AllClientsFailedError` (whatever aggregating nothing gave, or raised, is
   discarded), since going on would report an untrained model as the method's result; otherwise, if fewer than
   ``min_updates`` updates passed the checks, the round keeps the previous server state (recorded as an event);
6. the state's round counter is set, and every callback's ``after_round`` runs (evaluation, checkpoint,
   progress, in the order given) with the round's metrics: the aggregation's (``train_loss``, ...) and
   ``clients``, ``examples`` (of the valid updates) and ``seconds``; after the last round every callback's
   ``after_phase``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import AllClientsFailedError
from fedpeft.core.faults import FAULT_EXTRA, ClientDroppedError
from fedpeft.core.turns import Turns
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, num_bytes, upload_bytes
from fedpeft.engine.validation import UpdateChecks, UpdateRejectedError
from fedpeft.methods.base import Method, SamplingConfig

log = logging.getLogger("fedpeft")

# ``ClientUpdate.extras`` key of an update that is the securely aggregated mean of several clients' updates
# (fedpeft.engine.flower.secagg): the clients it sums, which count as valid updates of the round.
SUM_OF = "fedpeft.sum_of"
SECONDS_OF = "fedpeft.seconds_of"  # and each one's seconds of work

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
    concurrent_units = 1
    """How many units (the methods of a seed) may run at once, each in a thread of its own, taking turns
    (:class:`~fedpeft.core.turns.Turns`) for their server code; an engine that runs more than one waits with
    :meth:`wait` while replies are due."""
    turns: Turns | None = None

    def units_started(self, count: int) -> None:
        """``count`` units begin, each in a thread (engines that run several at once count them)."""

    def unit_ended(self) -> None:
        """A unit's thread ends."""

    def wait(self, seconds: float) -> None:
        """Wait ``seconds`` for replies, letting another unit's thread run meanwhile."""
        if self.turns is None:
            time.sleep(seconds)
        else:
            self.turns.wait(seconds)

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

    def cost_rows(self) -> list[dict[str, Any]]:
        """The engine's own cost rows for ``costs.jsonl`` (none by default; the Flower engine's per node)."""
        return []

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
        checks: UpdateChecks | None = None,
        min_updates: int = 1,
    ) -> ServerState:
        """Run rounds ``start_round .. method.rounds - 1`` of ``method`` over ``client_ids`` (see the module
        docstring for the order of what happens in a round); returns the final server state.

        ``checks``: the server's checks of every update (default: shapes, finite values and positive example
        counts, no norm bound); ``min_updates``: the fewest valid updates a round needs to change the state."""
        checks = checks or UpdateChecks()
        self.start_phase(label, seed)
        for round_ in range(start_round, method.rounds):
            if method.should_stop(state):
                break
            sampled = sorted(method.sample(client_ids, round_, seed))
            started = time.perf_counter()
            failures: list[str] = []
            rejected: list[str] = []
            examples: list[float] = []  # the weight of every update aggregated
            updates = self._updates(
                label, method, state, sampled, seed, round_, meter, failures, rejected, checks, examples
            )
            needed = method.cfg.min_clients if isinstance(method.cfg, SamplingConfig) else 1
            try:
                new_state, metrics = method.aggregate(state, updates)
            except Exception:
                check_round(round_, len(sampled), failures, needed)  # a round of failures explains the error better
                if len(failures) + len(rejected) < len(sampled):
                    raise
                new_state, metrics = state, {"clients": 0.0}  # nothing valid to aggregate: kept below
            check_round(round_, len(sampled), failures, needed)
            valid = len(sampled) - len(failures) - len(rejected)
            if valid < min_updates:
                reason = f"{valid} valid update(s), fewer than min_updates={min_updates}"
                log.warning("round %d: the server kept its previous state (%s)", round_, reason)
                meter.events.append({"metric": "kept_previous_state", "round": round_, "reason": reason})
                new_state = dataclasses.replace(state)
            seconds = time.perf_counter() - started
            metrics = {**metrics, "clients": float(valid), "examples": sum(examples), "seconds": seconds}
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
        rejected: list[str],
        checks: UpdateChecks,
        examples: list[float],
    ) -> Iterator[ClientUpdate]:
        sent: dict[str, Payload] = {}

        def payload_of(client_id: str) -> Payload:
            sent[client_id] = method.payload(state, client_id)
            return sent[client_id]

        for client_id, outcome, seconds in self.train_clients(label, seed, round_, sampled, payload_of):
            payload = sent.pop(client_id, Payload())
            if isinstance(outcome, UpdateRejectedError):  # checked on its node (secure aggregation)
                log.warning("round %d: the update of client %s was rejected: %s", round_, client_id, outcome)
                rejected.append(client_id)
                event = {"metric": "rejected_update", "round": round_, "client": client_id, "reason": str(outcome)}
                meter.events.append(event)
                continue
            if isinstance(outcome, BaseException):
                how = "dropped out" if isinstance(outcome, ClientDroppedError) else "failed"
                message = f"round {round_}: client {client_id} {how} and was left out ({outcome!r})"
                log.warning(message)
                failures.append(message)
                meter.record_failure(client_id, outcome, round_, message)
                if isinstance(outcome, ClientDroppedError):
                    meter.events.append({"metric": "dropped_client", "round": round_, "client": client_id})
                continue
            sum_of: list[str] | None = outcome.extras.pop(SUM_OF, None)
            contributors = sum_of or [client_id]
            client_seconds = outcome.extras.pop(SECONDS_OF, None) or {client_id: seconds}
            for contributor in contributors:
                down = num_bytes((sent.pop(contributor, None) or payload).tensors)
                meter.record_round(client_seconds.get(contributor, seconds), down, upload_bytes(outcome))
            fault = outcome.extras.pop(FAULT_EXTRA, None)
            faults = fault if isinstance(fault, dict) else {client_id: fault} if fault is not None else {}
            for contributor, kind in faults.items():
                meter.events.append({"metric": "injected_fault", "round": round_, "client": contributor, "kind": kind})
            reason = checks.reject_reason(outcome, payload, method.update_spec(payload), sum_of)
            if reason is not None:
                log.warning("round %d: the update of client(s) %s was rejected: %s", round_, contributors, reason)
                rejected += contributors
                for contributor in contributors:
                    event = {"metric": "rejected_update", "round": round_, "client": contributor, "reason": reason}
                    meter.events.append(event)
                continue
            examples.append(float(outcome.weight))
            yield outcome


def check_round(round_: int, sampled: int, failures: list[str], min_clients: int = 1) -> None:
    """Stop the run when fewer than ``min_clients`` of the clients sampled in round ``round_`` answered
    (``failures``: that round's messages of those that did not; a client whose update arrived answered, valid or
    not). A round without a single update means the method cannot train (a configuration or code error, or every
    node gone), and going on would report the untrained model as the method's result; below ``min_clients`` the
    round is not the one the config asks for. The round is not aggregated or checkpointed: ``--resume`` repeats
    it, for example once the lost nodes are back."""
    answered = sampled - len(failures)
    if not sampled or answered >= min(max(1, min_clients), sampled):
        return
    if answered <= 0:
        raise AllClientsFailedError(f"round {round_}: all {sampled} sampled clients failed; the first: {failures[0]}")
    raise AllClientsFailedError(
        f"round {round_}: only {answered} of {sampled} sampled clients answered, fewer than min_clients="
        f"{min_clients}; the first failure: {failures[0]}"
    )
