"""The server side of the Flower engine: client work sent as messages through a ServerApp's ``Grid``.

:class:`GridEngine` is the engine interface; it composes the rooms that do the work:

- :class:`~fedpeft.engine.flower.membership.Membership`: which node serves which client (partitions or sites),
  nodes lost and back;
- :class:`~fedpeft.engine.flower.exchange.Exchange`: the one loop that sends every message, takes in the replies
  and gives up on those overdue;
- :class:`~fedpeft.engine.flower.outbox.Outbox`: the steps of units that run at once, bundled per node;
- :class:`~fedpeft.engine.flower.node_stats.NodeStats`: per-node counters (the engine's cost rows);
- :class:`~fedpeft.engine.flower.base_sync.BaseSync`: the server's base model on every node.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedpeft.core.config import ExperimentConfig, dump_given
from fedpeft.core.errors import UserError
from fedpeft.core.faults import ClientDroppedError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.turns import Turns
from fedpeft.core.types import Payload, TrainResult
from fedpeft.engine.flower.arrivals import UNSERVED, PhaseArrivals
from fedpeft.engine.flower.base_sync import BaseSync
from fedpeft.engine.flower.codec import ClientCall, ClientTaskError, NodeResult, NodeTask, client_error, encode
from fedpeft.engine.flower.exchange import Exchange
from fedpeft.engine.flower.membership import Membership
from fedpeft.engine.flower.messages import CLOSE_QUERY, OPERATIONS
from fedpeft.engine.flower.node_stats import NodeStats
from fedpeft.engine.flower.outbox import Outbox, Request
from fedpeft.engine.rounds import ClientOutcome, Engine

if TYPE_CHECKING:
    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")


class GridEngine(Engine):
    """Runs the clients' work as Flower messages through a ServerApp's ``Grid`` (simulation or deployment).

    Same interface as :class:`~fedpeft.engine.local.LocalEngine`.

    Args:
        grid: the Grid the ServerApp's main received.
        worker: the server process's worker (the data tells which clients exist).
        cfg: the experiment config sent to the ClientApps (default: the worker's).
        run_dir: the run directory sent to the ClientApps (default: the worker's).
        on_client: called after every client's reply (progress).
        reply_timeout: seconds to wait for one message's reply before leaving its clients out (None: no limit);
            at least ``node_timeout`` for a node's first task, which starts its worker and loads the model.
        node_timeout: seconds to wait for SuperNodes to cover every partition.
        poll_interval: seconds between two pulls of replies.
        max_in_flight: messages sent and not yet answered, at most.
        stop: once set, the engine sends and receives nothing more: its caller gets a ``KeyboardInterrupt``
            (the run was interrupted; what is in flight is dropped).
        sites: with site-local data, the node that holds each client
            (:func:`~fedpeft.engine.flower.membership.register_sites`); otherwise the clients map to nodes by
            partition.
        concurrent_units: how many methods of a seed run at once (``engine.concurrent_methods``): their steps
            wait in the outbox, so that a node gets the steps due together as one message and goes from one to
            the next without Flower's idle poll in between.
        closes_run: whether :meth:`close` tells the serving nodes that the run is over (a deployment's ServerApp
            tells every node itself, however the run ends: :func:`end_run_on_nodes`).
    """

    name = "flower"
    arrival_order = True  # asynchronous schedules: :meth:`arrivals`

    def __init__(
        self,
        grid: Grid,
        worker: Worker,
        *,
        cfg: ExperimentConfig | None = None,
        run_dir: Path | None = None,
        on_client: Callable[[], None] | None = None,
        reply_timeout: float | None = None,
        node_timeout: float = 120.0,
        poll_interval: float = 0.1,
        max_in_flight: int = 64,
        stop: threading.Event | None = None,
        sites: dict[str, int] | None = None,
        concurrent_units: int = 1,
        closes_run: bool = True,
    ) -> None:
        self.grid = grid
        self.closes_run = closes_run
        self.worker = worker
        self.cfg = cfg or worker.cfg
        self.run_dir = str(Path(run_dir or worker.run_dir).resolve())
        self.config_text = dump_given(self.cfg)
        self.on_client = on_client
        self.reply_timeout = reply_timeout
        self.node_timeout = node_timeout
        self.concurrent_units = max(1, concurrent_units)
        self.turns = Turns() if self.concurrent_units > 1 else None
        self.stats = NodeStats()
        self.outbox = Outbox()
        self.exchange = Exchange(
            grid,
            poll_interval=poll_interval,
            max_in_flight=max_in_flight,
            stop=stop,
            sleep=self.wait,
            outbox=self.outbox,
            stats=self.stats,
        )
        self.membership = Membership(
            self.exchange,
            [c.client_id for c in worker.data.clients],
            sites=sites,
            config_text=self.config_text,
            node_timeout=node_timeout,
            reply_timeout=reply_timeout,
        )
        self.base_sync = BaseSync(
            self.exchange,
            self.membership,
            lambda seed: self.worker.bases.base_checkpoint(seed),
            run_dir=self.run_dir,
            reply_timeout=reply_timeout,
            node_timeout=node_timeout,
        )
        self.membership.on_change = self.base_sync.forget  # a node that takes over clients may lack the base model

    # ------------------------------------------------------------------ engine interface
    def start_phase(self, label: str, seed: int) -> None:
        """Every node needs the base model of ``seed`` before its clients train (not for the base stage)."""
        from fedpeft.worker import BASE_STAGE_LABEL

        if label != BASE_STAGE_LABEL:
            self.sync_base(seed)

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        """Send every client's round as one message; once all replies are in, yield them in client-id order
        (the order the local engine aggregates in, so the sums round alike). With ``engine.secagg`` the round
        runs as SecAgg+ (:mod:`fedpeft.engine.flower.secagg`) and yields one update, the secure mean."""
        from fedpeft.worker import BASE_STAGE_LABEL

        self.membership.refresh()
        if label != BASE_STAGE_LABEL:
            self.sync_base(seed)  # a node that took over a partition mid-phase needs the base model
        if self.cfg.engine.secagg is not None:
            from fedpeft.engine.flower.secagg import secure_round

            yield from secure_round(self, self.cfg.engine.secagg, label, seed, round_, client_ids, payload_of)
            return
        step = {"label": label, "seed": seed, "round_": round_}
        clients = [(client_id, {**step, "payload": payload_of(client_id)}) for client_id in client_ids]
        outcomes: dict[str, tuple[TrainResult | BaseException, float]] = {}
        group = f"{label}-seed{seed}-round{round_ + 1}"  # rounds counted from 1, as in the records
        for client_id, outcome, seconds in self._run_tasks("train", clients, group=group):
            outcomes[client_id] = (cast("TrainResult | BaseException", outcome), seconds)  # what train gives
        for client_id in client_ids:
            update, seconds = outcomes[client_id]
            yield ClientOutcome.of_training(client_id, update, seconds)

    # ------------------------------------------------------------------ asynchronous schedules
    def arrivals(self, label: str, seed: int) -> PhaseArrivals:
        """The clients in flight of one asynchronous phase, sent one by one and answered as the replies come."""
        return PhaseArrivals(self, label, seed)

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, object]]:
        """Run the worker operation ``op`` for each client on its node; results come in the order of ``client_ids``.

        A failed client's result is its error (:func:`~fedpeft.engine.flower.codec.client_error`).
        """
        if op not in OPERATIONS:
            raise ValueError(f"unknown worker operation {op!r}")
        self.membership.refresh()
        if "seed" in kwargs:
            self.sync_base(int(kwargs["seed"]))
        done: dict[str, object] = {}
        position = 0
        for client_id, outcome, _ in self._run_tasks(op, [(c, kwargs) for c in client_ids], group=op):
            if isinstance(outcome, BaseException):
                log.warning("client %s failed in %s: %r", client_id, op, outcome)
            done[client_id] = outcome
            while position < len(client_ids) and client_ids[position] in done:
                yield client_ids[position], done.pop(client_ids[position])
                position += 1

    def close(self) -> None:
        """Tell every serving node the run is over, so that it ends the worker process it kept for the run."""
        if self.closes_run and self.membership.mapped:
            end_run_on_nodes(self.grid, self.membership.serving_nodes(), exchange=self.exchange)

    def cost_rows(self) -> list[JSONObject]:
        """Per node: messages, model loads and where the seconds of its messages went (:meth:`NodeStats.rows`)."""
        return self.stats.rows()

    def units_started(self, count: int) -> None:
        """``count`` units begin, each in a thread; the outbox holds requests until every unit waits for replies."""
        self.outbox.units_started(count)

    def unit_ended(self) -> None:
        """A unit's thread ends; the outbox no longer waits for its requests."""
        self.outbox.unit_ended()

    # ------------------------------------------------------------------ what a secure round needs
    def node_of(self, client_id: str) -> int | None:
        """The node that serves ``client_id`` (None while its node is lost)."""
        return self.membership.node_of(client_id)

    def worker_sizes(self) -> dict[str, int]:
        """The training-set size of every client the server knows."""
        return {c.client_id: len(c.train) for c in self.worker.data.clients}

    def spec_of(self, label: str, payload: Payload) -> dict[str, torch.Size]:
        """The keys and shapes method ``label`` expects back for ``payload`` (the layout of a secure sum)."""
        spec = self.worker.methods[label].update_spec(payload)
        if spec is None:
            raise UserError(f"{label} declares no update shapes, which secure aggregation needs.")
        return spec

    # ------------------------------------------------------------------ client tasks
    def sync_base(self, seed: int) -> None:
        """A base model the server trained reaches every node (a pretrained one is on every node already)."""
        if self.cfg.base.kind != "pretrained":
            self.base_sync.sync(seed)

    def first_task_timeout(self, nodes: list[int]) -> float | None:
        """The reply timeout of a message to ``nodes``: at least ``node_timeout`` where one of them gets its first
        task (which starts its worker and loads the model), now or since it came back from a loss."""
        first = [node for node in nodes if node not in self.stats or node in self.membership.returned]
        self.membership.returned.difference_update(first)
        if self.reply_timeout is not None and first:
            return max(self.reply_timeout, self.node_timeout)
        return self.reply_timeout

    def _run_tasks(self, op: str, clients: list[ClientCall], *, group: str) -> Iterator[tuple[str, object, float]]:
        """Send each node one message with ``op`` for all of its clients; yield (client id, result or error,
        seconds) for every client as the nodes' replies arrive."""
        by_node: dict[int, list[ClientCall]] = {}
        for client_id, kwargs in clients:
            node = self.membership.node_of(client_id)
            if node is None:  # its partition's node is lost, and none took its place yet
                yield client_id, ClientTaskError(UNSERVED), 0.0
                continue
            by_node.setdefault(node, []).append((client_id, dict(kwargs)))
        tasks = {node: NodeTask(op, self.run_dir, self.config_text, items) for node, items in by_node.items()}
        timeout = self.first_task_timeout(list(tasks))
        requests = [Request(node, OPERATIONS[op], task, group, timeout) for node, task in tasks.items()]
        answered: Iterable[Request] = requests
        if self.turns is not None:
            # Methods run at once: their steps for a node travel together, and a unit's step goes on once every
            # node has answered it, whatever order the replies come in.
            self.exchange.complete(requests, bundled=True)
        else:
            answered = self.exchange.run(requests)
        for request in answered:
            assert request.reply is not None
            ids = [client_id for client_id, _ in tasks[request.node].clients]
            for client_id, outcome, seconds in self.outcomes(request.node, ids, request.reply):
                if self.on_client is not None:
                    self.on_client()
                yield client_id, outcome, seconds

    def outcomes(
        self, node: int, client_ids: list[str], reply: NodeResult | Message | str
    ) -> Iterator[tuple[str, object, float]]:
        """Each client's result or error in a node's reply (all clients fail alike when the message did: an
        error message, or the reason why no reply came; a node that did not answer is lost)."""
        if not isinstance(reply, NodeResult):
            if isinstance(reply, str) or reply.error.code == ErrorCode.NODE_UNAVAILABLE:
                self.membership.lose(node, reply if isinstance(reply, str) else str(reply.error.reason))
            if isinstance(reply, str):
                error: Exception = ClientTaskError(reply)
            elif (reply.error.reason or "").startswith(ClientDroppedError.__name__):
                error = ClientDroppedError(reply.error.reason)  # an injected drop: no update came
            else:
                error = ClientTaskError(f"error {reply.error.code}: {reply.error.reason}")
            for client_id in client_ids:
                yield client_id, error, 0.0
            return
        for entry in reply.results:
            if "error" not in entry:
                yield entry["client"], entry["value"], float(entry["seconds"])
            else:
                yield entry["client"], client_error(entry["error"], entry, dropped=bool(entry.get("dropped"))), 0.0


def end_run_on_nodes(
    grid: Grid, nodes: Iterable[int] | None = None, *, timeout: float = 60.0, exchange: Exchange | None = None
) -> list[int]:
    """Tell ``nodes`` (default: every node Flower lists as online) that the run is over (``query.close``), so that
    each ends the worker process it keeps for the run, or the one still starting; returns the nodes that did not
    confirm within ``timeout`` seconds."""
    exchange = exchange or Exchange(grid)
    listed = sorted(int(n) for n in (grid.get_node_ids() if nodes is None else nodes))
    queries = [Request(node, CLOSE_QUERY, encode({}), "close", timeout) for node in listed]
    silent = [query.node for query in exchange.run(queries) if query.failure is not None]
    for node in silent:
        log.info("node %s did not confirm the end of the run; its worker ends on its own", node)
    return silent


def flower_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config as the flower engine runs it: engine ``flower`` and per-client state on disk.

    Clients run in several processes (and machines), so their state between rounds lives in the run directory
    where any process serving the client finds it, not in one process's memory.
    """
    engine = cfg.engine.model_copy(update={"name": "flower", "state": "disk"})
    return cfg.model_copy(update={"engine": engine})
