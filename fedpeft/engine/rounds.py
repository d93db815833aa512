"""Synchronous rounds, and what every schedule shares: the engine, a client's outcome, a round's tally.

An engine only says how a round's client work reaches a worker (:meth:`Engine.train_clients`: in this process,
or as Flower messages) and how other per-client operations run (:meth:`Engine.map_clients`). A phase of
synchronous rounds (:class:`SynchronousRounds`, one schedule of :class:`~fedpeft.engine.phase.FederatedPhase`)
runs each round in this order:

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
6. the phase counts the round (:mod:`fedpeft.engine.phase`: it sets the state's round, for aggregated and kept
   rounds alike, and runs the callbacks and the checkpoint) with the round's metrics: the aggregation's
   (``train_loss``, ...) and ``clients``, ``examples`` (of the valid updates) and ``seconds``.

An engine yields a :class:`ClientOutcome` per client (the method's update or the error, and the engine's own
facts: seconds, injected faults, the clients a secure sum holds); a :class:`RoundTally` keeps what became of the
round's sampled clients.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import AllClientsFailedError
from fedpeft.core.faults import ClientDroppedError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.turns import Turns
from fedpeft.core.types import ClientUpdate, Payload, ServerState, TrainResult, num_bytes, upload_bytes
from fedpeft.engine.operations import operation
from fedpeft.engine.phase import FederatedPhase, RoundCallback, RoundResult
from fedpeft.engine.validation import UpdateChecks, UpdateRejectedError
from fedpeft.methods.base import Method, SamplingConfig

if TYPE_CHECKING:
    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")


@dataclass
class ClientOutcome:
    """What an engine yields for each client of a round: the engine's facts about the client's work beside the
    method's update (none of them travels in ``ClientUpdate.extras``).

    Attributes:
        client_id: the client (for a secure sum: the first of the clients it sums).
        result: its update, or the exception its work raised (an :class:`UpdateRejectedError` when its node
            rejected the update, under secure aggregation).
        seconds: the seconds its work took.
        faults: the injected faults that struck and still let an update come back, by client (kinds joined by
            ``,``), which the server records as ``injected_fault`` events.
        sum_of: for the securely aggregated mean of several clients' updates (:mod:`fedpeft.engine.flower.secagg`),
            the seconds of work of each client it sums, all of which count as valid updates of the round; ``None``
            for one client's update.
    """

    client_id: str
    result: ClientUpdate | BaseException
    seconds: float = 0.0
    faults: dict[str, str] = field(default_factory=dict)
    sum_of: dict[str, float] | None = None

    @classmethod
    def of_training(cls, client_id: str, result: TrainResult | BaseException, seconds: float) -> ClientOutcome:
        """The outcome of the worker's ``train`` operation for ``client_id``: what it returned or raised."""
        if isinstance(result, BaseException):
            return cls(client_id, result, seconds)
        faults = {client_id: ",".join(result.faults)} if result.faults else {}
        return cls(client_id, result.update, seconds, faults)


@dataclass
class RoundTally:
    """What became of the clients sampled in one round, filled in as their outcomes stream into aggregation;
    every failure and rejection is also an event of the phase's cost meter.

    Attributes:
        round_: the round (0-based).
        sampled: the clients sampled (sorted).
        meter: the phase's cost meter.
        failures: one message per client whose work failed or that dropped out.
        rejected: the clients whose update failed the server's checks (or its node's, under secure aggregation).
        weights: the weight (example count) of every update that went on to aggregation.
    """

    round_: int
    sampled: list[str]
    meter: CostMeter
    failures: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    @property
    def valid(self) -> int:
        """How many of the sampled clients' updates passed the checks."""
        return len(self.sampled) - len(self.failures) - len(self.rejected)

    def fail(self, client_id: str, error: BaseException) -> None:
        """``client_id``'s work raised ``error`` (or it dropped out): it is left out of the round."""
        how = "dropped out" if isinstance(error, ClientDroppedError) else "failed"
        message = f"round {self.round_ + 1}: client {client_id} {how} and was left out ({error!r})"
        log.warning(message)
        self.failures.append(message)
        self.meter.record_failure(client_id, error, self.round_, message)
        if isinstance(error, ClientDroppedError):
            self.meter.events.append({"metric": "dropped_client", "round": self.round_ + 1, "client": client_id})

    def reject(self, clients: list[str], reason: str) -> None:
        """The update of ``clients`` (one client's, or a secure sum's) failed a check for ``reason``."""
        shown = clients[0] if len(clients) == 1 else clients
        log.warning("round %d: the update of client(s) %s was rejected: %s", self.round_ + 1, shown, reason)
        self.rejected += clients
        for client_id in clients:
            event = {"metric": "rejected_update", "round": self.round_ + 1, "client": client_id, "reason": reason}
            self.meter.events.append(event)

    def record_faults(self, faults: dict[str, str]) -> None:
        """Record the injected faults that struck clients whose updates came back."""
        for client_id, kind in faults.items():
            event = {"metric": "injected_fault", "round": self.round_ + 1, "client": client_id, "kind": kind}
            self.meter.events.append(event)

    def accept(self, update: ClientUpdate) -> None:
        """``update`` passed the checks and goes on to aggregation."""
        self.weights.append(float(update.weight))

    def check(self, min_clients: int = 1) -> None:
        """Stop the run when too few sampled clients answered (:func:`check_round`)."""
        check_round(self.round_, len(self.sampled), self.failures, min_clients)


