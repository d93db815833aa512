"""Asynchronous schedules: the staleness functions and the server step against APPFL's FedBuff and FedAsync
aggregators (their formulas, written out here), the schedule's settings, and runs on the virtual clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from test_bad_input_config import refused

from fedpeft.core.config import load_config
from fedpeft.core.types import ClientUpdate, ServerState
from fedpeft.merging.server_step import WeightedMean
from fedpeft.merging.staleness import StalenessMixing
from fedpeft.runner import Experiment
from fedpeft.settings.schedule import ScheduleConfig


# ---------------------------------------------------------------------------------------------- the formulas
@pytest.mark.parametrize(
    ("settings", "staleness", "weight"),
    [
        ({"staleness": "constant"}, 7, 1.0),
        ({"staleness": "polynomial", "staleness_a": 0.5}, 0, 1.0),
        ({"staleness": "polynomial", "staleness_a": 0.5}, 3, 0.5),  # (3 + 1) ** -0.5
        ({"staleness": "polynomial", "staleness_a": 2.0}, 1, 0.25),
        ({"staleness": "hinge", "staleness_a": 10.0, "staleness_b": 4.0}, 4, 1.0),
        ({"staleness": "hinge", "staleness_a": 10.0, "staleness_b": 4.0}, 5, 1 / 11),  # 1 / (10 (5 - 4) + 1)
        ({"staleness": "hinge", "staleness_a": 0.5, "staleness_b": 2.0}, 6, 1 / 3),
    ],
)
def test_staleness_functions_are_appfls(settings, staleness, weight):
    schedule = ScheduleConfig(kind="fedbuff", **settings)
    assert schedule.weight(staleness) == pytest.approx(weight, rel=1e-12)


def _uploads(count: int, staleness: list[int]) -> tuple[ServerState, list[ClientUpdate]]:
    generator = torch.Generator().manual_seed(3)
    state = ServerState({"w": torch.randn(4, 3, generator=generator), "b": torch.randn(5, generator=generator)})
    updates = [
        ClientUpdate(
            f"c{k}",
            {"w": torch.randn(4, 3, generator=generator), "b": torch.randn(5, generator=generator)},
            float(3 + 5 * k),
            staleness=staleness[k],
        )
        for k in range(count)
    ]
    return state, updates


def _appfl_fedbuff(state: ServerState, updates: list[ClientUpdate], schedule: ScheduleConfig) -> dict:
    """APPFL's FedBuffAggregator: step = sum_k alpha s(u_k) w_k (x_k - g), w_k its sample size over the total
    (``client_weights_mode: sample_size``, the buffer's clients); g + step once K are buffered."""
    total = sum(u.weight for u in updates)
    out = {}
    for key, g in state.tensors.items():
        step = torch.zeros_like(g)
        for u in updates:
            step += schedule.mixing * schedule.weight(u.staleness) * (u.weight / total) * (u.tensors[key] - g)
        out[key] = g + step
    return out


def _appfl_fedasync(state: ServerState, update: ClientUpdate, schedule: ScheduleConfig) -> dict:
    """APPFL's FedAsyncAggregator (one client weight, ``num_clients`` 1): g + alpha s(u) (x - g)."""
    alpha_t = schedule.mixing * schedule.weight(update.staleness)
    return {key: g + alpha_t * (update.tensors[key] - g) for key, g in state.tensors.items()}


@pytest.mark.parametrize(
    "settings",
    [
        {"staleness": "constant", "server_lr": 0.7},
        {"staleness": "polynomial", "staleness_a": 0.5},
        {"staleness": "hinge", "staleness_a": 2.0, "staleness_b": 1.0, "server_lr": 1.5},
    ],
)
def test_the_fedbuff_step_is_appfls(settings):
    schedule = ScheduleConfig(kind="fedbuff", **settings)
    state, updates = _uploads(4, [0, 1, 3, 6])
    result = StalenessMixing(WeightedMean(), schedule)(state, iter(updates))
    expected = _appfl_fedbuff(state, updates, schedule)
    for key, tensor in expected.items():
        torch.testing.assert_close(result.tensors[key], tensor, atol=1e-6, rtol=1e-6)
    assert result.metrics["clients"] == 4.0


@pytest.mark.parametrize("staleness", [0, 1, 5])
@pytest.mark.parametrize("settings", [{}, {"staleness": "polynomial", "server_lr": 0.5}, {"staleness": "hinge"}])
def test_the_fedasync_step_is_appfls(settings, staleness):
    schedule = ScheduleConfig(kind="fedasync", **settings)
    state, updates = _uploads(1, [staleness])
    result = StalenessMixing(WeightedMean(), schedule)(state, iter(updates))
    for key, tensor in _appfl_fedasync(state, updates[0], schedule).items():
        torch.testing.assert_close(result.tensors[key], tensor, atol=1e-6, rtol=1e-6)


def test_fresh_updates_at_rate_one_give_the_weighted_mean_bit_for_bit():
    state, updates = _uploads(3, [0, 0, 0])
    mixed = StalenessMixing(WeightedMean(), ScheduleConfig(kind="fedbuff"))(state, iter(updates))
    mean = WeightedMean()(state, iter(updates))
    assert mixed.tensors.keys() == mean.tensors.keys()
    assert all(torch.equal(mixed.tensors[k], mean.tensors[k]) for k in mean.tensors)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kind": "fedbuff", "concurrency": 2, "buffer_size": 3}, "exceeds concurrency"),
        ({"kind": "fedbuff", "max_staleness": -1}, "greater than or equal to 0"),
        ({"kind": "fedasync", "buffer_size": 2}, "steps the server on every update"),
        ({"kind": "fedasync", "server_lr": 1.5}, "mixing weight"),
        ({"kind": "sync", "concurrency": 4}, "set kind: fedbuff or fedasync"),
        ({"kind": "fedbuf"}, "fedbuff"),
    ],
)
def test_impossible_schedules_are_refused(settings, message):
    with pytest.raises(ValidationError, match=message):
        ScheduleConfig(**settings)


