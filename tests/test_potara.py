"""Potara's closed-form mixing weight, per-sample gradients, Fisher merging and the LoRA-splitting baselines."""

from __future__ import annotations

import math
import random

import pytest
import torch

from fedpeft.adapters.gradients import per_sample_gradients
from fedpeft.methods.families.lora_keys import is_lora, is_lora_a, is_lora_b
from fedpeft.methods.fedalt import Mixer, mixture, rest_of_world
from fedpeft.methods.fisher_merge import fisher_weighted_merge
from fedpeft.methods.potara import alpha_from_traces, merge_states, mixing_weight, variance_terms
from fedpeft.models.runtime import ClientModel
from fedpeft.worker import build_method
from tests.conftest import WORDS

FAST = {"rounds": 2, "fraction": 1.0, "local_steps": 3, "lr": 5e-2}


def traces(grads_fed, grads_local, eps=1e-8):
    s2_f, s2_l, s_fl = variance_terms(grads_fed, grads_local, eps)
    return float(s2_f.sum()), float(s2_l.sum()), float(s_fl.sum())


def bound(a, tr_f, tr_l, tr_fl):
    return a**2 * tr_f + (1 - a) ** 2 * tr_l + 2 * a * (1 - a) * tr_fl


def random_gradients(seed: int, n: int = 30, j: int = 40, coupling: float = 0.7):
    generator = torch.Generator().manual_seed(seed)
    fed = torch.randn(n, j, generator=generator) * torch.rand(j, generator=generator) * 3
    noise = torch.randn(n, j, generator=generator) * torch.rand(j, generator=generator) * 3
    return fed, coupling * fed + noise


@pytest.mark.parametrize("seed", range(6))
def test_mixing_weight_is_the_argmin_of_the_variance_bound(seed):
    fed, local = random_gradients(seed, coupling=0.3 * seed - 0.6)
    alpha = mixing_weight(fed, local)
    tr_f, tr_l, tr_fl = traces(fed, local)
    grid = torch.linspace(0, 1, 100001, dtype=torch.float64)
    best = float(grid[torch.argmin(bound(grid, tr_f, tr_l, tr_fl))])
    assert alpha == pytest.approx(best, abs=2e-5)
    assert 0.0 <= alpha <= 1.0
    assert bound(alpha, tr_f, tr_l, tr_fl) <= min(tr_f, tr_l) * (1 + 1e-12)


def test_mixing_weight_by_hand():
    # Coordinate 0: identical gradients (rho = 1, s_FL = 1); coordinate 1: constant local gradient (rho = 0).
    # s2_F = (1, 1/2), s2_L = (1, 1) -> alpha = (0 + 1) / (0 + 1.5) = 2/3.
    fed = torch.tensor([[1.0, 0.0], [-1.0, 2.0]])
    local = torch.tensor([[1.0, 1.0], [-1.0, 1.0]])
    assert mixing_weight(fed, local, eps=1e-12) == pytest.approx(2 / 3, rel=1e-9)


def test_mixing_weight_without_correlation_is_the_trace_ratio():
    fed, noise = random_gradients(11)
    local = -0.8 * fed + 0.1 * noise  # negatively correlated everywhere: every rho is clipped to 0
    s2_f, s2_l, s_fl = variance_terms(fed, local)
    assert float(s_fl.abs().max()) == 0.0
    expected = float(s2_l.sum() / (s2_f.sum() + s2_l.sum()))
    assert mixing_weight(fed, local) == pytest.approx(expected, rel=1e-12)


def test_mixing_weight_stays_in_the_unit_interval_on_extreme_inputs():
    generator = torch.Generator().manual_seed(3)
    for scale_f, scale_l in [(1e-6, 1.0), (1.0, 1e-6), (1e3, 1e-3), (0.0, 1.0)]:
        fed = torch.randn(30, 50, generator=generator) * scale_f
        local = fed * 0.5 + torch.randn(30, 50, generator=generator) * scale_l
        assert 0.0 <= mixing_weight(fed, local) <= 1.0
    zero = torch.zeros(30, 5)
    assert mixing_weight(zero, zero) == 0.5  # both flat: f does not depend on a
    assert alpha_from_traces(2.0, 1.0, 5.0) == 0.5  # a non-convex bound (impossible after clipping) is refused


def test_clipped_cross_covariance_is_bounded_by_both_variances():
    fed, local = random_gradients(5, coupling=1.5)
    s2_f, s2_l, s_fl = variance_terms(fed, local)
    assert bool((s_fl >= 0).all()) and bool((s_fl <= torch.minimum(s2_f, s2_l)).all())


