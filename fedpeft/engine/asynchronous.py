"""Asynchronous schedules (FedBuff, FedAsync) on a virtual clock: C clients in flight, the server stepping as their
updates arrive.

A client's work takes ``duration`` units of virtual time: its work (local steps, or epochs x batches of its
training set) times its speed factor (``clients.speed``), both fixed for a seed, so the order in which updates
arrive, and the records, are the same on every machine and for any number of workers, and a long asynchronous run
costs the CPU of the clients it trains. The schedule (:class:`AsynchronousSchedule`, whose server steps a
:class:`~fedpeft.engine.phase.FederatedPhase` counts as it counts synchronous rounds):

1. every free slot gets a client, each with the current global state (``method.payload``) and the number of the
   server step that made it; when no client is in flight and C is the clients a round samples, the slots are
   filled with ``method.sample`` of that step (as a synchronous round would be), else with a uniform draw from
   the clients not in flight;
2. the clock moves to the next finishing time; every client finishing then arrives, in client-id order (their
   work, and that of every other client in flight not trained yet, runs through the engine at that moment, in one
   batch per state version);
3. each arrival is checked like a synchronous round's update (failures and rejections recorded the same way), and
   so is its staleness u (server steps since its state): u > ``max_staleness`` is rejected; a valid one is
   buffered with its staleness (and, with APPFL's ``client_weights``, its client's share of the federation; with
   ``delta_from: start``, moved onto the current state with its difference from the state it trained from kept,
   :func:`fedpeft.merging.staleness.rebase`);
4. with K updates buffered (K = 1 for FedAsync) the server steps (``method.aggregate``, whose server step weights
   and mixes them, :mod:`fedpeft.merging.staleness`); the step is a round of the records, its metrics with
   ``virtual_time`` and ``staleness``, counted by the phase as a synchronous round is (its round set, the
   callbacks, the checkpoint, which lists the clients then in flight).

With every client equally fast and K = C = the clients of a round, all C arrive together, the server steps once
on all of them, and the next C get the new state: the synchronous rounds, bit for bit.

The virtual clock (:class:`VirtualClock`) is the local engine's; the engine chooses (:attr:`Engine.arrival_order`).
The Flower engine's :class:`ArrivalClock` sends each client's work as it is dispatched and takes the replies in
the order they come (step 2): a node's reply, not a virtual duration, decides the order, and the records depend on
the machines. Everything else (dispatch, staleness, buffering, the server steps, failures) is the same schedule.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol, cast

from fedpeft.core.config import SpeedConfig
from fedpeft.core.errors import AllClientsFailedError, UserError
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Payload
from fedpeft.data.types import ClientData
from fedpeft.engine.phase import FederatedPhase, RoundResult
from fedpeft.engine.rounds import ClientOutcome, Engine, RoundTally
from fedpeft.merging.staleness import rebase
from fedpeft.settings.schedule import ScheduleConfig

_TRAILING_NUMBER = re.compile(r"(\d+)$")


def speed_factor(speed: SpeedConfig, client: ClientData, seed: int) -> float:
    """The client's speed factor: its group's, times its round-robin factor (by the number ending its id), times
    a lognormal draw fixed by the seed and the client."""
    factor = speed.groups.get(client.group, 1.0) if client.group is not None else 1.0
    if speed.round_robin:
        match = _TRAILING_NUMBER.search(client.client_id)
        if match is None:
            raise UserError(
                f"clients.speed.round_robin takes clients by the number at the end of their id, and client "
                f"{client.client_id!r} has none; give speeds by `groups` instead."
            )
        factor *= speed.round_robin[int(match.group(1)) % len(speed.round_robin)]
    if speed.distribution == "lognormal":
        draw = random.Random(derive_seed(seed, "client-speed", client.client_id)).gauss(0.0, 1.0)
        factor *= math.exp(speed.sigma * draw)
    return factor


def client_work(local_steps: int | None, local_epochs: float | None, batch_size: int, examples: int) -> float:
    """A client's work in local optimizer steps: ``local_steps``, or the steps of ``local_epochs`` over its
    ``examples`` in batches of ``batch_size``."""
    if local_steps is not None:
        return float(local_steps)
    return float(math.ceil((local_epochs or 1.0) * math.ceil(max(examples, 1) / batch_size)))


def virtual_durations(
    work: Callable[[ClientData], float], clients: Iterable[ClientData], speed: SpeedConfig, seed: int
) -> dict[str, float]:
    """Each client's virtual duration of one round of work: its ``work`` times its :func:`speed_factor`."""
    return {c.client_id: work(c) * speed_factor(speed, c, seed) for c in clients}


