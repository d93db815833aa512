"""The one codec of fedpeft's Flower messages: tensors into one ``ArrayRecord``, everything else into JSON in a
``ConfigRecord`` (the encoding of :mod:`fedpeft.core.encoding`, which checkpoints share); and the task and result
a message carries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TypedDict, cast, final

import torch  # ArrayRecord.to_torch_state_dict and Array.from_torch_tensor need torch imported
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedpeft.core.encoding import TENSOR, Packer, known_classes, unpack
from fedpeft.core.faults import INJECTED_ERRORS, ClientDroppedError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.engine.flower.messages import ARRAYS_KEY, CONFIG_KEY, JSON_FIELD


class _Packer(Packer):
    """Packs a value for a message: its tensors into one ArrayRecord."""

    def __init__(self) -> None:
        super().__init__("travel in a Flower message")
        self.arrays = ArrayRecord()

    def store(self, name: str, tensor: torch.Tensor) -> JSONObject:
        tensor = tensor.detach().cpu()
        try:
            array = tensor.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...): send the raw bytes, keep dtype and shape
            self.arrays[name] = Array(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
            return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
        self.arrays[name] = Array(array)
        return {}


def _tensor_reader(arrays: ArrayRecord) -> Callable[[JSONObject], torch.Tensor]:
    """The tensor of a marker, read from a message's ``arrays`` (a new tensor for every marker)."""

    def tensor_of(marker: JSONObject) -> torch.Tensor:
        tensor = torch.from_numpy(arrays[cast(str, marker[TENSOR])].numpy())
        if "dtype" in marker:
            tensor = tensor.view(getattr(torch, cast(str, marker["dtype"]))).reshape(cast(list[int], marker["shape"]))
        return tensor

    return tensor_of


def encode(value: object) -> RecordDict:
    """Message content of ``value``: its tensors in an ArrayRecord (key order and dtype kept), the rest as JSON.

    ``value`` may nest dicts, lists, tuples, numbers, strings, tensors and the dataclasses of
    :mod:`fedpeft.core.types` (``Payload``, ``ClientUpdate``, ``ServerState``, ``TrainResult``), as
    :mod:`fedpeft.core.encoding` packs them.
    """
    packer = _Packer()
    text = json.dumps(packer.pack(value))
    return RecordDict({ARRAYS_KEY: packer.arrays, CONFIG_KEY: ConfigRecord({JSON_FIELD: text})})


def decode(content: RecordDict) -> object:
    """The value :func:`encode` turned into ``content``."""
    text = content.config_records[CONFIG_KEY][JSON_FIELD]
    arrays = content.array_records[ARRAYS_KEY] if ARRAYS_KEY in content.array_records else ArrayRecord()
    return unpack(json.loads(str(text)), _tensor_reader(arrays), known_classes(), "A message")


ClientCall = tuple[str, dict[str, object]]
"""A client of a :class:`NodeTask`: its id, and the operation's keyword arguments besides ``client_id``."""


class _TaskFields(TypedDict):
    op: str
    run_dir: str
    config_text: str
    clients: list[ClientCall]


