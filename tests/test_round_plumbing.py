"""The round loop's plumbing (fedpeft.engine.rounds, fedpeft.engine.phase, fedpeft.engine.operations): the engine's
outcome type and the round tally, the phase that sets the round counter in one place and checkpoints, and the table
of worker operations both engines dispatch through."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import AllClientsFailedError
from fedpeft.core.faults import ClientDroppedError
from fedpeft.core.stores import MemoryStore
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, TrainResult
from fedpeft.engine.flower import client as node
from fedpeft.engine.flower.codec import NodeTask, decode, encode
from fedpeft.engine.flower.messages import EVALUATE_BASE, OPERATIONS
from fedpeft.engine.local import LocalEngine
from fedpeft.engine.operations import SERVER_OPERATIONS, WORKER_OPERATIONS, operation
from fedpeft.engine.phase import AfterRound, FederatedPhase, PhaseCheckpoint
from fedpeft.engine.rounds import ClientOutcome, Engine, RoundTally, SynchronousRounds
from fedpeft.engine.validation import UpdateRejectedError


# ---------------------------------------------------------------------------------------------- outcome and tally
def test_a_training_outcome_carries_the_faults_beside_the_update():
    update = ClientUpdate("c1", {"w": torch.ones(2)}, 3.0, extras={"counts": torch.ones(1)})
    outcome = ClientOutcome.of_training("c1", TrainResult(update, ["slow", "nan"]), 0.5)
    assert outcome.result is update and outcome.seconds == 0.5 and outcome.sum_of is None
    assert outcome.faults == {"c1": "slow,nan"} and set(update.extras) == {"counts"}
    assert ClientOutcome.of_training("c1", TrainResult(update), 0.5).faults == {}
    error = RuntimeError("disk full")
    assert ClientOutcome.of_training("c2", error, 0.1) == ClientOutcome("c2", error, 0.1)


def test_a_worker_reports_its_faults_beside_the_update_through_the_codec():
    result = TrainResult(ClientUpdate("c1", {"w": torch.ones(2)}, 3.0), ["scale"])
    back = decode(encode(result))
    assert type(back) is TrainResult and back.faults == ["scale"] and back.update.extras == {}


def test_the_tally_counts_and_records_what_became_of_each_client():
    meter = CostMeter()
    tally = RoundTally(4, ["a", "b", "c", "d"], meter)
    tally.fail("a", ClientDroppedError("gone"))
    tally.reject(["b"], "tensor 'w' holds non-finite values")
    tally.record_faults({"b": "nan"})
    tally.accept(ClientUpdate("c", {}, 10.0))
    tally.accept(ClientUpdate("d", {}, 2.5))
    assert tally.valid == 2 and tally.weights == [10.0, 2.5] and tally.rejected == ["b"]
    assert len(tally.failures) == 1 and "client a dropped out and was left out" in tally.failures[0]
    assert meter.failures == tally.failures
    metrics = [(e["metric"], e["round"], e.get("client")) for e in meter.events]
    # round 4 counted from 0 is the fifth round: the log line, costs.jsonl and summary.md all say round 5
    assert tally.failures[0].startswith("round 5: client a dropped out")
    assert ("dropped_client", 5, "a") in metrics and ("rejected_update", 5, "b") in metrics
    assert ("injected_fault", 5, "b") in metrics
    tally.check(min_clients=3)  # three answered (a rejected update is an answer)
    with pytest.raises(AllClientsFailedError, match="only 3 of 4"):
        tally.check(min_clients=4)


# ---------------------------------------------------------------------------------------------- the round loop
class _MeanMethod:
    """A stand-in method: the weighted mean of the uploads; its aggregate leaves the round counter alone."""

    name = "mean"
    rounds = 3
    cfg = SimpleNamespace()

    def __init__(self, *, same_state: bool = False) -> None:
        self.same_state = same_state  # return the state it was given (as a method with nothing to change does)
        self.seen: list[list[str]] = []

    def should_stop(self, state: ServerState) -> bool:
        return False

    def sample(self, client_ids: list[str], round_: int, seed: int) -> list[str]:
        return list(reversed(client_ids))

    def payload(self, state: ServerState, client_id: str) -> Payload:
        return Payload(state.tensors)

    def update_spec(self, payload: Payload) -> dict[str, torch.Size]:
        return {key: tensor.shape for key, tensor in payload.tensors.items()}

    def aggregate(self, state: ServerState, updates: Iterable[ClientUpdate]) -> tuple[ServerState, Metrics]:
        received = list(updates)
        self.seen.append([u.client_id for u in received])
        if self.same_state or not received:
            return state, {}
        total = sum(u.weight for u in received)
        mean = sum(u.tensors["w"] * u.weight for u in received) / total
        return dataclasses.replace(state, tensors={"w": mean}), {"train_loss": 1.0}


class _ScriptedEngine(Engine):
    """Yields the outcomes a test scripts per round (a callable of the client, its payload and the round)."""

    def __init__(self, script: Callable[[str, Payload, int], ClientOutcome]) -> None:
        self.script = script

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        for client_id in client_ids:
            yield self.script(client_id, payload_of(client_id), round_)


def _update(client_id: str, value: float, weight: float = 1.0) -> ClientUpdate:
    return ClientUpdate(client_id, {"w": torch.full((2,), value)}, weight)


def test_the_loop_sets_the_round_once_and_records_every_outcome():
    def script(client_id: str, payload: Payload, round_: int) -> ClientOutcome:
        if client_id == "a":
            return ClientOutcome(client_id, RuntimeError("crash"))
        if client_id == "b":
            return ClientOutcome(client_id, UpdateRejectedError("checked on its node"))
        if client_id == "c":
            update = ClientUpdate(client_id, {"w": torch.full((3,), 1.0)}, 1.0)  # a shape the spec refuses
            return ClientOutcome(client_id, update, 0.25, {client_id: "wrong_shape"})
        return ClientOutcome(client_id, _update(client_id, 2.0 * (round_ + 1), 4.0), 0.5, {client_id: "slow"})

    method = _MeanMethod()
    meter = CostMeter()
    metrics: list[Metrics] = []
    start = ServerState(tensors={"w": torch.zeros(2)})
    engine = _ScriptedEngine(script)
    callback = AfterRound(lambda s, r, m: metrics.append(m))
    state = engine.run_rounds("mean", method, start, ["a", "b", "c", "d"], seed=0, meter=meter, callbacks=[callback])
    assert state.round == 3 and start.round == 0  # set by the loop, on a new state object
    assert torch.equal(state.tensors["w"], torch.full((2,), 6.0))
    assert method.seen == [["d"]] * 3  # in client-id order, only the valid update
    assert [m["clients"] for m in metrics] == [1.0] * 3 and [m["examples"] for m in metrics] == [4.0] * 3
    kinds = {(e["metric"], e.get("client"), e.get("kind")) for e in meter.events}
    assert ("injected_fault", "c", "wrong_shape") in kinds and ("injected_fault", "d", "slow") in kinds
    assert {("rejected_update", "b", None), ("rejected_update", "c", None)} <= kinds
    assert len(meter.failures) == 3 and meter.client_rounds == 6  # c and d answered in each round


def test_a_kept_round_still_counts_and_the_previous_state_is_left_untouched():
    method = _MeanMethod(same_state=True)
    start = ServerState(tensors={"w": torch.zeros(2)})
    engine = _ScriptedEngine(lambda c, p, r: ClientOutcome(c, _update(c, 1.0)))
    state = engine.run_rounds("mean", method, start, ["a", "b"], seed=0, meter=CostMeter(), min_updates=3)
    assert state.round == 3 and start.round == 0 and state is not start
    assert torch.equal(state.tensors["w"], torch.zeros(2))


class _Recording:
    """A round callback that gives one record per round and counts the phases it saw end."""

    def __init__(self) -> None:
        self.ended = 0

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> list[Any]:
        return [{"round": round_ + 1, "clients": metrics["clients"], "state_round": state.round}]

    def after_phase(self, state: ServerState) -> None:
        self.ended += 1


def test_the_phase_keeps_the_records_of_its_rounds_in_its_checkpoint_and_resumes_from_it(tmp_path: Path):
    engine = _ScriptedEngine(lambda c, p, r: ClientOutcome(c, _update(c, 1.0 + r), 0.5))
    start = ServerState(tensors={"w": torch.zeros(2)})
    store, path = MemoryStore(), tmp_path / "phase.safetensors"
    store.put("a", {"w": torch.ones(1)}, 0)
    callback = _Recording()
    earlier = [{"round": 0, "budget": 2}]  # a previous phase's of the same unit: kept in front
    phase = FederatedPhase(
        "mean",
        _MeanMethod(),
        ["a", "b"],
        0,
        callbacks=[callback],
        checkpoint=PhaseCheckpoint(path, store),
        state=start,
        records=list(earlier),
    )
    state = phase.run(SynchronousRounds(engine, durations={"a": 2.0, "b": 0.5}))
    assert state.round == 3 and state.clock == 6.0 and callback.ended == 1
    assert phase.records == [*earlier, *({"round": r, "clients": 2.0, "state_round": r} for r in (1, 2, 3))]
    saved = load_checkpoint(path)
    assert saved["round"] == 3 and saved["round_records"] == phase.records and "in_flight" not in saved
    assert saved["meter"] == phase.meter.snapshot() and phase.meter.client_rounds == 6

    # A new phase resumed from the checkpoint has every round done: it runs none and ends with the same state.
    store.put("a", {"w": torch.zeros(1)}, 4)  # written after the checkpoint: the store comes back as saved
    resumed = FederatedPhase("mean", _MeanMethod(), ["a", "b"], 0, checkpoint=PhaseCheckpoint(path, store))
    resumed.resume(saved)
    assert resumed.records == phase.records and resumed.meter == phase.meter and not resumed.running()
    assert torch.equal(resumed.run(SynchronousRounds(engine)).tensors["w"], state.tensors["w"])
    assert torch.equal(store.get("a")["w"], torch.ones(1)) and resumed.state.clock == 6.0


class _SecureEngine(Engine):
    """Yields one round as a secure sum does: one update, the mean of every sampled client's."""

    def train_clients(
        self, label: str, seed: int, round_: int, client_ids: list[str], payload_of: Callable[[str], Payload]
    ) -> Iterator[ClientOutcome]:
        for client_id in client_ids:
            payload_of(client_id)
        seconds = {client_id: float(i + 1) for i, client_id in enumerate(client_ids)}
        update = _update(client_ids[0], 1.0, weight=20.0)
        yield ClientOutcome(client_ids[0], update, 9.0, {client_ids[1]: "slow"}, sum_of=seconds)


