"""A federated phase: what it carries from one server step to the next, and the one loop that runs its steps.

A :class:`FederatedPhase` holds the server state (its round and virtual clock), the phase's cost meter, the records
of its rounds, the clients in flight of an asynchronous schedule and the checkpoint it writes. A schedule says how
clients' work becomes server steps: synchronous rounds (:class:`fedpeft.engine.rounds.SynchronousRounds`) or
FedBuff and FedAsync (:class:`fedpeft.engine.asynchronous.AsynchronousSchedule`). After every step, here only:

1. the state's round is set (for aggregated and kept rounds alike: no method's ``aggregate`` sets it) and its
   clock, and the step's wall seconds join the meter's;
2. every callback's ``after_round`` runs (the runner's: evaluation, epsilon, the train rows, its loggers and the
   progress line), and the records it returns join the phase's;
3. the checkpoint is written: state, round, client-state store, meter, round records and clients in flight, what
   ``--resume`` continues from (:meth:`FederatedPhase.resume`).

After the last step, every callback's ``after_phase``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

from fedpeft.core.checkpoints import save_checkpoint
from fedpeft.core.costs import CostMeter
from fedpeft.core.records import ResultRecord
from fedpeft.core.stores import ClientStateStore, StoreSnapshot
from fedpeft.core.types import Metrics, ServerState
from fedpeft.engine.validation import UpdateChecks
from fedpeft.methods.base import Method


@dataclass
class RoundResult:
    """What a schedule makes of one server step, before the phase counts it.

    Attributes:
        state: the server state after the step (aggregated, or the previous one kept); the phase sets its round.
        metrics: the step's metrics: the aggregation's, ``clients``, ``examples``, ``seconds`` and, on a virtual
            clock, ``virtual_time`` (and ``staleness`` under an asynchronous schedule).
        seconds: the step's wall seconds, added to the meter's.
        clock: the virtual time after the step, the state's ``clock``.
        in_flight: the clients in flight after the step (an asynchronous schedule's), kept in the checkpoint.
    """

    state: ServerState
    metrics: Metrics
    seconds: float
    clock: float
    in_flight: list[str] = field(default_factory=list)


class RoundCallback(Protocol):
    """Something that happens after every round of a federated phase, and once after the phase."""

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> Sequence[ResultRecord]:
        """Called after round ``round_`` (0-based) with the state and the round's metrics; returns the records it
        makes of the round (the phase keeps them)."""
        ...

    def after_phase(self, state: ServerState) -> None:
        """Called once after the last round with the final state."""


class AfterRound:
    """A :class:`RoundCallback` from a plain function of ``(state, round_, metrics)``; it records nothing."""

    def __init__(self, fn: Callable[[ServerState, int, Metrics], object]) -> None:
        self.fn = fn

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> Sequence[ResultRecord]:
        """Call the function with the round's state, round (0-based) and metrics."""
        self.fn(state, round_, metrics)
        return []

    def after_phase(self, state: ServerState) -> None:
        """Nothing: the function is called after rounds only."""


class Schedule(Protocol):
    """How the clients' work of a phase becomes server steps."""

    def steps(self, phase: FederatedPhase) -> Generator[RoundResult, None, None]:
        """Run the phase's steps while :meth:`FederatedPhase.running`, yielding each one's result; after each
        yield, ``phase.state`` is the counted state the next step starts from. Closed early (an error, an
        interrupt), it leaves the engine's work as it is."""
        ...


class _SavedPhase(TypedDict):
    state: ServerState
    round: int
    store: StoreSnapshot | None
    meter: dict[str, object]


class SavedPhase(_SavedPhase, total=False):
    """A phase's checkpoint (:class:`PhaseCheckpoint`): its state and round, the client-state store's snapshot, the
    meter's, and the round records and clients in flight (which a checkpoint of an earlier version may lack)."""

    round_records: list[ResultRecord]
    in_flight: list[str]


@dataclass
class PhaseCheckpoint:
    """Where a phase is checkpointed after every round, and the client-state store saved with it.

    A checkpoint (:mod:`fedpeft.core.checkpoints`: safetensors and JSON, no pickle) holds ``state``, ``round``,
    ``store`` (the store's snapshot), ``meter``, ``round_records`` and, while clients are in flight,
    ``in_flight``."""

    path: Path
    store: ClientStateStore

    def save(self, phase: FederatedPhase) -> None:
        """Write ``phase`` after its latest round, atomically."""
        snapshot: SavedPhase = {
            "state": phase.state,
            "round": phase.state.round,
            "store": self.store.snapshot(),
            "meter": phase.meter.snapshot(),
            "round_records": phase.records,
        }
        if phase.in_flight:
            snapshot["in_flight"] = list(phase.in_flight)
        save_checkpoint(snapshot, self.path)


@dataclass
class FederatedPhase:
    """One federated phase of a method: what it carries between server steps and the loop that counts them
    (module docstring).

    Attributes:
        label: the method's row label.
        method: the method.
        client_ids: the clients it draws from (the seen pool).
        seed: the run seed.
        checks: the server's checks of every update (default: shapes, finite values and positive example counts,
            no norm bound); their training-set sizes also weight APPFL's ``sample_size`` client weights.
        callbacks: what runs after every round, in order, and after the phase.
        checkpoint: where the phase is checkpointed after every round; ``None``: nowhere.
        state: the server state; its ``round`` is the rounds done, its ``clock`` the virtual time.
        meter: the phase's cost meter (a method with one phase per budget shares one across them).
        records: the round records (evaluations, epsilon, train rows); given, those of the unit's earlier phases,
            which its checkpoints keep too.
        in_flight: an asynchronous schedule's clients in flight after the latest step; on a resume, those sent
            again first.
    """

    label: str
    method: Method
    client_ids: list[str]
    seed: int
    checks: UpdateChecks = field(default_factory=UpdateChecks)
    callbacks: Sequence[RoundCallback] = ()
    checkpoint: PhaseCheckpoint | None = None
    state: ServerState = field(default_factory=ServerState)
    meter: CostMeter = field(default_factory=CostMeter)
    records: list[ResultRecord] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)

    def resume(self, saved: SavedPhase) -> None:
        """Continue from the checkpoint ``saved`` (:class:`PhaseCheckpoint`): its state after its round, the
        client states as they were then, the meter, the round records and the clients in flight."""
        done = saved["round"]
        self.state = dataclasses.replace(saved["state"], round=done)
        if self.checkpoint is not None:
            self.checkpoint.store.restore(saved["store"])
            self.checkpoint.store.rollback(done - 1)
        self.meter.restore(saved["meter"])
        self.records = list(saved.get("round_records", []))
        self.in_flight = list(saved.get("in_flight", []))

    def running(self) -> bool:
        """Whether another server step is due: rounds are left and the method does not stop early."""
        return self.state.round < self.method.rounds and not self.method.should_stop(self.state)

    def run(self, schedule: Schedule) -> ServerState:
        """Run the phase's server steps from ``state.round`` under ``schedule``; returns the final state."""
        with contextlib.closing(schedule.steps(self)) as steps:
            for result in steps:
                self._count(result)
        for callback in self.callbacks:
            callback.after_phase(self.state)
        return self.state

    def _count(self, result: RoundResult) -> None:
        """The step ``result`` done: the one place the state's round is set, then the callbacks and the
        checkpoint."""
        round_ = self.state.round
        self.state = dataclasses.replace(result.state, round=round_ + 1, clock=result.clock)
        self.meter.wall_seconds += result.seconds
        self.in_flight = result.in_flight
        for callback in self.callbacks:
            self.records += callback.after_round(self.state, round_, result.metrics)
        if self.checkpoint is not None:
            self.checkpoint.save(self)
