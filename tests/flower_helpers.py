"""What the Flower engine's tests share: the tiny experiment, the records a run writes, and the in-process grid.

The tests of the Flower engine are split over several files (tests/test_flower*.py) so that ``--dist loadfile`` can
run their slow simulations and loopback deployments on different workers; other test files import these helpers
through tests/test_flower.py."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedpeft.core.progress import Progress
from fedpeft.engine.flower import client_app

REPO = Path(__file__).resolve().parents[1]
ATOL = 1e-5
RECORD_KEY = ("method", "budget", "pool", "client", "group", "seed", "round", "split", "metric")


FEDPEFT = str(Path(sys.executable).parent / "fedpeft")
"""The ``fedpeft`` command of this environment, for tests that start it as a user would."""


def make_certs(directory: Path, nodes: int) -> Path:
    """``fedpeft certs``: a CA, the SuperLink's certificate for localhost and 127.0.0.1, and ``nodes`` node keys, in
    ``directory`` (returned)."""
    command = [FEDPEFT, "certs", str(directory), "--host", "localhost", "--host", "127.0.0.1", "--nodes", str(nodes)]
    made = subprocess.run(command, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return directory


def launch_command(config: Path, out: Path, node_timeout: int) -> list[str]:
    """``fedpeft launch`` of ``config`` on the local deployment (``flwr run`` of this repository's app), writing
    to ``out``."""
    command = [FEDPEFT, "launch", str(config), "--federation", "local-deployment", "--app", str(REPO)]
    return command + ["--out", str(out), "--node-timeout", str(node_timeout)]


def launch(deployment: Any, config: Path, out: Path, node_timeout: int = 120) -> subprocess.CompletedProcess[str]:
    """Run :func:`launch_command` against ``deployment`` (a started ``LoopbackDeployment``) from its work
    directory; its output is captured."""
    command = launch_command(config, out, node_timeout)
    return subprocess.run(
        command, cwd=deployment.workdir, env=deployment.env, capture_output=True, text=True, timeout=900
    )


def tiny_raw(**changes: object) -> dict:
    """A tiny experiment: two synthetic languages, two clients each, a centralized base stage, FedIT and LoRA."""
    raw: dict = {
        "name": "flower-tiny",
        "seeds": [0],
        "data": {
            "name": "synthetic-xnli",
            "groups": ["lat1", "lat2"],
            "clients_per_group": 2,
            "train_per_group": 32,
            "test_per_group": 16,
            "base_samples": 64,
        },
        "model": {"name": "tiny-bert", "max_length": 32},
        "base": {"kind": "centralized", "epochs": 1, "batch_size": 16},
        "budgets": [2],
        "methods": [
            {"name": "fedit", "rounds": 2, "fraction": 1.0, "local_steps": 2, "batch_size": 8, "lr": 1e-3, "rank": 2},
            {"name": "lora", "epochs": 1, "batch_size": 8, "lr": 1e-3},
        ],
        "output": {"plots": False},
    }
    raw.update(changes)
    return raw


def read_records(run_dir: Path) -> dict[tuple, float]:
    """The records of a run that another run (engine) reproduces: all but the rounds' wall seconds."""
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not (r["split"] == "train" and r["metric"] == "seconds")]
    return {tuple(row[k] for k in RECORD_KEY): row["value"] for row in rows}


def read_costs(run_dir: Path) -> dict[tuple, float]:
    rows = [json.loads(line) for line in (run_dir / "costs.jsonl").read_text().splitlines()]
    return {(row["method"], row["phase"], row["metric"]): row["value"] for row in rows}


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread in this process, as in the simulation engine's client processes (one CPU each).

    It also keeps the in-process clients and the Ray workers from oversubscribing a small machine's cores.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class InProcessGrid(Grid):
    """A grid whose nodes are ClientApp calls in this process, each node with its partition's node config."""

    def __init__(
        self, num_nodes: int, lost_after_query: set[int] | None = None, node_dirs: list[Path] | None = None
    ) -> None:
        self.lost = lost_after_query or set()
        self.contexts = {
            1000 + i: Context(
                run_id=1,
                node_id=1000 + i,
                node_config={"partition-id": i, "num-partitions": num_nodes}
                | ({"run-dir": str(node_dirs[i])} if node_dirs else {}),
                state=RecordDict(),
                run_config={},
            )
            for i in range(num_nodes)
        }
        self.served: dict[int, list[str]] = {node: [] for node in self.contexts}
        self._replies: dict[str, Message] = {}

    def set_run(self, run):  # noqa: ANN001, ANN201
        self._run = run

    @property
    def run(self):  # noqa: ANN201
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: ANN001, ANN201
        return Message(content, dst_node_id, message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message_id = message.metadata.message_id or uuid.uuid4().hex  # kept if a subclass gave one
            message.metadata.__dict__["_message_id"] = message_id
            node = message.metadata.dst_node_id
            self.served[node].append(message.metadata.message_type)
            if node in self.lost and not message.metadata.message_type.startswith("query."):
                lost = Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node lost")
                self._replies[message_id] = Message(lost, reply_to=message)
            else:
                # Each node gets its own copy of the content, as it would over the network (protocols such as
                # SecAgg+ send one content object to every node, and each node's mod consumes its copy).
                received = Message(copy.deepcopy(message.content), node, message.metadata.message_type)
                received.metadata.__dict__.update(copy.deepcopy(message.metadata.__dict__))
                self._replies[message_id] = client_app(received, self.contexts[node])
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


@pytest.fixture
def task_identity(monkeypatch):
    """The identity Flower stamps on messages, which its runtimes set in their processes."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, attribute, 1)


class RoundLog(Progress):
    """Keeps the metrics of every finished round."""

    def __init__(self) -> None:
        super().__init__()
        self.round_metrics: list[dict] = []

    def advance_round(self, metrics: dict | None = None, evaluation_seconds: float | None = None) -> None:
        self.round_metrics.append(dict(metrics or {}))


def lose_and_restart(grid: InProcessGrid, node: int = 1001, new_id: int = 1005) -> None:
    """Make ``node`` of ``grid`` go down in round 1 and come back, with its node config and a new node id, during
    round 2 (as a restarted SuperNode does)."""
    original = grid.push_messages
    rounds_seen: list[str] = []

    def push(messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        trains = {m.metadata.group_id for m in messages if m.metadata.message_type == "train"}
        rounds_seen.extend(sorted(trains - set(rounds_seen)))
        if len(rounds_seen) == 2 and node not in grid.lost:
            grid.lost.add(node)
        if len(rounds_seen) == 3 and new_id not in grid.contexts:
            config = grid.contexts.pop(node).node_config
            grid.contexts[new_id] = Context(
                run_id=1, node_id=new_id, node_config=config, state=RecordDict(), run_config={}
            )
            grid.served[new_id] = []
        return original(messages)

    grid.push_messages = push  # type: ignore[method-assign]


def node_workers(worker_dir: Path) -> list[str]:
    """The worker processes started in ``worker_dir`` that still run (their command lines)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "fedpeft.engine.flower.node_worker" in command and str(worker_dir) in command:
            found.append(command)
    return found


def assert_nothing_left(worker_dir: Path, seconds: float = 30.0) -> None:
    """No worker process of ``worker_dir`` runs and no file but the workers' logs is left there."""
    deadline = time.monotonic() + seconds
    while (node_workers(worker_dir) or [p for p in worker_dir.iterdir() if p.suffix != ".log"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert not node_workers(worker_dir)
    assert sorted({p.suffix for p in worker_dir.iterdir()}) in ([], [".log"]), sorted(worker_dir.iterdir())
