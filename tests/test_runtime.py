"""The model runtime: adapters swapped in place, base weights untouched by adapter training."""

from __future__ import annotations

import pytest
import torch

from fedpeft.core.errors import UserError
from fedpeft.methods.base import lora_spec
from fedpeft.models.runtime import ClientModel
from fedpeft.training import TrainArgs


def test_reset_adapter_is_seeded_and_starts_at_base(toy_runtime, toy_clients):
    rt = toy_runtime
    test = toy_clients[0].test
    base_predictions = rt.predict(test)
    rt.activate(lora_spec(rt, 4))
    rt.reset_adapter(seed=3)
    first = rt.adapter_state()
    rt.reset_adapter(seed=3)
    second = rt.adapter_state()
    for key in first:
        torch.testing.assert_close(first[key], second[key])
    assert all(float(v.abs().sum()) == 0 for k, v in first.items() if "lora_B" in k)
    # B = 0 and the head copied from the base: the fresh adapter computes the base function.
    assert rt.predict(test) == base_predictions


def test_adapter_training_changes_only_the_adapter(toy_runtime, toy_clients):
    rt = toy_runtime
    base_before = rt.base_state()
    rt.activate(lora_spec(rt, 4))
    rt.reset_adapter(seed=0)
    adapter_before = rt.adapter_state()
    rt.train(toy_clients[0].train, TrainArgs(lr=1e-2, batch_size=16, seed=0, steps=5))
    for key, tensor in rt.base_state().items():
        torch.testing.assert_close(tensor, base_before[key], msg=key)
    changed = [k for k, v in rt.adapter_state().items() if not torch.equal(v, adapter_before[k])]
    assert any("lora_B" in k for k in changed) and any("classifier" in k for k in changed)


def test_swapping_adapters_reproduces_predictions(toy_runtime, toy_clients):
    rt = toy_runtime
    spec = lora_spec(rt, 4)
    states = []
    for client in toy_clients[:2]:
        rt.install(ClientModel(lora=spec), seed=1)
        rt.train(client.train, TrainArgs(lr=5e-2, batch_size=16, seed=1, steps=10))
        states.append((rt.adapter_state(), rt.predict(client.test + toy_clients[3].test)))
    for (state, predictions), client in zip(states, toy_clients[:2], strict=True):
        rt.install(ClientModel(lora=spec, adapter=state))
        assert rt.predict(client.test + toy_clients[3].test) == predictions


def test_two_adapter_shapes_coexist(toy_runtime):
    rt = toy_runtime
    rt.activate(lora_spec(rt, 2))
    small = rt.adapter_state()
    rt.activate(lora_spec(rt, 6))
    large = rt.adapter_state()
    a_small = next(v for k, v in small.items() if "lora_A" in k)
    a_large = next(v for k, v in large.items() if "lora_A" in k)
    assert a_small.shape[0] == 2 and a_large.shape[0] == 6


def test_full_training_with_adapters_present_and_restore(toy_runtime, toy_clients):
    rt = toy_runtime
    rt.activate(lora_spec(rt, 4))
    start = rt.base_state()
    rt.install(ClientModel())
    rt.train(toy_clients[0].train, TrainArgs(lr=1e-2, batch_size=16, seed=0, steps=3), "all")
    moved = rt.base_state()
    assert any(not torch.equal(moved[k], start[k]) for k in start)
    rt.load_base(None)
    for key, tensor in rt.base_state().items():
        torch.testing.assert_close(tensor, start[key])


def test_budget_beyond_model_is_a_user_error(toy_runtime):
    with pytest.raises(UserError, match="exceeds the largest rank"):
        toy_runtime.check_budget(10_000)
