"""BayesTune-LoRA and the PSG: penalties, straight-through clamp, pruning, hooks, export to plain PEFT."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from fedpeft.adapters.bayestune import (
    SCALE_MIN,
    PrunedAdapters,
    RankScaleHooks,
    bayestune_penalties,
    check_budget,
    clamp_st,
    finetune_pruned,
    fold_scales,
    initial_spec,
    lora_layers,
    prune_to_budget,
    pruned_spec,
)
from fedpeft.adapters.psg import make_generator, regress_toward, regression_loss
from fedpeft.core.errors import UserError
from fedpeft.methods.bayestune_lora import BayesTuneLoraConfig
from fedpeft.models.runtime import ClientModel


def test_penalties_match_a_hand_computation():
    b1 = torch.tensor([[1.0, -2.0], [0.0, 3.0]])  # column L1 norms 1 and 5
    b2 = torch.tensor([[-1.0], [1.0], [2.0]])  # column L1 norm 4
    scales = [torch.tensor([0.5, 2.0]), torch.tensor([4.0])]
    sparsity, prior = bayestune_penalties([b1, b2], scales)
    # L_s = 1/0.5 + 5/2 + 4/4; L_p = log(0.5 * 2 * 4) + 100 * (0.5 + 2 + 4)
    torch.testing.assert_close(sparsity, torch.tensor(5.5))
    torch.testing.assert_close(prior, torch.tensor(math.log(4.0) + 650.0))
    # With B0: only how far each column moved counts (column 0 of b1 did not move).
    b1_init = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    sparsity, _ = bayestune_penalties([b1, b2], scales, [b1_init, torch.zeros(3, 1)])
    torch.testing.assert_close(sparsity, torch.tensor(5.0 / 2.0 + 1.0))


def test_penalties_use_clamped_scales_and_pass_gradients_straight_through():
    raw = torch.tensor([-1.0, 0.5], requires_grad=True)
    b = torch.tensor([[2.0, 1.0]])
    sparsity, prior = bayestune_penalties([b], [raw])
    # -1 is clamped to 1e-4 in the forward pass.
    torch.testing.assert_close(sparsity, torch.tensor(2.0 / 1e-4 + 1.0 / 0.5))
    torch.testing.assert_close(prior, torch.tensor(math.log(1e-4) + 0.01 + math.log(0.5) + 50.0))
    (sparsity + prior).backward()
    # d/dlambda (|B|/lambda + log lambda + 100 lambda) at the clamped value, passed to the raw value unchanged.
    expected = torch.tensor([-2.0 / 1e-8 + 1e4 + 100.0, -1.0 / 0.25 + 2.0 + 100.0])
    torch.testing.assert_close(raw.grad, expected)


def test_straight_through_clamp():
    values = torch.tensor([-0.5, 5e-5, 0.5, 2000.0], requires_grad=True)
    clamped = clamp_st(values)
    torch.testing.assert_close(clamped.detach(), torch.tensor([1e-4, 1e-4, 0.5, 1000.0]))
    (clamped * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_pruning_keeps_the_top_r_times_l_and_drops_empty_modules():
    scores = {
        "a": torch.tensor([0.5, 0.1, 0.9]),
        "b": torch.tensor([0.2, 0.3, 0.05]),
        "c": torch.tensor([0.01, 0.02, 0.03]),
    }
    one = prune_to_budget(scores, 1)  # 3 ranks: 0.9, 0.5, 0.3
    assert {k: v.tolist() for k, v in one.items()} == {"a": [0, 2], "b": [1]}
    two = prune_to_budget(scores, 2)  # 6 ranks: c keeps none
    assert {k: v.tolist() for k, v in two.items()} == {"a": [0, 1, 2], "b": [0, 1, 2]}
    spec = pruned_spec(one, 1, 2.0, 0.0)
    assert spec.targets == ("a", "b")
    assert dict(spec.rank_pattern) == {"a": 2, "b": 1} and dict(spec.alpha_pattern) == {"a": 4.0, "b": 2.0}


def test_one_set_of_scales_gives_nested_structures_of_exact_size():
    generator = torch.Generator().manual_seed(0)
    scores = {f"m{i}": torch.rand(8, generator=generator) for i in range(5)}
    scores["m2"][:] = SCALE_MIN  # ties at the floor are broken by position, deterministically
    previous: dict[str, set[int]] = {}
    for budget in (1, 2, 3, 4, 8):
        structure = prune_to_budget(scores, budget)
        assert sum(v.numel() for v in structure.values()) == budget * 5
        current = {k: set(v.tolist()) for k, v in structure.items()}
        assert all(previous[k] <= current.get(k, set()) for k in previous)
        previous = current


def test_pruning_orders_as_torch_sorts_descending_and_stable():
    # The one definition of pruning is numpy (fedpeft.analysis.scales.kept_ranks, which the report uses too); on
    # torch tensors it keeps what a stable descending torch.sort of the float32 scores keeps, ties, NaN and
    # infinities included.
    generator = torch.Generator().manual_seed(0)
    for trial in range(60):
        modules, ranks = (
            int(torch.randint(1, 6, (1,), generator=generator)),
            int(torch.randint(1, 9, (1,), generator=generator)),
        )
        if trial % 3:
            scores = {f"m{i}": torch.rand(ranks, generator=generator, dtype=torch.float64) for i in range(modules)}
        else:  # many ties
            scores = {f"m{i}": torch.randint(0, 4, (ranks,), generator=generator) / 4.0 for i in range(modules)}
        scores["m0"][0] = math.nan if trial % 5 == 0 else scores["m0"][0]
        scores[f"m{modules - 1}"][-1] = math.inf if trial % 7 == 0 else scores[f"m{modules - 1}"][-1]
        flat = torch.cat([s.float() for s in scores.values()])
        for budget in range(ranks + 2):
            keep = torch.zeros(flat.numel(), dtype=torch.bool)
            keep[torch.sort(flat, descending=True, stable=True).indices[: budget * modules]] = True
            expected = {
                name: kept.tolist()
                for name, part in zip(scores, keep.split(ranks), strict=True)
                if (kept := part.nonzero().flatten()).numel()
            }
            structure = prune_to_budget(scores, budget)
            assert {name: kept.tolist() for name, kept in structure.items()} == expected, (trial, budget)
            assert all(kept.dtype == torch.int64 for kept in structure.values())


def test_budget_outside_r_max_is_a_user_error():
    assert check_budget(16, 16) == 16
    for bad in (0, 17, None):
        with pytest.raises(UserError, match="r_max=16"):
            check_budget(bad, 16)


def test_psg_init_and_clamped_output():
    generator = make_generator(3, 4, seed=0)
    assert generator.hidden.weight.shape == (12, 6) and generator.output.weight.shape == (12, 12)
    for layer in (generator.hidden, generator.output):
        # Xavier normal with gain 1e-6: std = 1e-6 * sqrt(2 / (fan_in + fan_out)).
        std = 1e-6 * math.sqrt(2.0 / sum(layer.weight.shape))
        assert float(layer.weight.detach().abs().max()) < 6 * std
        assert float(layer.weight.detach().std()) == pytest.approx(std, rel=0.5)
        torch.testing.assert_close(layer.bias, torch.full_like(layer.bias, 1e-4))
    statistics = torch.tensor([0.1, 1.0, -0.2, 0.8, 0.0, 1.2])
    # A fresh PSG outputs 1e-4 (the scales' initial value) up to the tiny weights' contribution.
    torch.testing.assert_close(generator.scales(statistics), torch.full((3, 4), 1e-4), atol=1e-9, rtol=0)
    with torch.no_grad():
        generator.output.bias.fill_(-1.0)
    assert torch.all(generator.scales(statistics) == 1e-4)  # clamped output
    generator.scales(statistics).sum().backward()
    assert torch.all(generator.output.bias.grad == 1.0)  # straight-through gradient below the floor
    same = make_generator(3, 4, seed=0)
    other = make_generator(3, 4, seed=1)
    assert torch.equal(make_generator(3, 4, seed=0).hidden.weight, same.hidden.weight)
    assert not torch.equal(other.hidden.weight, same.hidden.weight)


def test_regression_moves_the_psg_toward_the_target():
    statistics = torch.tensor([0.5, 1.0, -0.5, 2.0])
    target = torch.tensor([[0.02, 0.001, -3.0], [0.01, 0.03, 0.004]])
    goal = target.clamp_min(1e-4)
    for reduction, total in (("mean", float((goal - 1e-4).abs().mean())), ("sum", float((goal - 1e-4).abs().sum()))):
        generator = make_generator(2, 3, seed=0)
        before, after = regress_toward(generator, statistics, target, steps=20, lr=1e-3, reduction=reduction)
        assert before == pytest.approx(total, rel=1e-3)
        assert after < 0.5 * before


def test_regression_loss_sum_is_the_number_of_scales_times_the_mean():
    predicted = torch.tensor([[0.5, 1e-4], [2.0, 0.25]], requires_grad=True)
    target = torch.tensor([[0.25, 1e-4], [1.0, 1.0]])
    # |differences| = 0.25, 0, 1.0, 0.75: sum 2.0 over the 4 scales, mean 0.5.
    total = regression_loss(predicted, target, "sum")
    torch.testing.assert_close(total, torch.tensor(2.0))
    torch.testing.assert_close(regression_loss(predicted, target, "mean"), torch.tensor(0.5))
    (grad_sum,) = torch.autograd.grad(total, predicted)
    (grad_mean,) = torch.autograd.grad(regression_loss(predicted, target, "mean"), predicted)
    torch.testing.assert_close(grad_sum, torch.tensor([[1.0, 0.0], [1.0, -1.0]]))
    torch.testing.assert_close(grad_mean, grad_sum / 4)
    with pytest.raises(ValueError, match="median"):
        regression_loss(predicted, target, "median")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, 2 * 5),  # 48 examples at batch 10: 2 epochs of ceil(48 / 10) = 5 steps
        ({"stage1_epochs": 1.0}, 5),
        ({"stage1_steps": 3}, 3),  # the cap ends stage 1 early
        ({"stage1_steps": 50}, 10),  # a cap above 2 epochs changes nothing
    ],
)
def test_bayestune_lora_stage1_runs_epochs_of_batches_up_to_the_cap(settings, expected, toy_runtime, toy_clients):
    from fedpeft.core.types import ServerState
    from fedpeft.worker import build_method

    method = build_method({"name": "bayestune_lora", "r_max": 2, "r_init": 4, "batch_size": 10, **settings})
    assert (BayesTuneLoraConfig(name="bayestune_lora").stage1_epochs, method.cfg.r_init) == (2.0, 4)
    client = toy_clients[0]
    assert len(client.train) == 48
    steps: list[int] = []
    handle = register_optimizer_step_post_hook(lambda *_: steps.append(1))
    try:
        scales = method.client_scales(toy_runtime, client, ServerState(), None, seed=0)
    finally:
        handle.remove()
    assert len(steps) == expected and scales.metrics["steps"] == expected
    assert scales.scales.shape == (len(toy_runtime.target_modules), 4)


def test_hooks_scale_each_rank_and_fold_into_a_gives_the_same_function(toy_runtime, toy_clients):
    rt = toy_runtime
    spec = initial_spec(rt, 4, 2.0, 0.0)
    rt.install(ClientModel(lora=spec), seed=0)
    with torch.no_grad():
        for name, p in rt.adapter_parameters().items():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    names = list(lora_layers(rt))
    scales = torch.tensor([[0.5, -1.0, 2.0, 1.0]] * len(names))
    batch = rt.encode(toy_clients[0].test)
    batch.pop("labels")
    model = rt.activate(spec).eval()
    with torch.no_grad():
        plain = model(**batch).logits
        with RankScaleHooks(rt, list(scales)):
            hooked = model(**batch).logits
        after = model(**batch).logits
    assert not torch.allclose(hooked, plain)
    torch.testing.assert_close(after, plain)  # the hooks are gone on exit
    kept = {name: scales[i].clamp_min(SCALE_MIN) for i, name in enumerate(names)}
    rt.load_adapter(fold_scales(rt.adapter_state(), kept))
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, hooked)


def test_trainable_scales_receive_gradients_through_the_hooks(toy_runtime, toy_clients):
    rt = toy_runtime
    rt.install(ClientModel(lora=initial_spec(rt, 4, 2.0, 0.0)), seed=0)
    with torch.no_grad():
        for name, p in rt.adapter_parameters().items():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    scales = torch.nn.Parameter(torch.full((len(rt.target_modules), 4), 0.5))
    scales.data[0, 1] = -2.0  # below the floor: clamped forward, gradient straight through
    batch = rt.encode(toy_clients[0].train[:8])
    with RankScaleHooks(rt, scales):
        rt.activate(rt.active).train()(**batch).loss.backward()
    assert scales.grad is not None and scales.grad[0, 1] != 0 and bool(torch.all(scales.grad.abs().sum(1) > 0))


def test_exported_adapter_with_removed_modules_loads_with_plain_peft(toy_runtime, toy_clients, tmp_path):
    from peft import PeftModel

    from fedpeft.core.config import ExperimentConfig
    from fedpeft.data.types import FederatedData
    from fedpeft.worker import Worker

    rt = toy_runtime
    pristine = copy.deepcopy(rt.base_model)
    cfg = BayesTuneLoraConfig(name="bayestune_lora", r_max=2, lr=1e-2, finetune_epochs=1.0)
    # Module 1 and 3 hold only the smallest scales: at budget 1 they are removed.
    scales = torch.tensor([[0.9, 0.8, 0.1, 0.1], [1e-3] * 4, [0.7, 0.6, 0.5, 0.1], [-1.0] * 4])
    model = finetune_pruned(rt, toy_clients[0].train, scales, 1, cfg, seed=3, pruned=PrunedAdapters())
    names = [name for name, _ in rt.target_modules]
    assert model.lora is not None and dict(model.lora.rank_pattern) == {names[0]: 2, names[2]: 2}
    rt.install(model)
    test = toy_clients[0].test
    batch = rt.encode(test)
    batch.pop("labels")
    with torch.no_grad():
        expected = rt.activate(model.lora).eval()(**batch).logits

    data = FederatedData("toy", "classification", ["no", "yes"], ["g"], toy_clients)
    worker = Worker(ExperimentConfig(methods=[{"name": "lora"}], budgets=[1]), tmp_path, data=data, runtime=rt)
    target = worker.adapters.save("bayestune_lora", 1, "c0")
    loaded = PeftModel.from_pretrained(pristine, target).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected, rtol=1e-5, atol=1e-5)
    wrapped = {n.removeprefix("base_model.model.") for n, m in loaded.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == {names[0], names[2]}  # removed modules carry no LoRA at all
