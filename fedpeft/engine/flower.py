"""The Flower engine: the worker operations of an experiment run as Flower messages (ServerApp / ClientApp).

The server side is the same :class:`~fedpeft.runner.Experiment` as with the local engine; only the engine differs:
:class:`GridEngine` sends every client's task (a round's local training, the base-model evaluation, the
personalization) as one Message through the ServerApp's ``Grid``, and the ClientApp runs the very same
:class:`~fedpeft.worker.Worker` operation the local engine calls in-process. Replies are sorted by client id
before aggregation, so both engines compute the same numbers.

Clients map to SuperNodes by partition: client ``i`` (in sorted client-id order) belongs to partition
``i % num-partitions``, and the node whose node config says ``partition-id = p`` serves partition ``p``. The server
asks each node for its partition with a first query message. The simulation engine gives its virtual nodes
``partition-id`` and ``num-partitions`` itself; in deployment each ``flower-supernode`` is started with
``--node-config "partition-id=P num-partitions=N"``.

Every message carries the run directory and the resolved config YAML, from which the ClientApp builds its worker
once per process (cached at module level). Nothing outside this module handles Flower types: the codec below
turns tensors into an ``ArrayRecord`` and everything else into JSON in a ``ConfigRecord``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch  # ArrayRecord.to_torch_state_dict and Array.from_torch_tensor need torch imported
import yaml
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from fedpeft.core.config import ExperimentConfig, dump_given, validate
from fedpeft.core.costs import release_memory
from fedpeft.core.errors import UserError
from fedpeft.core.io import save_atomic
from fedpeft.core.progress import Progress
from fedpeft.core.types import ClientUpdate, Payload, ServerState
from fedpeft.engine.rounds import ClientOutcome, Engine

if TYPE_CHECKING:  # the worker pulls in transformers: imported when first needed, not for a node's queries
    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")

# ---------------------------------------------------------------------------------------------- message keys
# Message types ("<category>.<action>", as Flower requires) of the operations a ClientApp serves.
TRAIN = "train"  # one client's local training in one federated round
EVALUATE_BASE = "evaluate.base"  # the base model on one client's test split
PERSONALIZE = "train.personalize"  # one client's personalization at every budget, then its evaluation
EVALUATE_ROUND = "evaluate.round"  # one client's current model during a federated phase (eval.every)
CLIENT_BASE = "train.client_base"  # one client's own base model after a per-client base stage
PARTITION_QUERY = "query.partition"  # which partition of the clients a node serves
BASE_QUERY = "query.base"  # does the node hold the base model of a seed (and receive it if not)

# Worker operation -> message type. Only these operations can be called through a message.
OPERATIONS = {"train": TRAIN, "evaluate_base": EVALUATE_BASE, "personalize": PERSONALIZE}
OPERATIONS["evaluate_round"] = EVALUATE_ROUND
OPERATIONS["prepare_client_base"] = CLIENT_BASE

# Keys of a message's RecordDict and of its ConfigRecord.
ARRAYS_KEY = "fedpeft.arrays"  # ArrayRecord: every tensor of the message
CONFIG_KEY = "fedpeft.config"  # ConfigRecord: the rest, as JSON
JSON_FIELD = "json"

# Node config keys (``flower-supernode --node-config``); the simulation engine sets the first two itself.
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NODE_RUN_DIR = "run-dir"  # optional: where this node keeps its copy of the run directory

# Markers of the JSON encoding.
_TENSOR, _TUPLE, _ITEMS, _DATACLASS = "__tensor__", "__tuple__", "__items__", "__dataclass__"
_TRAVELLING = (Payload, ClientUpdate, ServerState)  # and their subclasses (each method's typed server state)


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _travelling_classes() -> dict[str, type]:
    """Every dataclass that may travel: the contract's types and their subclasses, by module-qualified name.

    Only classes already imported are found, which is all a message may name: a node has built the worker
    (and so imported the method) before it decodes a message with the method's state."""
    found: dict[str, type] = {}
    pending = list(_TRAVELLING)
    while pending:
        cls = pending.pop()
        found[_class_name(cls)] = cls
        pending += cls.__subclasses__()
    return found


# ---------------------------------------------------------------------------------------------- codec
class _Packer:
    """Turns a value into JSON-compatible data, moving its tensors into one ArrayRecord."""

    def __init__(self) -> None:
        self.arrays = ArrayRecord()

    def pack(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if is_dataclass(value) and isinstance(value, _TRAVELLING):
            packed = {f.name: self.pack(getattr(value, f.name)) for f in fields(value)}
            return {_DATACLASS: _class_name(type(value)), "fields": packed}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in value):
                return {k: self.pack(v) for k, v in value.items()}
            return {_ITEMS: [[self.pack(k), self.pack(v)] for k, v in value.items()]}
        if isinstance(value, list):
            return [self.pack(v) for v in value]
        if isinstance(value, tuple):
            return {_TUPLE: [self.pack(v) for v in value]}
        if isinstance(value, np.generic):
            return value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(
            f"A {type(value).__name__} cannot travel in a Flower message; use tensors, numbers, strings, "
            "lists, tuples or dicts of them."
        )

    def _tensor(self, tensor: torch.Tensor) -> dict[str, Any]:
        name = f"t{len(self.arrays)}"
        tensor = tensor.detach().cpu()
        marker: dict[str, Any] = {_TENSOR: name}
        try:
            array = tensor.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): send the raw bytes, keep dtype and shape
            array = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
            marker.update(dtype=str(tensor.dtype).removeprefix("torch."), shape=list(tensor.shape))
        self.arrays[name] = Array(array)
        return marker


