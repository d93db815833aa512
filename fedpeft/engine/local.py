"""The in-process engine: one model, clients run one after another, aggregation streams."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fedpeft.data.types import ClientData
from fedpeft.engine.common import CostMeter, client_seed, sample_clients
from fedpeft.engine.state import ClientStateStore
from fedpeft.methods.base import Method
from fedpeft.models.runtime import ModelRuntime
from fedpeft.types import ClientUpdate, Metrics, ServerState, num_bytes

log = logging.getLogger("fedpeft")
T = TypeVar("T")
RoundCallback = Callable[[ServerState, int, Metrics], None]


class LocalEngine:
    """Runs every client in this process on one shared :class:`ModelRuntime`."""

    name = "local"

    def __init__(self, runtime: ModelRuntime, *, on_client: Callable[[], None] | None = None) -> None:
        self.runtime = runtime
        self.on_client = on_client

    def run_rounds(
        self,
        method: Method,
        state: ServerState,
        clients: list[ClientData],
        *,
        seed: int,
        store: ClientStateStore,
        meter: CostMeter,
        start_round: int = 0,
        on_round_end: RoundCallback | None = None,
    ) -> ServerState:
        """Run rounds ``start_round .. cfg.rounds - 1`` of ``method`` over ``clients``."""
        by_id = {c.client_id: c for c in clients}
        cfg: Any = method.cfg
        for round_ in range(start_round, cfg.rounds):
            sampled = sample_clients(list(by_id), cfg.fraction, cfg.min_clients, seed, round_)
            started = time.perf_counter()
            updates = self._updates(method, state, [by_id[c] for c in sampled], seed, round_, store, meter)
            state, metrics = method.aggregate(state, updates)
            state.round = round_ + 1
            meter.wall_seconds += time.perf_counter() - started
            if on_round_end is not None:
                on_round_end(state, round_, metrics)
        return state

    def _updates(
        self,
        method: Method,
        state: ServerState,
        clients: list[ClientData],
        seed: int,
        round_: int,
        store: ClientStateStore,
        meter: CostMeter,
    ) -> Iterator[ClientUpdate]:
        for client in clients:
            payload = method.payload(state, client.client_id)
            started = time.perf_counter()
            try:
                update, client_state = method.client_update(
                    self.runtime,
                    client,
                    payload,
                    store.get(client.client_id),
                    client_seed(seed, method.name, "train", round_, client.client_id),
                )
            except Exception as err:  # a failing client must not stop the federation
                message = f"round {round_}: client {client.client_id} failed and was left out ({err!r})"
                log.warning(message)
                meter.failures.append(message)
                continue
            finally:
                if self.on_client is not None:
                    self.on_client()
            if client_state is not None:
                store.put(client.client_id, client_state, round_)
            meter.client_seconds += time.perf_counter() - started
            meter.client_rounds += 1
            meter.bytes_down += num_bytes(payload.tensors)
            meter.bytes_up += num_bytes(update.tensors)
            yield update

    def map_clients(
        self, work: Callable[[ModelRuntime, ClientData], T], clients: list[ClientData]
    ) -> Iterator[tuple[ClientData, T | BaseException]]:
        """Apply ``work`` to each client; a failure comes back as the exception instead of stopping the loop."""
        for client in clients:
            try:
                result: T | BaseException = work(self.runtime, client)
            except Exception as err:
                log.warning("client %s failed: %r", client.client_id, err)
                result = err
            if self.on_client is not None:
                self.on_client()
            yield client, result