@dataclass
class Flight:
    """A client in flight: the state version it trains from, its payload, when it finishes (on the virtual
    clock), and its outcome once the engine has run its work."""

    client_id: str
    version: int
    payload: Payload
    finish: float = 0.0
    outcome: ClientOutcome | None = None


class AsyncClock:
    """What decides when the clients in flight arrive: :class:`VirtualClock` (the local engine: their virtual
    durations) or :class:`ArrivalClock` (an engine that reports replies as they come: the Flower engine). The
    engine chooses (:attr:`Engine.arrival_order`).

    Attributes:
        now: the virtual time, recorded as each server step's ``virtual_time`` and the state's ``clock``; None
            for a clock that measures none.
    """

    now: float | None = None

    def start(self, flight: Flight) -> None:
        """``flight`` was dispatched."""
        raise NotImplementedError

    def arrivals(self, flights: list[Flight]) -> list[Flight]:
        """Wait for the next of ``flights`` to arrive; returns them, each with its outcome, in the order the loop
        takes them in."""
        raise NotImplementedError

    def end(self, flights: list[Flight]) -> None:
        """The phase ends with ``flights`` still in flight (their updates are not used)."""

    def abort(self) -> None:
        """The phase ended early (an error, an interrupt): whatever is in flight is left as it is."""

    def reachable(self, client_ids: list[str]) -> list[str]:
        """Those of ``client_ids`` that can be drawn now (all of them, unless the engine has lost some)."""
        return client_ids


class VirtualClock(AsyncClock):
    """Arrivals by virtual duration (module docstring): a client's work runs through the engine when its result is
    needed, together with every other client in flight not trained yet."""

    def __init__(self, engine: Engine, label: str, seed: int, durations: dict[str, float], now: float) -> None:
        self.engine, self.label, self.seed, self.durations = engine, label, seed, durations
        self.now: float = now

    def start(self, flight: Flight) -> None:
        """Set ``flight``'s finishing time: now plus its client's virtual duration."""
        flight.finish = self.now + self.durations.get(flight.client_id, 1.0)

    def arrivals(self, flights: list[Flight]) -> list[Flight]:
        """Move the clock to the next finishing time; the flights finishing then, in client-id order, after the
        engine has run the work of every flight not trained yet."""
        self.now = min(f.finish for f in flights)
        arriving = sorted((f for f in flights if f.finish == self.now), key=lambda f: f.client_id)
        _train(self.engine, self.label, self.seed, [f for f in flights if f.outcome is None])
        return arriving


class Arrivals(Protocol):
    """One phase's clients in flight on an engine that reports replies as they come (the Flower engine's
    :class:`~fedpeft.engine.flower.arrivals.PhaseArrivals`)."""

    def submit(self, round_: int, client_id: str, payload: Payload) -> None:
        """Send ``client_id``'s training from ``payload`` (of server step ``round_``)."""

    def reachable(self, client_ids: list[str]) -> list[str]:
        """Those of ``client_ids`` whose work can be sent now."""
        ...

    def next_outcomes(self) -> list[ClientOutcome]:
        """Wait until at least one submitted client's outcome is in; return every one in (client-id order)."""
        ...

    def drain(self) -> None:
        """Wait for (and discard) the outcomes of every client still submitted."""

    def close(self) -> None:
        """The phase ended early (an error or an interrupt): it waits for nothing more."""


