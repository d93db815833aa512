"""The per-architecture wrapper: every member of the method contract is either answered per architecture (a listed
set, each with its reason) or reaches the wrapped method; and every federated method that is not architecture-aware
runs in a federation of two architectures (uploads accepted, one server state per architecture, every client
personalized and evaluated on its own), on the local engine and, for a few of them, on Flower's simulation engine."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import fedpeft.methods  # noqa: F401
from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import ExperimentConfig, validate
from fedpeft.core.registry import METHODS
from fedpeft.core.types import ClientUpdate, Metrics, ServerState
from fedpeft.methods.base import FINAL, Method, contract, serves_as_base_stage
from fedpeft.methods.families.per_architecture import ArchitectureGroups, ArchitectureGroupsState
from fedpeft.runner import Experiment
from fedpeft.worker import build_data

# ---------------------------------------------------------------------------------------------- the contract
# The contract as its class defines it (read here, not through the wrapper's own list): its public members but the
# final methods, which are the same for every method and never handed to the wrapped one.
CONTRACT = {name: member for name, member in vars(Method).items() if not name.startswith("_") and name not in FINAL}


def _hook(member: Any) -> Any:
    """The function of a contract member that is a hook (a method or classmethod), else ``None``."""
    if isinstance(member, (classmethod, staticmethod)):
        return member.__func__
    return member if inspect.isfunction(member) else None


class Recorder:
    """Stands in for a wrapped method: records every hook called on it and answers with a marker of the hook; a
    property or class flag read from it is a marker of its name."""

    cfg = None

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in CONTRACT:
            raise AttributeError(name)
        if _hook(CONTRACT[name]) is None:
            return ("value", name)

        def hook(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return ("answer", name)

        return hook


def test_the_contract_lists_every_public_member_of_method():
    assert contract() == CONTRACT
    assert {"update_spec", "evaluate", "should_stop", "init_server_for_budget", "federated_per_budget"} <= set(CONTRACT)
    # What no method overrides is a function of methods.base, or a final method, not a hook.
    gone = {"trained_update", "server_step", "refused_server_settings", "serves_as_base_stage", "per_client_base_stage"}
    assert not gone & set(vars(Method)) and not {"report_sections", "report_plots"} & set(vars(Method))
    assert FINAL <= set(vars(Method)) and not FINAL & set(CONTRACT)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_each_member_of_the_contract_is_answered_per_architecture_or_reaches_the_wrapped_method(name):
    reasons = ArchitectureGroups.PER_ARCHITECTURE
    if name in reasons:  # deliberately the wrapper's own, with its reason
        assert name in vars(ArchitectureGroups) and reasons[name].strip()
        return
    inner = Recorder()
    wrapper = ArchitectureGroups(inner)  # type: ignore[arg-type]
    if _hook(CONTRACT[name]) is None:  # a property or class flag
        assert getattr(wrapper, name) == ("value", name)
        return
    sentinel = object()
    assert getattr(wrapper, name)(sentinel, keyword=sentinel) == ("answer", name)
    assert inner.calls == [(name, (sentinel,), {"keyword": sentinel})]


def test_every_hook_that_takes_or_gives_the_server_state_is_answered_per_architecture():
    """Forwarded as it is, such a hook would hand the wrapped method the wrapper's state of all groups."""
    of_state = sorted(
        name
        for name, member in CONTRACT.items()
        if _hook(member) is not None and any("ServerT" in str(a) for a in _hook(member).__annotations__.values())
    )
    assert "payload" in of_state and "aggregate" in of_state
    assert set(of_state) <= set(ArchitectureGroups.PER_ARCHITECTURE), of_state


def test_the_wrapper_answers_for_the_wrapped_methods_class():
    from fedpeft.worker import build_method

    fedl2p = ArchitectureGroups(build_method({"name": "fedl2p", "rounds": 3}))
    assert (fedl2p.name, fedl2p.label, fedl2p.rounds) == ("fedl2p", "fedl2p", 3)
    assert fedl2p.federated_per_budget and fedl2p.uses_budget and fedl2p.Config is METHODS.get("fedl2p").Config
    fedit = ArchitectureGroups(build_method({"name": "fedit"}))
    assert METHODS.get("fedit").batchable_clients and not fedit.batchable_clients  # one runtime per batch
    assert fedit.architecture_aware and serves_as_base_stage(fedit)


