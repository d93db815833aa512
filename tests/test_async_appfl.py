"""The asynchronous server step against APPFL's FedBuff and FedAsync aggregators, choice by choice
(docs/async.md): the client weights (``client_weights``: fedpeft's over the step's updates, APPFL's 1/N and sample
sizes over the federation), the difference an update brings (``delta_from``: from the current global state, or,
as APPFL's clients sending gradients, from the state the client trained from) and the rate (``server_lr``: APPFL's
0.9). Each expected value is APPFL's formula written out here; the replay at the end runs the asynchronous loop
against APPFL's aggregator followed arrival by arrival."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from test_bad_input_config import refused

from fedpeft.core.config import load_config
from fedpeft.core.errors import UserError
from fedpeft.core.types import ClientUpdate, Payload, ServerState, StateDict
from fedpeft.engine.asynchronous import AsynchronousSchedule, client_shares
from fedpeft.engine.phase import FederatedPhase
from fedpeft.engine.rounds import ClientOutcome, Engine
from fedpeft.engine.validation import UpdateChecks
from fedpeft.merging.server_step import WeightedMean
from fedpeft.merging.staleness import StalenessMixing, rebase
from fedpeft.runner import Experiment
from fedpeft.settings.schedule import ScheduleConfig

SIZES = {f"c{i}": 2 + 3 * i for i in range(10)}  # the federation: 10 clients and their training examples
N = len(SIZES)


def _random(seed: int, dtype: torch.dtype = torch.float32) -> StateDict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(4, 3, generator=generator, dtype=dtype),
        "b": torch.randn(5, generator=generator, dtype=dtype),
    }


def _buffer(staleness: list[int], share: str | None = None) -> tuple[ServerState, list[ClientUpdate]]:
    """The global state and a buffer of updates from clients c0, c1, ... (their sizes as weights), each with its
    staleness and, for APPFL's client weights, the share the server gives it."""
    state = ServerState(_random(100))
    updates = []
    for k, u in enumerate(staleness):
        client = f"c{k}"
        weight = 1.0 / N if share == "equal" else SIZES[client] / sum(SIZES.values()) if share else None
        updates.append(ClientUpdate(client, _random(k), float(SIZES[client]), staleness=u, share=weight))
    return state, updates


def _assert_close(result: StateDict, expected: StateDict, tolerance: float = 1e-6) -> None:
    assert result.keys() == expected.keys()
    for key, tensor in expected.items():
        torch.testing.assert_close(result[key], tensor, atol=tolerance, rtol=tolerance)


# ---------------------------------------------------------------------------------------------- one server step
@pytest.mark.parametrize("kind", ["fedbuff", "fedasync"])
def test_equal_client_weights_are_appfls_one_over_the_federation(kind):
    """APPFL, ``client_weights_mode: equal``: alpha_t = alpha s(u) / num_clients per update, step = sum_k
    alpha_t (x_k - g), applied once K are buffered (K = 1 under FedAsync)."""
    schedule = ScheduleConfig(kind=kind, client_weights="equal", staleness="polynomial", server_lr=0.9)
    state, updates = _buffer([0, 2, 5] if kind == "fedbuff" else [3], share="equal")
    result = StalenessMixing(WeightedMean(), schedule)(state, iter(updates))
    expected = {}
    for key, g in state.tensors.items():
        step = torch.zeros_like(g)
        for u in updates:
            alpha_t = 0.9 * (u.staleness + 1) ** -0.5 * (1.0 / N)
            step += alpha_t * (u.tensors[key] - g)
        expected[key] = g + step
    _assert_close(result.tensors, expected)