# ---------------------------------------------------------------------------------------------- runs
FEDIT = {"name": "fedit", "rounds": 3, "fraction": 0.5, "local_steps": 2, "lr": 0.005}
DATA = ["data.groups=[lat1, lat3]", "data.train_per_group=40", "data.test_per_group=20", "data.base_samples=200"]


def _run(tmp_path: Path, methods: list[dict], *overrides: str) -> tuple[list[dict], list[dict]]:
    """Records and cost rows of a run of ``methods`` on the smoke preset's tiny federation (4 seen clients)."""
    cfg = load_config("smoke", [*DATA, "budgets=[2]", f"methods={json.dumps(methods)}", *overrides])
    out = Experiment(cfg, tmp_path / "run").run()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    return records, costs


def _of(records: list[dict], label: str) -> list[tuple]:
    keys = ("budget", "pool", "client", "group", "seed", "round", "split", "metric", "value")
    rows = [tuple(r[k] for k in keys) for r in records if r["method"] == label and r["metric"] != "seconds"]
    return sorted(rows, key=repr)


def test_fedbuff_with_equally_fast_clients_and_k_c_a_round_gives_the_synchronous_records_bit_for_bit(tmp_path):
    methods = [{**FEDIT, "label": "sync"}, {**FEDIT, "label": "buff", "schedule": {"kind": "fedbuff"}}]
    records, _ = _run(tmp_path, methods)
    clock = ("virtual_time", "staleness")
    synchronous, buffered = _of(records, "sync"), _of(records, "buff")
    for rows in (synchronous, buffered):  # 2 local steps a server step; a synchronous round keeps the clock too
        assert sorted(r[8] for r in rows if r[7] == "virtual_time") == [2.0, 4.0, 6.0]
    assert [r[8] for r in buffered if r[7] == "staleness"] == [0.0, 0.0, 0.0]
    assert [r for r in synchronous if r[7] not in clock] == [r for r in buffered if r[7] not in clock]
    assert len([r for r in synchronous if r[7] not in clock]) == 17  # 8 test accuracies; loss, clients, examples


