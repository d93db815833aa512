"""Asynchronous schedules (FedBuff, FedAsync) on a virtual clock: C clients in flight, the server stepping as their
updates arrive.

A client's work takes ``duration`` units of virtual time: its work (local steps, or epochs x batches of its
training set) times its speed factor (``clients.speed``), both fixed for a seed, so the order in which updates
arrive, and the records, are the same on every machine and for any number of workers, and a long asynchronous run
costs the CPU of the clients it trains. The loop (:func:`run_asynchronous`):

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
   ``virtual_time`` and ``staleness``, and the callbacks run as after a synchronous round.

With every client equally fast and K = C = the clients of a round, all C arrive together, the server steps once
on all of them, and the next C get the new state: the synchronous rounds, bit for bit.

The virtual clock (:class:`VirtualClock`) is the local engine's; the engine chooses (:attr:`Engine.arrival_order`).
The Flower engine's :class:`ArrivalClock` sends each client's work as it is dispatched and takes the replies in
the order they come (step 2): a node's reply, not a virtual duration, decides the order, and the records depend on
the machines. Everything else (dispatch, staleness, buffering, the server steps, failures) is this one loop.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol, cast

from fedpeft.core.config import SpeedConfig
from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import AllClientsFailedError, UserError
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Payload, ServerState
from fedpeft.data.types import ClientData
from fedpeft.engine.rounds import ClientOutcome, Engine, RoundCallback, RoundTally
from fedpeft.engine.validation import UpdateChecks
from fedpeft.merging.staleness import rebase
from fedpeft.methods.base import Method
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


def run_asynchronous(
    engine: Engine,
    label: str,
    method: Method,
    state: ServerState,
    client_ids: list[str],
    *,
    schedule: ScheduleConfig,
    durations: dict[str, float],
    seed: int,
    meter: CostMeter,
    callbacks: Sequence[RoundCallback],
    checks: UpdateChecks,
    in_flight: list[str] | None = None,
) -> ServerState:
    """Run ``method``'s server steps ``state.round .. method.rounds - 1`` under ``schedule`` (module docstring);
    returns the final state. The engine's clock (:attr:`Engine.arrival_order`) decides the order of arrivals.

    ``in_flight``: kept up to date, before the callbacks of each server step, with the clients then in flight
    (the checkpoint lists them); given non-empty, as on a resume, those clients are dispatched first, with the
    restored state (the updates they were training were lost with the interrupted run). APPFL's ``sample_size``
    client weights take the clients' training-set sizes the server knows from ``checks``."""
    per_round = len(method.sample(client_ids, state.round, seed))
    concurrency, buffer_size = flight_sizes(label, schedule, per_round, len(client_ids))
    shares = client_shares(label, schedule, client_ids, checks.sizes)
    flights: list[Flight] = []
    buffer: list[ClientUpdate] = []
    dispatches, streak = 0, 0
    phase_clients = set(client_ids)
    in_order = sorted(phase_clients)
    resent = [c for c in dict.fromkeys(in_flight or []) if c in phase_clients][:concurrency]
    tally = RoundTally(state.round, [], meter)
    started = time.perf_counter()
    engine.start_phase(label, seed)
    clock: AsyncClock = (
        ArrivalClock(cast(ArrivalEngine, engine), label, seed)
        if engine.arrival_order
        else VirtualClock(engine, label, seed, durations, state.clock)
    )

    def too_stale(staleness: int, _update: ClientUpdate) -> str | None:
        limit = schedule.max_staleness
        return None if limit is None or staleness <= limit else f"staleness {staleness} exceeds max_staleness={limit}"

    def dispatch(chosen: list[str]) -> None:
        for client_id in chosen:
            flight = Flight(client_id, state.round, method.payload(state, client_id))
            clock.start(flight)
            flights.append(flight)

    def fill() -> None:
        nonlocal dispatches, resent
        if resent:  # a resume: the clients in flight at the checkpoint go first
            dispatch(resent)
            resent = []
        free = concurrency - len(flights)
        if free <= 0:
            return
        busy = {f.client_id for f in flights}
        if not flights and free == per_round:
            chosen = sorted(method.sample(client_ids, state.round, seed))
        else:
            idle = clock.reachable([c for c in in_order if c not in busy])
            rng = random.Random(derive_seed(seed, label, "async-dispatch", dispatches))
            chosen = sorted(rng.sample(idle, min(free, len(idle))))
        dispatches += 1
        dispatch(chosen)

    try:
        while state.round < method.rounds and not method.should_stop(state):
            fill()
            if not flights:
                raise AllClientsFailedError(
                    f"server step {state.round + 1}: no client of the seen pool can be reached now (the nodes serving "
                    "them were lost), so the asynchronous schedule has none to send."
                )
            for flight in clock.arrivals(flights):
                flights.remove(flight)
                tally.sampled.append(flight.client_id)
                assert flight.outcome is not None
                staleness = state.round - flight.version
                sent = {flight.client_id: flight.payload}
                update = engine.receive(method, flight.outcome, sent, checks, tally, partial(too_stale, staleness))
                if update is None:
                    streak += 1
                    if streak >= max(concurrency, buffer_size) * 2:
                        first = tally.failures[0] if tally.failures else f"client {flight.client_id} was rejected"
                        raise AllClientsFailedError(
                            f"server step {state.round + 1}: the last {streak} clients to arrive under the "
                            f"asynchronous schedule all failed or were rejected; the first: {first}"
                        )
                    continue
                streak = 0
                if schedule.delta_from == "start" and staleness > 0:  # the state it trained from is not the current
                    now = method.payload(state, flight.client_id).tensors
                    update = dataclasses.replace(update, tensors=rebase(update.tensors, flight.payload.tensors, now))
                share = None if shares is None else shares[flight.client_id]
                buffer.append(dataclasses.replace(update, staleness=staleness, share=share))
                if len(buffer) < buffer_size:
                    continue
                new_state, metrics = method.aggregate(state, iter(buffer))
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
                step = state.round
                state = dataclasses.replace(
                    new_state, round=step + 1, clock=state.clock if clock.now is None else clock.now
                )
                meter.wall_seconds += seconds
                if in_flight is not None:
                    in_flight[:] = [f.client_id for f in flights]
                for callback in callbacks:
                    callback.after_round(state, step, metrics)
                buffer, tally, started = [], RoundTally(state.round, [], meter), time.perf_counter()
                if state.round >= method.rounds or method.should_stop(state):
                    break
    except BaseException:
        clock.abort()
        raise
    clock.end(flights)
    for callback in callbacks:
        callback.after_phase(state)
    return state


def _train(engine: Engine, label: str, seed: int, flights: list[Flight]) -> None:
    """Run the work of ``flights`` through the engine, one batch per state version they train from."""
    for version in sorted({f.version for f in flights}):
        group = {f.client_id: f for f in flights if f.version == version}
        payloads = {client_id: flight.payload for client_id, flight in group.items()}
        for outcome in engine.train_clients(label, seed, version, sorted(group), payloads.__getitem__):
            group[outcome.client_id].outcome = outcome