@pytest.mark.parametrize("kind", ["fedbuff", "fedasync"])
def test_sample_size_client_weights_are_appfls_over_the_whole_federation(kind):
    """APPFL, ``client_weights_mode: sample_size``: weight = n_k / sum of every client's sample size (all N, not
    the buffer's), alpha_t = alpha s(u) weight."""
    schedule = ScheduleConfig(kind=kind, client_weights="sample_size", staleness="hinge", staleness_a=2.0)
    state, updates = _buffer([0, 6, 1, 9] if kind == "fedbuff" else [7], share="sample_size")
    result = StalenessMixing(WeightedMean(), schedule)(state, iter(updates))
    alpha = 1.0 if kind == "fedbuff" else 0.9  # fedpeft's default rates: FedBuff 1, FedAsync APPFL's 0.9
    total = sum(SIZES.values())
    expected = {}
    for key, g in state.tensors.items():
        step = torch.zeros_like(g)
        for u in updates:
            s = 1.0 if u.staleness <= 4 else 1.0 / (2.0 * (u.staleness - 4) + 1.0)
            step += alpha * s * (SIZES[u.client_id] / total) * (u.tensors[key] - g)
        expected[key] = g + step
    _assert_close(result.tensors, expected)


@pytest.mark.parametrize("client_weights", ["buffer", "equal"])
@pytest.mark.parametrize("kind", ["fedbuff", "fedasync"])
def test_differences_from_the_state_each_client_started_from_are_appfls_gradients(kind, client_weights):
    """APPFL with ``send_gradient: True``: the client sends gradient = start - x, and the step adds
    alpha_t (-gradient), alpha_t = alpha s(u) w; fedpeft moves each update onto the current state (``rebase``)."""
    schedule = ScheduleConfig(kind=kind, client_weights=client_weights, delta_from="start", server_lr=0.9)
    state, updates = _buffer(
        [2, 0, 4] if kind == "fedbuff" else [3], share=None if client_weights == "buffer" else "equal"
    )
    starts = [_random(50 + k) if u.staleness else state.tensors for k, u in enumerate(updates)]
    moved = [
        dataclasses.replace(u, tensors=rebase(u.tensors, start, state.tensors))
        for u, start in zip(updates, starts, strict=True)
    ]
    result = StalenessMixing(WeightedMean(), schedule)(state, iter(moved))
    in_buffer = sum(u.weight for u in updates)
    expected = {}
    for key, g in state.tensors.items():
        step = torch.zeros_like(g)
        for u, start in zip(updates, starts, strict=True):
            gradient = start[key] - u.tensors[key]
            if client_weights == "equal":
                weight = 1.0 / N
            else:
                weight = u.weight / in_buffer if kind == "fedbuff" else 1.0
            step += 0.9 * weight * (-gradient)  # constant staleness function
        expected[key] = g + step
    _assert_close(result.tensors, expected)


def test_appfls_example_fedbuff_config_in_one_step():
    """APPFL's examples/resources/configs/mnist/server_fedbuff.yaml: FedBuffAggregator, equal client weights,
    polynomial staleness with a = 0.5, alpha 0.9, K = 3, clients sending gradients."""
    schedule = ScheduleConfig(
        kind="fedbuff",
        buffer_size=3,
        staleness="polynomial",
        staleness_a=0.5,
        server_lr=0.9,
        client_weights="equal",
        delta_from="start",
    )
    state, updates = _buffer([1, 0, 3], share="equal")
    starts = [_random(70 + k) for k in range(3)]
    moved = [
        dataclasses.replace(u, tensors=rebase(u.tensors, s, state.tensors))
        for u, s in zip(updates, starts, strict=True)
    ]
    result = StalenessMixing(WeightedMean(), schedule)(state, iter(moved))
    expected = {
        key: g
        + sum(
            0.9 * (u.staleness + 1) ** -0.5 / N * (u.tensors[key] - s[key])
            for u, s in zip(updates, starts, strict=True)
        )
        for key, g in state.tensors.items()
    }
    _assert_close(result.tensors, expected)


def test_rebase_moves_floating_tensors_it_can_and_leaves_the_rest():
    x = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([3, 4]), "new": torch.tensor([5.0]), "r": torch.ones(2)}
    start = {"w": torch.tensor([0.5, 0.5]), "n": torch.tensor([1, 1]), "r": torch.ones(3)}
    now = {"w": torch.tensor([2.0, -1.0]), "n": torch.tensor([9, 9]), "r": torch.zeros(3)}
    moved = rebase(x, start, now)
    assert torch.equal(moved["w"], torch.tensor([2.5, 0.5]))  # x - start kept, now from now
    assert moved["n"] is x["n"] and moved["new"] is x["new"] and moved["r"] is x["r"]