class Engine:
    """Runs clients' work for the runner. Subclasses implement :meth:`train_clients` and :meth:`map_clients`."""

    name = "engine"
    concurrent_units = 1
    """How many units (the methods of a seed) may run at once, each in a thread of its own, taking turns
    (:class:`~fedpeft.core.turns.Turns`) for their server code; an engine that runs more than one waits with
    :meth:`wait` while replies are due."""
    turns: Turns | None = None
    arrival_order = False
    """Whether an asynchronous schedule takes the clients' replies in the order they come (the engine then
    implements :class:`~fedpeft.engine.asynchronous.ArrivalEngine`: ``arrivals``, one per phase)
    instead of the virtual clock (:mod:`fedpeft.engine.asynchronous`)."""

    def units_started(self, count: int) -> None:
        """``count`` units begin, each in a thread (engines that run several at once count them)."""

    def unit_ended(self) -> None:
        """A unit's thread ends."""

    def stop(self) -> None:
        """The run was interrupted while units ran at once: their threads should end at their next wait."""

    def wait(self, seconds: float) -> None:
        """Wait ``seconds`` for replies, letting another unit's thread run meanwhile."""
        if self.turns is None:
            time.sleep(seconds)
        else:
            self.turns.wait(seconds)

    def call_worker(self, op: str, worker: Worker, **kwargs: object) -> Any:
        """Run the worker operation ``op`` once, for no client: the server's work that needs the loaded model (a
        method's initial state, the base model's files, costs). By default on ``worker``, this process's; an engine
        whose worker processes hold the model runs it on one of them. What the operation raises is raised here."""
        return operation(op)(worker, client_id=None, **kwargs)

    def start_phase(self, label: str, seed: int) -> None:
        """Called before the rounds of a federated phase (e.g. to make sure every node has the base model)."""

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        """Run one round's local training of ``client_ids`` (sorted); yield each one's :class:`ClientOutcome` in
        that order (from the worker's ``train``: :meth:`ClientOutcome.of_training`)."""
        raise NotImplementedError

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, object]]:
        """Call the worker operation ``op`` for each client; a failure comes back as the exception."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds (nothing by default)."""

    def workers_peak_rss_mb(self) -> float | None:
        """The largest peak resident memory (MiB) of the worker processes this engine runs clients on, so far;
        None where the clients run in this process or on other machines (by default)."""
        return None

    def cost_rows(self) -> list[JSONObject]:
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
        callbacks: Sequence[RoundCallback] = (),
        checks: UpdateChecks | None = None,
        min_updates: int = 1,
        durations: dict[str, float] | None = None,
    ) -> ServerState:
        """Run a phase of synchronous rounds of ``method`` over ``client_ids`` from ``state.round``, checkpointed
        nowhere (:class:`~fedpeft.engine.phase.FederatedPhase` with :class:`SynchronousRounds`); returns the final
        server state."""
        checks = checks or UpdateChecks()
        phase = FederatedPhase(label, method, client_ids, seed, checks, callbacks, state=state, meter=meter)
        return phase.run(SynchronousRounds(self, min_updates=min_updates, durations=durations))

    def receive(
        self,
        method: Method,
        outcome: ClientOutcome,
        sent: dict[str, Payload],
        checks: UpdateChecks,
        tally: RoundTally,
        also: Callable[[ClientUpdate], str | None] | None = None,
    ) -> ClientUpdate | None:
        """The update of ``outcome`` if it is valid, else ``None``: a failure, or an update that fails the server's
        checks (or ``also``, a further check giving the reason to reject), is recorded in ``tally``; the client's
        costs are recorded either way. ``sent``: the payloads sent to the outcome's clients (popped)."""
        client_id, update = outcome.client_id, outcome.result
        payload = sent.pop(client_id, Payload())
        if isinstance(update, UpdateRejectedError):  # checked on its node (secure aggregation)
            tally.reject([client_id], str(update))
            return None
        if isinstance(update, BaseException):
            tally.fail(client_id, update)
            return None
        seconds_of = outcome.sum_of or {client_id: outcome.seconds}
        for contributor, seconds in seconds_of.items():
            down = num_bytes((sent.pop(contributor, None) or payload).tensors)
            tally.meter.record_round(seconds, down, upload_bytes(update))
        tally.record_faults(outcome.faults)
        sum_of = list(outcome.sum_of) if outcome.sum_of is not None else None
        reason = checks.reject_reason(update, payload, method.update_spec(payload), sum_of)
        if reason is None and also is not None:
            reason = also(update)
        if reason is not None:
            tally.reject(list(seconds_of), reason)
            return None
        tally.accept(update)
        return update