def test_a_secure_sum_counts_every_client_it_holds():
    meter = CostMeter()
    method = _MeanMethod()
    method.rounds = 1
    metrics: list[Metrics] = []
    callback = AfterRound(lambda s, r, m: metrics.append(m))
    start = ServerState(tensors={"w": torch.zeros(2)})
    _SecureEngine().run_rounds("mean", method, start, ["a", "b"], seed=0, meter=meter, callbacks=[callback])
    assert metrics[0]["clients"] == 2.0 and metrics[0]["examples"] == 20.0
    assert meter.client_rounds == 2 and meter.client_seconds == 3.0  # each client's own seconds, not the sum's
    assert [e["client"] for e in meter.events if e["metric"] == "injected_fault"] == ["b"]


# ---------------------------------------------------------------------------------------------- worker operations
class _Worker:
    """Records the operations called on it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def op(**kwargs: Any) -> Any:
            self.calls.append((name, kwargs))
            return [{"client": kwargs.get("client_id")}]

        return op


def test_every_operation_a_message_names_is_in_the_table():
    assert set(WORKER_OPERATIONS) - SERVER_OPERATIONS == set(OPERATIONS)
    assert SERVER_OPERATIONS <= set(WORKER_OPERATIONS)
    worker = _Worker()
    for name in OPERATIONS:
        operation(name)(worker, client_id="c0", seed=1)
    assert [call[0] for call in worker.calls] == list(OPERATIONS)
    assert all(call[1] == {"client_id": "c0", "seed": 1} for call in worker.calls)
    worker.calls.clear()
    for name in SERVER_OPERATIONS:  # the server's own work: the worker is not told a client
        operation(name)(worker, client_id=None, seed=1)
    assert sorted(worker.calls) == sorted((name, {"seed": 1}) for name in SERVER_OPERATIONS)


def test_an_operation_outside_the_table_cannot_be_called():
    with pytest.raises(ValueError, match="unknown worker operation '__init__'"):
        operation("__init__")
    engine = LocalEngine(_Worker())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown worker operation 'store'"):
        list(engine.map_clients("store", ["c0"]))


def test_both_engines_dispatch_through_the_table(monkeypatch):
    worker = _Worker()
    results = list(LocalEngine(worker).map_clients("evaluate_base", ["c0", "c1"], seed=3))  # type: ignore[arg-type]
    assert results == [("c0", [{"client": "c0"}]), ("c1", [{"client": "c1"}])]
    workers = node.NodeWorkers()
    monkeypatch.setattr(workers, "worker", lambda run_dir, text, node_config: worker)
    task = NodeTask("evaluate_base", "run", "config", [("c2", {"seed": 3})])
    reply = node._node_task(EVALUATE_BASE, task, {}, workers)
    assert reply.results[0]["value"] == [{"client": "c2"}]
    assert worker.calls[-1] == ("evaluate_base", {"client_id": "c2", "seed": 3})
    with pytest.raises(ValueError, match="cannot run as"):
        node._node_task(EVALUATE_BASE, NodeTask("train", "run", "config", []), {}, workers)
