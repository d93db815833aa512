"""A node's side of fedpeft's messages: the worker operations a message asks for, run on the node's long-lived
worker; and the ClientApp of the simulation engine, which runs them in its own (long-lived) process."""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

import yaml
from flwr.app import Context, Message, RecordDict, UserConfigValue
from flwr.clientapp import ClientApp

from fedpeft.core.checkpoints import load_checkpoint, save_checkpoint
from fedpeft.core.config import ExperimentConfig, validate
from fedpeft.core.costs import release_memory
from fedpeft.core.errors import UserError
from fedpeft.core.faults import ClientDroppedError, InjectedFaultError
from fedpeft.data.sites import site_config, site_report
from fedpeft.data.types import FederatedData
from fedpeft.engine.flower.codec import (
    ClientFailure,
    ClientValue,
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
    ALIVE_QUERY,
    BASE_QUERY,
    BUNDLE,
    CLOSE_QUERY,
    DATA_PATH,
    NODE_RUN_DIR,
    OPERATIONS,
    PARTITION_QUERY,
    SITE_QUERY,
    TRAIN,
    BaseQuery,
)
from fedpeft.engine.flower.relay import error_reply, partition_answer, serve_every_message
from fedpeft.engine.flower.secagg import handle_secure_train, is_secure_request
from fedpeft.engine.flower.secagg_mod import secure_aggregation_mod
from fedpeft.engine.operations import operation

if TYPE_CHECKING:  # the worker pulls in transformers: imported when first needed, not for a node's queries
    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")


def _node_run_dir(task_run_dir: str, node_config: Mapping[str, UserConfigValue]) -> Path:
    return Path(str(node_config.get(NODE_RUN_DIR) or task_run_dir))


class NodeWorkers:
    """What a node's process keeps between messages: the worker of the experiment it serves, a site's own data,
    the digests of base-model files, and how many workers it built and the seconds that took.

    Only the latest worker (and site data) is kept: a process serves one experiment at a time, and a model per
    entry would add up. The process that answers messages owns one for as long as it lives (the simulation's
    ClientApp, a deployment's node worker).
    """

    def __init__(self) -> None:
        self._workers: dict[tuple[str, str, str], Worker] = {}
        self._data: dict[str, FederatedData] = {}  # by data config
        self._digests: dict[tuple[str, int, int], str] = {}  # by (path, mtime, size)
        self.model_loads = 0
        self.load_seconds = 0.0

    def site_data(self, cfg: ExperimentConfig, node_config: Mapping[str, UserConfigValue]) -> FederatedData | None:
        """With site-local data (``data.sites``), this node's clients, built from its node config's ``data-path``
        (the latest build is kept); otherwise None (the worker builds the data from the config)."""
        if cfg.data.sites is None:
            return None
        if not node_config.get(DATA_PATH):
            raise ValueError(f"this SuperNode has no {DATA_PATH} in its node config, and the run's data lives on sites")
        data_cfg = site_config(cfg.data, str(node_config[DATA_PATH]))
        key = data_cfg.model_dump_json()
        if key not in self._data:
            from fedpeft.worker import build_data

            self._data.clear()
            self._data[key] = build_data(cfg.model_copy(update={"data": data_cfg}))
        return self._data[key]

    def worker(self, run_dir: Path, config_text: str, node_config: Mapping[str, UserConfigValue]) -> Worker:
        """The worker of (run directory, config), built on first use (with the node's own data when the run's
        data lives on sites)."""
        from fedpeft.worker import Worker

        key = (str(run_dir), config_text, str(node_config.get(DATA_PATH, "")))
        if key not in self._workers:
            self._workers.clear()
            started = time.perf_counter()
            cfg: ExperimentConfig = validate(yaml.safe_load(config_text))
            self._workers[key] = Worker(cfg, run_dir, data=self.site_data(cfg, node_config))
            self.model_loads += 1
            self.load_seconds += time.perf_counter() - started
        return self._workers[key]

    def forget_workers(self) -> None:
        """Drop the worker (e.g. it may hold an older base model than the one just stored)."""
        self._workers.clear()

    def close(self) -> None:
        """The run is over: let go of its model and data."""
        self._workers.clear()
        self._data.clear()

    def file_digest(self, path: Path) -> str:
        """The digest of a checkpoint's tensors (:func:`tensors_digest`), read once per version of the file."""
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key not in self._digests:
            self._digests[key] = tensors_digest(load_checkpoint(path)["tensors"])
        return self._digests[key]


