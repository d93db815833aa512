"""The local engine: clients run on this process's worker one after another, or, with ``engine.workers`` of 2 or
more, side by side on worker processes (:mod:`fedpeft.engine.pool`), or, with ``engine.batch_clients`` above 1,
several clients of a batchable method in one batch (:mod:`fedpeft.engine.batched`); either way their results reach
aggregation in client-id order, so the numbers are the same."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from fedpeft.core.config import dump_given
from fedpeft.core.costs import release_memory
from fedpeft.core.turns import Turns
from fedpeft.core.types import Payload, TrainResult
from fedpeft.engine.batched import batched_personalization, batched_training
from fedpeft.engine.operations import operation
from fedpeft.engine.pool import SERVER_TASK, WorkerPool
from fedpeft.engine.resources import EngineSettings
from fedpeft.engine.rounds import ClientOutcome, Engine
from fedpeft.worker import Worker

if TYPE_CHECKING:
    from fedpeft.data.types import FederatedData

log = logging.getLogger("fedpeft")


class LocalEngine(Engine):
    """Runs every client on this process's :class:`~fedpeft.worker.Worker`, or on the worker processes of its
    settings (:class:`~fedpeft.engine.resources.EngineSettings`), each with a worker of its own."""

    name = "local"

    def __init__(
        self,
        worker: Worker,
        settings: EngineSettings | None = None,
        *,
        on_client: Callable[[], None] | None = None,
        data: FederatedData | None = None,
        batch_clients: int = 1,
    ) -> None:
        """``settings``: the worker processes (their count, threads and GPUs, pinned round-robin:
        :class:`WorkerPool`) and how many units (the base evaluation and the methods) run at once, each in a thread
        that takes turns with the others for its server code (:class:`~fedpeft.core.turns.Turns`) and lets them
        have the turn while its clients run (default: every client in this process, one unit at a time);
        ``data``: the federation the run was given (None: a worker process builds it from the config);
        ``batch_clients``: clients of a batchable method trained in one batch (:mod:`fedpeft.engine.batched`)."""
        self.worker = worker
        self.settings = settings or EngineSettings(state=worker.state)
        self.batch_clients = batch_clients
        self.on_client = on_client
        self.pool: WorkerPool | None = None
        if self.settings.processes:
            processes, threads = self.settings.processes, self.settings.threads or 1
            gpus = list(self.settings.gpus)
            self.pool = WorkerPool(dump_given(worker.cfg), worker.run_dir, processes, threads, data, gpus)
            self.pool.start()
            if self.settings.concurrent_units >= 2:
                self.concurrent_units = self.settings.concurrent_units
                self.turns = Turns()

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        """Each client's round: on this process's worker, the next one starts when aggregation asks for its update;
        on worker processes, as soon as one is free."""
        if self.pool is not None:

            def kwargs_of(client_id: str) -> dict[str, object]:
                return {"label": label, "seed": seed, "round_": round_, "payload": payload_of(client_id)}

            for client_id, outcome, seconds in self.pool.run("train", client_ids, kwargs_of, self._pause):
                self._after_client(release=False)
                yield ClientOutcome.of_training(client_id, cast("TrainResult | BaseException", outcome), seconds)
            return
        if self._batched(label):
            for outcome in batched_training(
                self.worker, self.batch_clients, label, seed, round_, client_ids, payload_of
            ):
                self._after_client()
                yield outcome
            return
        for client_id in client_ids:
            payload = payload_of(client_id)
            started = time.perf_counter()
            result: TrainResult | Exception
            try:
                result = self.worker.train(label, seed, round_, client_id, payload)
            except Exception as err:  # a failing client must not stop the federation
                result = err
            finally:
                self._after_client()
            yield ClientOutcome.of_training(client_id, result, time.perf_counter() - started)

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, object]]:
        """Call the worker operation ``op`` for each client; a failure comes back as the exception."""
        if self.pool is not None:
            for client_id, value, _ in self.pool.run(op, client_ids, lambda _client: kwargs, self._pause):
                if isinstance(value, BaseException):
                    log.warning("client %s failed in %s: %r", client_id, op, value)
                self._after_client(release=False)
                yield client_id, value
            return
        if op == "personalize" and self._batched(kwargs["label"]):
            for client_id, value in batched_personalization(self.worker, self.batch_clients, client_ids, **kwargs):
                if isinstance(value, BaseException):
                    log.warning("client %s failed in %s: %r", client_id, op, value)
                self._after_client()
                yield client_id, value
            return
        run = operation(op)
        for client_id in client_ids:
            try:
                result: object = run(self.worker, client_id=client_id, **kwargs)
            except Exception as err:
                log.warning("client %s failed in %s: %r", client_id, op, err)
                result = err
            self._after_client()
            yield client_id, result

    def call_worker(self, op: str, worker: Worker, **kwargs: object) -> Any:
        """Run the worker operation ``op`` once, for no client, on this process's worker or, with worker processes,
        on one of them (the model is theirs; this process loads none); what it raises is raised here."""
        if self.pool is None:
            return super().call_worker(op, worker, **kwargs)
        for _, value, _ in self.pool.run(op, [SERVER_TASK], lambda _client: kwargs, self._pause):
            if isinstance(value, BaseException):
                raise value
            return value
        raise AssertionError("the pool gave no result")

    def running(self) -> dict[str, int]:
        """The worker process that runs each client's task now, by client (none without worker processes)."""
        return self.pool.running() if self.pool is not None else {}

    def workers_peak_rss_mb(self) -> float | None:
        """The largest peak resident memory (MiB) of the worker processes so far (None without them)."""
        return self.pool.peak_rss_mb() if self.pool is not None else None

    @property
    def _pause(self) -> Callable[[float], None] | None:
        """How a unit waits for its clients' results when units run at once, without the turn until a process
        has a message (None: the pool blocks)."""
        turns, pool = self.turns, self.pool
        if turns is None or pool is None:
            return None
        return lambda seconds: turns.wait(seconds, until=pool.readable)

    def stop(self) -> None:
        """The run was interrupted: every unit's thread raises ``KeyboardInterrupt`` at its next look for results."""
        if self.pool is not None:
            self.pool.stopped.set()

    def close(self) -> None:
        """End the worker processes, if any."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _batched(self, label: str) -> bool:
        """Whether the clients of method ``label`` train in batches (``batch_clients`` above 1, a batchable method)."""
        return self.batch_clients > 1 and self.worker.methods[label].batchable_clients

    def _after_client(self, *, release: bool = True) -> None:
        if release:
            release_memory()
        if self.on_client is not None:
            self.on_client()
