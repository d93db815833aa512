"""The Flower engine: its codec, the same numbers as the local engine, failing clients, deployment on loopback."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch
import yaml
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedpeft.apps.flower import run_flower_simulation
from fedpeft.apps.loopback import LoopbackDeployment
from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import ExperimentConfig, validate
from fedpeft.core.progress import Progress
from fedpeft.core.types import ClientUpdate, Payload, ServerState
from fedpeft.engine.flower import (
    GridEngine,
    client_app,
    decode,
    encode,
    flower_config,
    tensors_digest,
)
from fedpeft.runner import Experiment
from fedpeft.worker import Worker

REPO = Path(__file__).resolve().parents[1]
ATOL = 1e-5
RECORD_KEY = ("method", "budget", "pool", "client", "group", "seed", "round", "split", "metric")


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


# ---------------------------------------------------------------------------------------------- codec
def test_codec_round_trip_keeps_order_dtypes_and_structure():
    tensors = {
        "z.weight": torch.randn(3, 4),
        "a.bias": torch.arange(5, dtype=torch.int64),
        "m.half": torch.randn(2, 2).to(torch.bfloat16),
        "m.flag": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    value = {
        "state": ServerState(tensors=tensors, round=3),
        "other": {"scales": torch.ones(2), "names": ("a", "b"), 7: None},
        "update": ClientUpdate("c1", {"w": torch.zeros(1)}, 12.0, {"loss": 0.5}, {"counts": [torch.ones(3)]}),
        "payload": Payload({"w": torch.full((2,), 3.0)}, {"lr": 1e-4, "nested": {"k": [1, 2.0, "x", None]}}),
    }
    back = decode(encode(value))
    state = back["state"]
    assert isinstance(state, ServerState) and state.round == 3
    assert list(state.tensors) == list(tensors)
    for key, tensor in tensors.items():
        assert state.tensors[key].dtype == tensor.dtype and state.tensors[key].shape == tensor.shape
        assert torch.equal(state.tensors[key], tensor), key
    other = back["other"]
    assert torch.equal(other["scales"], torch.ones(2))
    assert other["names"] == ("a", "b") and other[7] is None
    update = back["update"]
    assert isinstance(update, ClientUpdate) and update.client_id == "c1" and update.weight == 12.0
    assert update.metrics == {"loss": 0.5} and torch.equal(update.extras["counts"][0], torch.ones(3))
    assert back["payload"].config == value["payload"].config
    assert tensors_digest(state.tensors) == tensors_digest(tensors)


def test_codec_refuses_what_cannot_travel():
    with pytest.raises(TypeError, match="cannot travel"):
        encode({"handle": object()})


@dataclasses.dataclass
class _TypedState(ServerState):
    """A method's typed server state, as methods declare them."""

    init_seed: int = 0
    layout: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    individual: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


def test_codec_round_trips_a_typed_server_state():
    state = _TypedState(tensors={"w": torch.ones(2)}, round=3, init_seed=7, layout=[("q", 4)])
    state.individual["c0"] = torch.arange(3.0)
    back = decode(encode({"state": state, "groups": {"small": state}}))
    assert type(back["state"]) is _TypedState and back["state"].init_seed == 7 and back["state"].round == 3
    assert back["state"].layout == [("q", 4)] and torch.equal(back["state"].individual["c0"], torch.arange(3.0))
    assert type(back["groups"]["small"]) is _TypedState


