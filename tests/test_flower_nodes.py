"""Nodes over an in-process grid (ClientApp calls in this process): concurrent methods, failing clients, lost,
restarted and conflicting nodes, the base model sent to nodes that lack it. A SuperNode killed on loopback (a real
SuperLink and SuperNodes), which comes back, is in tests/test_flower_operations.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import pytest
from flower_helpers import (
    ATOL,
    InProcessGrid,
    RoundLog,
    lose_and_restart,
    one_torch_thread,
    read_costs,
    read_records,
    task_identity,
    tiny_raw,
)
from flwr.app import Message

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import validate
from fedpeft.engine.flower import GridEngine, flower_config, tensors_digest
from fedpeft.runner import Experiment
from fedpeft.worker import Worker

__all__ = ["one_torch_thread", "task_identity"]  # fixtures used here


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


def test_concurrent_methods_caps_the_methods_running_beside_the_base_evaluation(tmp_path, task_identity):
    """engine.concurrent_methods = 1: the base model's evaluation runs beside one method, and once it ends the
    next method does not take its place: no message carries the steps of two methods."""
    fedit = tiny_raw()["methods"][0]
    methods = [fedit, fedit | {"label": "second"}, fedit | {"label": "third"}]
    raw = tiny_raw(base={"kind": "pretrained"}, methods=methods, engine={"concurrent_methods": 1})
    raw["data"] = {**raw["data"], "unseen_pool": False}
    grid = QueuedGrid(num_nodes=2)
    groups: list[str] = []
    push = grid.push_messages

    def recording_push(messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        groups.extend(m.metadata.group_id for m in messages)
        return push(messages)

    grid.push_messages = recording_push  # type: ignore[method-assign]
    Experiment(flower_config(validate(raw)), tmp_path / "run").run(
        engine_factory=lambda worker: GridEngine(grid, worker, concurrent_units=2)
    )
    labels = ("fedit-", "second-", "third-")
    steps = [group for group in groups if any(label in group for label in labels)]
    assert {label for label in labels if any(label in group for group in steps)} == set(labels)
    assert all(sum(label in group for label in labels) == 1 for group in steps), steps


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
    raw["validation"] = {"min_result_fraction": 0.5}  # half the clients lose their node: the run still completes
    grid = InProcessGrid(num_nodes=2, lost_after_query={1001})
    out = Experiment(flower_config(validate(raw)), tmp_path / "run").run(
        engine_factory=lambda worker: GridEngine(grid, worker)
    )
    # Partition 1 (node 1001) serves lat1-seen-01, whose every task came back as Flower's error reply.
    assert sorted((key[0], key[3]) for key in read_records(out)) == [("base", "lat1-seen-00"), ("lora", "lat1-seen-00")]
    assert (out / "summary.md").exists()


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