class StopsAfterOneRound(Method[Any, ServerState, None]):
    """A method whose phase ends after its first aggregated round."""

    def should_stop(self, state: ServerState) -> bool:
        return state.round >= 1

    def aggregate(self, state: ServerState, updates: Any) -> tuple[ServerState, Metrics]:
        total = sum(float(u.tensors["w"]) for u in updates)
        return ServerState(tensors={"w": torch.tensor(total)}, round=state.round), {}


def test_a_group_that_would_stop_keeps_its_state_until_every_group_would():
    wrapper = ArchitectureGroups(StopsAfterOneRound(None))
    state = ArchitectureGroupsState(
        groups={"s": ServerState(round=1), "m": ServerState()}, assignment={"c0": "s", "c1": "m"}
    )
    assert not wrapper.should_stop(state)
    updates = [ClientUpdate(c, {"w": torch.tensor(2.0)}, 1.0) for c in ("c0", "c1")]
    new_state, _ = wrapper.aggregate(state, iter(updates))
    assert new_state.groups["s"] is state.groups["s"]  # stopped: its update is left out
    assert float(new_state.groups["m"].tensors["w"]) == 2.0 and new_state.groups["m"].round == 1
    assert wrapper.should_stop(new_state)


# ---------------------------------------------------------------------------------------------- the matrix
# Methods that share across architectures themselves (FedMosaic and its baselines) are not wrapped.
ARCHITECTURE_AWARE = sorted(
    n for n in METHODS.names() if METHODS.get(n).federated and METHODS.get(n).architecture_aware
)
# Methods that refuse a federation of several architectures at start, with the reason (none at present).
REFUSE_SEVERAL_ARCHITECTURES: dict[str, str] = {}
WRAPPED = sorted(
    n
    for n in METHODS.names()
    if METHODS.get(n).federated and n not in ARCHITECTURE_AWARE and n not in REFUSE_SEVERAL_ARCHITECTURES
)
# Methods that need a sparse mixture-of-experts model run in a federation of two tiny OLMoE models instead.
MOE_ONLY = {"flame"}
FAST = {"rounds": 2, "fraction": 1.0, "local_steps": 2, "local_epochs": None, "lr": 1e-2, "rank": 2, "batch_size": 8}
SHORT = {"local_rounds": 1}  # phases some methods run besides their rounds (Potara's local phase)
ROUNDS = FAST["rounds"]


def method_entry(name: str) -> dict:
    fields = METHODS.get(name).Config.model_fields
    return {"name": name, **{k: v for k, v in {**FAST, **SHORT}.items() if k in fields}}


