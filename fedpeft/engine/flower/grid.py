"""The server side of the Flower engine: client work sent as messages through a ServerApp's ``Grid``."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedpeft.core.config import ExperimentConfig, dump_given
from fedpeft.core.errors import UserError
from fedpeft.core.faults import ClientDroppedError
from fedpeft.core.turns import Turns
from fedpeft.core.types import ClientUpdate, Payload
from fedpeft.data.sites import join_sites, node_data_config
from fedpeft.data.types import FederatedData
from fedpeft.engine.flower.codec import (
    ClientTaskError,
    NodeBundle,
    NodeResult,
    NodeTask,
    client_error,
    decode,
    encode,
    tensors_digest,
    unbundle_results,
)
from fedpeft.engine.flower.messages import (
    BASE_QUERY,
    BUNDLE,
    CLOSE_QUERY,
    JSON_FIELD,
    NUM_PARTITIONS,
    OPERATIONS,
    PARTITION_ID,
    PARTITION_QUERY,
    SITE_QUERY,
    TIMING_KEY,
)
from fedpeft.engine.rounds import ClientOutcome, Engine

if TYPE_CHECKING:
    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")


@dataclass(eq=False)
class _Request:
    """A unit's task for one node, waiting in the outbox or for its reply (methods at once)."""

    node: int
    task: NodeTask
    group: str
    timeout: float | None
    queued: float
    reply: NodeResult | Message | str | None = None


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
        sites: with site-local data, the node that holds each client (:func:`register_sites`); otherwise the
            clients map to nodes by partition.
        concurrent_units: how many methods of a seed run at once (``engine.concurrent_methods``): their
            messages wait in each node's queue, so that a node goes from one to the next without Flower's idle
            poll in between.
    """

    name = "flower"

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
    ) -> None:
        self.grid = grid
        self.worker = worker
        self.cfg = cfg or worker.cfg
        self.run_dir = str(Path(run_dir or worker.run_dir).resolve())
        self.config_text = dump_given(self.cfg)
        self.on_client = on_client
        self.reply_timeout = reply_timeout
        self.node_timeout = node_timeout
        self.poll_interval = poll_interval
        self.max_in_flight = max_in_flight
        self.stop = stop
        ids = sorted(c.client_id for c in worker.data.clients)
        self._client_index = {client_id: i for i, client_id in enumerate(ids)}
        self._partition_nodes: list[int | None] | None = None
        self._answers: dict[int, tuple[int | None, int | None]] = {}  # node -> (partition, num_partitions)
        self._lost: set[int] = set()  # nodes that did not answer a message
        self._base_synced: set[int] = set()
        self._node_stats: dict[int, dict[str, Any]] = {}
        self._owners: dict[str, int | None] | None = dict(sites) if sites is not None else None
        self.concurrent_units = max(1, concurrent_units)
        self.turns = Turns() if self.concurrent_units > 1 else None
        self._busy: set[str] = set()  # shared steps (node discovery, base sync) that a unit's thread is doing
        self.coalesce_seconds = 1.0  # the longest a step waits in the outbox for the other units' steps
        self._outbox: list[_Request] = []
        self._in_flight: dict[str, tuple[int, list[_Request], float, float | None]] = {}
        self._waiting: list[list[_Request]] = []  # the requests of each unit's thread that waits in _bundled
        self._units_running = 0

    # ------------------------------------------------------------------ engine interface
    def start_phase(self, label: str, seed: int) -> None:
        """Every node needs the base model of ``seed`` before its clients train (not for the base stage)."""
        from fedpeft.worker import BASE_STAGE_LABEL

        if label != BASE_STAGE_LABEL:
            self._sync_base(seed)

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        """Send every client's round as one message; once all replies are in, yield them in client-id order
        (the order the local engine aggregates in, so the sums round alike). With ``engine.secagg`` the round
        runs as SecAgg+ (:mod:`fedpeft.engine.flower.secagg`) and yields one update, the secure mean."""
        from fedpeft.worker import BASE_STAGE_LABEL

        self._refresh()
        if label != BASE_STAGE_LABEL:
            self._sync_base(seed)  # a node that took over a partition mid-phase needs the base model
        if self.cfg.engine.secagg is not None:
            from fedpeft.engine.flower.secagg import secure_round

            yield from secure_round(self, self.cfg.engine.secagg, label, seed, round_, client_ids, payload_of)
            return
        step = {"label": label, "seed": seed, "round_": round_}
        clients = [(client_id, {**step, "payload": payload_of(client_id)}) for client_id in client_ids]
        outcomes: dict[str, tuple[ClientUpdate | BaseException, float]] = {}
        group = f"{label}-seed{seed}-round{round_}"
        for client_id, outcome, seconds in self._run_tasks("train", clients, group=group):
            outcomes[client_id] = (outcome, seconds)
        for client_id in client_ids:
            update, seconds = outcomes[client_id]
            yield client_id, update, seconds

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Run the worker operation ``op`` for each client on its node; results come in the order of ``client_ids``.

        A failed client's result is its error (:func:`~fedpeft.engine.flower.codec.client_error`).
        """
        if op not in OPERATIONS:
            raise ValueError(f"unknown worker operation {op!r}")
        self._refresh()
        if "seed" in kwargs:
            self._sync_base(int(kwargs["seed"]))
        done: dict[str, Any] = {}
        position = 0
        for client_id, outcome, _ in self._run_tasks(op, [(c, kwargs) for c in client_ids], group=op):
            if isinstance(outcome, BaseException):
                log.warning("client %s failed in %s: %r", client_id, op, outcome)
            done[client_id] = outcome
            while position < len(client_ids) and client_ids[position] in done:
                yield client_ids[position], done.pop(client_ids[position])
                position += 1

    def close(self) -> None:
        """Tell every node the run is over, so that it ends the worker process it kept for the run."""
        if self._partition_nodes is None and self._owners is None:
            return
        queries = [(n, n, CLOSE_QUERY, encode({})) for n in self._serving_nodes()]
        for node, reply in self._exchange(queries, group="close", timeout=self.reply_timeout or 60.0):
            if isinstance(reply, str) or reply.has_error():
                log.info("node %s did not confirm the end of the run", node)

    def cost_rows(self) -> list[dict[str, Any]]:
        """Per node: messages, model loads (workers its processes built for the run) and where the seconds of
        its messages went: Flower's start of a ClientApp process per message, the node worker's start and model
        load (once per run), fedpeft's relay and codec, and the clients' work; ``message_seconds`` is the sum of
        the server's waits for the node's replies."""
        rows = []
        for node, stats in sorted(self._node_stats.items()):
            values = {
                "messages": stats["messages"],
                "model_loads": sum(stats["loads"].values()),
                "message_seconds": stats["round_trip"],
                "flower_start_seconds": stats["start"],
                "worker_startup_seconds": stats["startup"],
                "fedpeft_overhead_seconds": stats["overhead"],
                "client_work_seconds": stats["work"],
            }
            rows += [{"node": node, "metric": metric, "value": value} for metric, value in values.items()]
        return rows

    def worker_sizes(self) -> dict[str, int]:
        """The training-set size of every client the server knows."""
        return {c.client_id: len(c.train) for c in self.worker.data.clients}

    def spec_of(self, label: str, payload: Payload) -> dict[str, torch.Size]:
        """The keys and shapes method ``label`` expects back for ``payload`` (the layout of a secure sum)."""
        spec = self.worker.methods[label].update_spec(payload)
        if spec is None:
            raise UserError(f"{label} declares no update shapes, which secure aggregation needs.")
        return spec

    # ------------------------------------------------------------------ nodes
    def node_of(self, client_id: str) -> int | None:
        """The node that serves ``client_id``: the node that holds its data (site-local data), or the node of
        partition ``index % num_partitions`` (None while that node is lost)."""
        if self._owners is not None:
            return self._owners[client_id]
        nodes = self._nodes()
        return nodes[self._client_index[client_id] % len(nodes)]

    def _serving_nodes(self) -> list[int]:
        """The nodes that serve some client now."""
        nodes = self._owners.values() if self._owners is not None else self._nodes()
        return sorted({n for n in nodes if n is not None})

    def _in_turn(self, step: str, done: Callable[[], bool], do: Callable[[], object]) -> None:
        """Run a step shared by every unit (node discovery, a refresh, a base sync) that several units' threads
        may reach at once, unless ``done()``: after the thread doing it, if any, has finished (which may have
        done it meanwhile)."""
        while step in self._busy:
            self.wait(self.poll_interval)
        if done():
            return
        self._busy.add(step)
        try:
            do()
        finally:
            self._busy.discard(step)

    def _nodes(self) -> list[int | None]:
        """Node id of each partition, learnt from the nodes (waits for nodes in deployment)."""
        self._in_turn("nodes", lambda: self._partition_nodes is not None, self._discover_nodes)
        assert self._partition_nodes is not None
        return self._partition_nodes

    def _discover_nodes(self) -> None:
        def assigned() -> bool:
            nodes = _assign_partitions(self._answers)
            if nodes is not None:
                log.info("clients map to nodes by partition: %s", nodes)
                self._partition_nodes = list(nodes)
            return nodes is not None

        poll_nodes(
            self.grid,
            ask=self._query_partitions,
            asked=lambda node: node in self._answers,
            ready=assigned,
            timeout=self.node_timeout,
            failure=lambda: _missing_partitions_message(self._answers, self.node_timeout),
            sleep=self.wait,
        )

    def _query_partitions(self, nodes: list[int], timeout: float | None = None) -> None:
        """Ask ``nodes`` which partition each serves (into ``_answers``; -1: a node that did not say)."""
        queries = [(node, node, PARTITION_QUERY, encode({})) for node in nodes]
        for node, reply in self._exchange(queries, group="partition", timeout=timeout or self.node_timeout):
            if isinstance(reply, str) or reply.has_error():
                log.warning("node %s did not say which partition it serves; it gets no clients", node)
                self._answers[node] = (-1, None)
                continue
            answer = decode(reply.content)
            self._answers[node] = (answer["partition_id"], answer["num_partitions"])

    def _lose(self, node: int, reason: str) -> None:
        """``node`` did not answer: its clients are left out until it, or a node in its place, answers again."""
        if node not in self._lost:
            log.warning("node %s is lost (%s); its clients are left out until a node serves them again", node, reason)
            self._lost.add(node)

    def _refresh(self) -> None:
        """After a node was lost, at the start of a step: ask the lost nodes still connected and the nodes that
        joined since which partition they serve, and map every partition to a node that answers (a restarted
        SuperNode comes back with a new node id; it takes over its partition's clients from this step on)."""
        self._in_turn("refresh", lambda: not self._lost, self._refresh_now)

    def _refresh_now(self) -> None:
        if self._owners is not None:
            self._refresh_sites()
            return
        if self._partition_nodes is None:
            return
        listed = {int(n) for n in self.grid.get_node_ids()}
        ask = sorted(n for n in listed if n not in self._answers or n in self._lost)
        for node in ask:
            self._answers.pop(node, None)
        self._query_partitions(ask, timeout=min(self.reply_timeout or 30.0, 30.0))
        self._lost = {n for n in self._lost if n not in self._answers or self._answers[n][0] == -1}
        live = {n: a for n, a in self._answers.items() if n in listed and n not in self._lost}
        before = list(self._partition_nodes)
        self._partition_nodes = _assign_partitions(live, partial=len(before)) or before
        if self._partition_nodes != before:
            log.info("clients map to nodes by partition: %s", self._partition_nodes)
            self._base_synced.clear()  # a new node may lack the base model

    def _refresh_sites(self) -> None:
        """:meth:`_refresh` for site-local data: a node that joined since (a restarted SuperNode has a new id), or a
        lost one still connected, takes back the clients it holds whose node is lost; a client that a node in
        service holds already is refused, never moved."""
        assert self._owners is not None
        listed = {int(n) for n in self.grid.get_node_ids()}
        serving = set(self._serving_nodes())
        ask = sorted(n for n in listed if n not in serving or n in self._lost)
        request = encode({"config": self.config_text})
        queries = [(n, n, SITE_QUERY, request) for n in ask]
        timeout = max(min(self.reply_timeout or 30.0, 30.0), self.node_timeout)  # may start the node's worker
        claims: dict[int, list[str]] = {}
        for node, reply in self._exchange(queries, group="site", timeout=timeout):
            if not isinstance(reply, str) and not reply.has_error():
                claims[node] = [entry["id"] for entry in decode(reply.content)["clients"]]
                self._lost.discard(node)
        before = dict(self._owners)
        for client_id, owner in before.items():
            if owner in self._lost or (owner is not None and owner not in listed):
                self._owners[client_id] = None
        for node, clients in sorted(claims.items()):
            for client_id in clients:
                owner = self._owners.get(client_id, -1)
                if owner == -1:
                    log.warning("node %s holds client %s, which the run did not register: left out", node, client_id)
                elif owner is None:
                    self._owners[client_id] = node
                elif owner != node:
                    raise UserError(
                        f"SuperNodes {owner} and {node} both hold client {client_id!r}; each client's data must "
                        "live on one site: stop the node that should not serve it (check `flwr supernode list`)."
                    )
        if self._owners != before:
            log.info("clients map to nodes by site: %s", _by_node(self._owners))
            self._base_synced.clear()  # a new node may lack the base model

    def _sync_base(self, seed: int) -> None:
        """Make sure every node holds the base model of ``seed`` (sent only to nodes that lack it)."""
        if self.cfg.base.kind != "pretrained":
            self._in_turn("base", lambda: seed in self._base_synced, lambda: self._sync_base_now(seed))

    def _sync_base_now(self, seed: int) -> None:
        path = self.worker.base_checkpoint(seed)
        if not path.exists():
            return
        tensors = torch.load(path, weights_only=False)["tensors"]
        request = {
            "run_dir": self.run_dir,
            "path": str(path.resolve().relative_to(self.run_dir)),
            "digest": tensors_digest(tensors),
        }
        nodes = self._serving_nodes()
        lacking = []
        queries = [(n, n, BASE_QUERY, encode(request)) for n in nodes]
        # The base query may be a node's first message of the run, which starts its worker process.
        timeout = None if self.reply_timeout is None else max(self.reply_timeout, self.node_timeout)
        for node, reply in self._exchange(queries, group="base", timeout=timeout):
            if not isinstance(reply, str) and not reply.has_error() and decode(reply.content)["present"]:
                continue
            lacking.append(node)
        if lacking:
            log.info("sending the base model of seed %s to nodes %s", seed, lacking)
            sends = [(n, n, BASE_QUERY, encode({**request, "tensors": tensors})) for n in lacking]
            for node, reply in self._exchange(sends, group="base", timeout=timeout):
                if isinstance(reply, str) or reply.has_error() or not decode(reply.content)["present"]:
                    reason = reply if isinstance(reply, str) else reply.error.reason if reply.has_error() else "?"
                    log.warning("node %s could not store the base model of seed %s (%s)", node, seed, reason)
        self._base_synced.add(seed)

    # ------------------------------------------------------------------ messaging
    def _run_tasks(
        self, op: str, clients: list[tuple[str, dict[str, Any]]], *, group: str
    ) -> Iterator[tuple[str, Any, float]]:
        """Send each node one message with ``op`` for all of its clients; yield (client id, result or error,
        seconds) for every client as the nodes' replies arrive."""
        by_node: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for client_id, kwargs in clients:
            node = self.node_of(client_id)
            if node is None:  # its partition's node is lost, and none took its place yet
                yield client_id, ClientTaskError("no SuperNode serves its partition now (its node was lost)"), 0.0
                continue
            by_node.setdefault(node, []).append((client_id, dict(kwargs)))
        tasks = {node: NodeTask(op, self.run_dir, self.config_text, items) for node, items in by_node.items()}
        timeout = self.reply_timeout
        if timeout is not None and any(node not in self._node_stats for node in tasks):
            timeout = max(timeout, self.node_timeout)  # a node's first task starts its worker and loads the model
        if self.turns is not None:  # methods run at once: their steps for a node travel together
            replies: Iterable[tuple[int, NodeResult | Message | str]] = self._bundled(tasks, group, timeout)
        else:
            sent = time.monotonic()
            messages = ((node, node, OPERATIONS[op], task) for node, task in tasks.items())
            replies = (
                (node, reply if isinstance(reply, str) else self._read(node, reply, 1, time.monotonic() - sent)[0])
                for node, reply in self._exchange(messages, group=group, timeout=timeout)
            )
        for node, reply in replies:
            ids = [client_id for client_id, _ in tasks[node].clients]
            for client_id, outcome, seconds in self._outcomes(node, ids, reply):
                if self.on_client is not None:
                    self.on_client()
                yield client_id, outcome, seconds

    def _outcomes(
        self, node: int, client_ids: list[str], reply: NodeResult | Message | str
    ) -> Iterator[tuple[str, Any, float]]:
        """Each client's result or error in a node's reply, read by :meth:`_read` (all clients fail alike when
        the message did: an error message, or the reason why no reply came)."""
        if not isinstance(reply, NodeResult):
            if isinstance(reply, str) or reply.error.code == ErrorCode.NODE_UNAVAILABLE:
                self._lose(node, reply if isinstance(reply, str) else str(reply.error.reason))
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

    # ------------------------------------------------------------------ methods at once
    def units_started(self, count: int) -> None:
        self._units_running += count

    def unit_ended(self) -> None:
        self._units_running -= 1

    def _bundled(
        self, tasks: dict[int, NodeTask], group: str, timeout: float | None
    ) -> Iterator[tuple[int, NodeResult | Message | str]]:
        """Put ``tasks`` in the outbox and wait (letting the other units' threads run) until every node has
        answered; the outbox goes out once every running unit waits, or after ``coalesce_seconds``, as one
        message per node that carries every unit's task for it (:meth:`_pump`)."""
        requests = [_Request(node, task, group, timeout, time.monotonic()) for node, task in tasks.items()]
        self._outbox += requests
        self._waiting.append(requests)
        try:
            while any(r.reply is None for r in requests):
                self._check_stop()
                self._pump()
                if any(r.reply is None for r in requests):
                    self.wait(self.poll_interval)
        finally:
            self._waiting.remove(requests)
            self._outbox = [r for r in self._outbox if all(r is not mine for mine in requests)]
        for request in requests:
            assert request.reply is not None
            yield request.node, request.reply

    def _pump(self) -> None:
        """Send the outbox when it is due, take in the replies that came, and give up on those overdue."""
        now = time.monotonic()
        # Every unit's thread waits for a reply still due: no other step will join the outbox now.
        all_wait = sum(any(r.reply is None for r in mine) for mine in self._waiting) >= self._units_running
        if self._outbox and (all_wait or now - self._outbox[0].queued >= self.coalesce_seconds):
            by_node: dict[int, list[_Request]] = {}
            for request in self._outbox:
                by_node.setdefault(request.node, []).append(request)
            self._outbox = []
            batch, groups = [], []
            for node, requests in sorted(by_node.items()):
                if len(requests) == 1:
                    task = requests[0].task
                    batch.append(Message(task.to_content(), node, OPERATIONS[task.op], group_id=requests[0].group))
                else:
                    bundle = NodeBundle([r.task for r in requests]).to_content()
                    batch.append(Message(bundle, node, BUNDLE, group_id="+".join(r.group for r in requests)))
                groups.append((node, requests))
            for (node, requests), message_id in zip(groups, self.grid.push_messages(batch), strict=True):
                if not message_id:
                    for request in requests:
                        request.reply = "the message could not be sent"
                    continue
                timeouts = [r.timeout for r in requests]
                limit = None if None in timeouts else max(t for t in timeouts if t is not None)
                self._in_flight[str(message_id)] = (node, requests, now, limit)
        if not self._in_flight:
            return
        for reply in self.grid.pull_messages(list(self._in_flight)):
            entry = self._in_flight.pop(reply.metadata.reply_to_message_id, None)
            if entry is None:
                continue
            node, requests, sent, _ = entry
            results = self._read(node, reply, len(requests), time.monotonic() - sent)
            for request, result in zip(requests, results, strict=True):
                request.reply = result
        now = time.monotonic()
        for message_id, (_, requests, sent, limit) in list(self._in_flight.items()):
            if limit is not None and now - sent > limit:
                del self._in_flight[message_id]
                for request in requests:
                    request.reply = f"no reply within {limit:g} s"

    def _read(self, node: int, reply: Message, tasks: int, round_trip: float) -> list[NodeResult | Message]:
        """The result of each of the ``tasks`` tasks a node's reply answers (one task's message, or a bundle's),
        counted once (:meth:`_count`); the reply itself for each task when it carries an error."""
        if reply.has_error():
            return [reply] * tasks
        if tasks == 1:
            result = NodeResult.from_content(reply.content)
            results, stats = [result], result.stats
        else:
            results, stats = unbundle_results(reply.content)
        self._count(node, stats, reply, round_trip)
        return list(results)

    def _count(self, node: int, stats: dict[str, Any], reply: Message, round_trip: float) -> None:
        """Add a node's reply to its counters (see :meth:`cost_rows`)."""
        zero = {"messages": 0, "loads": {}, "round_trip": 0.0, "start": 0.0, "startup": 0.0, "overhead": 0.0}
        entry = self._node_stats.setdefault(node, {**zero, "work": 0.0})
        timing: dict[str, Any] = {}
        if TIMING_KEY in reply.content.config_records:  # a deployment node: its ClientApp relayed the message
            timing = json.loads(str(reply.content.config_records[TIMING_KEY][JSON_FIELD]))
        work = float(stats.get("work_seconds", 0.0))
        handled = float(timing.get("relay_seconds") or stats.get("seconds", 0.0))
        # Starting the worker process and building its model are the run's one-off costs, not a message's.
        startup = float(timing.get("worker_start_seconds") or 0.0) + float(stats.get("load_seconds", 0.0))
        entry["messages"] += 1
        entry["loads"][stats.get("pid")] = int(stats.get("model_loads", 0))
        entry["round_trip"] += round_trip
        entry["start"] += float(timing.get("start_seconds") or 0.0)
        entry["startup"] += startup
        entry["overhead"] += max(0.0, handled - work - startup)
        entry["work"] += work

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise KeyboardInterrupt("the run was interrupted")

    def _exchange(
        self, messages: Iterable[tuple[Any, int, str, Any]], *, group: str, timeout: float | None
    ) -> Iterator[tuple[Any, Message | str]]:
        """:func:`exchange` over this engine's grid, stopped by its stop event."""
        yield from exchange(
            self.grid,
            messages,
            group=group,
            timeout=timeout,
            poll_interval=self.poll_interval,
            max_in_flight=self.max_in_flight,
            check_stop=self._check_stop,
            sleep=self.wait,
        )