class ArrivalEngine(Protocol):
    """An engine whose asynchronous phases take replies in the order they come (:attr:`Engine.arrival_order`)."""

    def arrivals(self, label: str, seed: int) -> Arrivals:
        """The clients in flight of phase (``label``, ``seed``), kept apart from other phases running at once."""
        ...


class ArrivalClock(AsyncClock):
    """Arrivals in the order the engine's replies come: a client's work is sent as it is dispatched, and the
    loop takes each reply as it arrives (replies that come together in client-id order). It measures no virtual
    time, and the order, hence the records, depends on the machines. Clients the engine cannot reach now (a
    lost node's) are not drawn."""

    def __init__(self, engine: ArrivalEngine, label: str, seed: int) -> None:
        self.phase = engine.arrivals(label, seed)

    def start(self, flight: Flight) -> None:
        """Send ``flight``'s work to its node now."""
        self.phase.submit(flight.version, flight.client_id, flight.payload)

    def reachable(self, client_ids: list[str]) -> list[str]:
        """Those of ``client_ids`` the engine can send work to now."""
        return self.phase.reachable(client_ids)

    def arrivals(self, flights: list[Flight]) -> list[Flight]:
        """Wait for the next replies; the flights they answer, with their outcomes, in client-id order."""
        by_id = {f.client_id: f for f in flights}
        arriving = []
        for outcome in self.phase.next_outcomes():
            flight = by_id[outcome.client_id]  # the phase's own clients only
            flight.outcome = outcome
            arriving.append(flight)
        return arriving

    def end(self, flights: list[Flight]) -> None:
        """Wait for the clients still in flight and drop their updates."""
        self.phase.drain()

    def abort(self) -> None:
        """The phase ended early: it waits for nothing more."""
        self.phase.close()


def flight_sizes(label: str, schedule: ScheduleConfig, per_round: int, clients: int) -> tuple[int, int]:
    """(C, K) of method ``label``'s asynchronous ``schedule`` on a pool of ``clients`` clients of which a round
    samples ``per_round``: the clients in flight (``concurrency``, by default ``per_round``) and the updates of one
    server step (``buffer_size``, by default C; 1 under FedAsync).

    Raises:
        UserError: ``concurrency`` above the clients there are, or a buffer larger than the clients in flight
            (its default concurrency included), which no server step could fill.
    """
    if schedule.concurrency is not None and schedule.concurrency > clients:
        raise UserError(
            f"Method {label!r} sets schedule.concurrency={schedule.concurrency}, but its federated phase has "
            f"{clients} clients to train at once; set concurrency to {clients} or less."
        )
    concurrency = schedule.concurrency or min(per_round, clients)
    buffer_size = 1 if schedule.kind == "fedasync" else (schedule.buffer_size or concurrency)
    if buffer_size > concurrency:
        default = "" if schedule.concurrency is not None else " (its default: the clients a round samples)"
        raise UserError(
            f"Method {label!r} sets schedule.buffer_size K={buffer_size}, more than its concurrency C={concurrency}"
            f"{default}, so a server step would wait for more updates than clients train at once; set buffer_size "
            f"to {concurrency} or less, or concurrency to {buffer_size} or more."
        )
    return concurrency, buffer_size


def client_shares(
    label: str, schedule: ScheduleConfig, client_ids: list[str], sizes: Mapping[str, int]
) -> dict[str, float] | None:
    """Each client's weight w in a server step of method ``label``'s ``schedule`` under APPFL's client weights
    (``client_weights``): 1/N for ``equal``, its training examples (``sizes``) over those of the N clients
    ``client_ids`` for ``sample_size``; ``None`` for fedpeft's ``buffer`` (the step weights the updates it has).

    Raises:
        UserError: ``sample_size`` when the server knows no training-set size of some client, or only empty ones.
    """
    if schedule.client_weights == "buffer":
        return None
    if schedule.client_weights == "equal":
        return {c: 1.0 / len(client_ids) for c in client_ids}
    unknown = [c for c in client_ids if c not in sizes]
    total = sum(sizes.get(c, 0) for c in client_ids)
    if unknown or total <= 0:
        why = f"of client {unknown[0]!r} is unknown to the server" if unknown else "of every client is 0"
        raise UserError(
            f"Method {label!r} sets schedule.client_weights: sample_size, which weighs each client by its training "
            f"examples over the federation's, but the training-set size {why}; use client_weights: equal or buffer."
        )
    return {c: sizes[c] / total for c in client_ids}