# ---------------------------------------------------------------------------------------------- equivalence
@pytest.mark.slow
def test_simulation_engine_matches_local_engine(tmp_path):
    """The same records and global adapter as the local engine, with the two methods running at once
    (``engine.concurrent_methods``: their messages interleave on the nodes, their server steps take turns)."""
    cfg = validate(tiny_raw())
    Experiment(cfg, tmp_path / "local").run()
    run_flower_simulation(validate(tiny_raw(engine={"concurrent_methods": 2})), tmp_path / "flower")

    local, flower = read_records(tmp_path / "local"), read_records(tmp_path / "flower")
    assert {k[0] for k in local} == {"base", "fedit", "lora"}
    assert local.keys() == flower.keys()
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key

    # The global adapter after the last round: the floats themselves, not only the accuracies they lead to.
    def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
        return load_checkpoint(run_dir / "checkpoints" / "fedit" / "seed0.safetensors")["state"].tensors

    local_state, flower_state = final_state(tmp_path / "local"), final_state(tmp_path / "flower")
    assert list(local_state) == list(flower_state)
    for key, tensor in local_state.items():
        torch.testing.assert_close(flower_state[key], tensor, atol=ATOL, rtol=0, msg=key)

    local_costs, flower_costs = read_costs(tmp_path / "local"), read_costs(tmp_path / "flower")
    for metric in ("bytes_up_total", "bytes_down_total"):
        assert flower_costs["fedit", "federated", metric] == local_costs["fedit", "federated", metric] > 0
    assert yaml.safe_load((tmp_path / "flower" / "config.yaml").read_text())["engine"]["name"] == "flower"


@pytest.mark.slow
def test_user_error_inside_the_simulation_reaches_the_cli(tmp_path, monkeypatch, capsys):
    from fedpeft import cli

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_raw(budgets=[100_000], base={"kind": "pretrained"})))
    argv = ["fedpeft", "run", str(config), "--engine", "flower", "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "rank" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_stops_a_simulation_at_once_and_the_run_resumes(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) ends `fedpeft run --engine flower` within seconds with exit
    code 130, leaves no Ray or ClientApp process behind and a checkpoint from which --resume finishes the run
    with the numbers of an uninterrupted one."""
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0] | {"rounds": 12}])
    raw["data"] = {**raw["data"], "unseen_pool": False}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "flower"
    fedpeft = str(Path(sys.executable).parent / "fedpeft")
    command = [fedpeft, "run", str(config), "--engine", "flower", "--out", str(out)]
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    checkpoint = out / "checkpoints" / "fedit" / "seed0.safetensors"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.poll() is None, "the run ended before it could be interrupted"
    os.killpg(run.pid, signal.SIGINT)
    interrupted = time.monotonic()
    _, err = run.communicate(timeout=120)
    assert time.monotonic() - interrupted < 60  # seconds on an idle machine; generous for a loaded one
    assert run.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].endswith("--resume`."), err[-3000:]
    # Nothing of the run's session stays: a short-lived helper that a library starts at exit (Flower's telemetry
    # runs `file` through platform.platform()) may still be ending; Ray and the ClientApps must be gone.
    deadline = time.monotonic() + 10
    while True:
        left = subprocess.run(["ps", "-o", "pid=,comm=", "-s", str(run.pid)], capture_output=True, text=True).stdout
        if not left.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left.strip(), left
    state = load_checkpoint(checkpoint)
    assert 1 <= state["state"].round < 12 and not state["meter"]["failures"]  # no round of the ended backend

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    Experiment(validate(raw), tmp_path / "local").run()
    local, flower = read_records(tmp_path / "local"), read_records(out)
    assert local.keys() == flower.keys()
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key


# ---------------------------------------------------------------------------------------------- failures
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

    def advance_round(self, metrics: dict | None = None) -> None:
        self.round_metrics.append(dict(metrics or {}))


class QueuedGrid(InProcessGrid):
    """An InProcessGrid whose nodes answer later: each pull handles the oldest message sent (one per pull), so
    the server's threads wait for replies as they do in a deployment."""

    def __init__(self, num_nodes: int) -> None:
        super().__init__(num_nodes)
        self.queue: list[tuple[str, Message]] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message_id = uuid.uuid4().hex
            message.metadata.__dict__["_message_id"] = message_id
            self.queue.append((message_id, message))
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        if self.queue:
            InProcessGrid.push_messages(self, [self.queue.pop(0)[1]])
        return super().pull_messages(message_ids)


def test_methods_at_once_share_messages_and_keep_their_numbers(tmp_path, task_identity):
    """engine.concurrent_methods: three methods run at once; a node gets one message for the steps that are due
    together (a bundle), and every record equals the local engine's, where the methods run one after the other."""
    methods = [*tiny_raw()["methods"], {"name": "fedprox", "rounds": 2, "local_steps": 2, "batch_size": 8}]
    raw = tiny_raw(base={"kind": "pretrained"}, methods=methods)
    raw["data"] = {**raw["data"], "unseen_pool": False}
    local = Experiment(validate(raw), tmp_path / "local").run()
    grid = QueuedGrid(num_nodes=2)

    def engine(worker: Worker) -> GridEngine:
        made = GridEngine(grid, worker, concurrent_units=3)
        made.outbox.coalesce_seconds = 3600.0  # it leaves only once every unit waits: no timing in the test
        return made

    flower = Experiment(flower_config(validate(raw)), tmp_path / "flower").run(engine_factory=engine)
    ours, theirs = read_records(local), read_records(flower)
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        assert theirs[key] == pytest.approx(value, abs=ATOL), key
    for served in grid.served.values():
        # base evaluation, then round 0 of fedit and fedprox with lora's personalization, ... in fewer messages
        assert "train.bundle" in served, served
        assert served.count("train") + served.count("train.bundle") < 4
    messages = {key: value for key, value in read_costs(flower).items() if key[:2] == ("engine", "nodes")}
    assert messages[("engine", "nodes", "messages")] < 7  # 1 + 2 + 2 + 1 + 1 + 1 steps one at a time


def test_a_client_that_raises_is_left_out_and_the_run_finishes(tmp_path, monkeypatch, caplog, task_identity):
    from fedpeft.worker import Worker

    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0]])
    raw["data"] = {**raw["data"], "unseen_pool": False}
    cfg = flower_config(validate(raw))
    failing = "lat1-seen-01"
    train = Worker.train

    def flaky_train(self, label, seed, round_, client_id, payload):  # noqa: ANN001, ANN202
        if client_id == failing and round_ == 0:
            raise RuntimeError("disk full")
        return train(self, label, seed, round_, client_id, payload)

    monkeypatch.setattr(Worker, "train", flaky_train)
    grid = InProcessGrid(num_nodes=2)
    progress = RoundLog()
    out = Experiment(cfg, tmp_path / "run", progress).run(engine_factory=lambda worker: GridEngine(grid, worker))

    seen = sorted({key[3] for key in read_records(out) if key[3] is not None})
    assert seen == ["lat1-seen-00", "lat1-seen-01", "lat2-seen-00", "lat2-seen-01"]
    # Round 0 aggregated the three clients that replied, round 1 all four.
    assert [m["clients"] for m in progress.round_metrics] == [3.0, 4.0]
    failures = load_checkpoint(out / "checkpoints" / "fedit" / "seed0.safetensors")["meter"]["failures"]
    assert len(failures) == 1 and failing in failures[0] and "disk full" in failures[0]
    assert any(failing in r.getMessage() and "left out" in r.getMessage() for r in caplog.records)
    # Clients i and i + 2 (sorted ids) share partition i % 2, so each node served half of every step.
    assert all(sorted(types) == sorted(next(iter(grid.served.values()))) for types in grid.served.values())
    assert (out / "summary.md").exists()