def register_sites(
    grid: Grid, cfg: ExperimentConfig, *, node_timeout: float, poll_interval: float = 1.0
) -> tuple[FederatedData, dict[str, int], ExperimentConfig]:
    """Site-local data (``data.sites``): ask the SuperNodes which clients their ``data-path`` holds, until
    ``cfg.data.sites`` of them have answered.

    Returns the server's view of the data (ids, groups, pools and sizes; no example), the node of each client,
    and the config to run with (the one the nodes build their data from: for the generic datasets it names the
    unseen pool drawn over every site's clients).

    Raises:
        UserError: fewer sites than ``data.sites`` within ``node_timeout`` seconds, more nodes with data than
            that, or reports that do not fit together (a client on two sites, different class names).
    """
    expected = cfg.data.sites
    assert expected is not None
    request = encode({"config": dump_given(cfg)})
    reports: dict[int, dict[str, Any]] = {}
    refusals: dict[int, str] = {}

    def ask(nodes: list[int]) -> None:
        queries = [(node, node, SITE_QUERY, request) for node in nodes]
        for node, reply in exchange(grid, queries, group="site", timeout=node_timeout):
            if isinstance(reply, str) or reply.has_error():
                refusals[node] = reply if isinstance(reply, str) else str(reply.error.reason)
                log.warning("node %s reports no site data (%s); it gets no clients", node, refusals[node])
            else:
                reports[node] = decode(reply.content)

    def every_site() -> bool:
        if len(reports) > expected:
            raise UserError(
                f"{len(reports)} SuperNodes hold data (a data-path in their node config), but data.sites is "
                f"{expected}; stop the nodes that should not take part, or raise data.sites."
            )
        return len(reports) == expected

    def failure() -> str:
        reasons = "".join(f"; node {n}: {reason}" for n, reason in sorted(refusals.items()))
        return (
            f"{len(reports)} of the {expected} sites (data.sites) reported their clients within "
            f"{node_timeout:.0f} s{reasons}; start each site's SuperNode with --node-config \"data-path='DIR'\"."
        )

    poll_nodes(
        grid,
        ask=ask,
        asked=lambda node: node in reports or node in refusals,
        ready=every_site,
        timeout=node_timeout,
        failure=failure,
        interval=poll_interval,
    )
    data = join_sites(cfg.data, reports)
    owners = {entry["id"]: node for node, report in reports.items() for entry in report["clients"]}
    run_cfg = cfg.model_copy(update={"data": node_data_config(cfg.data, data)})
    log.info("clients map to nodes by site: %s", _by_node(owners))
    return data, owners, run_cfg


