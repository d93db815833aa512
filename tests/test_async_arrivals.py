"""Asynchronous schedules in arrival order (the Flower engine's clock): the one schedule of
:class:`fedpeft.engine.asynchronous.AsynchronousSchedule` with a fake engine whose replies come in a given order, and
the Flower simulation engine running FedBuff."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from flower_helpers import one_torch_thread, read_records, task_identity, tiny_raw

from fedpeft.core.costs import CostMeter
from fedpeft.core.types import ClientUpdate, Payload, ServerState
from fedpeft.engine.asynchronous import AsynchronousSchedule
from fedpeft.engine.phase import AfterRound, FederatedPhase
from fedpeft.engine.rounds import ClientOutcome, Engine
from fedpeft.engine.validation import UpdateChecks
from fedpeft.settings.schedule import ScheduleConfig

__all__ = ["one_torch_thread", "task_identity"]  # the fixtures apply here


class ReplyOrderEngine(Engine):
    """Replies one submitted client per wait: the oldest, except that ``slow`` answers only after ``lag`` other
    replies; ``failing`` raises."""

    arrival_order = True

    def __init__(self, slow: str, lag: int, failing: str) -> None:
        self.slow, self.lag, self.failing = slow, lag, failing
        self.submitted: list[tuple[str, int, int]] = []  # (client, server step of its state, replies before it)
        self.replies = 0
        self.dispatched: dict[str, list[int]] = {}
        self.drained: list[str] = []

    def arrivals(self, label: str, seed: int) -> ReplyOrderEngine:
        return self

    def reachable(self, client_ids: list[str]) -> list[str]:
        return client_ids

    def close(self) -> None:
        pass

    def submit(self, round_: int, client_id: str, payload: Payload) -> None:
        self.submitted.append((client_id, round_, self.replies))
        self.dispatched.setdefault(client_id, []).append(round_)

    def next_outcomes(self) -> list[ClientOutcome]:
        ready = [s for s in self.submitted if s[0] != self.slow or self.replies - s[2] >= self.lag]
        client_id, round_, _ = ready[0]
        self.submitted.remove(ready[0])
        self.replies += 1
        if client_id == self.failing:
            return [ClientOutcome(client_id, RuntimeError("boom"))]
        update = ClientUpdate(client_id, {"w": torch.full((2,), float(round_))}, 1.0)
        return [ClientOutcome(client_id, update, 0.1)]

    def drain(self) -> None:
        self.drained = [s[0] for s in self.submitted]
        self.submitted = []


class Recording:
    """A method whose server step records its updates' (client, staleness) and counts up the state."""

    cfg = None
    rounds = 6

    def __init__(self) -> None:
        self.steps: list[list[tuple[str, int]]] = []

    def sample(self, client_ids: list[str], round_: int, seed: int) -> list[str]:
        return sorted(client_ids)[:2]

    def payload(self, state: ServerState, client_id: str) -> Payload:
        return Payload({"w": state.tensors["w"].clone()})

    def should_stop(self, state: ServerState) -> bool:
        return False

    def update_spec(self, payload: Payload) -> Any:
        return None

    def aggregate(self, state: ServerState, updates: Any) -> tuple[ServerState, dict[str, float]]:
        buffer = list(updates)
        self.steps.append([(u.client_id, u.staleness) for u in buffer])
        return ServerState({"w": state.tensors["w"] + 1}, state.round), {"train_loss": 0.0}


def asynchronous_phase(method: Any, **options: Any) -> FederatedPhase:
    """A phase of ``method`` over clients c0..c5 from a zero state (``options``: meter, callbacks, in_flight)."""
    clients = [f"c{i}" for i in range(6)]
    return FederatedPhase(
        "buff", method, clients, 0, UpdateChecks(), state=ServerState({"w": torch.zeros(2)}), **options
    )


def run_phase(engine: Engine, method: Any, schedule: ScheduleConfig, **options: Any) -> ServerState:
    """The asynchronous phase of ``method`` under ``schedule`` (:func:`asynchronous_phase`)."""
    return asynchronous_phase(method, **options).run(AsynchronousSchedule(engine, schedule, {}))


