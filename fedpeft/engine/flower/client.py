"""A node's side of fedpeft's messages: the worker operations a message asks for, run on the node's long-lived
worker; and the ClientApp of the simulation engine, which runs them in its own (long-lived) process."""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedpeft.core.checkpoints import load_checkpoint, save_checkpoint
from fedpeft.core.config import ExperimentConfig, validate
from fedpeft.core.costs import release_memory
from fedpeft.core.faults import ClientDroppedError, InjectedFaultError
from fedpeft.data.sites import site_config, site_report
from fedpeft.data.types import FederatedData
from fedpeft.engine.flower.codec import (
    NodeBundle,
    NodeResult,
    NodeTask,
    bundle_results,
    decode,
    encode,
    error_details,
    tensors_digest,
)
from fedpeft.engine.flower.messages import (
    BASE_QUERY,
    BUNDLE,
    CLOSE_QUERY,
    DATA_PATH,
    NODE_RUN_DIR,
    OPERATIONS,
    PARTITION_QUERY,
    SITE_QUERY,
    TRAIN,
)
from fedpeft.engine.flower.relay import error_reply, partition_answer, serve_every_message
from fedpeft.engine.flower.secagg import handle_secure_train, is_secure_request
from fedpeft.engine.flower.secagg_mod import secure_aggregation_mod
from fedpeft.engine.operations import operation

if TYPE_CHECKING:  # the worker pulls in transformers: imported when first needed, not for a node's queries
    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")

_WORKERS: dict[tuple[str, str, str], Worker] = {}
_DATA: dict[str, FederatedData] = {}  # a site's own clients (data.sites), by data config
_DIGESTS: dict[tuple[str, int, int], str] = {}
_COUNTS: dict[str, float] = {"model_loads": 0, "load_seconds": 0.0}  # workers this process built, and their time


def _node_run_dir(task_run_dir: str, node_config: Mapping[str, Any]) -> Path:
    return Path(str(node_config.get(NODE_RUN_DIR) or task_run_dir))


def site_data(cfg: ExperimentConfig, node_config: Mapping[str, Any]) -> FederatedData | None:
    """With site-local data (``data.sites``), this node's clients, built from its node config's ``data-path`` (the
    latest build is kept); otherwise None (the worker builds the data from the config)."""
    if cfg.data.sites is None:
        return None
    if not node_config.get(DATA_PATH):
        raise ValueError(f"this SuperNode has no {DATA_PATH} in its node config, and the run's data lives on sites")
    data_cfg = site_config(cfg.data, str(node_config[DATA_PATH]))
    key = data_cfg.model_dump_json()
    if key not in _DATA:
        from fedpeft.worker import build_data

        _DATA.clear()
        _DATA[key] = build_data(cfg.model_copy(update={"data": data_cfg}))
    return _DATA[key]


def cached_worker(run_dir: Path, config_text: str, node_config: Mapping[str, Any]) -> Worker:
    """The worker of (run directory, config) in this process, built on first use (with the node's own data when
    the run's data lives on sites).

    Only the latest one is kept: a process serves one experiment at a time, and a model per entry would add up.
    """
    from fedpeft.worker import Worker

    key = (str(run_dir), config_text, str(node_config.get(DATA_PATH, "")))
    if key not in _WORKERS:
        _WORKERS.clear()
        started = time.perf_counter()
        cfg: ExperimentConfig = validate(yaml.safe_load(config_text))
        _WORKERS[key] = Worker(cfg, run_dir, data=site_data(cfg, node_config))
        _COUNTS["model_loads"] += 1
        _COUNTS["load_seconds"] += time.perf_counter() - started
    return _WORKERS[key]