def test_fedasync_with_lognormal_speeds_steps_on_each_arrival_deterministically(tmp_path):
    schedule = {"kind": "fedasync", "concurrency": 3, "max_staleness": 1, "server_lr": 0.6}
    methods = [{**FEDIT, "rounds": 6, "label": "async", "schedule": schedule}]
    speed = "clients.speed={distribution: lognormal, sigma: 1.0}"
    records, costs = _run(tmp_path / "a", methods, speed)
    again, _ = _run(tmp_path / "b", methods, speed)
    assert _of(records, "async") == _of(again, "async")
    train = [r for r in records if r["split"] == "train"]
    times = [r["value"] for r in sorted(train, key=lambda r: r["round"]) if r["metric"] == "virtual_time"]
    assert len(times) == 6 and times == sorted(times) and len(set(times)) >= 4
    assert all(r["value"] == 1.0 for r in train if r["metric"] == "clients")  # one update a server step
    # The schedule depends on the seed's speed factors alone, not on what the clients learn: the same on any machine.
    rejected = [(c["client"], c["reason"]) for c in costs if c.get("metric") == "rejected_update"]
    assert rejected == [
        ("lat3-seen-00", "staleness 4 exceeds max_staleness=1"),
        ("lat3-seen-01", "staleness 5 exceeds max_staleness=1"),
    ]
    staleness = [r["value"] for r in sorted(train, key=lambda r: r["round"]) if r["metric"] == "staleness"]
    assert staleness == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]


@pytest.mark.slow
def test_an_asynchronous_run_gives_the_same_records_on_two_workers(tmp_path):
    schedule = {"kind": "fedbuff", "concurrency": 3, "buffer_size": 2, "staleness": "polynomial"}
    methods = [{**FEDIT, "rounds": 4, "label": "buff", "schedule": schedule}]
    speed = "clients.speed={distribution: lognormal, sigma: 0.5}"
    one, _ = _run(tmp_path / "one", methods, speed)
    two, _ = _run(tmp_path / "two", methods, speed, "engine.workers=2")
    assert _of(one, "buff") == _of(two, "buff") and len(_of(one, "buff")) == 8 + 4 * 5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["methods=[{name: flora, rounds: 2, schedule: {kind: fedbuff}}]"], "cannot use `schedule.kind: fedbuff`"),
        (
            ["methods=[{name: fedit, schedule: {kind: fedasync}, dp: {noise_multiplier: 1.0, clip_norm: 1.0}}]"],
            "privacy accountant assumes synchronous rounds",
        ),
        (["methods=[{name: fedit, schedule: {kind: fedbuff, concurrency: 2, buffer_size: 3}}]"], "exceeds concurrency"),
        # the default concurrency is the clients a round samples: 2 of the 4 seen clients
        (
            ["methods=[{name: fedit, fraction: 0.5, schedule: {kind: fedbuff, buffer_size: 3}}]"],
            "buffer_size K=3, more than its concurrency C=2 (its default: the clients a round samples)",
        ),
        (
            ["methods=[{name: fedit, schedule: {kind: fedasync, concurrency: 5}}]"],
            "sets schedule.concurrency=5, but its federated phase has 4 clients",
        ),
        (
            [
                "base={kind: federated, method: {name: fedit, fraction: 0.5, schedule: {kind: fedbuff}}}",
                "base.method.schedule.buffer_size=4",
                "methods=[{name: lora}]",
            ],
            "Method 'base-stage' sets schedule.buffer_size K=4",
        ),
        (
            ["methods=[{name: fedit, schedule: {kind: fedasync}}]", "engine.secagg={}", "--engine", "flower"],
            "Secure aggregation needs a cohort of updates",
        ),
        (["methods=[{name: fedit, schedule: {kind: fedasync}}]", "clients.speed.groups={tier9: 2.0}"], "tier9"),
    ],
)
def test_bad_schedules_are_one_sentence_and_exit_2(overrides, message, tmp_path, monkeypatch, capsys):
    sets = [item for item in overrides if not item.startswith("--") and item != "flower"]
    extra = [item for item in overrides if item.startswith("--") or item == "flower"]
    args = ["run", "smoke", "--out", str(tmp_path / "run"), *extra]
    for item in [*DATA, *sets]:
        args += ["--set", item]
    assert message in refused(monkeypatch, capsys, tmp_path, args)


