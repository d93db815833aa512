"""The server side of the Flower engine: client work sent as messages through a ServerApp's ``Grid``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from flwr.app import Message
from flwr.serverapp import Grid

from fedpeft.core.config import ExperimentConfig, dump_given
from fedpeft.core.errors import UserError
from fedpeft.core.faults import ClientDroppedError
from fedpeft.core.types import ClientUpdate, Payload
from fedpeft.engine.flower.codec import ClientTask, ClientTaskError, TaskResult, decode, encode, tensors_digest
from fedpeft.engine.flower.messages import BASE_QUERY, NUM_PARTITIONS, OPERATIONS, PARTITION_ID, PARTITION_QUERY
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
        reply_timeout: seconds to wait for one message's reply before leaving the client out (None: no limit).
        node_timeout: seconds to wait for SuperNodes to cover every partition.
        poll_interval: seconds between two pulls of replies.
        max_in_flight: messages sent and not yet answered, at most.
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
        ids = sorted(c.client_id for c in worker.data.clients)
        self._client_index = {client_id: i for i, client_id in enumerate(ids)}
        self._partition_nodes: list[int] | None = None
        self._base_synced: set[int] = set()

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
        if self.cfg.engine.secagg is not None:
            from fedpeft.engine.flower.secagg import secure_round

            yield from secure_round(self, self.cfg.engine.secagg, label, seed, round_, client_ids, payload_of)
            return
        tasks = []
        for client_id in client_ids:
            kwargs = {"label": label, "seed": seed, "round_": round_, "payload": payload_of(client_id)}
            tasks.append(self._task("train", client_id, kwargs))
        outcomes: dict[str, tuple[ClientUpdate | BaseException, float]] = {}
        for client_id, outcome in self._run_tasks(tasks, group=f"{label}-seed{seed}-round{round_}"):
            if isinstance(outcome, BaseException):
                outcomes[client_id] = (outcome, 0.0)
            else:
                outcomes[client_id] = (outcome.value, outcome.seconds)
        for client_id in client_ids:
            update, seconds = outcomes[client_id]
            yield client_id, update, seconds

    def map_clients(self, op: str, client_ids: list[str], **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Run the worker operation ``op`` for each client on its node; results come in the order of ``client_ids``.

        A failed client's result is a :class:`ClientTaskError`.
        """
        if op not in OPERATIONS:
            raise ValueError(f"unknown worker operation {op!r}")
        if "seed" in kwargs:
            self._sync_base(int(kwargs["seed"]))
        tasks = [self._task(op, client_id, kwargs) for client_id in client_ids]
        done: dict[str, Any] = {}
        position = 0
        for client_id, outcome in self._run_tasks(tasks, group=op):
            if isinstance(outcome, BaseException):
                log.warning("client %s failed in %s: %r", client_id, op, outcome)
                done[client_id] = outcome
            else:
                done[client_id] = outcome.value
            while position < len(client_ids) and client_ids[position] in done:
                yield client_ids[position], done.pop(client_ids[position])
                position += 1

    def close(self) -> None:
        """Nothing to release: the ClientApps keep their workers for the life of their process."""

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
    def node_of(self, client_id: str) -> int:
        """The node that serves ``client_id``: the node of partition ``index % num_partitions``."""
        nodes = self._nodes()
        return nodes[self._client_index[client_id] % len(nodes)]

    def _nodes(self) -> list[int]:
        """Node id of each partition, learnt from the nodes (waits for nodes in deployment)."""
        if self._partition_nodes is not None:
            return self._partition_nodes
        deadline = time.monotonic() + self.node_timeout
        answers: dict[int, tuple[int | None, int | None]] = {}
        while True:
            new = sorted(int(n) for n in self.grid.get_node_ids() if int(n) not in answers)
            queries = [(node, node, PARTITION_QUERY, encode({})) for node in new]
            for node, reply in self._exchange(queries, group="partition", timeout=self.node_timeout):
                if isinstance(reply, str) or reply.has_error():
                    log.warning("node %s did not say which partition it serves; it gets no clients", node)
                    answers[node] = (-1, None)
                    continue
                answer = decode(reply.content)
                answers[node] = (answer["partition_id"], answer["num_partitions"])
            nodes = _assign_partitions(answers)
            if nodes is not None:
                log.info("clients map to nodes by partition: %s", nodes)
                self._partition_nodes = nodes
                return nodes
            if time.monotonic() > deadline:
                raise UserError(_missing_partitions_message(answers, self.node_timeout))
            time.sleep(1.0)

    def _sync_base(self, seed: int) -> None:
        """Make sure every node holds the base model of ``seed`` (sent only to nodes that lack it)."""
        if self.cfg.base.kind == "pretrained" or seed in self._base_synced:
            return
        path = self.worker.base_checkpoint(seed)
        if not path.exists():
            return
        tensors = torch.load(path, weights_only=False)["tensors"]
        request = {
            "run_dir": self.run_dir,
            "path": str(path.resolve().relative_to(self.run_dir)),
            "digest": tensors_digest(tensors),
        }
        nodes = sorted(set(self._nodes()))
        lacking = []
        queries = [(n, n, BASE_QUERY, encode(request)) for n in nodes]
        for node, reply in self._exchange(queries, group="base", timeout=self.reply_timeout):
            if not isinstance(reply, str) and not reply.has_error() and decode(reply.content)["present"]:
                continue
            lacking.append(node)
        if lacking:
            log.info("sending the base model of seed %s to nodes %s", seed, lacking)
            sends = [(n, n, BASE_QUERY, encode({**request, "tensors": tensors})) for n in lacking]
            for node, reply in self._exchange(sends, group="base", timeout=self.reply_timeout):
                if isinstance(reply, str) or reply.has_error() or not decode(reply.content)["present"]:
                    reason = reply if isinstance(reply, str) else reply.error.reason if reply.has_error() else "?"
                    log.warning("node %s could not store the base model of seed %s (%s)", node, seed, reason)
        self._base_synced.add(seed)

    # ------------------------------------------------------------------ messaging
    def _task(self, op: str, client_id: str, kwargs: dict[str, Any]) -> ClientTask:
        return ClientTask(op, client_id, self.run_dir, self.config_text, dict(kwargs))

    def _run_tasks(self, tasks: list[ClientTask], *, group: str) -> Iterator[tuple[str, TaskResult | Exception]]:
        """Send each task to its client's node; yield (client id, result or error) as replies arrive."""
        messages = ((t.client_id, self.node_of(t.client_id), OPERATIONS[t.op], t) for t in tasks)
        for client_id, reply in self._exchange(messages, group=group, timeout=self.reply_timeout):
            if self.on_client is not None:
                self.on_client()
            if isinstance(reply, str):
                yield client_id, ClientTaskError(reply)
            elif reply.has_error() and (reply.error.reason or "").startswith(ClientDroppedError.__name__):
                yield client_id, ClientDroppedError(reply.error.reason)  # an injected drop: no update came
            elif reply.has_error():
                yield client_id, ClientTaskError(f"error {reply.error.code}: {reply.error.reason}")
            else:
                yield client_id, TaskResult.from_content(reply.content)

    def _exchange(
        self, messages: Iterable[tuple[Any, int, str, Any]], *, group: str, timeout: float | None
    ) -> Iterator[tuple[Any, Message | str]]:
        """Push (key, node, message type, content or task) messages, at most ``max_in_flight`` unanswered.

        Yields (key, reply) as replies arrive; instead of a reply, the reason why none came (not sent, no reply
        within ``timeout`` seconds). Tasks are encoded only when sent, so few payloads are in memory at once.
        """
        pending = iter(messages)
        in_flight: dict[str, tuple[Any, float]] = {}
        exhausted = False
        while True:
            if not exhausted and len(in_flight) < self.max_in_flight:
                batch, keys = [], []
                for key, node, message_type, content in pending:
                    if isinstance(content, ClientTask):
                        content = content.to_content()
                    batch.append(Message(content, int(node), message_type, group_id=group))
                    keys.append(key)
                    if len(in_flight) + len(batch) >= self.max_in_flight:
                        break
                else:
                    exhausted = True
                if batch:
                    now = time.monotonic()
                    ids = list(self.grid.push_messages(batch))
                    for key, message_id in zip(keys, ids, strict=True):
                        if message_id:
                            in_flight[str(message_id)] = (key, now)
                        else:
                            yield key, "the message could not be sent"
            if not in_flight:
                if exhausted:
                    return
                continue
            replies = list(self.grid.pull_messages(list(in_flight)))
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
                time.sleep(self.poll_interval)


def _assign_partitions(answers: dict[int, tuple[int | None, int | None]]) -> list[int] | None:
    """Node id per partition, or None while some partition has no node yet.

    Nodes that declare no partition (no node config) split the clients by their sorted node ids.
    """
    usable = {n: a for n, a in answers.items() if a[0] != -1}
    if not usable:
        return None
    declared = {n: a for n, a in usable.items() if a[0] is not None}
    if not declared:
        return sorted(usable)
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
        if partition in owners:
            log.warning(
                "nodes %s and %s both serve partition %s; using %s",
                owners[partition],
                node,
                partition,
                owners[partition],
            )
            continue
        owners[partition] = node
    if len(owners) < total:
        return None
    return [owners[p] for p in range(total)]


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