def _unpack(value: Any, arrays: ArrayRecord) -> Any:
    if isinstance(value, list):
        return [_unpack(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    if _TENSOR in value:
        tensor = torch.from_numpy(arrays[value[_TENSOR]].numpy())
        if "dtype" in value:
            tensor = tensor.view(getattr(torch, value["dtype"])).reshape(value["shape"])
        return tensor
    if _TUPLE in value:
        return tuple(_unpack(v, arrays) for v in value[_TUPLE])
    if _ITEMS in value:
        return {_unpack(k, arrays): _unpack(v, arrays) for k, v in value[_ITEMS]}
    if _DATACLASS in value:
        cls = _travelling_classes().get(value[_DATACLASS])
        if cls is None:
            raise TypeError(f"A message names the unknown state class {value[_DATACLASS]!r}.")
        return cls(**{k: _unpack(v, arrays) for k, v in value["fields"].items()})
    return {k: _unpack(v, arrays) for k, v in value.items()}


def encode(value: Any) -> RecordDict:
    """Message content of ``value``: its tensors in an ArrayRecord (key order and dtype kept), the rest as JSON.

    ``value`` may nest dicts, lists, tuples, numbers, strings, tensors and the dataclasses of
    :mod:`fedpeft.core.types` (``Payload``, ``ClientUpdate``, ``ServerState``).
    """
    packer = _Packer()
    text = json.dumps(packer.pack(value))
    return RecordDict({ARRAYS_KEY: packer.arrays, CONFIG_KEY: ConfigRecord({JSON_FIELD: text})})


def decode(content: RecordDict) -> Any:
    """The value :func:`encode` turned into ``content``."""
    text = content.config_records[CONFIG_KEY][JSON_FIELD]
    arrays = content.array_records[ARRAYS_KEY] if ARRAYS_KEY in content.array_records else ArrayRecord()
    return _unpack(json.loads(str(text)), arrays)


@dataclass
class ClientTask:
    """One worker operation for one client, as the ServerApp sends it.

    Attributes:
        op: the worker operation (a key of :data:`OPERATIONS`).
        client_id: the client it runs for.
        run_dir: the run directory (a node may keep its own copy: node config ``run-dir``).
        config_text: the experiment config as given (``dump_given``), from which the ClientApp builds its worker.
        kwargs: the operation's keyword arguments besides ``client_id``.
    """

    op: str
    client_id: str
    run_dir: str
    config_text: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def to_content(self) -> RecordDict:
        return encode(
            {
                "op": self.op,
                "client_id": self.client_id,
                "run_dir": self.run_dir,
                "config_text": self.config_text,
                "kwargs": self.kwargs,
            }
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> ClientTask:
        return cls(**decode(content))


@dataclass
class TaskResult:
    """What the ClientApp returns for a :class:`ClientTask`: the operation's result and its seconds."""

    value: Any
    seconds: float

    def to_content(self) -> RecordDict:
        return encode({"value": self.value, "seconds": self.seconds})

    @classmethod
    def from_content(cls, content: RecordDict) -> TaskResult:
        return cls(**decode(content))


class ClientTaskError(RuntimeError):
    """A client's task failed on its node (the ClientApp raised, the node was lost, no reply came)."""


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of named tensors (names, dtypes, shapes and values), equal across processes and machines."""
    digest = hashlib.sha256()
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------- ClientApp
_WORKERS: dict[tuple[str, str], Worker] = {}
_DIGESTS: dict[tuple[str, int, int], str] = {}


def _node_run_dir(task_run_dir: str, context: Context) -> Path:
    return Path(str(context.node_config.get(NODE_RUN_DIR) or task_run_dir))


def cached_worker(run_dir: Path, config_text: str) -> Worker:
    """The worker of (run directory, config) in this process, built on first use.

    Only the latest one is kept: a process serves one experiment at a time, and a model per entry would add up.
    """
    from fedpeft.worker import Worker

    key = (str(run_dir), config_text)
    if key not in _WORKERS:
        _WORKERS.clear()
        cfg: ExperimentConfig = validate(yaml.safe_load(config_text))
        _WORKERS[key] = Worker(cfg, run_dir)
    return _WORKERS[key]


def _error_reply(message: Message, err: BaseException) -> Message:
    log.warning("%s failed on this node: %r\n%s", message.metadata.message_type, err, traceback.format_exc())
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=repr(err)), reply_to=message)


def handle_task(message: Message, context: Context) -> Message:
    """Run the worker operation a :class:`ClientTask` message asks for; a failure becomes an error reply."""
    try:
        task = ClientTask.from_content(message.content)
        if OPERATIONS.get(task.op) != message.metadata.message_type:
            raise ValueError(f"operation {task.op!r} cannot run as a {message.metadata.message_type} message")
        worker = cached_worker(_node_run_dir(task.run_dir, context), task.config_text)
        started = time.perf_counter()
        value = getattr(worker, task.op)(client_id=task.client_id, **task.kwargs)
        result = TaskResult(value, time.perf_counter() - started)
        return Message(result.to_content(), reply_to=message)
    except Exception as err:  # reported to the server, which leaves the client out
        return _error_reply(message, err)
    finally:
        release_memory()


def handle_partition_query(message: Message, context: Context) -> Message:
    """Tell the server which partition of the clients this node serves (from its node config)."""
    config = context.node_config
    answer = {
        "partition_id": int(config[PARTITION_ID]) if PARTITION_ID in config else None,
        "num_partitions": int(config[NUM_PARTITIONS]) if NUM_PARTITIONS in config else None,
    }
    return Message(encode(answer), reply_to=message)


def handle_base_query(message: Message, context: Context) -> Message:
    """Say whether this node holds the server's base model of a seed; store it when the message carries it."""
    try:
        request = decode(message.content)
        root = _node_run_dir(request["run_dir"], context)
        path = root / request["path"]
        if not path.resolve().is_relative_to(root.resolve()):
            raise ValueError(f"{request['path']!r} lies outside the run directory")
        if request.get("tensors") is not None:
            save_atomic({"tensors": request["tensors"]}, path)
            _WORKERS.clear()  # a worker may hold an older base of this seed
        present = path.exists() and _file_digest(path) == request["digest"]
        return Message(encode({"present": present}), reply_to=message)
    except Exception as err:
        return _error_reply(message, err)


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _DIGESTS:
        _DIGESTS[key] = tensors_digest(torch.load(path, weights_only=False)["tensors"])
    return _DIGESTS[key]


client_app = ClientApp()
client_app.train()(handle_task)
client_app.evaluate("base")(handle_task)
client_app.train("personalize")(handle_task)
client_app.evaluate("round")(handle_task)
client_app.train("client_base")(handle_task)
client_app.query("partition")(handle_partition_query)
client_app.query("base")(handle_base_query)


# ---------------------------------------------------------------------------------------------- GridEngine
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
        (the order the local engine aggregates in, so the sums round alike)."""
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


# ---------------------------------------------------------------------------------------------- simulation
def flower_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config as the flower engine runs it: engine ``flower`` and per-client state on disk.

    Clients run in several processes (and machines), so their state between rounds lives in the run directory
    where any process serving the client finds it, not in one process's memory.
    """
    engine = cfg.engine.model_copy(update={"name": "flower", "state": "disk"})
    return cfg.model_copy(update={"engine": engine})


def run_flower_simulation(
    cfg: ExperimentConfig, out: Path, *, resume: bool = False, progress: Progress | None = None
) -> Path:
    """Run an experiment on Flower's simulation engine (Ray, in-process); returns the output directory.

    The ServerApp runs the same :class:`~fedpeft.runner.Experiment` as the local engine, with a
    :class:`GridEngine` over its grid; ``cfg.engine.num_supernodes`` virtual SuperNodes serve the clients, at
    most one per CPU core at a time.
    """
    if importlib.util.find_spec("ray") is None:
        raise UserError("The flower engine simulates with Ray; install it with `pip install 'flwr[simulation]'`.")
    from flwr.simulation import run_simulation

    from fedpeft.runner import Experiment

    cfg = flower_config(cfg)
    progress = progress or Progress()
    experiment = Experiment(cfg, out, progress)  # validates the methods before anything starts
    failures: list[BaseException] = []

    def main(grid: Grid, context: Context) -> None:
        try:
            experiment.run(
                resume=resume,
                engine_factory=lambda worker: GridEngine(grid, worker, on_client=progress.advance_client),
            )
        except BaseException as err:  # re-raised below, in the caller's thread, as it is
            failures.append(err)

    server_app = ServerApp()
    server_app.main()(main)
    nodes = max(1, cfg.engine.num_supernodes)
    parallel = max(1, min(nodes, os.cpu_count() or 1))
    gpus = 1.0 / parallel if cfg.device.startswith("cuda") else 0.0
    verbose = log.isEnabledFor(logging.INFO)
    backend_config: dict[str, Any] = {
        "client_resources": {"num_cpus": 1, "num_gpus": gpus},
        "init_args": {
            "num_cpus": parallel,
            "num_gpus": 1 if gpus else 0,
            "include_dashboard": False,
            "log_to_driver": verbose,
            "logging_level": logging.INFO if verbose else logging.ERROR,
        },
    }
    if not verbose:  # importing flwr resets its logger to DEBUG
        logging.getLogger("flwr").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
        run_simulation(
            server_app=server_app, client_app=client_app, num_supernodes=nodes, backend_config=backend_config
        )
    if failures:
        raise failures[0]
    if not (Path(out) / "results.jsonl").exists():
        raise RuntimeError("The Flower simulation ended before the experiment wrote its outputs; see the log above.")
    return Path(out)