def test_fisher_merge_golden_numbers():
    fed = torch.tensor([1.0, 2.0, 0.0])
    local = torch.tensor([3.0, 0.0, 4.0])
    fisher_fed = torch.tensor([1.0, 3.0, 0.0])
    fisher_local = torch.tensor([1.0, 1.0, 0.0])
    merged = fisher_weighted_merge(fed, local, fisher_fed, fisher_local, eps=1e-12)
    torch.testing.assert_close(merged, torch.tensor([2.0, 1.5, 2.0]))


def test_merge_states_weighs_each_tensor():
    fed = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([2.0])}
    local = {"a": torch.tensor([3.0, 5.0]), "b": torch.tensor([0.0])}
    merged = merge_states(fed, local, {"*": 0.25, "b": 0.5})
    torch.testing.assert_close(merged["a"], torch.tensor([2.5, 4.0]))
    torch.testing.assert_close(merged["b"], torch.tensor([1.0]))


# ------------------------------------------------------------------------------------- per-sample gradients


def install_trained_lora(runtime, seed=0):
    method = build_method({"name": "potara", "rank": 2})
    spec = method.spec(runtime)
    runtime.install(ClientModel(lora=spec), seed=seed)
    generator = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(v.shape, generator=generator) * 0.3 for k, v in runtime.adapter_state().items()}
    runtime.load_adapter(state)
    return spec, state