def test_the_arrival_order_loop_counts_staleness_steps_every_k_and_records_failures():
    engine = ReplyOrderEngine(slow="c0", lag=5, failing="c3")
    method = Recording()
    meter = CostMeter()
    metrics: list[dict[str, float]] = []
    seen: list[list[str]] = []
    schedule = ScheduleConfig(kind="fedbuff", concurrency=3, buffer_size=2)
    phase = asynchronous_phase(method, meter=meter)
    phase.callbacks = [AfterRound(lambda _s, _r, m: (metrics.append(m), seen.append(list(phase.in_flight))))]
    state = phase.run(AsynchronousSchedule(engine, schedule, {}))
    assert state.round == 6 and len(method.steps) == 6 and all(len(step) == 2 for step in method.steps)
    assert [m["clients"] for m in metrics] == [2.0] * 6
    assert all("virtual_time" not in m for m in metrics)  # arrival order measures no virtual time
    assert state.clock == 0.0
    # Each update's staleness is the server steps between its dispatch and its arrival: the slow client's state
    # came from an earlier step than the server is at when it arrives.
    applied = [entry for step in method.steps for entry in step]
    steps_at = [i for i, step in enumerate(method.steps) for _ in step]
    dispatch_of = {c: list(rounds) for c, rounds in engine.dispatched.items()}
    for (client_id, staleness), step in zip(applied, steps_at, strict=True):
        assert staleness == step - dispatch_of[client_id].pop(0), client_id
        if client_id == "c3":
            pytest.fail("the failing client's update was aggregated")
    assert any(c == "c0" and u > 0 for c, u in applied)  # the slow client arrived stale
    assert any("c3" in f and "boom" in f for f in meter.failures)
    # The checkpoint's list of clients in flight after each step (C = 3, one just arrived); the phase ends by
    # draining those left.
    assert all(len(f) == 2 for f in seen) and sorted(engine.drained) == sorted(seen[-1])


def test_a_resume_sends_the_listed_clients_in_flight_first():
    engine = ReplyOrderEngine(slow="none", lag=0, failing="none")
    method = Recording()
    method.rounds = 1
    schedule = ScheduleConfig(kind="fedbuff", concurrency=2, buffer_size=2)
    run_phase(engine, method, schedule, in_flight=["c4", "c5", "gone"])
    assert sorted(c for c, _ in method.steps[0]) == ["c4", "c5"]
    assert list(engine.dispatched)[:2] == ["c4", "c5"]  # C = 2: the listed clients fill the slots


def test_a_resume_fills_the_slots_left_beside_the_listed_clients():
    engine = ReplyOrderEngine(slow="none", lag=0, failing="none")
    method = Recording()
    method.rounds = 1
    schedule = ScheduleConfig(kind="fedbuff", concurrency=3, buffer_size=3)
    run_phase(engine, method, schedule, in_flight=["c5"])
    first = list(engine.dispatched)[:3]
    assert first[0] == "c5" and len(set(first)) == 3 and len(method.steps[0]) == 3


def test_refusing_secure_aggregation_with_an_asynchronous_schedule_is_one_sentence(tmp_path, monkeypatch, capsys):
    from test_bad_input_config import refused

    args = ["run", "smoke", "--out", str(tmp_path / "run"), "--engine", "flower"]
    args += ["--set", "methods=[{name: fedit, schedule: {kind: fedbuff}}]", "--set", "engine.secagg={}"]
    message = refused(monkeypatch, capsys, tmp_path, args)
    assert message.startswith("error: Secure aggregation needs a cohort of updates") and message.count(". ") == 0