class AsynchronousSchedule:
    """FedBuff or FedAsync (module docstring): C clients in flight, a server step every K valid arrivals.

    Args:
        engine: what runs the clients' work; its clock (:attr:`Engine.arrival_order`) decides the order of
            arrivals.
        schedule: the method's ``schedule``.
        durations: each client's virtual duration (the virtual clock's).
    """

    def __init__(self, engine: Engine, schedule: ScheduleConfig, durations: dict[str, float]) -> None:
        self.engine, self.schedule, self.durations = engine, schedule, durations

    def steps(self, phase: FederatedPhase) -> Generator[RoundResult, None, None]:
        """The phase's server steps from ``phase.state.round``, one result each, with the clients then in flight.
        Clients listed in flight on a resume (``phase.in_flight``) are dispatched first, with the restored state
        (the updates they were training were lost with the interrupted run). APPFL's ``sample_size`` client
        weights take the clients' training-set sizes the server knows from ``phase.checks``."""
        engine, label, seed = self.engine, phase.label, phase.seed
        per_round = len(phase.method.sample(phase.client_ids, phase.state.round, seed))
        concurrency, buffer_size = flight_sizes(label, self.schedule, per_round, len(phase.client_ids))
        shares = client_shares(label, self.schedule, phase.client_ids, phase.checks.sizes)
        buffer: list[ClientUpdate] = []
        streak = 0
        tally = RoundTally(phase.state.round, [], phase.meter)
        started = time.perf_counter()
        engine.start_phase(label, seed)
        clock: AsyncClock = (
            ArrivalClock(cast(ArrivalEngine, engine), label, seed)
            if engine.arrival_order
            else VirtualClock(engine, label, seed, self.durations, phase.state.clock)
        )
        slots = _Slots(phase, clock, concurrency, per_round)
        try:
            while phase.running():
                slots.fill()
                if not slots.flights:
                    raise AllClientsFailedError(
                        f"server step {phase.state.round + 1}: no client of the seen pool can be reached now (the "
                        "nodes serving them were lost), so the asynchronous schedule has none to send."
                    )
                for flight in clock.arrivals(slots.flights):
                    slots.flights.remove(flight)
                    update = self._arrival(phase, flight, tally, shares)
                    if update is None:
                        streak += 1
                        if streak >= max(concurrency, buffer_size) * 2:
                            first = tally.failures[0] if tally.failures else f"client {flight.client_id} was rejected"
                            raise AllClientsFailedError(
                                f"server step {phase.state.round + 1}: the last {streak} clients to arrive under "
                                f"the asynchronous schedule all failed or were rejected; the first: {first}"
                            )
                        continue
                    streak = 0
                    buffer.append(update)
                    if len(buffer) < buffer_size:
                        continue
                    yield self._server_step(phase, buffer, clock, started, slots.flights)
                    buffer, tally, started = [], RoundTally(phase.state.round, [], phase.meter), time.perf_counter()
                    if not phase.running():
                        break
        except BaseException:
            clock.abort()
            raise
        clock.end(slots.flights)

    def _arrival(
        self, phase: FederatedPhase, flight: Flight, tally: RoundTally, shares: dict[str, float] | None
    ) -> ClientUpdate | None:
        """The update ``flight`` brings, ready for the buffer (its staleness, its share, rebased with
        ``delta_from: start``), or ``None`` when it failed or was rejected (recorded in ``tally``)."""
        state = phase.state
        tally.sampled.append(flight.client_id)
        assert flight.outcome is not None
        staleness = state.round - flight.version
        sent = {flight.client_id: flight.payload}
        too_stale = partial(self._too_stale, staleness)
        update = self.engine.receive(phase.method, flight.outcome, sent, phase.checks, tally, too_stale)
        if update is None:
            return None
        if self.schedule.delta_from == "start" and staleness > 0:  # the state it trained from is not the current
            now = phase.method.payload(state, flight.client_id).tensors
            update = dataclasses.replace(update, tensors=rebase(update.tensors, flight.payload.tensors, now))
        share = None if shares is None else shares[flight.client_id]
        return dataclasses.replace(update, staleness=staleness, share=share)

    def _too_stale(self, staleness: int, _update: ClientUpdate) -> str | None:
        limit = self.schedule.max_staleness
        return None if limit is None or staleness <= limit else f"staleness {staleness} exceeds max_staleness={limit}"

    @staticmethod
    def _server_step(
        phase: FederatedPhase, buffer: list[ClientUpdate], clock: AsyncClock, started: float, flights: list[Flight]
    ) -> RoundResult:
        """The server step on the ``buffer`` of K updates, begun at ``started``, with ``flights`` still in flight."""
        state = phase.state
        new_state, metrics = phase.method.aggregate(state, iter(buffer))
        seconds = time.perf_counter() - started
        metrics = {
            **metrics,
            "clients": float(len(buffer)),
            "examples": sum(float(u.weight) for u in buffer),
            "seconds": seconds,
        }
        if clock.now is not None:
            metrics["virtual_time"] = clock.now
        metrics["staleness"] = sum(u.staleness for u in buffer) / len(buffer)
        now = state.clock if clock.now is None else clock.now
        return RoundResult(new_state, metrics, seconds, now, [f.client_id for f in flights])