class SynchronousRounds:
    """Synchronous rounds (the module docstring's order): each samples its clients, takes in every one's outcome
    and aggregates the valid updates.

    Args:
        engine: what runs the clients' work.
        min_updates: the fewest valid updates a round needs to change the state.
        durations: each client's virtual duration (docs/async.md); given, a round lasts as long as its slowest
            sampled client on the virtual clock, whose time after each round is the metric ``virtual_time`` (for a
            comparison with asynchronous schedules, :class:`fedpeft.engine.asynchronous.AsynchronousSchedule`).
    """

    def __init__(self, engine: Engine, *, min_updates: int = 1, durations: dict[str, float] | None = None) -> None:
        self.engine, self.min_updates, self.durations = engine, min_updates, durations

    def steps(self, phase: FederatedPhase) -> Generator[RoundResult, None, None]:
        """The phase's rounds from ``phase.state.round``, one result each."""
        method, meter = phase.method, phase.meter
        needed = method.cfg.min_clients if isinstance(method.cfg, SamplingConfig) else 1
        self.engine.start_phase(phase.label, phase.seed)
        while phase.running():
            state, round_ = phase.state, phase.state.round
            sampled = sorted(method.sample(phase.client_ids, round_, phase.seed))
            started = time.perf_counter()
            tally = RoundTally(round_, sampled, meter)
            updates = self._updates(phase, state, tally)
            try:
                new_state, metrics = method.aggregate(state, updates)
            except Exception:
                tally.check(needed)  # a round of failures explains the error better
                if tally.valid > 0:
                    raise
                new_state, metrics = state, {"clients": 0.0}  # nothing valid to aggregate: kept below
            tally.check(needed)
            if tally.valid < self.min_updates:
                reason = f"{tally.valid} valid update(s), fewer than min_updates={self.min_updates}"
                log.warning("round %d: the server kept its previous state (%s)", round_ + 1, reason)
                meter.events.append({"metric": "kept_previous_state", "round": round_ + 1, "reason": reason})
                new_state = state
            seconds = time.perf_counter() - started
            metrics = {**metrics, "clients": float(tally.valid), "examples": sum(tally.weights), "seconds": seconds}
            clock = state.clock
            if self.durations is not None and sampled:
                clock += max(self.durations.get(c, 1.0) for c in sampled)
                metrics["virtual_time"] = clock
            yield RoundResult(new_state, metrics, seconds, clock)

    def _updates(self, phase: FederatedPhase, state: ServerState, tally: RoundTally) -> Iterator[ClientUpdate]:
        """The round's valid updates, in client-id order, as the engine's outcomes arrive; what became of each
        sampled client goes into ``tally``."""
        sent: dict[str, Payload] = {}
        method = phase.method

        def payload_of(client_id: str) -> Payload:
            sent[client_id] = method.payload(state, client_id)
            return sent[client_id]

        outcomes = self.engine.train_clients(phase.label, phase.seed, tally.round_, tally.sampled, payload_of)
        for outcome in outcomes:
            update = self.engine.receive(method, outcome, sent, phase.checks, tally)
            if update is not None:
                yield update


def check_round(round_: int, sampled: int, failures: list[str], min_clients: int = 1) -> None:
    """Stop the run when fewer than ``min_clients`` of the clients sampled in round ``round_`` (0-based; messages
    count rounds from 1, as the records do) answered
    (``failures``: that round's messages of those that did not; a client whose update arrived answered, valid or
    not). A round without a single update means the method cannot train (a configuration or code error, or every
    node gone), and going on would report the untrained model as the method's result; below ``min_clients`` the
    round is not the one the config asks for. The round is not aggregated or checkpointed: ``--resume`` repeats
    it, for example once the lost nodes are back."""
    answered = sampled - len(failures)
    if not sampled or answered >= min(max(1, min_clients), sampled):
        return
    if answered <= 0:
        raise AllClientsFailedError(
            f"round {round_ + 1}: all {sampled} sampled clients failed; the first: {failures[0]}"
        )
    raise AllClientsFailedError(
        f"round {round_ + 1}: only {answered} of {sampled} sampled clients answered, fewer than min_clients="
        f"{min_clients}; the first failure: {failures[0]}"
    )