@pytest.mark.slow
def test_fedbuff_on_the_flower_simulation_engine_reaches_its_server_steps(tmp_path):
    from fedpeft.apps.flower import run_flower_simulation
    from fedpeft.core.config import validate

    method = {
        **tiny_raw()["methods"][0],
        "rounds": 3,
        "schedule": {"kind": "fedbuff", "concurrency": 2, "buffer_size": 2},
    }
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[method])
    raw["data"] = {**raw["data"], "unseen_pool": False}
    run_flower_simulation(validate(raw), tmp_path / "flower")
    rows = [json.loads(line) for line in (tmp_path / "flower" / "results.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["method"] == "fedit" and r["split"] == "train"]
    assert sorted({r["round"] for r in train}) == [1, 2, 3]
    assert [r["value"] for r in sorted(train, key=lambda r: r["round"]) if r["metric"] == "clients"] == [2.0] * 3
    staleness = [r["value"] for r in train if r["metric"] == "staleness"]
    assert len(staleness) == 3 and all(u >= 0 for u in staleness)


def test_a_lost_node_s_clients_fail_and_the_asynchronous_run_goes_on(tmp_path, task_identity):
    """Through Flower messages (an in-process grid): node 1001 answers only queries and then dies (Flower still
    lists it, with a heartbeat never renewed), so each of its clients fails as its message comes back "node
    unavailable" and is not drawn again while no node serves it; the others' updates make the server steps."""
    from flower_helpers import InProcessGrid
    from flwr.proto.node_pb2 import NodeInfo

    class DeadNodeGrid(InProcessGrid):
        def get_nodes(self) -> list[NodeInfo]:
            return [NodeInfo(node_id=n, online_until=1e9 if n in self.lost else 0.0) for n in self.contexts]

    from fedpeft.core.config import validate
    from fedpeft.engine.flower.grid import GridEngine, flower_config
    from fedpeft.runner import Experiment

    method = {
        **tiny_raw()["methods"][0],
        "rounds": 3,
        "schedule": {"kind": "fedbuff", "concurrency": 3, "buffer_size": 1},
    }
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[method])
    raw["data"] = {**raw["data"], "unseen_pool": False}
    raw["validation"] = {"min_result_fraction": 0.4}  # the lost node's clients have no evaluations either
    grid = DeadNodeGrid(num_nodes=2, lost_after_query={1001})
    engine_factory = lambda worker: GridEngine(grid, worker)  # noqa: E731
    out = Experiment(flower_config(validate(raw)), tmp_path / "grid").run(engine_factory=engine_factory)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["method"] == "fedit" and r["split"] == "train" and r["metric"] == "clients"]
    assert sorted(r["round"] for r in train) == [1, 2, 3] and all(r["value"] == 1.0 for r in train)
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    failed = [c["client"] for c in costs if c.get("metric") == "failed_client" and c["phase"] == "federated"]
    assert failed and set(failed) <= {"lat1-seen-01", "lat2-seen-01"}, failed  # the clients of partition 1
    # Once its node is lost, a client is not drawn again: each of them fails once at most, in the first draw.
    assert len(failed) == len(set(failed)), failed


def grid_run(raw: dict, out: Path) -> tuple[Path, Any]:
    """``raw`` run on the Flower engine over an in-process grid of two nodes, with the methods at once as
    ``engine.concurrent_methods`` says; returns the run directory and the grid."""
    from flower_helpers import InProcessGrid

    from fedpeft.core.config import validate
    from fedpeft.engine.flower.grid import GridEngine, flower_config
    from fedpeft.runner import Experiment

    cfg = flower_config(validate(raw))
    units = (cfg.engine.concurrent_methods or 0) + 1
    grid = InProcessGrid(num_nodes=2)
    run_dir = Experiment(cfg, out).run(engine_factory=lambda worker: GridEngine(grid, worker, concurrent_units=units))
    return run_dir, grid