def test_client_shares_are_one_over_n_or_sample_sizes_over_the_federation():
    ids = sorted(SIZES)
    assert client_shares("m", ScheduleConfig(kind="fedbuff"), ids, SIZES) is None
    equal = client_shares("m", ScheduleConfig(kind="fedbuff", client_weights="equal"), ids, {})
    assert equal == {c: 1.0 / N for c in ids}
    sizes = client_shares("m", ScheduleConfig(kind="fedasync", client_weights="sample_size"), ids, SIZES)
    assert sizes is not None and sizes["c3"] == 11 / sum(SIZES.values())
    with pytest.raises(UserError, match="training-set size of client 'c1' is unknown to the server"):
        client_shares("m", ScheduleConfig(kind="fedbuff", client_weights="sample_size"), ids, {"c0": 2})


def test_a_step_with_appfls_client_weights_needs_the_shares():
    state, updates = _buffer([0, 1])
    with pytest.raises(ValueError, match="did not set on c0's"):
        StalenessMixing(WeightedMean(), ScheduleConfig(kind="fedbuff", client_weights="equal"))(state, updates)


# ---------------------------------------------------------------------------------------------- the loop, replayed
def _training(client_id: str, times: int) -> StateDict:
    """What client ``client_id`` adds to the state it got, the ``times``-th time it trains."""
    return {k: 0.1 * v for k, v in _random(1000 * int(client_id[1:]) + times, torch.float64).items()}


class Replies(Engine):
    """Answers one submitted client per wait, the oldest, except that ``slow`` answers only after ``lag`` other
    replies (``together``: every submitted client at once, in client-id order); a reply is the state the client
    was sent plus its :func:`_training`. ``events`` logs each send and reply in order."""

    arrival_order = True

    def __init__(self, slow: str = "", lag: int = 0, together: bool = False) -> None:
        self.slow, self.lag, self.together = slow, lag, together
        self.pending: list[tuple[str, StateDict, int]] = []
        self.replies = 0
        self.trained: Counter[str] = Counter()
        self.events: list[tuple[str, str]] = []

    def arrivals(self, label: str, seed: int) -> Replies:
        return self

    def reachable(self, client_ids: list[str]) -> list[str]:
        return client_ids

    def close(self) -> None:
        pass

    def submit(self, round_: int, client_id: str, payload: Payload) -> None:
        self.pending.append((client_id, dict(payload.tensors), self.replies))
        self.events.append(("send", client_id))

    def next_outcomes(self) -> list[ClientOutcome]:
        ready = [p for p in self.pending if p[0] != self.slow or self.replies - p[2] >= self.lag]
        answering = sorted(ready) if self.together else ready[:1]
        outcomes = []
        for entry in answering:
            self.pending.remove(entry)
            client_id, sent, _ = entry
            self.replies += 1
            training = _training(client_id, self.trained[client_id])
            self.trained[client_id] += 1
            self.events.append(("reply", client_id))
            trained = {k: v + training[k] for k, v in sent.items()}
            outcomes.append(ClientOutcome(client_id, ClientUpdate(client_id, trained, float(SIZES[client_id])), 0.1))
        return outcomes

    def drain(self) -> None:
        self.pending = []


class Mixing:
    """A method whose server step is fedpeft's asynchronous step around the weighted mean."""

    cfg = None
    rounds = 8

    def __init__(self, schedule: ScheduleConfig) -> None:
        self.schedule = schedule

    def sample(self, client_ids: list[str], round_: int, seed: int) -> list[str]:
        return sorted(client_ids)[:3]

    def payload(self, state: ServerState, client_id: str) -> Payload:
        return Payload(dict(state.tensors))

    def should_stop(self, state: ServerState) -> bool:
        return False

    def update_spec(self, payload: Payload) -> Any:
        return {key: tensor.shape for key, tensor in payload.tensors.items()}

    def aggregate(self, state: ServerState, updates: Any) -> tuple[ServerState, dict[str, float]]:
        result = StalenessMixing(WeightedMean(), self.schedule)(state, updates)
        return dataclasses.replace(state, tensors=result.tensors), dict(result.metrics)


