"""Asynchronous schedules in arrival order (the Flower engine's clock): the one loop of
:func:`fedpeft.engine.asynchronous.run_asynchronous` with a fake engine whose replies come in a given order, and
the Flower simulation engine running FedBuff."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from flower_helpers import one_torch_thread, task_identity, tiny_raw

from fedpeft.core.costs import CostMeter
from fedpeft.core.types import ClientUpdate, Payload, ServerState
from fedpeft.engine.asynchronous import run_asynchronous
from fedpeft.engine.rounds import AfterRound, ClientOutcome, Engine
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

    def submit(self, label: str, seed: int, round_: int, client_id: str, payload: Payload) -> None:
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


def run_phase(engine: Engine, method: Any, schedule: ScheduleConfig, **options: Any) -> ServerState:
    """``run_asynchronous`` of ``method`` over clients c0..c5 from a zero state (``options``: meter, callbacks,
    in_flight)."""
    defaults: dict[str, Any] = {"meter": CostMeter(), "callbacks": [], "in_flight": None}
    return run_asynchronous(
        engine,
        "buff",
        method,
        ServerState({"w": torch.zeros(2)}),
        [f"c{i}" for i in range(6)],
        schedule=schedule,
        durations={},
        seed=0,
        checks=UpdateChecks(),
        **(defaults | options),
    )


def test_the_arrival_order_loop_counts_staleness_steps_every_k_and_records_failures():
    engine = ReplyOrderEngine(slow="c0", lag=5, failing="c3")
    method = Recording()
    meter = CostMeter()
    metrics: list[dict[str, float]] = []
    flying: list[str] = []
    seen: list[list[str]] = []
    schedule = ScheduleConfig(kind="fedbuff", concurrency=3, buffer_size=2)
    callbacks = [AfterRound(lambda _s, _r, m: (metrics.append(m), seen.append(list(flying))))]
    state = run_phase(engine, method, schedule, meter=meter, callbacks=callbacks, in_flight=flying)
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
    """Through Flower messages (an in-process grid): node 1001 answers only queries, so each of its clients fails
    as its message comes back "node unavailable" (then at once: its partition has no node); the others' updates
    make the server steps."""
    from flower_helpers import InProcessGrid

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
    grid = InProcessGrid(num_nodes=2, lost_after_query={1001})
    engine_factory = lambda worker: GridEngine(grid, worker)  # noqa: E731
    out = Experiment(flower_config(validate(raw)), tmp_path / "grid").run(engine_factory=engine_factory)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["method"] == "fedit" and r["split"] == "train" and r["metric"] == "clients"]
    assert sorted(r["round"] for r in train) == [1, 2, 3] and all(r["value"] == 1.0 for r in train)
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    failed = {c["client"] for c in costs if c.get("metric") == "failed_client"}
    assert failed and failed <= {"lat1-seen-01", "lat2-seen-01"}, failed  # the clients of partition 1