def test_a_lost_node_leaves_its_clients_out(tmp_path, task_identity):
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[{"name": "lora", "epochs": 1, "batch_size": 8}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    grid = InProcessGrid(num_nodes=2, lost_after_query={1001})
    out = Experiment(flower_config(validate(raw)), tmp_path / "run").run(
        engine_factory=lambda worker: GridEngine(grid, worker)
    )
    # Partition 1 (node 1001) serves lat1-seen-01, whose every task came back as Flower's error reply.
    assert sorted((key[0], key[3]) for key in read_records(out)) == [("base", "lat1-seen-00"), ("lora", "lat1-seen-00")]
    assert (out / "summary.md").exists()


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


def test_a_restarted_node_takes_its_partition_back(tmp_path, task_identity):
    """A node lost mid-run leaves its clients out of the rounds it misses; restarted (a new node id, the same
    partition) it serves them again from the next step, and the run completes."""
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0] | {"rounds": 5}])
    raw["data"] = {**raw["data"], "unseen_pool": False}
    grid = InProcessGrid(num_nodes=2)
    lose_and_restart(grid)
    progress = RoundLog()
    out = Experiment(flower_config(validate(raw)), tmp_path / "run", progress).run(
        engine_factory=lambda worker: GridEngine(grid, worker)
    )
    # Round 0 with both nodes, rounds 1 and 2 without node 1001's two clients, then all four again on node 1005.
    assert [m["clients"] for m in progress.round_metrics] == [4.0, 2.0, 2.0, 4.0, 4.0]
    assert "train" in grid.served[1005] and "train.personalize" in grid.served[1005]
    fedit = {key[3] for key in read_records(out) if key[0] == "fedit" and key[7] == "test"}
    assert len(fedit) == 4  # every client personalized and evaluated, on the node that serves it at the end