def _appfl(events: list[tuple[str, str]], initial: StateDict, schedule: ScheduleConfig, k: int, rounds: int) -> Any:
    """APPFL's aggregator followed through ``events``: a client sent the model gets the global state and the
    global step (``client_step``); on its reply alpha_t = alpha s(global_step - client_step) w, and the step adds
    alpha_t (x - g) (models sent) or alpha_t (-gradient), gradient = start - x (``send_gradient``); the global
    state takes the summed step every K replies (K = 1: FedAsync). fedpeft's ``buffer`` weights, n_k over the
    buffer's examples (1 under FedAsync), in place of w for that choice. Returns the state after ``rounds`` steps
    and the staleness of every reply."""
    g = {key: tensor.clone() for key, tensor in initial.items()}
    global_step, client_step, start, trained = 0, {}, {}, Counter()
    buffered: list[tuple[str, float, StateDict]] = []  # (client, s(u), its difference)
    seen = []
    for kind, client in events:
        if global_step == rounds:
            break
        if kind == "send":
            start[client], client_step[client] = {key: t.clone() for key, t in g.items()}, global_step
            continue
        training = _training(client, trained[client])
        trained[client] += 1
        x = {key: start[client][key] + training[key] for key in g}
        staleness = global_step - client_step[client]
        seen.append(staleness)
        if schedule.delta_from == "start":
            gradient = {key: start[client][key] - x[key] for key in g}
            delta = {key: -gradient[key] for key in g}
        else:
            delta = {key: x[key] - g[key] for key in g}
        buffered.append((client, schedule.weight(staleness), delta))
        if len(buffered) < k:
            continue
        in_buffer = sum(SIZES[c] for c, _, _ in buffered)
        for c, s, d in buffered:
            if schedule.client_weights == "equal":
                w = 1.0 / N
            elif schedule.client_weights == "sample_size":
                w = SIZES[c] / sum(SIZES.values())
            else:
                w = SIZES[c] / in_buffer
            for key in g:
                g[key] = g[key] + schedule.mixing * s * w * d[key]
        buffered, global_step = [], global_step + 1
    return g, seen


@pytest.mark.parametrize("delta_from", ["global", "start"])
@pytest.mark.parametrize("client_weights", ["buffer", "equal", "sample_size"])
@pytest.mark.parametrize(
    "settings",
    [
        {"kind": "fedbuff", "concurrency": 3, "buffer_size": 2, "staleness": "polynomial", "server_lr": 0.9},
        {"kind": "fedasync", "concurrency": 3, "staleness": "hinge", "staleness_a": 2.0, "staleness_b": 1.0},
    ],
)
def test_the_asynchronous_loop_follows_appfls_aggregator_arrival_by_arrival(settings, client_weights, delta_from):
    schedule = ScheduleConfig(**settings, client_weights=client_weights, delta_from=delta_from)
    engine = Replies(slow="c0", lag=4)
    initial = _random(7, torch.float64)
    phase = FederatedPhase(
        "appfl", Mixing(schedule), sorted(SIZES), 0, UpdateChecks(SIZES), state=ServerState(dict(initial))
    )
    state = phase.run(AsynchronousSchedule(engine, schedule, {}))
    k = settings.get("buffer_size", 1)
    expected, staleness = _appfl(engine.events, initial, schedule, k, Mixing.rounds)
    assert state.round == Mixing.rounds and max(staleness) >= 2  # the slow client's updates arrive stale
    _assert_close(state.tensors, expected, 1e-12)


