"""Checkpoints (fedpeft.core.checkpoints): every method's server state comes back bit for bit from safetensors and
JSON, loading one runs no code (no unpickling, no class the contract does not know), and a run that holds a
checkpoint of an earlier version (a pickle) is refused with one sentence."""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fedpeft.core.checkpoints import CONTENT_KEY, FORMAT, FORMAT_KEY, has_checkpoint, load_checkpoint, save_checkpoint
from fedpeft.core.config import load_config
from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import UserError
from fedpeft.core.registry import METHODS
from fedpeft.core.types import ServerState
from fedpeft.engine.local import LocalEngine
from fedpeft.engine.phase import FederatedPhase, PhaseCheckpoint
from fedpeft.engine.rounds import SynchronousRounds
from fedpeft.runner import Experiment
from tests import test_methods as matrix


def assert_same(got: object, expected: object, where: str = "value") -> None:
    """``got`` equals ``expected`` in type and value all the way down: tensors in dtype, shape and bytes, dicts in
    key order, dataclasses field by field."""
    assert type(got) is type(expected), f"{where}: {type(got).__name__} is not {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == expected.dtype and got.shape == expected.shape and got.device == expected.device, where
        as_bytes = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in (got, expected)]
        assert torch.equal(*as_bytes), where
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            assert_same(getattr(got, field.name), getattr(expected, field.name), f"{where}.{field.name}")
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected), where
        for key, value in expected.items():
            assert_same(got[key], value, f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) and expected != expected:
        assert got != got, where  # NaN
    else:
        assert got == expected, where


@pytest.mark.parametrize("name", matrix.ALL)
def test_every_methods_initial_state_round_trips(name, request, tmp_path):
    toy_runtime, _, _ = matrix.toy_setup(name, request)
    method = matrix.make(name)
    state = method.init_server(toy_runtime, seed=0)
    states = {"state": state}
    if method.federated_per_budget:
        states["budget"] = method.init_server_for_budget(toy_runtime, 0, 2)
    path = tmp_path / "state.safetensors"
    save_checkpoint(states, path)
    assert_same(load_checkpoint(path), states)


@pytest.mark.parametrize("name", matrix.FEDERATED)
def test_a_round_of_every_federated_method_checkpoints_and_loads_back(name, request, tmp_path):
    """The checkpoint after a round (aggregated state, client-state store, cost meter) comes back as it was."""
    _, toy_clients, toy_worker_factory = matrix.toy_setup(name, request)
    fields = {k: v for k, v in {**matrix.FAST, "rounds": 1}.items() if k in METHODS.get(name).Config.model_fields}
    worker = toy_worker_factory([{"name": name, **fields}])
    method = worker.methods[name]
    store, meter = worker.store(name, 0), CostMeter()
    state = method.init_server(worker.runtime, seed=0)
    path = tmp_path / "checkpoints" / name / "seed0.safetensors"
    records = [{"method": name, "round": 1, "metric": "loss", "value": 0.25}]
    ids = [c.client_id for c in toy_clients]
    checkpoint = PhaseCheckpoint(path, store)
    phase = FederatedPhase(name, method, ids, 0, checkpoint=checkpoint, state=state, meter=meter, records=list(records))
    state = phase.run(SynchronousRounds(LocalEngine(worker)))
    saved = load_checkpoint(path)
    assert saved["round"] == 1 and saved["round_records"] == records
    assert_same(saved["state"], state, "state")
    assert_same(saved["store"], store.snapshot(), "store")
    assert saved["meter"] == meter.snapshot()


@dataclasses.dataclass
class _NotAState:
    value: int = 0


def _write_raw(path: Path, content: object, tensors: dict[str, torch.Tensor] | None = None) -> None:
    metadata = {FORMAT_KEY: FORMAT, CONTENT_KEY: json.dumps(content)}
    save_file(tensors or {"t0": torch.zeros(1)}, str(path), metadata=metadata)


@pytest.mark.parametrize(
    "cls",
    [
        "subprocess:Popen",  # importable, and no dataclass at all
        "fedpeft.core.costs:CostMeter",  # a dataclass of fedpeft's that is no state type
        f"{__name__}:_NotAState",  # a dataclass this module imported
        "fedpeft.no_such_module:State",
    ],
)
def test_a_checkpoint_naming_a_class_that_is_no_state_type_is_refused(cls, tmp_path):
    path = tmp_path / "bad.safetensors"
    _write_raw(path, {"state": {"__dataclass__": cls, "fields": {}}})
    with pytest.raises(UserError, match="unknown state class"):
        load_checkpoint(path)
    assert "fedpeft.no_such_module" not in sys.modules


