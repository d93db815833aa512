"""FedL2P: per-module rates from the MLP, meta-updates, early stopping, one federated phase per budget."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import load_config
from fedpeft.core.types import ClientUpdate
from fedpeft.methods.fedl2p import POST, FedL2PState, module_groups, split_validation
from fedpeft.models.runtime import ClientModel
from fedpeft.runner import Experiment
from fedpeft.worker import build_method


def test_a_module_whose_rate_is_zero_keeps_its_initial_weights(toy_runtime, toy_clients):
    method = build_method({"name": "fedl2p", "lr": 0.05, "finetune_epochs": 1})
    state = method.init_server_for_budget(toy_runtime, seed=0, budget=2)
    tensors = dict(state.tensors)
    last = max(k for k in tensors if k.startswith("mlp.") and k.endswith(".weight"))
    tensors[last] = torch.zeros_like(tensors[last])
    bias = torch.ones_like(tensors[last.replace("weight", "bias")])
    bias[0] = -3.0  # clamped to a zero multiplier: the first module (a lora_A) does not train
    tensors[last.replace("weight", "bias")] = bias

    model = method.personalize(toy_runtime, toy_clients[0], FedL2PState(tensors=tensors), None, 2, seed=5)
    toy_runtime.install(ClientModel(lora=model.lora), seed=5)
    initial = toy_runtime.adapter_state()
    frozen = module_groups(toy_runtime)[0][0]
    key = frozen.replace(f".{model.lora.key}", "")
    assert "lora_A" in key and torch.equal(model.adapter[key], initial[key])
    moved = [k for k in initial if not torch.equal(model.adapter[k], initial[k])]
    assert len(moved) == len(initial) - 1


def test_meta_learning_updates_the_mlp_within_adam_steps(toy_runtime, toy_clients):
    method = build_method({"name": "fedl2p", "local_steps": 2, "mlp_lr": 1e-3})
    state = method.init_server_for_budget(toy_runtime, seed=0, budget=2)
    payload = method.payload(state, "c0")
    assert payload.config == {"budget": 2} and set(payload.tensors) == set(state.tensors)
    update, _ = method.client_update(toy_runtime, toy_clients[0], payload, None, seed=1)
    assert set(update.tensors) == set(state.tensors)
    assert {"val_loss", "outer_loss"} <= set(update.metrics)
    moved = [k for k in state.tensors if not torch.equal(update.tensors[k], state.tensors[k])]
    assert moved
    # Three Adam steps move no entry further than three learning rates.
    post_change = (update.tensors[POST] - state.tensors[POST]).abs().max()
    assert post_change <= 3 * 1e-6 * 1.001
    for key in moved:
        if key != POST:
            assert (update.tensors[key] - state.tensors[key]).abs().max() <= 3 * 1e-3 * 1.001


def test_validation_split_is_fixed_per_client(toy_clients):
    train, val = split_validation(toy_clients[0].train, 0.2, "c0")
    assert len(val) == round(0.2 * 48) and len(train) + len(val) == 48
    assert split_validation(toy_clients[0].train, 0.2, "c0") == (train, val)


def test_early_stopping_keeps_the_best_mlp():
    method = build_method({"name": "fedl2p", "patience": 2})
    state = FedL2PState(tensors={POST: torch.zeros(1)}, budget=2)
    history = []
    for round_, loss in enumerate([1.0, 0.5, 0.7, 0.6]):
        update = ClientUpdate("c0", {POST: torch.full((1,), float(round_ + 1))}, 1.0, {"val_loss": loss})
        history.append(state)
        assert not method.should_stop(state)
        new_state, _ = method.aggregate(state, iter([update]))
        state = dataclasses.replace(new_state, round=round_ + 1)  # the round loop counts the round
    # The MLP that reached 0.5 was the one sent in round 1 (the output of round 0).
    assert torch.equal(state.best_tensors[POST], history[1].tensors[POST]) and state.best_loss == 0.5
    assert method.should_stop(state) and state.round == 4


@pytest.mark.slow
def test_one_federated_phase_per_budget_with_per_client_bases_and_resume(tmp_path):
    overrides = [
        "data.groups=[lat1, lat4]",
        "budgets=[2, 4]",
        "base.kind=federated",
        "base.method={name: feddpa, rounds: 2, fraction: 0.5, local_steps: 2, lr: 0.005}",
        "methods=[{name: fedl2p, rounds: 2, fraction: 0.5, local_steps: 2, finetune_epochs: 1}]",
        "output.plots=false",
        "output.save_adapters=false",
    ]
    out = tmp_path / "run"
    Experiment(load_config("smoke", overrides), out).run()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if r["split"] != "train"]  # train: the base stage's and fedl2p's rounds
    assert {(r["method"], r["budget"]) for r in evaluated} == {("base", None), ("fedl2p", 2), ("fedl2p", 4)}
    states = {b: load_checkpoint(out / "checkpoints" / "fedl2p" / f"seed0-r{b}.safetensors") for b in (2, 4)}
    assert [states[b]["state"].budget for b in (2, 4)] == [2, 4]
    assert all(s["round"] == 2 for s in states.values())
    clients = sorted({r["client"] for r in evaluated})
    assert sorted(p.stem for p in (out / "checkpoints" / "client-base" / "seed0").iterdir()) == clients
    base_rows = {r["client"]: r["value"] for r in records if r["method"] == "base"}
    assert len(set(base_rows.values())) > 1

    # Lose everything after the base stage and the second budget's federated phase; a resumed run (a new
    # process: the base stage's client states come back from its checkpoint) ends with the same numbers.
    shutil.rmtree(out / "checkpoints" / "client-base")
    (out / "checkpoints" / "fedl2p" / "seed0-r4.safetensors").unlink()
    for name in ("client-base-seed0", "base-seed0", "fedl2p-seed0"):
        (out / "parts" / f"{name}.jsonl").unlink()
    (out / "results.jsonl").unlink()
    Experiment(load_config("smoke", overrides), out).run(resume=True)
    resumed = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    timing = lambda r: r["split"] == "train" and r["metric"] == "seconds"  # noqa: E731  (wall time: not reproducible)
    key = lambda r: tuple(str(r[k]) for k in ("method", "budget", "client", "split", "round", "metric"))  # noqa: E731
    assert sorted((r for r in resumed if not timing(r)), key=key) == sorted(
        (r for r in records if not timing(r)), key=key
    )