def test_differences_from_the_start_change_nothing_when_every_update_is_fresh():
    """With K = C = the clients of a round arriving together, every update is fresh: ``delta_from: start`` gives
    fedpeft's default step bit for bit."""
    finals = []
    for delta_from in ("global", "start"):
        schedule = ScheduleConfig(kind="fedbuff", delta_from=delta_from)
        start = ServerState(_random(7, torch.float64))
        phase = FederatedPhase("fresh", Mixing(schedule), sorted(SIZES), 0, UpdateChecks(SIZES), state=start)
        state = phase.run(AsynchronousSchedule(Replies(together=True), schedule, {}))
        finals.append(state.tensors)
    assert not torch.equal(finals[0]["w"], _random(7, torch.float64)["w"])
    assert all(torch.equal(finals[0][key], finals[1][key]) for key in finals[0])


# ---------------------------------------------------------------------------------------------- settings and runs
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kind": "sync", "client_weights": "equal"}, "client_weights apply to an asynchronous schedule"),
        ({"delta_from": "start"}, "delta_from apply to an asynchronous schedule"),
        ({"kind": "fedbuff", "client_weights": "examples"}, "'buffer', 'equal' or 'sample_size'"),
        ({"kind": "fedasync", "delta_from": "gradient"}, "'global' or 'start'"),
    ],
)
def test_appfl_choices_a_schedule_cannot_take_are_refused(settings, message):
    with pytest.raises(ValidationError, match=message):
        ScheduleConfig(**settings)


DATA = ["data.groups=[lat1, lat3]", "data.train_per_group=40", "data.test_per_group=20", "data.base_samples=200"]


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("{client_weights: equal}", "client_weights apply to an asynchronous schedule; set kind: fedbuff or fedasync"),
        ("{kind: fedbuff, delta_from: gradient}", "'global' or 'start'"),
    ],
)
def test_an_impossible_appfl_choice_is_one_sentence_and_exit_2(schedule, message, tmp_path, monkeypatch, capsys):
    args = ["run", "smoke", "--out", str(tmp_path / "run")]
    for item in [*DATA, f"methods=[{{name: fedit, schedule: {schedule}}}]"]:
        args += ["--set", item]
    assert message in refused(monkeypatch, capsys, tmp_path, args)


def test_a_run_takes_appfls_choices_and_its_defaults_stay_fedpefts(tmp_path):
    """Two runs, the same methods by label (so the same clients are dispatched, with the same speeds): fedpeft's
    choices left out or written out give the same records, and APPFL's change them."""
    fedit = {"name": "fedit", "rounds": 4, "fraction": 0.5, "local_steps": 2, "lr": 0.005}
    base = {"kind": "fedbuff", "concurrency": 3, "buffer_size": 2, "server_lr": 0.9, "staleness": "polynomial"}
    fedpefts = {"client_weights": "buffer", "delta_from": "global"}
    appfls = {"client_weights": "equal", "delta_from": "start"}

    def run(name: str, buff: dict, appfl: dict) -> list[dict]:
        methods = [{**fedit, "label": "buff", "schedule": buff}, {**fedit, "label": "appfl", "schedule": appfl}]
        overrides = [*DATA, "budgets=[2]", f"methods={json.dumps(methods)}", "clients.speed={distribution: lognormal}"]
        out = Experiment(load_config("smoke", overrides), tmp_path / name).run()
        return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]

    first = run("first", base, {**base, **appfls})
    second = run("second", {**base, **fedpefts}, base)

    def rows(records: list[dict], label: str, split: str | None = None) -> list[tuple]:
        keys = ("client", "seed", "round", "split", "metric", "value")
        chosen = [r for r in records if r["method"] == label and r["metric"] != "seconds"]
        return sorted((tuple(r[k] for k in keys) for r in chosen if split in (None, r["split"])), key=repr)

    assert rows(first, "buff") == rows(second, "buff")
    staleness = [r["value"] for r in first if r["method"] == "appfl" and r["metric"] == "staleness"]
    assert len(staleness) == 4 and max(staleness) > 0  # stale updates, whose difference is taken from their start
    assert rows(first, "appfl", "test") and rows(first, "appfl", "test") != rows(second, "appfl", "test")