class _Slots:
    """A phase's C slots of clients in flight (module docstring, step 1), each given the phase's current state."""

    def __init__(self, phase: FederatedPhase, clock: AsyncClock, concurrency: int, per_round: int) -> None:
        self.phase, self.clock, self.concurrency, self.per_round = phase, clock, concurrency, per_round
        self.flights: list[Flight] = []
        self.dispatches = 0
        clients = set(phase.client_ids)
        self.in_order = sorted(clients)
        self.resent = [c for c in dict.fromkeys(phase.in_flight) if c in clients][:concurrency]

    def fill(self) -> None:
        """Give every free slot a client: first those in flight at the checkpoint resumed from, then, with none in
        flight and C the clients of a round, the round's sample, else a uniform draw from the clients not in
        flight."""
        phase = self.phase
        if self.resent:
            self._dispatch(self.resent)
            self.resent = []
        free = self.concurrency - len(self.flights)
        if free <= 0:
            return
        if not self.flights and free == self.per_round:
            chosen = sorted(phase.method.sample(phase.client_ids, phase.state.round, phase.seed))
        else:
            busy = {f.client_id for f in self.flights}
            idle = self.clock.reachable([c for c in self.in_order if c not in busy])
            rng = random.Random(derive_seed(phase.seed, phase.label, "async-dispatch", self.dispatches))
            chosen = sorted(rng.sample(idle, min(free, len(idle))))
        self.dispatches += 1
        self._dispatch(chosen)

    def _dispatch(self, chosen: list[str]) -> None:
        state = self.phase.state
        for client_id in chosen:
            flight = Flight(client_id, state.round, self.phase.method.payload(state, client_id))
            self.clock.start(flight)
            self.flights.append(flight)


def _train(engine: Engine, label: str, seed: int, flights: list[Flight]) -> None:
    """Run the work of ``flights`` through the engine, one batch per state version they train from."""
    for version in sorted({f.version for f in flights}):
        group = {f.client_id: f for f in flights if f.version == version}
        payloads = {client_id: flight.payload for client_id, flight in group.items()}
        for outcome in engine.train_clients(label, seed, version, sorted(group), payloads.__getitem__):
            group[outcome.client_id].outcome = outcome
