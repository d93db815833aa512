"""The in-process engine: one worker, clients run one after another, aggregation streams."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from fedpeft.core.costs import release_memory
from fedpeft.core.types import Payload, TrainResult
from fedpeft.engine.operations import operation
from fedpeft.engine.rounds import ClientOutcome, Engine
from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")


class LocalEngine(Engine):
    """Runs every client in this process on one :class:`~fedpeft.worker.Worker`."""

    name = "local"

    def __init__(self, worker: Worker, *, on_client: Callable[[], None] | None = None) -> None:
        self.worker = worker
        self.on_client = on_client

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        """Each client's round, one after another: the next one starts when aggregation asks for its update."""
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

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Call the worker operation ``op`` for each client; a failure comes back as the exception."""
        run = operation(op)
        for client_id in client_ids:
            try:
                result: Any = run(self.worker, client_id=client_id, **kwargs)
            except Exception as err:
                log.warning("client %s failed in %s: %r", client_id, op, err)
                result = err
            self._after_client()
            yield client_id, result

    def _after_client(self) -> None:
        release_memory()
        if self.on_client is not None:
            self.on_client()