def test_asynchronous_phases_at_once_on_flower_keep_their_replies_apart_and_their_numbers(tmp_path, task_identity):
    """Two asynchronous phases and a synchronous one at once (``engine.concurrent_methods``) over Flower messages:
    the same clients train for both asynchronous methods at the same time, and each reply reaches its own phase.
    On an in-process grid every reply comes at once, so the order of arrivals is fixed and each method's records
    are those of the method run alone; the phases' messages to a node leave bundled."""
    fedit = tiny_raw()["methods"][0]
    methods = [
        fedit | {"label": "buff", "rounds": 3, "schedule": {"kind": "fedbuff", "concurrency": 3, "buffer_size": 2}},
        fedit | {"label": "mix", "rounds": 3, "lr": 2e-3, "schedule": {"kind": "fedasync", "concurrency": 2}},
        fedit | {"label": "sync"},
    ]
    raw = tiny_raw(base={"kind": "pretrained"}, methods=methods)
    raw["data"] = {**raw["data"], "unseen_pool": False}
    together, grid = grid_run(raw | {"engine": {"concurrent_methods": 3}}, tmp_path / "together")
    assert any("train.bundle" in served for served in grid.served.values()), grid.served
    records = read_records(together)

    def of(label: str, found: dict[tuple, float]) -> dict[tuple, float]:
        # A synchronous method keeps a virtual clock only beside an asynchronous one.
        return {k: v for k, v in found.items() if k[0] == label and k[8] != "virtual_time"}

    for method in methods:
        alone, _ = grid_run(raw | {"methods": [method]}, tmp_path / method["label"])
        expected = of(method["label"], read_records(alone))
        assert expected and of(method["label"], records) == expected, method["label"]
    steps = {(k[0], k[6]) for k in records if k[7] == "train" and k[8] == "staleness"}
    assert steps == {(label, step) for label in ("buff", "mix") for step in (1, 2, 3)}


class EchoGrid:
    """A grid whose node answers a train message with each client's update ``{"w": [the payload's marker]}``,
    and gives back one reply per pull, the oldest first (so that replies for several phases are in flight)."""

    def __init__(self) -> None:
        self._replies: list[tuple[str, Any]] = []
        self._sent = 0

    def get_node_ids(self) -> list[int]:
        return [7]

    def push_messages(self, messages: Any) -> list[str]:
        from flwr.app import Message

        from fedpeft.core.types import TrainResult
        from fedpeft.engine.flower.codec import NodeResult, NodeTask

        ids = []
        for message in messages:
            task = NodeTask.from_content(message.content)
            results = []
            for client_id, step in task.clients:
                update = ClientUpdate(client_id, {"w": step["payload"].tensors["w"].clone()}, 1.0)
                results.append({"client": client_id, "value": TrainResult(update), "seconds": 0.0})
            # Unique for the grid's life, as a SuperLink's are (an id() of a message freed since can come back).
            self._sent += 1
            message_id = f"m{self._sent}"
            message.metadata.__dict__["_message_id"] = message_id
            self._replies.append((message_id, Message(NodeResult(results).to_content(), reply_to=message)))
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Any) -> list[Any]:
        wanted = set(message_ids)
        for position, (message_id, reply) in enumerate(self._replies):
            if message_id in wanted:
                del self._replies[position]
                return [reply]
        return []


def test_each_asynchronous_phase_on_the_flower_engine_gets_its_own_replies(task_identity):
    """Two phases at once send the same client: a pull that takes in the other phase's reply leaves it to that
    phase, and each phase's outcome is the update of the payload it sent."""
    from types import SimpleNamespace

    from fedpeft.core.config import validate
    from fedpeft.engine.flower.grid import GridEngine, flower_config

    cfg = flower_config(validate(tiny_raw(base={"kind": "pretrained"})))
    worker = SimpleNamespace(cfg=cfg, run_dir=".", data=SimpleNamespace(clients=[SimpleNamespace(client_id="c0")]))
    engine = GridEngine(EchoGrid(), worker, sites={"c0": 7}, poll_interval=0.0)  # type: ignore[arg-type]
    first, second = engine.arrivals("a", 0), engine.arrivals("b", 0)
    first.submit(0, "c0", Payload({"w": torch.tensor([1.0])}))
    second.submit(0, "c0", Payload({"w": torch.tensor([2.0])}))
    later = second.next_outcomes()  # the first reply to come is the first phase's: the second waits for its own
    earlier = first.next_outcomes()
    assert [o.client_id for o in earlier] == [o.client_id for o in later] == ["c0"]
    assert earlier[0].result.tensors["w"].item() == 1.0 and later[0].result.tensors["w"].item() == 2.0
    assert first.reachable(["c0"]) == ["c0"]
