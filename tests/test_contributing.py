"""The example method of docs/contributing.md, run as written: through the method matrix, an experiment, and against
FedIT (with no momentum the two compute the same numbers)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from fedpeft.core.registry import METHODS
from tests import test_methods as matrix

DOC = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"
NAME = "fedavgm_lora"


@pytest.fixture(scope="module")
def example_method(tmp_path_factory) -> type:
    """The doc's code block imported as a module (which registers the method once per test session)."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None, "docs/contributing.md has no python block"
    if NAME not in METHODS:
        path = tmp_path_factory.mktemp("contributed") / f"{NAME}.py"
        path.write_text(code.group(1))
        spec = importlib.util.spec_from_file_location(f"contributed_{NAME}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return METHODS.get(NAME)


@pytest.mark.parametrize(
    "invariant",
    [
        matrix.test_aggregating_identical_updates_is_identity,
        matrix.test_federated_round_runs_and_keeps_private_keys_home,
        matrix.test_personalize_gives_an_evaluable_model,
        matrix.test_training_changes_only_adapter_parameters,
    ],
)
def test_example_passes_the_method_matrix(example_method, invariant, request):
    invariant(NAME, request)


def test_example_adapter_reads_back(example_method, request, tmp_path):
    matrix.test_saved_adapter_reads_back(NAME, request, tmp_path)


def test_example_without_momentum_is_fedit(example_method, toy_runtime, toy_clients):
    fedit = matrix.make("fedit")
    example = example_method(example_method.Config(name=NAME, **{**matrix.FAST, "momentum": 0.0}))
    theirs = fedit.init_server(toy_runtime, 0)
    ours = type(example.init_server(toy_runtime, 0))(tensors=dict(theirs.tensors))  # both from FedIT's adapter
    for round_ in range(2):
        pairs = [
            (
                example.client_update(toy_runtime, c, example.payload(ours, c.client_id), None, seed=round_)[0],
                fedit.client_update(toy_runtime, c, fedit.payload(theirs, c.client_id), None, seed=round_)[0],
            )
            for c in toy_clients[:2]
        ]
        ours, _ = example.aggregate(ours, iter(p[0] for p in pairs))
        theirs, _ = fedit.aggregate(theirs, iter(p[1] for p in pairs))
    for key, tensor in theirs.tensors.items():
        torch.testing.assert_close(ours.tensors[key], tensor, msg=key)


def test_momentum_changes_the_global_adapter(example_method, toy_runtime, toy_clients):
    plain = example_method(example_method.Config(name=NAME, **{**matrix.FAST, "momentum": 0.0}))
    heavy = example_method(example_method.Config(name=NAME, **{**matrix.FAST, "momentum": 0.9}))
    states = [plain.init_server(toy_runtime, 0), heavy.init_server(toy_runtime, 0)]
    for round_ in range(2):
        for i, method in enumerate((plain, heavy)):
            updates = [
                method.client_update(toy_runtime, c, method.payload(states[i], c.client_id), None, seed=round_)[0]
                for c in toy_clients[:2]
            ]
            states[i], _ = method.aggregate(states[i], iter(updates))
    assert states[1].velocity and any(
        not torch.allclose(states[0].tensors[k], states[1].tensors[k]) for k in states[0].tensors
    )


def test_example_runs_in_an_experiment(example_method, tmp_path):
    from fedpeft.core.config import load_config
    from fedpeft.runner import Experiment

    overrides = [
        "data.groups=[lat1, lat3]",
        "base.kind=pretrained",
        "budgets=[2]",
        "output.plots=false",
        f"methods=[{{name: {NAME}, rounds: 2, fraction: 1.0, local_steps: 2, lr: 0.005, momentum: 0.5}}]",
    ]
    out = Experiment(load_config("smoke", overrides), tmp_path / "run").run()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    ours = [r for r in records if r["method"] == NAME and r["metric"] == "accuracy"]
    assert ours and all(r["round"] == 2 for r in ours)
    assert "momentum: 0.5" in (out / "config.yaml").read_text()  # the resolved config names the method's keys