def handle_content(message_type: str, content: RecordDict, node_config: Mapping[str, Any]) -> RecordDict:
    """The reply content to a message of ``message_type`` (raises when the node cannot answer it at all).

    The one handler of fedpeft's messages on a node: the ClientApp of the simulation calls it in its own process,
    a deployment's node worker process (:mod:`fedpeft.engine.flower.node_worker`) for the ClientApp that relays
    to it.
    """
    try:
        if message_type == PARTITION_QUERY:
            return encode(partition_answer(node_config))
        if message_type == BASE_QUERY:
            return _base_query(decode(content), node_config)
        if message_type == SITE_QUERY:  # site-local data: the clients this node holds, ids and sizes only
            cfg = validate(yaml.safe_load(decode(content)["config"]))
            data = site_data(cfg, node_config)
            if data is None:
                raise ValueError("the run's data does not live on sites (data.sites is not set)")
            return encode(site_report(data))
        if message_type == CLOSE_QUERY:  # the run is over: let go of its model and data
            _WORKERS.clear()
            _DATA.clear()
            return encode({"closed": True})
        if message_type == TRAIN and is_secure_request(content):  # a SecAgg+ round: all of this node's clients
            return handle_secure_train(
                content, lambda run_dir, text: cached_worker(_node_run_dir(run_dir, node_config), text, node_config)
            )
        if message_type == BUNDLE:  # the steps of methods that run at once, one after the other
            tasks = NodeBundle.from_content(content).tasks
            return bundle_results([_node_task(OPERATIONS.get(t.op, "?"), t, node_config) for t in tasks])
        return _node_task(message_type, NodeTask.from_content(content), node_config).to_content()
    finally:
        release_memory()


def _node_task(message_type: str, task: NodeTask, node_config: Mapping[str, Any]) -> NodeResult:
    """Run the worker operation of a :class:`NodeTask` for each of its clients, one after the other."""
    started, loaded = time.perf_counter(), _COUNTS["load_seconds"]
    if OPERATIONS.get(task.op) != message_type:
        raise ValueError(f"operation {task.op!r} cannot run as a {message_type} message")
    run = operation(task.op)
    worker = cached_worker(_node_run_dir(task.run_dir, node_config), task.config_text, node_config)
    load = _COUNTS["load_seconds"] - loaded
    results: list[dict[str, Any]] = []
    work = 0.0
    for client_id, kwargs in task.clients:
        client_started = time.perf_counter()
        try:
            value = run(worker, client_id=client_id, **kwargs)
        except Exception as err:  # reported to the server, which leaves the client out
            dropped = isinstance(err, ClientDroppedError)
            trace = "" if isinstance(err, (InjectedFaultError, ClientDroppedError)) else "\n" + traceback.format_exc()
            log.warning("%s of client %s failed on this node: %r%s", task.op, client_id, err, trace)
            results.append({"client": client_id, "error": repr(err), **error_details(err), "dropped": dropped})
        else:
            results.append({"client": client_id, "value": value, "seconds": time.perf_counter() - client_started})
        work += time.perf_counter() - client_started
    stats = {"pid": os.getpid(), "model_loads": int(_COUNTS["model_loads"]), "work_seconds": work}
    stats.update(load_seconds=load, seconds=time.perf_counter() - started)
    return NodeResult(results, stats)


def _base_query(request: dict[str, Any], node_config: Mapping[str, Any]) -> RecordDict:
    """Say whether this node holds the server's base model of a seed; store it when the message carries it."""
    root = _node_run_dir(request["run_dir"], node_config)
    path = root / request["path"]
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{request['path']!r} lies outside the run directory")
    if request.get("tensors") is not None:
        save_checkpoint({"tensors": request["tensors"]}, path)
        _WORKERS.clear()  # a worker may hold an older base of this seed
    present = path.exists() and _file_digest(path) == request["digest"]
    return encode({"present": present})


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _DIGESTS:
        _DIGESTS[key] = tensors_digest(load_checkpoint(path)["tensors"])
    return _DIGESTS[key]


def handle_message(message: Message, context: Context) -> Message:
    """A ClientApp handler: answer ``message`` in this process (the simulation's long-lived Ray workers)."""
    try:
        reply = handle_content(message.metadata.message_type, message.content, context.node_config)
    except Exception as err:
        log.warning("%s failed on this node: %r\n%s", message.metadata.message_type, err, traceback.format_exc())
        return error_reply(message, repr(err))
    return Message(reply, reply_to=message)


client_app = ClientApp(mods=[secure_aggregation_mod])
serve_every_message(client_app, handle_message)
