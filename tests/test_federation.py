"""Heterogeneous federations: architecture assignment, lazy per-architecture runtimes, per-group aggregation."""

from __future__ import annotations

import random

import pytest
import torch

from fedpeft.core.config import ExperimentConfig, validate
from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import UserError
from fedpeft.core.types import ClientUpdate
from fedpeft.data.types import ClientData, FederatedData
from fedpeft.engine.local import LocalEngine
from fedpeft.federation import assign_architectures
from fedpeft.methods.families.per_architecture import ArchitectureGroups

WORDS = "red green blue cat dog bird one two three".split()


def _example(rng: random.Random) -> dict:
    # Made-up words too, so that a 300-token BPE vocabulary does not saturate on the corpus.
    word = rng.choice(WORDS) if rng.random() < 0.5 else "".join(rng.choice("abcdefghijklmnop") for _ in range(5))
    return {"prompt": f"say {word}", "response": word, "group": "g"}


def generation_data(groups: str = "ab", clients: int = 4) -> FederatedData:
    rng = random.Random(0)
    members = [
        ClientData(f"c{i}", groups[i % len(groups)], "seen", [_example(rng) for _ in range(12)], [_example(rng)])
        for i in range(clients)
    ]
    return FederatedData("toy", "generation", None, list(groups), members, base_train=[_example(rng) for _ in range(8)])


HETERO = {
    "models": {
        "llama": {"name": "tiny-llama", "vocab_size": 300, "overrides": {"num_hidden_layers": 5, "hidden_size": 32}},
        "qwen": {"name": "tiny-qwen2", "vocab_size": 300, "overrides": {"num_hidden_layers": 5}},
    },
    "assign": {"groups": {"a": "llama", "b": "qwen"}},
    "methods": [{"name": "fedit", "rounds": 1, "fraction": 1.0, "local_steps": 1, "rank": 2, "batch_size": 4}],
}


def test_assignment_rules_apply_in_order():
    cfg = validate(
        {
            "models": {"s": {"name": "tiny-llama"}, "m": {"name": "tiny-llama"}, "l": {"name": "tiny-qwen2"}},
            "assign": {"clients": {"c5": "l"}, "groups": {"b": "m"}, "counts": {"s": 2, "l": 1}, "default": "s"},
        }
    )
    members = [ClientData(f"c{i}", "a" if i < 4 else "b", "seen", [], []) for i in range(7)]
    assert assign_architectures(cfg, members) == {
        "c0": "s", "c1": "s", "c2": "l", "c3": "s", "c4": "m", "c5": "l", "c6": "m",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"models": {"s": {"name": "tiny-llama"}}, "model": {"name": "tiny-qwen2"}}, "either `model`"),
        ({"assign": {"default": "s"}}, "needs `models`"),
        ({"models": {"s": {"name": "tiny-llama"}}, "assign": {"default": "x"}}, "['x']"),
        ({"models": {"s": {"name": "tiny-llama"}}, "base": {"kind": "federated"}}, "pretrained or centralized"),
    ],
)
def test_bad_architecture_configs_are_refused(raw, message):
    with pytest.raises(UserError, match="Invalid config") as err:
        validate(raw)
    assert message in str(err.value)


def test_a_client_without_architecture_is_refused():
    cfg = validate({"models": {"s": {"name": "tiny-llama"}}, "assign": {"counts": {"s": 1}}})
    with pytest.raises(UserError, match="c1 gets no architecture"):
        assign_architectures(cfg, [ClientData("c0", "a", "seen", [], []), ClientData("c1", "a", "seen", [], [])])


def test_heterogeneous_worker_loads_each_architecture_once(tmp_path, monkeypatch):
    import fedpeft.models.table as table
    from fedpeft.worker import Worker

    loads: list[str] = []
    original = table.load_model

    def counting(cfg, **kwargs):
        loads.append(cfg.name)
        return original(cfg, **kwargs)

    monkeypatch.setattr(table, "load_model", counting)
    worker = Worker(validate(HETERO), tmp_path, data=generation_data())
    assert loads == ["tiny-llama"]  # the first architecture; the other waits until a client needs it
    method = worker.methods["fedit"]
    assert isinstance(method, ArchitectureGroups)
    state = method.init_server(worker.runtime, seed=0)
    state = LocalEngine(worker).run_rounds("fedit", method, state, ["c0", "c1", "c2", "c3"], seed=0, meter=CostMeter())
    worker.personalize("fedit", 0, "c3", state)
    assert loads == ["tiny-llama", "tiny-qwen2"]
    assert worker.runtime_for("c0") is worker.runtime
    assert worker.runtime_for("c1").loaded.family == "qwen2" and worker.runtime_for("c1").architecture == "qwen"
    assert worker.runtime_for("c1") is worker.runtime_for("c3")
    # Each family has its own tokenizer.
    assert worker.runtime_for("c0").tokenizer.get_vocab() != worker.runtime_for("c1").tokenizer.get_vocab()


def test_homogeneous_methods_aggregate_within_each_architecture_group(tmp_path):
    from fedpeft.worker import Worker

    worker = Worker(validate(HETERO), tmp_path, data=generation_data())
    method = worker.methods["fedit"]
    state = method.init_server(worker.runtime, seed=0)
    groups = state.groups
    llama_key = next(k for k in groups["llama"].tensors if "lora_A" in k)
    assert groups["llama"].tensors[llama_key].shape[1] == 32 and groups["qwen"].tensors[llama_key].shape[1] == 64
    updates = []
    for i, client in enumerate(["c0", "c1", "c2", "c3"]):
        arch = groups["llama" if client in ("c0", "c2") else "qwen"]
        tensors = {k: torch.full_like(v, float(i)) for k, v in arch.tensors.items()}
        updates.append(ClientUpdate(client, tensors, weight=1.0 + i))
    new_state, metrics = method.aggregate(state, iter(updates))
    new_groups = new_state.groups
    # llama: clients 0 (weight 1) and 2 (weight 3) -> (0 * 1 + 2 * 3) / 4; qwen: 1 (w 2) and 3 (w 4) -> 14 / 6.
    torch.testing.assert_close(
        new_groups["llama"].tensors[llama_key], torch.full_like(new_groups["llama"].tensors[llama_key], 1.5)
    )
    torch.testing.assert_close(
        new_groups["qwen"].tensors[llama_key], torch.full_like(new_groups["qwen"].tensors[llama_key], 14 / 6)
    )
    # The round loop counts the wrapper's rounds; the wrapper counts each group's.
    assert metrics["clients"] == 4.0 and new_state.round == state.round
    assert new_groups["llama"].round == new_groups["qwen"].round == 1
    assert method.payload(new_state, "c3").tensors[llama_key].shape[1] == 64


def test_homogeneous_configs_are_not_wrapped(toy_worker_factory):
    worker = toy_worker_factory([{"name": "fedit", "rounds": 1}])
    assert not isinstance(worker.methods["fedit"], ArchitectureGroups)
    assert worker.federation.names == ["default"] and not worker.federation.heterogeneous
    assert ExperimentConfig().models == {}