def poll_nodes(
    grid: Grid,
    *,
    ask: Callable[[list[int]], None],
    asked: Callable[[int], bool],
    ready: Callable[[], bool],
    timeout: float,
    failure: Callable[[], str],
    sleep: Callable[[float], None] = time.sleep,
    interval: float = 1.0,
) -> None:
    """Ask every SuperNode that connects and was not ``asked`` yet (``ask(node ids)``), every ``interval``
    seconds until ``ready()``.

    Raises:
        UserError: ``failure()``, the sentence for a run that was not ready after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        ask(sorted(int(n) for n in grid.get_node_ids() if not asked(int(n))))
        if ready():
            return
        if time.monotonic() > deadline:
            raise UserError(failure())
        sleep(interval)


def _by_node(owners: dict[str, int | None] | dict[str, int]) -> dict[int | None, list[str]]:
    grouped: dict[int | None, list[str]] = {}
    for client_id, node in owners.items():
        grouped.setdefault(node, []).append(client_id)
    return grouped


def exchange(
    grid: Grid,
    messages: Iterable[tuple[Any, int, str, Any]],
    *,
    group: str,
    timeout: float | None,
    poll_interval: float = 0.1,
    max_in_flight: int = 64,
    check_stop: Callable[[], None] = lambda: None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[Any, Message | str]]:
    """Push (key, node, message type, content or task) messages, at most ``max_in_flight`` unanswered.

    Yields (key, reply) as replies arrive; instead of a reply, the reason why none came (not sent, no reply
    within ``timeout`` seconds). Tasks are encoded only when sent, so few payloads are in memory at once.
    """
    pending = iter(messages)
    in_flight: dict[str, tuple[Any, float]] = {}
    exhausted = False
    while True:
        check_stop()
        if not exhausted and len(in_flight) < max_in_flight:
            batch, keys = [], []
            for key, node, message_type, content in pending:
                if isinstance(content, NodeTask):
                    content = content.to_content()
                batch.append(Message(content, int(node), message_type, group_id=group))
                keys.append(key)
                if len(in_flight) + len(batch) >= max_in_flight:
                    break
            else:
                exhausted = True
            if batch:
                now = time.monotonic()
                ids = list(grid.push_messages(batch))
                for key, message_id in zip(keys, ids, strict=True):
                    if message_id:
                        in_flight[str(message_id)] = (key, now)
                    else:
                        yield key, "the message could not be sent"
        if not in_flight:
            if exhausted:
                return
            continue
        replies = list(grid.pull_messages(list(in_flight)))
        check_stop()  # replies that come after an interrupt are the ended backend's errors
        for reply in replies:
            entry = in_flight.pop(reply.metadata.reply_to_message_id, None)
            if entry is not None:
                yield entry[0], reply
        if timeout is not None:
            now = time.monotonic()
            for message_id, (key, sent) in list(in_flight.items()):
                if now - sent > timeout:
                    del in_flight[message_id]
                    yield key, f"no reply within {timeout:g} s"
        if not replies and in_flight:
            sleep(poll_interval)


def _assign_partitions(answers: dict[int, tuple[int | None, int | None]], partial: int = 0) -> list[int | None] | None:
    """Node id per partition, or None while some partition has no node yet.

    Nodes that declare no partition (no node config) split the clients by their sorted node ids. With
    ``partial`` (the number of partitions known already), a partition without a node gets None instead.
    """
    usable = {n: a for n, a in answers.items() if a[0] != -1}
    declared = {n: a for n, a in usable.items() if a[0] is not None}
    if not declared:
        found: list[int | None] = [*sorted(usable)]
        if partial:  # undeclared nodes fill the partitions in node-id order
            return found[:partial] + [None] * (partial - len(found[:partial]))
        return found or None
    totals = {a[1] for a in declared.values()}
    if len(totals) != 1 or None in totals:
        raise UserError(
            f"The SuperNodes disagree on {NUM_PARTITIONS} ({sorted(map(str, totals))}); start every node with "
            f'the same --node-config "{NUM_PARTITIONS}=N".'
        )
    total = int(next(iter(totals)))  # type: ignore[arg-type]
    owners: dict[int, int] = {}
    for node, (partition, _) in sorted(declared.items()):
        if partition is None or not 0 <= partition < total:
            raise UserError(
                f"SuperNode {node} says {PARTITION_ID}={partition}, outside 0..{total - 1}; fix its --node-config."
            )
        if partition in owners:  # never prefer one silently: either may be the impostor
            raise UserError(
                f"SuperNodes {owners[partition]} and {node} both claim {PARTITION_ID}={partition}; each partition "
                "needs exactly one node: stop the node that should not serve it (check `flwr supernode list`)."
            )
        owners[partition] = node
    if len(owners) < total and not partial:
        return None
    return [owners.get(p) for p in range(total)]


def _missing_partitions_message(answers: dict[int, tuple[int | None, int | None]], waited: float) -> str:
    declared = {a[0] for a in answers.values() if a[0] is not None and a[0] >= 0}
    totals = {a[1] for a in answers.values() if a[1] is not None}
    if not answers or not totals:
        return f"No SuperNode connected within {waited:.0f} s; start flower-supernode on the client machines."
    total = max(totals)
    missing = [p for p in range(total) if p not in declared]
    return (
        f"No SuperNode serves partition(s) {missing} of {total} after {waited:.0f} s; start one per partition "
        f'with --node-config "{PARTITION_ID}=P {NUM_PARTITIONS}={total}".'
    )


def flower_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config as the flower engine runs it: engine ``flower`` and per-client state on disk.

    Clients run in several processes (and machines), so their state between rounds lives in the run directory
    where any process serving the client finds it, not in one process's memory.
    """
    engine = cfg.engine.model_copy(update={"name": "flower", "state": "disk"})
    return cfg.model_copy(update={"engine": engine})