def test_a_round_below_min_clients_stops_the_run(tmp_path, task_identity):
    """Fewer answers than min_clients: the run stops with one sentence and no checkpoint of that round."""
    from fedpeft.core.errors import AllClientsFailedError

    method = tiny_raw()["methods"][0] | {"min_clients": 4}
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[method])
    raw["data"] = {**raw["data"], "unseen_pool": False}
    grid = InProcessGrid(num_nodes=2, lost_after_query={1001})
    with pytest.raises(AllClientsFailedError, match=r"only 2 of 4 sampled clients answered, fewer than min_clients=4"):
        Experiment(flower_config(validate(raw)), tmp_path / "run").run(
            engine_factory=lambda worker: GridEngine(grid, worker)
        )
    assert not (tmp_path / "run" / "checkpoints" / "fedit").exists()
    assert (tmp_path / "run" / "parts" / "base-seed0.jsonl").exists()  # what was done stays: --resume goes on


def test_a_node_that_claims_a_served_partition_is_refused(tmp_path, task_identity):
    """Two nodes that claim one partition stop the run with one sentence; neither is silently preferred."""
    from fedpeft.core.errors import UserError

    raw = tiny_raw(base={"kind": "pretrained"}, methods=[{"name": "lora", "epochs": 1, "batch_size": 8}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    grid = InProcessGrid(num_nodes=3)
    grid.contexts[1002].node_config["partition-id"] = 0  # a third node that claims partition 0 of 3
    with pytest.raises(UserError, match=r"SuperNodes 1000 and 1002 both claim partition-id=0"):
        Experiment(flower_config(validate(raw)), tmp_path / "run").run(
            engine_factory=lambda worker: GridEngine(grid, worker)
        )
    assert all(served == ["query.partition"] for served in grid.served.values())  # no task reached any node
    assert not (tmp_path / "run").exists()


def test_nodes_without_the_base_model_receive_it(tmp_path, task_identity):
    raw = tiny_raw(methods=[{"name": "lora", "epochs": 1, "batch_size": 8}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    node_dirs = [tmp_path / "node0", tmp_path / "node1"]
    grid = InProcessGrid(num_nodes=2, node_dirs=node_dirs)
    out = Experiment(flower_config(validate(raw)), tmp_path / "run").run(
        engine_factory=lambda worker: GridEngine(grid, worker)
    )
    server_base = load_checkpoint(out / "checkpoints" / "base-centralized.safetensors")["tensors"]
    for node_dir, served in zip(node_dirs, grid.served.values(), strict=True):
        node_base = load_checkpoint(node_dir / "checkpoints" / "base-centralized.safetensors")["tensors"]
        assert tensors_digest(node_base) == tensors_digest(server_base)
        assert served.count("query.base") == 2  # asked, then sent
    assert sorted({key[0] for key in read_records(out)}) == ["base", "lora"]


# ---------------------------------------------------------------------------------------------- deployment
@pytest.mark.slow
def test_deployment_on_loopback(tmp_path):
    """A secure deployment on loopback (TLS, SuperNode authentication with registered keys): a SuperLink and two
    SuperNodes, each with its own run directory; the federated round runs as SecAgg+ (its plain form is the same
    task handling the base evaluation and personalization messages use here, and the simulation tests run it), so
    one deployment covers both. A node without a registered key cannot join; a node that claims a served
    partition stops the next run with one sentence and a non-zero status."""
    # Every message starts a ClientApp process on its node (Flower's deployment runtime) that relays to the node's
    # worker process, so the run is short: one client per node, the pretrained base, one round of FedIT. The
    # base-model transfer to nodes that lack it is tested in-process (test_nodes_without_the_base_model_receive_it).
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0] | {"rounds": 1}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    raw["engine"] = {"secagg": {}}  # the round as SecAgg+: each node masks its update, the server sees the sum
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    node_dirs = [tmp_path / f"node{i}" for i in range(2)]  # as on separate machines: each node its own run dir
    worker_dir = Path(tempfile.mkdtemp(prefix="fp"))  # short: a Unix socket's path is limited to ~100 bytes
    node_configs = [
        f"partition-id={i} num-partitions=2 run-dir='{node_dirs[i]}' worker-dir='{worker_dir}'" for i in range(2)
    ]
    fedpeft = str(Path(sys.executable).parent / "fedpeft")
    certs = tmp_path / "certs"
    made = subprocess.run(
        [fedpeft, "certs", str(certs), "--host", "localhost", "--host", "127.0.0.1", "--nodes", "4"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    env = {"OMP_NUM_THREADS": "1"}  # the "machines" share this machine's cores
    with LoopbackDeployment(tmp_path, node_configs, env, certs=certs) as deployment:
        # A node whose key was never registered is turned away by the SuperLink.
        intruder = deployment.start_node(2, "partition-id=0 num-partitions=2", key=certs / "node-3", wait=False)
        assert intruder.wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in deployment.log("supernode2").read_text()

        launch = [fedpeft, "launch", str(config), "--federation", "local-deployment", "--app", str(REPO)]
        launch += ["--out", str(out), "--node-timeout", "60"]
        # A ClientApp process per message (4 per node for the SecAgg+ round) on a loaded machine.
        finished = subprocess.run(launch, cwd=tmp_path, env=deployment.env, capture_output=True, text=True, timeout=900)
        logs = finished.stdout + finished.stderr
        (tmp_path / "flwr-run.log").write_text(logs)
        assert finished.returncode == 0, logs[-4000:]
        assert (out / "summary.md").exists(), logs[-4000:]
        # The server closed the run: each node's worker process has ended and removed its socket.
        deadline = time.monotonic() + 30
        while list(worker_dir.glob("*.sock")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not list(worker_dir.glob("*.sock"))

        # A registered node that claims partition 0, which a node serves already: the next run stops at once.
        deployment.register(certs / "node-4")
        deployment.start_node(3, "partition-id=0 num-partitions=2", key=certs / "node-4")
        refused = subprocess.run(
            [*launch[:-4], "--out", str(tmp_path / "out2"), "--node-timeout", "60"],
            cwd=tmp_path,
            env=deployment.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert refused.returncode == 2, refused.stdout[-3000:]
        last = refused.stdout.strip().splitlines()[-1]
        assert last.startswith("error: SuperNodes") and "both claim partition-id=0" in last, last
        assert "Traceback" not in refused.stdout + refused.stderr

    records = {key: value for key, value in read_records(out).items() if key[7] == "test"}  # evaluations
    train = {key[0] for key in read_records(out) if key[7] == "train"}
    assert train == {"fedit"}  # the secure round's training records (loss, clients, examples)
    clients = ["lat1-seen-00", "lat1-seen-01"]
    assert sorted((key[0], key[3]) for key in records) == [(m, c) for m in ("base", "fedit") for c in clients]
    assert all(0.0 <= value <= 1.0 for value in records.values())
    assert "fedit" in (out / "summary.md").read_text()
    assert "Secure aggregation completed" in logs, logs[-4000:]
    # Each node served its own partition, client i on node i, and kept its state and FedIT's global adapter (the
    # one every client keeps, written once) in its run dir.
    for node_dir in node_dirs:
        assert (node_dir / "adapters" / "fedit" / "global" / "adapter_model.safetensors").is_file()
    # Per node: one message for the base evaluation, one for the personalization (the secure round's messages
    # are the protocol's own), one model load for the whole run, and the seconds split into their parts.
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    nodes: dict[int, dict[str, float]] = {}
    for row in costs:
        if row["method"] == "engine":
            nodes.setdefault(row["node"], {})[row["metric"]] = row["value"]
    assert len(nodes) == 2
    for counters in nodes.values():
        assert counters["messages"] == 2 and counters["model_loads"] == 1
        parts = ("flower_start_seconds", "worker_startup_seconds", "fedpeft_overhead_seconds", "client_work_seconds")
        assert all(counters[part] > 0 for part in parts), counters
        assert counters["message_seconds"] > counters["client_work_seconds"]


@pytest.mark.slow
def test_a_supernode_killed_mid_run_comes_back(tmp_path):
    """A SuperNode killed by its process id mid-run: the rounds go on with the other node's client (after the reply
    timeout), and the node started again takes part from the next step on; the run completes."""
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0] | {"rounds": 6}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    worker_dir = Path(tempfile.mkdtemp(prefix="fp"))
    node_configs = [
        f"partition-id={i} num-partitions=2 run-dir='{tmp_path / f'node{i}'}' worker-dir='{worker_dir}'"
        for i in range(2)
    ]
    checkpoint = out / "checkpoints" / "fedit" / "seed0.safetensors"

    def wait_for_round(done: int, run: subprocess.Popen) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and run.poll() is None:
            with contextlib.suppress(Exception):  # absent, or being replaced
                if load_checkpoint(checkpoint)["state"].round >= done:
                    return
            time.sleep(0.5)
        raise AssertionError(f"round {done} never completed")

    fedpeft = str(Path(sys.executable).parent / "fedpeft")
    with LoopbackDeployment(tmp_path, node_configs, {"OMP_NUM_THREADS": "1"}) as deployment:
        launch = [fedpeft, "launch", str(config), "--federation", "local-deployment", "--app", str(REPO)]
        launch += ["--out", str(out), "--node-timeout", "180", "--reply-timeout", "30"]
        log = open(tmp_path / "launch.log", "w")  # noqa: SIM115  (closed below)
        run = subprocess.Popen(launch, cwd=tmp_path, env=deployment.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_round(1, run)
            deployment.kill("supernode1")  # its SuperNode and ClientApp processes; its worker follows
            wait_for_round(2, run)
            deployment.start_node(1, node_configs[1])
            assert run.wait(timeout=900) == 0, (tmp_path / "launch.log").read_text()[-4000:]
        finally:
            if run.poll() is None:
                run.kill()
            log.close()

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    clients = {r["round"]: r["value"] for r in rows if r["split"] == "train" and r["metric"] == "clients"}
    assert clients[min(clients)] == 2.0 and 1.0 in clients.values() and clients[max(clients)] == 2.0, clients
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    nodes = {row["node"] for row in costs if row["method"] == "engine"}
    assert len(nodes) == 3  # the killed node, the other one, and the killed one started again (a new node id)
    assert {key[3] for key in read_records(out) if key[0] == "fedit" and key[7] == "test"} == {
        "lat1-seen-00",
        "lat1-seen-01",
    }


def test_flower_config_keeps_client_state_on_disk():
    cfg = flower_config(ExperimentConfig())
    assert cfg.engine.name == "flower" and cfg.engine.state == "disk"


@pytest.mark.parametrize("dataset", ["synthetic-fedaya", "synthetic-masakhanews"])
def test_client_side_config_builds_the_servers_data(dataset):
    """Datasets read keys left unset as their own defaults (Fed-Aya's natural partition, MasakhaNEWS' client
    count): the text a ClientApp rebuilds the config from keeps which keys were given, so a node builds the
    server's clients; the fully resolved dump would mark every key as given."""
    from fedpeft.core.config import dump_config, dump_given
    from fedpeft.worker import build_data

    cfg = flower_config(validate({"name": "x", "data": {"name": dataset}, "model": {"name": "tiny-llama"}}))
    server = build_data(cfg)
    given = validate(yaml.safe_load(dump_given(cfg)))
    node = build_data(given)
    assert [c.client_id for c in node.clients] == [c.client_id for c in server.clients]
    assert [len(c.train) for c in node.clients] == [len(c.train) for c in server.clients]
    resolved = validate(yaml.safe_load(dump_config(cfg)))
    assert resolved.data.model_fields_set > given.data.model_fields_set
