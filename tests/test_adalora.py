"""AdaLoRA through the project's training loop: budget allocation, the exact LoRA conversion, PEFT reloading."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from peft import AdaLoraConfig, PeftModel, get_peft_model

from fedpeft.methods.adalora import ADAPTER, schedule, to_lora
from fedpeft.models.runtime import ClientModel, LoraSpec, unload_adapters
from fedpeft.training import TrainArgs
from fedpeft.worker import build_method


def logits(runtime, examples) -> torch.Tensor:
    return logits_of(runtime.activate(runtime.active), runtime, examples)


def logits_of(model, runtime, examples) -> torch.Tensor:
    batch = runtime.encode(examples)
    batch.pop("labels")
    with torch.no_grad():
        return model.eval()(**batch).logits


def test_schedule_keeps_a_final_allocation_step():
    assert schedule(100, 0.1, 0.3) == (10, 30)
    assert schedule(6, 0.1, 0.3) == (1, 2)
    assert schedule(1, 0.1, 0.3) == (0, 0)  # no final phase: the allocation follows the one step
    for total in (1, 2, 3, 10, 37):
        for warmup, final in ((0.1, 0.3), (0.0, 0.0), (0.5, 0.9), (1.0, 1.0), (2.0, 3.0)):
            tinit, tfinal = schedule(total, warmup, final)
            # PEFT's own check: a budget phase of at least one step, whatever the step count
            AdaLoraConfig(target_modules=["query"], total_step=total, tinit=tinit, tfinal=tfinal)
            assert 0 <= tinit and (tfinal >= 1 or total == 1)


@pytest.mark.parametrize("steps", [1, 2, 3, 10])
def test_every_step_count_trains_and_ends_at_the_budget(steps, toy_runtime, toy_clients):
    """A client with a single step (or two, three, ten) trains, and its adapter keeps r ranks per layer on
    average: the final allocation happens even when no step is left after it."""
    client = toy_clients[0]
    method = build_method({"name": "adalora", "lr": 0.02, "epochs": steps, "batch_size": len(client.train)})
    assert toy_runtime.steps_for(len(client.train), len(client.train), float(steps), None) == steps
    model = method.personalize(toy_runtime, client, None, None, 2, seed=3)
    assert model.lora is not None
    assert sum(r for _, r in model.lora.rank_pattern) == 2 * len(toy_runtime.target_modules)


def test_budget_shrinks_to_r_per_module_and_the_lora_conversion_is_exact(toy_runtime, toy_clients):
    client = toy_clients[0]
    lora = LoraSpec(rank=2, alpha=4.0, targets=("query", "value"))
    toy_runtime.install(ClientModel(lora=lora), seed=1)
    with torch.no_grad():
        for p in toy_runtime.adapter_parameters().values():
            p.add_(0.1)
    lora_state = toy_runtime.adapter_state()
    before = logits(toy_runtime, client.test)

    method = build_method({"name": "adalora", "lr": 0.02, "epochs": 4})
    total = toy_runtime.steps_for(len(client.train), 16, 4.0, None)
    config = method.adalora_config(toy_runtime, 2, total)
    assert (config.init_r, config.target_r, config.deltaT, config.orth_reg_weight) == (3, 2, 1, 0.1)
    toy_runtime.detach_adapters()
    torch.manual_seed(0)
    model = get_peft_model(toy_runtime.base_model, config, adapter_name=ADAPTER)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    steps: list[int] = []

    def allocate(step: int) -> None:
        steps.append(step)
        model.base_model.update_and_allocate(step)

    toy_runtime.train(
        client.train, TrainArgs(lr=0.02, batch_size=16, seed=3, steps=total, model=model, after_step=allocate), params
    )
    assert steps == list(range(total))
    pattern = config.rank_pattern
    modules = len(toy_runtime.target_modules)
    assert len(pattern) == modules and sum(sum(kept) for kept in pattern.values()) == 2 * modules
    adalora_logits = logits_of(model, toy_runtime, client.test)
    for ranknum in (m.ranknum[ADAPTER] for m in model.modules() if hasattr(m, "ranknum")):
        ranknum.requires_grad_(True)  # as some PEFT versions leave it: folding reads it without autograd's warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        spec, tensors = to_lora(model, ["classifier"], 0.0)
    unload_adapters(model)

    assert sum(r for _, r in spec.rank_pattern) == 2 * modules
    toy_runtime.install(ClientModel(lora=spec, adapter=tensors))
    torch.testing.assert_close(logits(toy_runtime, client.test), adalora_logits, rtol=1e-5, atol=1e-6)
    # The plain LoRA path is as it was before AdaLoRA borrowed the base model.
    toy_runtime.install(ClientModel(lora=lora, adapter=lora_state))
    torch.testing.assert_close(logits(toy_runtime, client.test), before)


def test_orthogonal_regularization_enters_the_loss(toy_runtime, toy_clients):
    """The method trains with AdaLoRA's orthogonal penalty: the same client with the penalty off ends elsewhere
    (the dropout masks and batches are the same: the seed is)."""
    client = toy_clients[0]
    adapters = {}
    for weight in (0.1, 0.0):
        method = build_method({"name": "adalora", "lr": 0.02, "epochs": 2, "orth_reg_weight": weight})
        model = method.personalize(toy_runtime, client, None, None, 2, 5)
        adapters[weight] = model.adapter
    assert adapters[0.1].keys() == adapters[0.0].keys()
    with_penalty, without = adapters[0.1], adapters[0.0]
    moved = [
        k
        for k in with_penalty
        if with_penalty[k].shape != without[k].shape or not torch.allclose(with_penalty[k], without[k], atol=1e-4)
    ]
    assert moved  # kept ranks or values


@pytest.mark.parametrize("budget", [1, 3])
def test_personalized_adapter_reloads_with_plain_peft(budget, toy_runtime, toy_clients, toy_worker_factory):
    pristine = copy.deepcopy(toy_runtime.base_model)
    worker = toy_worker_factory([{"name": "adalora", "lr": 0.02}])
    method, client = worker.methods["adalora"], toy_clients[2]
    model = method.personalize(toy_runtime, client, None, None, budget, seed=7)
    assert sum(r for _, r in model.lora.rank_pattern) <= budget * len(toy_runtime.target_modules)
    toy_runtime.install(model)
    expected = logits(toy_runtime, client.test)
    path = worker.adapters.save("adalora", budget, client.client_id)

    reloaded = PeftModel.from_pretrained(pristine, path).eval()
    batch = toy_runtime.encode(client.test)
    batch.pop("labels")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, expected, rtol=1e-5, atol=1e-6)
