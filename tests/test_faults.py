"""Untrusted updates: the server's checks, injected faults on both engines, and runs in which every client fails."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import validate
from fedpeft.core.errors import AllClientsFailedError, UserError
from fedpeft.core.types import ClientUpdate, Payload
from fedpeft.engine.flower import GridEngine, flower_config
from fedpeft.engine.validation import UpdateChecks, update_norm
from fedpeft.runner import Experiment
from tests.test_flower import ATOL, InProcessGrid, one_torch_thread, read_records, task_identity, tiny_raw

__all__ = ["one_torch_thread", "task_identity"]  # fixtures used here

SEEN = ["lat1-seen-00", "lat1-seen-01", "lat2-seen-00", "lat2-seen-01"]


# ---------------------------------------------------------------------------------------------- the checks
def _payload() -> Payload:
    return Payload(tensors={"a": torch.zeros(2, 3), "b": torch.zeros(3)})


def _update(**changes: object) -> ClientUpdate:
    tensors = {"a": torch.full((2, 3), 0.1), "b": torch.full((3,), 0.1)}
    update = ClientUpdate("c0", tensors, 10.0)
    for key, value in changes.items():
        setattr(update, key, value)
    return update


def _with(key: str, value: torch.Tensor | None) -> dict[str, torch.Tensor]:
    tensors = {"a": torch.full((2, 3), 0.1), "b": torch.full((3,), 0.1)}
    if value is None:
        del tensors[key]
    else:
        tensors[key] = value
    return tensors


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        (_update(tensors=_with("b", None)), "missing tensors 'b'"),
        (_update(tensors=_with("c", torch.zeros(1))), "unexpected tensors 'c'"),
        (_update(tensors=_with("a", torch.zeros(3, 3))), "tensor 'a' has shape [3, 3], expected [2, 3]"),
        (_update(tensors=_with("b", torch.tensor([0.0, math.nan, 0.0]))), "tensor 'b' holds non-finite values"),
        (_update(tensors=_with("a", torch.full((2, 3), math.inf))), "tensor 'a' holds non-finite values"),
        (_update(extras={"relevance": torch.tensor([math.nan])}), "'extras.relevance' holds non-finite"),
        (_update(weight=0.0), "example count 0.0 is not a positive number"),
        (_update(weight=-10.0), "example count -10.0 is not a positive number"),
        (_update(weight=math.inf), "is not a positive number"),
        (_update(weight=1e9), "example count 1e+09 exceeds the 100 examples the server knows it holds"),
        (_update(tensors=_with("a", torch.full((2, 3), 10.0))), "exceeds the bound 5"),
    ],
)
def test_the_server_rejects_each_kind_of_bad_update(update, reason):
    checks = UpdateChecks({"c0": 100}, max_norm=5.0)
    payload = _payload()
    got = checks.reject_reason(update, payload, {k: v.shape for k, v in payload.tensors.items()})
    assert got is not None and reason in got


def test_a_sound_update_passes_and_its_norm_is_its_distance_from_the_payload():
    checks = UpdateChecks({"c0": 100}, max_norm=5.0)
    payload = _payload()
    update = _update()
    assert checks.reject_reason(update, payload, {k: v.shape for k, v in payload.tensors.items()}) is None
    assert update_norm(update, payload) == pytest.approx(math.sqrt(9 * 0.01))
    # A client the server knows no size of, and no declared spec: only the other checks apply.
    assert UpdateChecks().reject_reason(_update(weight=1e9), payload, None) is None


def test_fault_settings_are_checked_when_the_config_loads():
    raw = tiny_raw(faults=[{"kind": "scale", "clients": ["lat1-seen-00"]}])
    with pytest.raises(UserError, match="scale.*needs `value`"):
        validate(raw)
    with pytest.raises(UserError, match="faults.0.kind"):
        validate(tiny_raw(faults=[{"kind": "melt"}]))
    with pytest.raises(UserError, match="validation.max_norm"):
        validate(tiny_raw(validation={"max_norm": 0}))


# ---------------------------------------------------------------------------------------------- every fault kind
# Round 1 (the first): one crash, a NaN and an inf upload, a straggler (the only valid update); round 2: a wrong
# shape, an update boosted 100 times past the norm bound, a client that drops out; round 3: no fault. (`faults`
# counts rounds from 1, as costs.jsonl and the log do.)
FAULTS = [
    {"kind": "raise", "clients": ["lat1-seen-00"], "rounds": [1]},
    {"kind": "nan", "clients": ["lat1-seen-01"], "rounds": [1]},
    {"kind": "inf", "clients": ["lat2-seen-00"], "rounds": [1]},
    {"kind": "slow", "clients": ["lat2-seen-01"], "rounds": [1], "value": 0.2},
    {"kind": "wrong_shape", "clients": ["lat1-seen-00"], "rounds": [2]},
    {"kind": "scale", "clients": ["lat1-seen-01"], "rounds": [2], "value": 100.0},
    {"kind": "drop", "clients": ["lat2-seen-00"], "rounds": [2]},
]
EVENTS = {
    (1, "lat1-seen-00", "injected_fault"),
    (1, "lat1-seen-00", "failed_client"),
    (1, "lat1-seen-01", "injected_fault"),
    (1, "lat1-seen-01", "rejected_update"),
    (1, "lat2-seen-00", "injected_fault"),
    (1, "lat2-seen-00", "rejected_update"),
    (1, "lat2-seen-01", "injected_fault"),
    (2, "lat1-seen-00", "injected_fault"),
    (2, "lat1-seen-00", "rejected_update"),
    (2, "lat1-seen-01", "injected_fault"),
    (2, "lat1-seen-01", "rejected_update"),
    (2, "lat2-seen-00", "injected_fault"),
    (2, "lat2-seen-00", "failed_client"),
    (2, "lat2-seen-00", "dropped_client"),
    (1, None, "kept_previous_state"),
    (2, None, "kept_previous_state"),
}


def faulty_raw(**changes: object) -> dict:
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[{**tiny_raw()["methods"][0], "rounds": 3}])
    raw["faults"] = FAULTS
    raw["validation"] = {"max_norm": 1.0, "min_updates": 2}
    raw.update(changes)
    return raw


def events(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "costs.jsonl").read_text().splitlines()]
    return [r for r in rows if "round" in r]


def check_faulty_run(run_dir: Path) -> None:
    rows = events(run_dir)
    assert {(r["round"], r.get("client"), r["metric"]) for r in rows} == EVENTS
    reasons = {(r["round"], r["client"]): r["reason"] for r in rows if r["metric"] == "rejected_update"}
    assert "non-finite" in reasons[1, "lat1-seen-01"] and "non-finite" in reasons[1, "lat2-seen-00"]
    assert "has shape" in reasons[2, "lat1-seen-00"] and "exceeds the bound 1" in reasons[2, "lat1-seen-01"]
    kinds = {(r["round"], r["client"]): r["kind"] for r in rows if r["metric"] == "injected_fault"}
    assert kinds[1, "lat2-seen-01"] == "slow" and kinds[2, "lat1-seen-01"] == "scale"
    assert kinds[1, "lat1-seen-00"] == "raise" and kinds[2, "lat2-seen-00"] == "drop"
    errors = {(r["round"], r["client"]): r["error"] for r in rows if r["metric"] == "failed_client"}
    assert errors == {(1, "lat1-seen-00"): "InjectedFaultError", (2, "lat2-seen-00"): "InjectedDropError"}
    failed = [json.loads(line) for line in (run_dir / "costs.jsonl").read_text().splitlines()]
    assert {(r["method"], r["metric"]): r["value"] for r in failed}["fedit", "failed_client_rounds"] == 2.0
    state = load_checkpoint(run_dir / "checkpoints" / "fedit" / "seed0.safetensors")["state"]
    assert state.round == 3 and all(bool(torch.isfinite(t).all()) for t in state.tensors.values())
    summary = (run_dir / "summary.md").read_text()
    assert "## Rejected updates" in summary and "holds non-finite values" in summary
    assert "round kept the previous state" in summary and "1 valid update(s), fewer than min_updates=2" in summary


@pytest.fixture(scope="module")
def local_faulty_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "local"
    Experiment(validate(faulty_raw()), out).run()
    return out


def test_every_fault_kind_is_recorded_and_the_run_completes_on_the_local_engine(local_faulty_run):
    check_faulty_run(local_faulty_run)


def test_every_fault_kind_gives_the_same_run_through_flower_messages(tmp_path, local_faulty_run, task_identity):
    cfg = flower_config(validate(faulty_raw()))
    grid = InProcessGrid(num_nodes=2)
    out = Experiment(cfg, tmp_path / "grid").run(engine_factory=lambda worker: GridEngine(grid, worker))
    check_faulty_run(out)
    local, flower = read_records(local_faulty_run), read_records(out)
    assert local.keys() == flower.keys()
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key


@pytest.mark.slow
def test_every_fault_kind_on_the_flower_simulation_engine(tmp_path, local_faulty_run):
    from fedpeft.apps.flower import run_flower_simulation

    out = tmp_path / "flower"
    run_flower_simulation(validate(faulty_raw()), out)
    check_faulty_run(out)
    local, flower = read_records(local_faulty_run), read_records(out)
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key


def test_a_round_below_min_updates_keeps_the_previous_state(tmp_path):
    """Round 1 of the faulty run has one valid update, fewer than min_updates=2: the global adapter after it is
    the initial one, bit for bit."""
    raw = faulty_raw()
    raw["methods"][0]["rounds"] = 1
    out = Experiment(validate(raw), tmp_path / "run").run()
    saved = load_checkpoint(out / "checkpoints" / "fedit" / "seed0.safetensors")
    initial = validate(raw)
    from fedpeft.worker import Worker

    worker = Worker(initial, tmp_path / "fresh")
    start = worker.methods["fedit"].init_server(worker.runtime, 0)
    assert saved["state"].round == 1
    for key, tensor in start.tensors.items():
        assert torch.equal(saved["state"].tensors[key], tensor), key


# ---------------------------------------------------------------------------------------------- a NaN client
def test_ten_rounds_with_a_nan_client_keep_a_finite_adapter_and_the_accuracy(tmp_path):
    """FedIT for 10 rounds with one client uploading NaN every round: each of its updates is rejected, so the
    global adapter is exactly the one of a run in which that client drops out every round, finite, and its
    accuracy is within noise of the run without faults."""
    bad = "lat1-seen-01"

    def run(name: str, faults: list[dict]) -> tuple[Path, dict]:
        raw = tiny_raw(base={"kind": "pretrained"}, methods=[{**tiny_raw()["methods"][0], "rounds": 10}])
        raw["faults"] = faults
        out = Experiment(validate(raw), tmp_path / name).run()
        return out, load_checkpoint(out / "checkpoints" / "fedit" / "seed0.safetensors")["state"].tensors

    nan_run, nan_state = run("nan", [{"kind": "nan", "clients": [bad]}])
    drop_run, drop_state = run("drop", [{"kind": "drop", "clients": [bad]}])
    clean_run, _ = run("clean", [])
    for key, tensor in nan_state.items():
        assert bool(torch.isfinite(tensor).all()) and torch.equal(tensor, drop_state[key]), key
    assert sum(r["metric"] == "rejected_update" for r in events(nan_run)) == 10

    def accuracy(run_dir: Path) -> float:
        values = [v for k, v in read_records(run_dir).items() if k[0] == "fedit" and k[-1] == "accuracy"]
        return sum(values) / len(values)

    assert accuracy(nan_run) == accuracy(drop_run)
    assert abs(accuracy(nan_run) - accuracy(clean_run)) < 0.1


# ---------------------------------------------------------------------------------------------- nobody left
@pytest.mark.slow
def test_a_round_in_which_every_client_fails_stops_the_cli_with_one_sentence(tmp_path):
    config = tmp_path / "all-fail.yaml"
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0]])
    raw["faults"] = [{"kind": "raise", "rounds": [2], "methods": ["fedit"]}]
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "fedpeft.cli", "run", str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines == [
        "error: the run stopped: round 2: all 4 sampled clients failed; the first: round 2: client lat1-seen-00 "
        'failed and was left out (InjectedFaultError("injected fault: the client\'s work raised"))'
    ]
    assert "Traceback" not in done.stderr
    assert (out / "config.yaml").is_file()  # what was written stays


def test_personalization_that_fails_for_every_client_stops_the_run(tmp_path, monkeypatch):
    from fedpeft.worker import Worker

    def broken(self, label, seed, client_id, state, **kwargs):  # noqa: ANN001, ANN202
        raise RuntimeError("out of memory")

    monkeypatch.setattr(Worker, "personalize", broken)
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[{"name": "lora", "epochs": 1, "batch_size": 8}])
    with pytest.raises(AllClientsFailedError, match=r"every one of the 8 clients failed lora's personalization"):
        Experiment(validate(raw), tmp_path / "run").run()


def test_base_evaluation_failures_are_counted_and_named_as_such(tmp_path, monkeypatch):
    from fedpeft.worker import Worker

    evaluate = Worker.evaluate_base

    def flaky(self, seed, client_id):  # noqa: ANN001, ANN202
        if client_id == "lat1-seen-00":
            raise RuntimeError("bad batch")
        return evaluate(self, seed, client_id)

    monkeypatch.setattr(Worker, "evaluate_base", flaky)
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[{"name": "lora", "epochs": 1, "batch_size": 8}])
    raw["validation"] = {"min_result_fraction": 0.8}  # the base row misses one client of 8: accepted here
    out = Experiment(validate(raw), tmp_path / "run").run()
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    assert [(c["phase"], c["value"]) for c in costs if c["metric"] == "failed_clients"] == [("evaluation", 1.0)]
    summary = (out / "summary.md").read_text()
    assert "1 client(s) failed the base model's evaluation" in summary
    assert "left out of the aggregation" not in summary


def test_a_run_with_clients_missing_from_its_results_ends_with_exit_1_unless_the_config_accepts_it(
    tmp_path, monkeypatch, capsys
):
    """One client's personalization fails: the outputs are written, the summary lists it, and the command exits 1
    with one line naming how many and where; `validation.min_result_fraction` below the share present accepts it."""
    from entry_point import cli

    from fedpeft.worker import Worker

    real = Worker.personalize

    def one_fails(self, label, seed, client_id, state, **kwargs):  # noqa: ANN001, ANN202
        if client_id == "lat2-seen-01":
            raise RuntimeError("out of memory")
        return real(self, label, seed, client_id, state, **kwargs)

    monkeypatch.setattr(Worker, "personalize", one_fails)
    config = tmp_path / "one-fails.yaml"
    config.write_text(yaml.safe_dump(tiny_raw(base={"kind": "pretrained"}, methods=[{"name": "lora", "epochs": 1}])))
    out = tmp_path / "run"
    code, _, err = cli(monkeypatch, capsys, "run", str(config), "--out", str(out))
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "error: the run completed without final results of 1 of 8 clients for lora (seed 0, budget 2), fewer than "
        f"validation.min_result_fraction=1 asks; the failures are listed under Failed clients in {out / 'summary.md'}."
    )
    assert "lat2-seen-01" in (out / "summary.md").read_text()
    code, _, err = cli(
        monkeypatch, capsys, "run", str(config), "--out", str(tmp_path / "accepted"),
        "--set", "validation.min_result_fraction=0.8",
    )  # fmt: skip
    assert code == 0, err


def test_a_run_whose_tiered_method_evaluates_one_tier_completes(tmp_path):
    """Like the dense FLAME presets: the clients of the other tiers have no results, by the config."""
    from fedpeft.core.config import load_config

    tiers = [{"name": "tier1", "rank": 4}, {"name": "tier2", "rank": 2}]
    entry = {"name": "trivial_lora", "rounds": 1, "lr": 0.005, "eval_tiers": ["tier1"], "tiers": tiers}
    sets = ["data.groups=[lat1, lat3]", "data.train_per_group=40", "data.test_per_group=20", "data.base_samples=200"]
    cfg = load_config("smoke", [*sets, "budgets=[2]", f"methods={json.dumps([entry])}"])
    out = Experiment(cfg, tmp_path / "run").run()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tested = {r["client"] for r in rows if r["method"] == "trivial_lora" and r["split"] == "test"}
    assert tested and all(
        r["budget"] == "tier1" for r in rows if r["method"] == "trivial_lora" and r["split"] == "test"
    )
    assert len(tested) < len({r["client"] for r in rows if r["method"] == "base"})


def test_result_coverage_pools_the_tiers_of_a_tiered_method_and_not_rank_budgets(tmp_path):
    from fedpeft.core.errors import MissingResultsError
    from fedpeft.runner import check_result_coverage

    def test_record(method, budget, client):  # noqa: ANN001, ANN202
        return {"method": method, "seed": 0, "budget": budget, "client": client, "split": "test"}

    clients = ["a", "b", "c", "d"]
    tiers = [test_record("flame", tier, c) for tier, c in zip(["t1", "t1", "t2", "t3"], clients, strict=True)]
    check_result_coverage(tiers, clients, 1.0, tmp_path / "summary.md")  # each client at its own tier: complete
    ranks = [test_record("lora", r, c) for r in (2, 8) for c in clients if (r, c) != (8, "d")]
    with pytest.raises(MissingResultsError, match=r"of 1 of 4 clients for lora \(seed 0, budget 8\)"):
        check_result_coverage(ranks, clients, 1.0, tmp_path / "summary.md")
    check_result_coverage(ranks, clients, 0.75, tmp_path / "summary.md")
    # A method that evaluates some clients only (a tiered method's `eval_tiers`) is judged on those.
    dense = [test_record("trivial_lora-dense", "t1", "a")]
    with pytest.raises(MissingResultsError, match=r"of 3 of 4 clients for trivial_lora-dense"):
        check_result_coverage(dense, clients, 1.0, tmp_path / "summary.md")
    check_result_coverage(dense, clients, 1.0, tmp_path / "summary.md", evaluates={"trivial_lora-dense": ["a"]})