def test_per_sample_gradients_equal_single_sample_backward(toy_runtime):
    rng = random.Random(0)
    examples = [
        {"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))), "text_pair": None, "label": i % 2}
        for i in range(9)
    ]
    install_trained_lora(toy_runtime)
    toy_runtime.peft.train()  # the function must switch dropout off itself and restore the mode
    grads, layout = per_sample_gradients(toy_runtime, examples)
    assert toy_runtime.peft.training
    assert grads.shape == (9, sum(shape.numel() for _, shape in layout))
    assert any(not is_lora(k) for k, _ in layout)  # the head is part of the adapter
    params = {k: p for k, p in zip([k for k, _ in layout], toy_runtime.adapter_parameters().values(), strict=True)}
    toy_runtime.peft.eval()
    for row, example in enumerate(examples):
        for p in params.values():
            p.requires_grad_(True)
            p.grad = None
        toy_runtime.peft(**toy_runtime.encode([example])).loss.backward()
        expected = torch.cat([params[k].grad.reshape(-1) for k, _ in layout])
        torch.testing.assert_close(grads[row], expected, rtol=1e-4, atol=1e-6)
    lora_only, lora_layout = per_sample_gradients(toy_runtime, examples[:3], select=is_lora)
    assert all(is_lora(k) for k, _ in lora_layout) and lora_only.shape[0] == 3


# ------------------------------------------------------------------------------------- methods


def test_potara_merges_every_tensor_convexly_and_reports_its_parts(toy_runtime, toy_clients):
    for granularity in ("global", "ab", "module"):
        method = build_method({"name": "potara", **FAST, "local_rounds": 2, "granularity": granularity})
        state = method.init_server(toy_runtime, seed=0)
        update, _ = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
        state.tensors = update.tensors
        model = method.personalize(toy_runtime, toy_clients[1], state, None, None, seed=2)
        fed, local = model.variants["fedit"].adapter, model.variants["local"].adapter
        assert set(model.info) >= {"alpha", "merge_s", "train_s"} and 0 <= model.info["alpha"] <= 1
        weights = set()
        for key, merged in model.adapter.items():
            span = fed[key] - local[key]
            if float(span.abs().max()) < 1e-6:
                continue
            index = span.abs().argmax()
            a = float((merged.flatten()[index] - local[key].flatten()[index]) / span.flatten()[index])
            torch.testing.assert_close(merged, a * fed[key] + (1 - a) * local[key], rtol=1e-5, atol=1e-6)
            assert -1e-6 <= a <= 1 + 1e-6
            weights.add(round(a, 5))
        if granularity == "global":
            assert weights == {round(model.info["alpha"], 5)}
        if granularity == "ab":
            assert {round(model.info["alpha_A"], 5), round(model.info["alpha_B"], 5)} >= weights - {
                round(model.info["alpha"], 5)
            }


def test_potara_local_phase_starts_from_the_federated_initialization(toy_runtime, toy_clients):
    method = build_method({"name": "potara", **FAST, "local_rounds": 0, "parts": True})
    state = method.init_server(toy_runtime, seed=0)
    model = method.personalize(toy_runtime, toy_clients[0], state, None, None, seed=9)
    for key, tensor in state.tensors.items():  # no local steps: the local part is the initialization itself
        torch.testing.assert_close(model.variants["local"].adapter[key], tensor)


def test_potara_local_round_is_a_fedit_round_of_work(toy_runtime, toy_clients, monkeypatch):
    # With local_epochs set, a round of either phase is that many passes over the data (local_steps is unused).
    entry = {"name": "potara", **FAST, "local_epochs": 1.0, "batch_size": 4, "local_rounds": 2, "parts": False}
    method = build_method(entry)
    client = toy_clients[0]
    per_round = math.ceil(len(client.train) / 4)
    state = method.init_server(toy_runtime, seed=0)
    update, _ = method.client_update(toy_runtime, client, method.payload(state, "c0"), None, seed=1)
    assert update.metrics["steps"] == per_round
    steps: list[float] = []
    train = toy_runtime.train

    def counted(*args, **kwargs):
        metrics = train(*args, **kwargs)
        steps.append(metrics["steps"])
        return metrics

    monkeypatch.setattr(toy_runtime, "train", counted)
    method.personalize(toy_runtime, client, state, None, None, seed=2)
    assert steps == [2 * per_round]


def test_potara_grid_search_scores_every_weight(toy_runtime, toy_clients):
    method = build_method({"name": "potara", **FAST, "local_rounds": 1, "grid_search": True, "grid": [0.0, 0.5, 1.0]})
    state = method.init_server(toy_runtime, seed=0)
    model = method.personalize(toy_runtime, toy_clients[0], state, None, None, seed=3)
    assert model.info["alpha_grid"] in (0.0, 0.5, 1.0)
    assert {f"val_accuracy@{a:g}" for a in (0, 0.5, 1)} <= set(model.info)
    assert {f"test_accuracy@{a:g}" for a in (0, 0.5, 1)} <= set(model.info)
    assert "grid" in model.variants
    fit, holdout = method.fit_split(toy_clients[0])
    assert len(holdout) == round(0.2 * 48) and not {id(x) for x in fit} & {id(x) for x in holdout}


def test_ffa_lora_never_changes_a(toy_runtime, toy_clients):
    method = build_method({"name": "ffa_lora", **FAST})
    state = method.init_server(toy_runtime, seed=0)
    assert state.tensors and not any(is_lora_a(k) for k in state.tensors)
    toy_runtime.install(ClientModel(lora=method.spec(toy_runtime)), seed=state.init_seed)
    initial = toy_runtime.adapter_state()
    for round_ in range(2):
        update, _ = method.client_update(
            toy_runtime, toy_clients[round_], method.payload(state, "c"), None, seed=round_
        )
        assert not any(is_lora_a(k) for k in update.tensors)
        after = toy_runtime.adapter_state()
        for key in initial:
            if is_lora_a(key):
                torch.testing.assert_close(after[key], initial[key])
        assert any(float((after[k] - initial[k]).abs().max()) > 0 for k in initial if is_lora_b(k))
        state, _ = method.aggregate(state, iter([update]))
    final = method.personalize(toy_runtime, toy_clients[2], state, None, None, seed=7).adapter
    for key in initial:
        if is_lora_a(key):
            torch.testing.assert_close(final[key], initial[key])


def test_fedsa_lora_uploads_a_only_and_keeps_b_home(toy_runtime, toy_clients):
    method = build_method({"name": "fedsa_lora", **FAST})
    state = method.init_server(toy_runtime, seed=0)
    assert state.tensors and all(is_lora_a(k) for k in state.tensors)
    update, kept = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    assert update.tensors and all(is_lora_a(k) for k in update.tensors)
    assert kept and not any(is_lora_a(k) for k in kept)
    assert any(float(v.abs().max()) > 0 for k, v in kept.items() if is_lora_b(k))
    state, _ = method.aggregate(state, iter([update]))
    model = method.personalize(toy_runtime, toy_clients[0], state, kept, None, seed=2)
    for key, tensor in kept.items():  # the client's model: its own B (and head) with the global A
        torch.testing.assert_close(model.adapter[key], tensor)
    for key, tensor in state.tensors.items():
        torch.testing.assert_close(model.adapter[key], tensor)


def test_fedalt_rest_of_world_leaves_the_client_out():
    individuals = {
        "a": (1.0, {"w": torch.tensor([1.0])}),
        "b": (3.0, {"w": torch.tensor([5.0])}),
        "c": (1.0, {"w": torch.tensor([9.0])}),
    }
    torch.testing.assert_close(rest_of_world(individuals, "a")["w"], torch.tensor([6.0]))
    torch.testing.assert_close(rest_of_world(individuals, "")["w"], torch.tensor([5.0]))
    torch.testing.assert_close(rest_of_world({"a": individuals["a"]}, "a")["w"], torch.tensor([1.0]))


def test_fedalt_mixture_with_equal_parts_is_the_plain_lora_and_detaches(toy_runtime, toy_clients):
    spec, state = install_trained_lora(toy_runtime, seed=4)
    batch = toy_runtime.encode(toy_clients[0].test[:5])
    toy_runtime.peft.eval()
    with torch.no_grad():
        plain = toy_runtime.peft(**batch).logits
        toy_runtime.install(ClientModel(lora=spec), seed=0)
        layers = {n: m.in_features for n, m in toy_runtime.peft.named_modules() if hasattr(m, "lora_A") and m.lora_A}
        mixer = Mixer(layers)  # zero gates: weights 1/2, 1/2
        lora = {k: v for k, v in state.items() if is_lora(k)}
        toy_runtime.install(ClientModel(lora=spec, adapter=state, extension=mixture(lora, mixer)))
        mixed = toy_runtime.peft(**batch).logits
        torch.testing.assert_close(mixed, plain, rtol=1e-5, atol=1e-6)
        halved = {k: v * 0 if is_lora_b(k) else v for k, v in lora.items()}
        toy_runtime.install(ClientModel(lora=spec, adapter=state, extension=mixture(halved, mixer)))
        assert float((toy_runtime.peft(**batch).logits - plain).abs().max()) > 1e-4
        toy_runtime.install(ClientModel(lora=spec, adapter=state))  # the hooks are gone
        torch.testing.assert_close(toy_runtime.peft(**batch).logits, plain)


def test_fedalt_keeps_training_its_individual_lora(toy_runtime, toy_clients):
    method = build_method({"name": "fedalt", **FAST})
    state = method.init_server(toy_runtime, seed=0)
    first, kept = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    assert first.tensors and all(is_lora(k) for k in first.tensors)
    other, _ = method.client_update(toy_runtime, toy_clients[1], method.payload(state, "c1"), None, seed=1)
    state, _ = method.aggregate(state, iter([first, other]))
    payload = method.payload(state, "c0")
    for key, tensor in other.tensors.items():  # c0's rest of world is c1 alone
        torch.testing.assert_close(payload.tensors[key], tensor)
    second, kept2 = method.client_update(toy_runtime, toy_clients[0], payload, kept, seed=2)
    changed = [float((second.tensors[k] - first.tensors[k]).abs().max()) for k in first.tensors]
    assert max(changed) > 0
    assert any(float((kept2["mixer"][k] - kept["mixer"][k]).abs().max()) > 0 for k in kept["mixer"])
    model = method.personalize(toy_runtime, toy_clients[0], state, kept2, None, seed=3)
    assert model.extension is not None
    toy_runtime.install(model)
    assert 0 <= toy_runtime.evaluate(toy_clients[0].test)["accuracy"] <= 1


def test_per_sample_gradients_of_a_causal_lm_take_the_padded_batch_exactly():
    from fedpeft.core.config import ModelConfig
    from fedpeft.models.runtime import ModelRuntime
    from fedpeft.models.table import load_model

    rng = random.Random(1)
    examples = [
        {"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))), "response": "a b" * rng.randint(1, 3)}
        for _ in range(6)
    ]
    texts = [ex["prompt"] + " " + ex["response"] for ex in examples]
    loaded = load_model(
        ModelConfig(name="tiny-llama", vocab_size=300, max_length=32), task="generation", corpus=lambda: texts
    )
    runtime = ModelRuntime(loaded, max_length=32)
    attention = runtime.base_model.config._attn_implementation
    install_trained_lora(runtime, seed=2)
    grads, layout = per_sample_gradients(runtime, examples, select=is_lora)
    assert runtime.base_model.config._attn_implementation == attention  # switched back after the transform
    params = dict(zip([k for k, _ in layout], runtime.adapter_parameters().values(), strict=False))
    runtime.peft.eval()
    for row, example in enumerate(examples):
        for p in params.values():
            p.requires_grad_(True)
            p.grad = None
        runtime.peft(**runtime.encode([example])).loss.backward()
        expected = torch.cat([params[k].grad.reshape(-1) for k, _ in layout])
        torch.testing.assert_close(grads[row], expected, rtol=1e-4, atol=1e-6)