@dataclass
class NodeTask:
    """One worker operation for every client a node serves in a step (a round, an evaluation), as one message.

    Attributes:
        op: the worker operation (a key of :data:`OPERATIONS`).
        run_dir: the run directory (a node may keep its own copy: node config ``run-dir``).
        config_text: the experiment config as given (``dump_given``), from which the node builds its worker.
        clients: (client id, the operation's keyword arguments besides ``client_id``) per client, in the order
            the node runs them.
    """

    op: str
    run_dir: str
    config_text: str
    clients: list[ClientCall] = field(default_factory=list)

    def to_content(self) -> RecordDict:
        """The task as message content (:func:`encode`)."""
        return encode(
            {"op": self.op, "run_dir": self.run_dir, "config_text": self.config_text, "clients": self.clients}
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> NodeTask:
        """The task :meth:`to_content` encoded."""
        value = cast(_TaskFields, decode(content))
        return cls(
            value["op"],
            value["run_dir"],
            value["config_text"],
            [(client_id, kwargs) for client_id, kwargs in value["clients"]],
        )


class ErrorDetails(TypedDict, total=False):
    """What a node reports of an error a client's work raised, beside its repr (:func:`error_details`)."""

    error_type: str
    message: str


@final  # no other keys: a result without ``error`` is a value
class ClientValue(TypedDict):
    """A client's result in a :class:`NodeResult`: what its operation returned, and the seconds it took."""

    client: str
    value: object
    seconds: float


class ClientFailure(ErrorDetails):
    """A client's failure in a :class:`NodeResult`: the error's repr and details, and whether the client dropped
    out (an injected fault, not an error of the node)."""

    client: str
    error: str
    dropped: bool


NodeCounters = dict[str, float]
"""A node process's counters (:attr:`NodeResult.stats`), by name."""


class _ResultFields(TypedDict):
    results: list[ClientValue | ClientFailure]
    stats: NodeCounters


@dataclass
class NodeResult:
    """A node's answer to a :class:`NodeTask`: per client its result or its failure, and the node's counters.

    Attributes:
        results: per client, in the task's order, ``{"client", "value", "seconds"}`` or ``{"client", "error",
            "dropped"}`` (``dropped``: the client left the round, an injected fault, not an error of the node).
        stats: the node process's counters: ``pid``, ``model_loads`` (workers built by the process so far),
            ``seconds`` (handling the message, decoding and encoding included) and ``work_seconds`` (the clients'
            operations alone).
    """

    results: list[ClientValue | ClientFailure]
    stats: NodeCounters = field(default_factory=dict)

    def to_content(self) -> RecordDict:
        """The result as message content (:func:`encode`)."""
        return encode({"results": self.results, "stats": self.stats})

    @classmethod
    def from_content(cls, content: RecordDict) -> NodeResult:
        """The result :meth:`to_content` encoded."""
        return cls(**cast(_ResultFields, decode(content)))


@dataclass
class NodeBundle:
    """Several :class:`NodeTask` for one node in one message: the steps of methods that run at once
    (``engine.concurrent_methods``), so that the node starts one ClientApp process for all of them."""

    tasks: list[NodeTask]

    def to_content(self) -> RecordDict:
        """The bundle as message content: its tasks' fields, in order, under ``bundle``."""
        return encode({"bundle": [{f.name: getattr(t, f.name) for f in fields(t)} for t in self.tasks]})

    @classmethod
    def from_content(cls, content: RecordDict) -> NodeBundle:
        """The bundle :meth:`to_content` encoded, its tasks in their order."""
        entries = cast(dict[str, list[_TaskFields]], decode(content))["bundle"]
        tasks = [
            NodeTask(
                e["op"], e["run_dir"], e["config_text"], [(client_id, kwargs) for client_id, kwargs in e["clients"]]
            )
            for e in entries
        ]
        return cls(tasks)


def bundle_results(results: list[NodeResult]) -> RecordDict:
    """The reply to a :class:`NodeBundle`: each task's :class:`NodeResult`, and the node's counters summed."""
    stats: NodeCounters = {}
    for result in results:
        for key, value in result.stats.items():
            stats[key] = value if key in ("pid", "model_loads") else stats.get(key, 0.0) + value
    return encode({"bundle": [{"results": r.results, "stats": r.stats} for r in results], "stats": stats})


class _BundleResults(TypedDict):
    bundle: list[_ResultFields]
    stats: NodeCounters


def unbundle_results(content: RecordDict) -> tuple[list[NodeResult], NodeCounters]:
    """Each task's :class:`NodeResult` and the summed counters of a reply to a :class:`NodeBundle`."""
    value = cast(_BundleResults, decode(content))
    return [NodeResult(**entry) for entry in value["bundle"]], value["stats"]


class ClientTaskError(RuntimeError):
    """A client's task failed on its node (the ClientApp raised, the node was lost, no reply came).

    ``error_type`` and ``error_message``: the class name and message of what the client's work raised on its
    node, where the node said (else this error's own)."""

    def __init__(self, reason: str, error_type: str | None = None, error_message: str | None = None) -> None:
        super().__init__(reason)
        self.error_type = error_type or type(self).__name__
        self.error_message = reason if error_message is None else error_message


# The errors of injected faults, rebuilt as they are on the server, so that it records the fault (as the local
# engine does) and a run reads the same on either engine.
_FAULT_ERRORS = {cls.__name__: cls for cls in INJECTED_ERRORS}


def error_details(err: BaseException) -> ErrorDetails:
    """What a node reports of an error a client's work raised, beside its repr: its class name and message."""
    return {"error_type": type(err).__name__, "message": str(err)}


def client_error(reason: str, details: ErrorDetails, *, dropped: bool = False) -> Exception:
    """The server's error for a client whose task failed on its node.

    Args:
        reason: the node's text of the error (its repr).
        details: the node's report, with :func:`error_details` (``error_type``, ``message``) where the node gives
            them.
        dropped: the client dropped out (its work raised a :class:`ClientDroppedError`).

    Returns:
        the injected fault's own error (:data:`fedpeft.core.faults.INJECTED_ERRORS`), else a
        :class:`ClientDroppedError` for a dropped client, else a :class:`ClientTaskError` naming the error.
    """
    error_type, message = details.get("error_type"), details.get("message")
    fault_error = _FAULT_ERRORS.get(error_type or "")
    if fault_error is not None:
        return fault_error(reason if message is None else message)
    if dropped:
        return ClientDroppedError(reason)
    return ClientTaskError(reason, error_type, message)


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of named tensors (names, dtypes, shapes and values), equal across processes and machines."""
    digest = hashlib.sha256()
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
