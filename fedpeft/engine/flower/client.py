"""The ClientApp: runs the worker operation a message asks for on this node's long-lived worker."""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import torch  # ArrayRecord.to_torch_state_dict needs torch imported
import yaml
from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedpeft.core.config import ExperimentConfig, validate
from fedpeft.core.costs import release_memory
from fedpeft.core.faults import ClientDroppedError, InjectedFaultError
from fedpeft.core.io import save_atomic
from fedpeft.engine.flower.codec import ClientTask, TaskResult, decode, encode, tensors_digest
from fedpeft.engine.flower.messages import NODE_RUN_DIR, NUM_PARTITIONS, OPERATIONS, PARTITION_ID
from fedpeft.engine.flower.secagg import handle_secure_train, is_secure_request, secure_aggregation_mod

if TYPE_CHECKING:  # the worker pulls in transformers: imported when first needed, not for a node's queries
    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")

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
    trace = "" if isinstance(err, (InjectedFaultError, ClientDroppedError)) else "\n" + traceback.format_exc()
    log.warning("%s failed on this node: %r%s", message.metadata.message_type, err, trace)
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=repr(err)), reply_to=message)


def handle_task(message: Message, context: Context) -> Message:
    """Run the worker operation a :class:`ClientTask` message asks for; a failure becomes an error reply."""
    try:
        if is_secure_request(message.content):  # a SecAgg+ round: all of this node's clients at once
            return handle_secure_train(
                message, lambda run_dir, text: cached_worker(_node_run_dir(run_dir, context), text)
            )
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


client_app = ClientApp(mods=[secure_aggregation_mod])
client_app.train()(handle_task)
client_app.evaluate("base")(handle_task)
client_app.train("personalize")(handle_task)
client_app.evaluate("round")(handle_task)
client_app.train("client_base")(handle_task)
client_app.query("partition")(handle_partition_query)
client_app.query("base")(handle_base_query)