def handle_content(
    message_type: str, content: RecordDict, node_config: Mapping[str, UserConfigValue], workers: NodeWorkers
) -> RecordDict:
    """The reply content to a message of ``message_type`` (raises when the node cannot answer it at all).

    The one handler of fedpeft's messages on a node: the ClientApp of the simulation calls it in its own process,
    a deployment's node worker process (:mod:`fedpeft.engine.flower.node_worker`) for the ClientApp that relays
    to it; ``workers`` is that process's.
    """
    try:
        if message_type == PARTITION_QUERY:
            return encode(partition_answer(node_config))
        if message_type == BASE_QUERY:
            return _base_query(cast(BaseQuery, decode(content)), node_config, workers)
        if message_type == SITE_QUERY:  # site-local data: the clients this node holds, ids and sizes only
            cfg = validate(yaml.safe_load(cast("Mapping[str, str]", decode(content))["config"]))
            return encode(site_answer(cfg, node_config, workers))
        if message_type == CLOSE_QUERY:
            workers.close()
            return encode({"closed": True})
        if message_type == ALIVE_QUERY:  # a deployment's relay answers it; nothing to renew in this process
            return encode({"renewed": False})
        if message_type == TRAIN and is_secure_request(content):  # a SecAgg+ round: all of this node's clients
            return handle_secure_train(
                content, lambda run_dir, text: workers.worker(_node_run_dir(run_dir, node_config), text, node_config)
            )
        if message_type == BUNDLE:  # the steps of methods that run at once, one after the other
            tasks = NodeBundle.from_content(content).tasks
            return bundle_results([_node_task(OPERATIONS.get(t.op, "?"), t, node_config, workers) for t in tasks])
        return _node_task(message_type, NodeTask.from_content(content), node_config, workers).to_content()
    finally:
        release_memory()


def site_answer(
    cfg: ExperimentConfig, node_config: Mapping[str, UserConfigValue], workers: NodeWorkers
) -> dict[str, object]:
    """A node's answer to the server's site query: its ``data_path`` (None for a node that is no site), and either
    the report of its clients (:func:`~fedpeft.data.sites.site_report`: ids and sizes, never an example) or, under
    ``error``, the one sentence that says why it cannot build them (a bad data file, say)."""
    if not node_config.get(DATA_PATH):
        return {"data_path": None}
    path = str(node_config[DATA_PATH])
    if cfg.data.sites is None:
        raise ValueError("the run's data does not live on sites (data.sites is not set)")
    try:
        data = workers.site_data(cfg, node_config)
    except Exception as err:  # the site's own sentence goes to the server, which stops the run with it
        log.warning("this site cannot build its clients from %s: %r\n%s", path, err, traceback.format_exc())
        return {"data_path": path, "error": failure_sentence(err)}
    assert data is not None
    return {"data_path": path, **site_report(data)}


def failure_sentence(err: BaseException) -> str:
    """``err`` as one line: a :class:`UserError`'s own sentence, any other error with its class name."""
    text = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
    return " ".join(text.split())


def _node_task(
    message_type: str, task: NodeTask, node_config: Mapping[str, UserConfigValue], workers: NodeWorkers
) -> NodeResult:
    """Run the worker operation of a :class:`NodeTask` for each of its clients, one after the other."""
    started, loaded = time.perf_counter(), workers.load_seconds
    if OPERATIONS.get(task.op) != message_type:
        raise ValueError(f"operation {task.op!r} cannot run as a {message_type} message")
    run = operation(task.op)
    worker = workers.worker(_node_run_dir(task.run_dir, node_config), task.config_text, node_config)
    load = workers.load_seconds - loaded
    results: list[ClientValue | ClientFailure] = []
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
    stats = {"pid": os.getpid(), "model_loads": workers.model_loads, "work_seconds": work}
    stats.update(load_seconds=load, seconds=time.perf_counter() - started)
    return NodeResult(results, stats)


def _base_query(request: BaseQuery, node_config: Mapping[str, UserConfigValue], workers: NodeWorkers) -> RecordDict:
    """Say whether this node holds the server's base model of a seed; store it when the message carries it."""
    root = _node_run_dir(request["run_dir"], node_config)
    path = root / request["path"]
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{request['path']!r} lies outside the run directory")
    if request.get("tensors") is not None:
        save_checkpoint({"tensors": request["tensors"]}, path)
        workers.forget_workers()  # a worker may hold an older base of this seed
    present = path.exists() and workers.file_digest(path) == request["digest"]
    return encode({"present": present})


def build_client_app() -> ClientApp:
    """The ClientApp of the simulation: it answers every message in its own long-lived process (a Ray worker),
    with the one :class:`NodeWorkers` it owns, which lives as long as the process."""
    workers = NodeWorkers()

    def handle_message(message: Message, context: Context) -> Message:
        try:
            reply = handle_content(message.metadata.message_type, message.content, context.node_config, workers)
        except Exception as err:
            log.warning("%s failed on this node: %r\n%s", message.metadata.message_type, err, traceback.format_exc())
            return error_reply(message, repr(err))
        return Message(reply, reply_to=message)

    app = ClientApp(mods=[secure_aggregation_mod])
    serve_every_message(app, handle_message)
    return app


client_app = build_client_app()