def test_a_state_with_fields_its_class_lacks_is_refused(tmp_path):
    path = tmp_path / "bad.safetensors"
    name = f"{ServerState.__module__}:{ServerState.__qualname__}"
    _write_raw(path, {"__dataclass__": name, "fields": {"round": 1, "command": "rm -rf /"}})
    with pytest.raises(UserError, match="fields it lacks: \\['command'\\]"):
        load_checkpoint(path)


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path):
    pickled = tmp_path / "seed0.safetensors"
    torch.save({"state": ServerState()}, pickled)
    with pytest.raises(UserError, match="not a checkpoint fedpeft can read"):
        load_checkpoint(pickled)
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.ones(1)}, str(plain))
    with pytest.raises(UserError, match="not a fedpeft checkpoint"):
        load_checkpoint(plain)


def test_loading_a_checkpoint_unpickles_nothing(tmp_path, monkeypatch):
    state = ServerState(tensors={"w": torch.randn(3, 2), "b": torch.arange(4)}, round=2)
    state.server_optimizer = {"m": {"w": torch.zeros(3, 2)}}
    value = {"state": state, "store": {"c0": [(1, {"adapter": state.tensors})]}, "meter": {"failures": []}}
    path = tmp_path / "seed0.safetensors"
    save_checkpoint(value, path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a checkpoint was unpickled")

    for module, name in [(pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")]:
        monkeypatch.setattr(module, name, refuse)
    assert_same(load_checkpoint(path), value)


def test_tensors_shared_or_viewed_keep_their_values(tmp_path):
    """A tensor met twice is stored once and comes back as one tensor; views of one storage, non-contiguous
    tensors and bfloat16 keep their values."""
    base = torch.arange(12.0).reshape(3, 4)
    shared = torch.ones(2)
    value = {
        "a": shared,
        "b": shared,
        "rows": [base[0], base[1:]],
        "transposed": base.t(),
        "bf16": torch.randn(3).to(torch.bfloat16),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "views.safetensors"
    save_checkpoint(value, path)
    back = load_checkpoint(path)
    assert back["a"] is back["b"]
    for key in ("rows", "transposed", "bf16", "empty"):
        assert_same(back[key], [t.contiguous() for t in value[key]] if key == "rows" else value[key], key)


def test_has_checkpoint_refuses_an_earlier_versions_pickle(tmp_path):
    run = tmp_path / "runs" / "x"
    path = run / "checkpoints" / "fedit" / "seed0.safetensors"
    assert not has_checkpoint(path, run)
    path.parent.mkdir(parents=True)
    torch.save({"state": ServerState()}, path.with_suffix(".pt"))
    with pytest.raises(UserError) as refused:
        has_checkpoint(path, run)
    assert str(refused.value) == (
        f"{run} holds a checkpoint of an earlier fedpeft version (checkpoints/fedit/seed0.pt), which this version "
        "does not load; start the run again in a new directory."
    )
    save_checkpoint({"state": ServerState()}, path)
    assert has_checkpoint(path, run)  # the current checkpoint is the one a resumed run reads


TINY = [
    "data.groups=[lat1]",
    "data.train_per_group=40",
    "data.test_per_group=20",
    "base.kind=pretrained",
    "budgets=[2]",
    "methods=[{name: fedit, rounds: 2, fraction: 1.0, local_steps: 1, lr: 0.005}]",
    "output.plots=false",
    "output.save_adapters=false",
]


def test_resuming_a_run_with_an_earlier_versions_checkpoint_is_one_sentence_and_exit_2(tmp_path, monkeypatch, capsys):
    from fedpeft.cli import main

    out = tmp_path / "run"
    Experiment(load_config("smoke", TINY), out).run()
    # As a run of an earlier version stands after it was killed during FedIT's rounds.
    (out / "results.jsonl").unlink()
    for part in (out / "parts").glob("fedit-seed0*"):
        part.unlink()
    (out / "checkpoints" / "fedit" / "seed0.safetensors").unlink()
    torch.save({"state": ServerState(), "round": 1}, out / "checkpoints" / "fedit" / "seed0.pt")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the earlier checkpoint was unpickled"))

    args = ["run", "smoke", "--out", str(out), "--resume"]
    for item in TINY:
        args += ["--set", item]
    monkeypatch.setattr(sys, "argv", ["fedpeft", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{out} holds a checkpoint of an earlier fedpeft version (checkpoints/fedit/seed0.pt)" in err
    assert "start the run again in a new directory" in err and "Traceback" not in err