def two_architectures(methods: list[dict], *, moe: bool = False) -> dict:
    """A federation of two architectures of different families and widths, two seen and two unseen clients each
    (synthetic-xnli); with ``moe``, two tiny OLMoE models of different widths, two clients each (instructions)."""
    raw: dict = {
        "name": "per-architecture",
        "seeds": [0],
        "threads": 1,
        "base": {"kind": "pretrained"},
        "budgets": [2],
        "methods": methods,
        "output": {"plots": False},
        # A tiered method personalizes each client at its own tier only, which the runner's count of final results
        # per budget takes for missing clients; check_run counts every client's records over its budgets itself.
        "validation": {"min_result_fraction": 0.0},
    }
    if moe:
        options = {"num_clients": 4, "samples": 80, "categories": ["nouns", "plural"], "base_categories": ["plural"]}
        data = {"name": "synthetic-instructions", "base_samples": 40, "unseen_pool": False, "options": options}
        olmoe = {"name": "tiny-olmoe", "max_length": 48, "vocab_size": 300}
        models = {"olmoe-s": {**olmoe, "overrides": {"hidden_size": 32}}, "olmoe-l": olmoe}
        return raw | {
            "data": data,
            "models": models,
            "assign": {"counts": {"olmoe-s": 2, "olmoe-l": 2}},
            "eval": {"max_new_tokens": 3},
            "budgets": [],
        }
    data = {
        "name": "synthetic-xnli",
        "groups": ["lat1", "lat2"],
        "clients_per_group": 2,
        "train_per_group": 16,
        "test_per_group": 8,
        "base_samples": 32,
    }
    models = {
        "llama": {"name": "tiny-llama", "max_length": 24, "vocab_size": 300, "overrides": {"hidden_size": 32}},
        "qwen": {"name": "tiny-qwen2", "max_length": 24, "vocab_size": 300},
    }
    return raw | {"data": data, "models": models, "assign": {"groups": {"lat1": "llama", "lat2": "qwen"}}}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_run(cfg: ExperimentConfig, run_dir: Path, name: str) -> None:
    """What a run of method ``name`` in a federation of two architectures must show."""
    architectures = list(cfg.models)
    records, costs = read_jsonl(run_dir / "results.jsonl"), read_jsonl(run_dir / "costs.jsonl")
    # Uploads accepted: no rejected update, no failed client, and every round aggregated every seen client.
    events = [c for c in costs if c["method"] == name and ("reject" in c["metric"] or "fail" in c["metric"])]
    assert not [e for e in events if e["value"]], events
    seen = len(build_data(cfg).pool("seen"))
    train = [r for r in records if r["method"] == name and r["split"] == "train"]
    per_round = [r["value"] for r in train if r["metric"] == "clients"]
    assert per_round and all(value == seen for value in per_round), per_round
    # One server state per architecture (per budget, for a method with one federated phase per budget).
    phases = [f"seed0-r{b}" for b in cfg.budgets] if METHODS.get(name).federated_per_budget else ["seed0"]
    assert sorted(path.name for path in (run_dir / "checkpoints" / name).iterdir()) == [
        f"{phase}.safetensors" for phase in phases
    ]
    for phase in phases:
        state = load_checkpoint(run_dir / "checkpoints" / name / f"{phase}.safetensors")["state"]
        assert isinstance(state, ArchitectureGroupsState) and list(state.groups) == architectures
        assert all(type(group) is not ArchitectureGroupsState for group in state.groups.values())
        assert [group.round for group in state.groups.values()] == [ROUNDS] * len(architectures)
        assert sorted(set(state.assignment.values())) == sorted(architectures)
    # Every client (seen and unseen, of both architectures) personalized and evaluated.
    clients = {r["client"] for r in records if r["method"] == "base" and r["split"] == "test"}
    evaluated = {r["client"] for r in records if r["method"] == name and r["split"] == "test" and r["round"] == ROUNDS}
    assert clients and evaluated == clients
    assert all(torch.isfinite(torch.tensor(r["value"])) for r in records if r["method"] == name)
    personalization = [c for c in costs if c["method"] == name and c["phase"] == "personalization"]
    assert personalization and not [c for c in personalization if c["metric"] == "failed_clients" and c["value"]]


@pytest.mark.parametrize("name", WRAPPED)
def test_method_runs_in_a_federation_of_two_architectures(name, tmp_path):
    cfg = validate(two_architectures([method_entry(name)], moe=name in MOE_ONLY))
    Experiment(cfg, tmp_path / name).run()
    check_run(cfg, tmp_path / name, name)


def test_the_matrix_covers_every_federated_method():
    # The shipped methods (a test elsewhere registers an example method for the session, undeclared).
    shipped = [n for n in METHODS.names() if METHODS.entry(n).module is not None]
    federated = {n for n in shipped if METHODS.get(n).federated}
    assert federated == set(WRAPPED) | set(ARCHITECTURE_AWARE) | set(REFUSE_SEVERAL_ARCHITECTURES)
    assert "fedmosaic" in ARCHITECTURE_AWARE and "fedit" in WRAPPED


# The methods: RoLoRA's uploads leave out the frozen factor (update_spec), FedDPA mixes its adapters at
# inference (evaluate), FedL2P runs one federated phase per budget and stops early (should_stop).
ON_FLOWER = ["rolora", "feddpa", "fedl2p"]


@pytest.mark.slow
def test_simulation_engine_gives_the_local_engines_records(tmp_path):
    from flower_helpers import ATOL, read_records

    from fedpeft.apps.flower import run_flower_simulation

    raw = two_architectures([method_entry(name) for name in ON_FLOWER])
    Experiment(validate(raw), tmp_path / "local").run()
    cfg = validate(raw)
    run_flower_simulation(cfg, tmp_path / "flower")
    for name in ON_FLOWER:
        check_run(cfg, tmp_path / "flower", name)
    local, flower = read_records(tmp_path / "local"), read_records(tmp_path / "flower")
    assert {key[0] for key in local} == {"base", *ON_FLOWER}
    assert local.keys() == flower.keys()
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key
