"""The in-process engine: one worker, clients run one after another, aggregation streams."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from fedpeft.core.costs import CostMeter, release_memory
from fedpeft.core.types import ClientUpdate, Metrics, ServerState, num_bytes, upload_bytes
from fedpeft.engine.rounds import check_round, sample_round
from fedpeft.methods.base import Method
from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")
RoundCallback = Callable[[ServerState, int, Metrics], None]


class LocalEngine:
    """Runs every client in this process on one :class:`~fedpeft.worker.Worker`."""

    name = "local"

    def __init__(self, worker: Worker, *, on_client: Callable[[], None] | None = None) -> None:
        self.worker = worker
        self.on_client = on_client

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
        on_round_end: RoundCallback | None = None,
    ) -> ServerState:
        """Run rounds ``start_round .. cfg.rounds - 1`` of ``method`` over ``client_ids``."""
        cfg: Any = method.cfg
        for round_ in range(start_round, cfg.rounds):
            if method.should_stop(state):
                break
            sampled = sample_round(method, client_ids, seed, round_)
            started = time.perf_counter()
            failed_before = len(meter.failures)
            updates = self._updates(label, method, state, sampled, seed, round_, meter)
            state, metrics = method.aggregate(state, updates)
            check_round(round_, len(sampled), meter.failures[failed_before:])
            state.round = round_ + 1
            meter.wall_seconds += time.perf_counter() - started
            if on_round_end is not None:
                on_round_end(state, round_, metrics)
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
    ) -> Iterator[ClientUpdate]:
        for client_id in sampled:
            payload = method.payload(state, client_id)
            started = time.perf_counter()
            try:
                update = self.worker.train(label, seed, round_, client_id, payload)
            except Exception as err:  # a failing client must not stop the federation
                message = f"round {round_}: client {client_id} failed and was left out ({err!r})"
                log.warning(message)
                meter.failures.append(message)
                continue
            finally:
                release_memory()
                if self.on_client is not None:
                    self.on_client()
            meter.record_round(time.perf_counter() - started, num_bytes(payload.tensors), upload_bytes(update))
            yield update

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Call the worker operation ``op`` for each client; a failure comes back as the exception."""
        for client_id in client_ids:
            try:
                result: Any = getattr(self.worker, op)(client_id=client_id, **kwargs)
            except Exception as err:
                log.warning("client %s failed in %s: %r", client_id, op, err)
                result = err
            release_memory()
            if self.on_client is not None:
                self.on_client()
            yield client_id, result