def test_fedit_merged_reads_its_learning_rate_schedule_by_the_old_name_beside_the_servers():
    from fedpeft.core.config import method_config

    old = method_config({"name": "fedit_merged", "schedule": "constant"})
    assert old.lr_schedule == "constant" and old.schedule.kind == "sync"
    both = method_config({"name": "fedit_merged", "lr_schedule": "constant", "schedule": {"kind": "fedbuff"}})
    assert both.lr_schedule == "constant" and both.schedule.kind == "fedbuff"


def test_the_report_compares_methods_on_the_virtual_clock(tmp_path):
    """With speeds and evaluations during training, summary.md has each method's final metric, its virtual time at
    the end and its time to the lowest final value, and the plot of the metric against virtual time is drawn."""
    schedule = {"kind": "fedasync", "concurrency": 2, "server_lr": 0.6}
    methods = [{**FEDIT, "label": "sync"}, {**FEDIT, "rounds": 6, "label": "async", "schedule": schedule}]
    speed = "clients.speed={distribution: lognormal, sigma: 1.0}"
    records, _ = _run(tmp_path, methods, speed, "eval.every=1")
    out = tmp_path / "run"
    summary = (out / "summary.md").read_text()
    section = summary[summary.index("## Virtual time") :].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| sync") or line.startswith("| async")]
    assert len(rows) == 2
    train = {(r["method"], r["round"]): r["value"] for r in records if r["metric"] == "virtual_time"}
    assert f"| {train['sync', 3]:.2f} |" in rows[0] and f"| {train['async', 6]:.2f} |" in rows[1]
    assert (out / "plots" / "virtual_time_accuracy.png").is_file()
    # A synchronous round lasts as long as its slowest sampled client: the clock only moves forward.
    assert train["sync", 1] < train["sync", 2] < train["sync", 3]


def test_speed_factors_come_from_groups_round_robin_and_a_seeded_lognormal():
    from fedpeft.core.config import SpeedConfig
    from fedpeft.data.types import ClientData
    from fedpeft.engine.asynchronous import speed_factor

    clients = [ClientData(f"g{i % 2}-seen-{i:02d}", f"g{i % 2}", "seen", [], []) for i in range(6)]
    tiers = SpeedConfig(round_robin=[1.0, 2.0, 4.0, 8.0], groups={"g1": 3.0})
    assert [speed_factor(tiers, c, 0) for c in clients] == [1.0, 6.0, 4.0, 24.0, 1.0, 6.0]
    drawn = SpeedConfig(distribution="lognormal", sigma=1.0)
    once = [speed_factor(drawn, c, 0) for c in clients]
    assert once == [speed_factor(drawn, c, 0) for c in clients]  # fixed by the seed and the client
    assert once != [speed_factor(drawn, c, 1) for c in clients] and len(set(once)) == 6
    assert SpeedConfig(sigma=0.0, distribution="lognormal").varies and not SpeedConfig().varies
    with pytest.raises(ValidationError, match="round_robin"):
        SpeedConfig(round_robin=[1.0, 0.0])
