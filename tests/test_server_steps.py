"""The server step as parts: the weighted mean and the metric mean, each wrapper (robust rule, DP, server optimizer)
on its own against hand-computed numbers, their composition in the documented order, and the step a method's
config gives it."""

from __future__ import annotations

import math

import pytest
import torch

import fedpeft.methods  # noqa: F401
from fedpeft.core.config import validate
from fedpeft.core.errors import UserError
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, ServerState
from fedpeft.merging.dp import DifferentialPrivacy, DPConfig, dp_mean, noise_generator
from fedpeft.merging.robust import AggregationConfig, RobustRule, robust_aggregate
from fedpeft.merging.server_opt import ServerOptimizer, ServerOptimizerConfig, server_step
from fedpeft.merging.server_step import MetricMean, WeightedMean, float_uploads, metric_mean, weighted_mean
from fedpeft.methods.base import method_server_step
from fedpeft.methods.families.per_architecture import for_architectures
from fedpeft.methods.fedit import FedITState
from fedpeft.runner import Experiment
from fedpeft.worker import build_method
from tests.test_flower import tiny_raw
from tests.test_secagg import SECAGG, raw


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def update(client: str, weight: float, loss: float = 0.0, **tensors: torch.Tensor) -> ClientUpdate:
    return ClientUpdate(client, dict(tensors), weight, {"loss": loss})


def assert_equal(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(expected)
    for key, tensor in expected.items():
        assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key


# ---------------------------------------------------------------------- the weighted mean and the metric mean


def test_weighted_mean_and_metric_mean_are_separate():
    updates = [update("a", 1.0, 1.0, w=t(1.0, 2.0)), update("b", 3.0, 4.0, w=t(3.0, 4.0))]
    torch.testing.assert_close(weighted_mean(iter(updates))["w"], t(2.5, 3.5), rtol=0, atol=0)
    assert metric_mean(iter(updates)) == {"train_loss": 2.5, "clients": 2.0}  # unweighted over clients
    assert weighted_mean([]) == {} and metric_mean([]) == {"clients": 0.0}


def test_weights_summing_to_zero_aggregate_nothing_and_report_only_the_count():
    updates = [update("a", 0.0, 1.0, w=t(1.0)), update("b", 0.0, 2.0, w=t(3.0))]
    assert weighted_mean(updates) == {} and metric_mean(updates) == {"clients": 2.0}


def test_the_metric_mean_of_a_stream_another_function_consumes():
    consumed = []

    def stream():
        for i, weight in enumerate((1.0, 3.0)):
            consumed.append(i)
            yield update(f"c{i}", weight, float(i), w=t(float(i)))

    running = MetricMean()
    mean = weighted_mean(running.observe(stream()))
    assert consumed == [0, 1]  # one pass
    torch.testing.assert_close(mean["w"], t(0.75), rtol=0, atol=0)
    assert running.result() == {"train_loss": 0.5, "clients": 2.0}


def test_the_innermost_step_is_the_streaming_mean_and_keeps_the_moments():
    moments = {"m": {"w": t(9.0)}}
    state = ServerState(tensors={"w": t(0.0, 0.0)}, round=4, server_optimizer=moments)
    updates = [update("a", 1.0, 1.0, w=t(1.0, 2.0)), update("b", 3.0, 3.0, w=t(3.0, 4.0))]
    result = WeightedMean()(state, iter(updates))
    assert_equal(result.tensors, {"w": t(2.5, 3.5)})
    assert result.metrics == {"train_loss": 2.0, "clients": 2.0}
    assert result.moments is moments


# ---------------------------------------------------------------------- each wrapper on its own

G = {"w": t(1.0, 1.0)}


def test_trimmed_mean_drops_the_extremes_of_each_coordinate():
    values = [(1.0, 10.0), (2.0, 20.0), (3.0, 1000.0), (4.0, 30.0), (5.0, -50.0)]
    updates = [update(f"c{i}", 1.0 + i, w=t(*v)) for i, v in enumerate(values)]
    step = RobustRule(WeightedMean(), AggregationConfig(robust="trimmed_mean", trim_fraction=0.2))
    result = step(ServerState(tensors=dict(G)), iter(updates))
    # floor(0.2 * 5) = 1 value dropped at each end, unweighted: (2 + 3 + 4) / 3 and (10 + 20 + 30) / 3.
    assert_equal(result.tensors, {"w": t(3.0, 20.0)})
    assert result.metrics == {"train_loss": 0.0, "clients": 5.0}


@pytest.mark.parametrize(("count", "expected"), [(3, t(2.0, 20.0)), (4, t(2.5, 25.0))])
def test_median_is_the_middle_value_or_the_mean_of_the_two(count, expected):
    values = [(3.0, 30.0), (1.0, 10.0), (2.0, 20.0), (4.0, 40.0)][:count]
    updates = [update(f"c{i}", 1.0, w=t(*v)) for i, v in enumerate(values)]
    result = RobustRule(WeightedMean(), AggregationConfig(robust="median"))(ServerState(tensors=dict(G)), updates)
    assert_equal(result.tensors, {"w": expected})


def test_norm_bound_clips_each_update_then_takes_the_weighted_mean_and_keeps_integer_buffers():
    ids = torch.tensor([7, 8])
    updates = [
        ClientUpdate("a", {"w": t(4.0, 5.0), "ids": ids}, 1.0, {"loss": 1.0}),  # delta (3, 4): norm 5, clipped
        ClientUpdate("b", {"w": t(1.0, 1.5), "ids": ids}, 3.0, {"loss": 3.0}),  # delta (0, 0.5): kept
    ]
    step = RobustRule(WeightedMean(), AggregationConfig(robust="clip", clip_norm=1.0))
    result = step(ServerState(tensors=dict(G)), iter(updates))
    # g + ((0.6, 0.8) * 1 + (0, 0.5) * 3) / 4
    torch.testing.assert_close(result.tensors["w"], t(1.15, 1.575), rtol=0, atol=1e-7)
    assert torch.equal(result.tensors["ids"], ids)  # not a float: the weighted mean
    assert result.metrics == {"train_loss": 2.0, "clients": 2.0, "robust_clipped_fraction": 0.5}


def test_dp_clips_each_update_adds_seeded_noise_and_divides_by_the_clients_sampled():
    state = ServerState(tensors={"b": t(0.0, 0.0), "a": t(1.0)}, round=2)
    updates = [
        update("c0", 10.0, 1.0, b=t(3.0, 4.0), a=t(1.0)),  # norm 5: scaled by 1/5
        update("c1", 20.0, 2.0, b=t(0.0, 0.5), a=t(1.0)),  # norm 0.5: kept
        update("c2", 30.0, 3.0, b=t(-6.0, 8.0), a=t(1.0)),  # norm 10: scaled by 1/10
    ]
    cfg = DPConfig(clip_norm=1.0, noise_multiplier=0.5, seed=7)
    result = DifferentialPrivacy(WeightedMean(), cfg, lambda round_: 4)(state, iter(updates))

    generator = torch.Generator()
    generator.manual_seed(derive_seed(7, "dp", 2))  # round 2's noise, drawn key by key in sorted order
    noise_a = torch.normal(0.0, 0.5, size=(1,), generator=generator, dtype=torch.float64)
    noise_b = torch.normal(0.0, 0.5, size=(2,), generator=generator, dtype=torch.float64)
    clipped_sum_b = torch.tensor([0.6 + 0.0 - 0.6, 0.8 + 0.5 + 0.8], dtype=torch.float64)
    expected_b = (clipped_sum_b + noise_b) / 4  # m = 4: one sampled client did not answer
    expected_a = 1.0 + noise_a / 4
    torch.testing.assert_close(result.tensors["b"], expected_b.float(), rtol=0, atol=1e-7)
    torch.testing.assert_close(result.tensors["a"], expected_a.float(), rtol=0, atol=1e-7)
    assert list(result.tensors) == ["b", "a"]
    assert result.metrics == {"train_loss": 2.0, "clients": 3.0, "dp_clipped_fraction": pytest.approx(2 / 3)}


def test_dp_without_a_bound_pool_divides_by_the_updates():
    state = ServerState(tensors={"w": t(0.0)})
    updates = [update("c0", 1.0, w=t(0.5)), update("c1", 5.0, w=t(0.25))]
    cfg = DPConfig(clip_norm=1.0, noise_multiplier=0.0)
    result = DifferentialPrivacy(WeightedMean(), cfg, lambda round_: None)(state, updates)
    assert_equal(result.tensors, {"w": t(0.375)})  # uniform weights, not the data sizes


def test_the_server_optimizer_takes_a_fedadam_step_and_carries_its_moments():
    cfg = ServerOptimizerConfig(name="adam", lr=0.1)
    step = ServerOptimizer(WeightedMean(), cfg)
    state = ServerState(tensors={"w": t(1.0, 2.0)})
    result = step(state, [update("c0", 2.0, w=t(2.0, 1.0))])  # the mean (2, 1): Delta = (1, -1)
    b1, b2, tau = 0.9, 0.99, 1e-3
    m = (1 - b1) * torch.tensor([1.0, -1.0], dtype=torch.float64)
    v = (1 - b2) * torch.tensor([1.0, 1.0], dtype=torch.float64)
    correction = math.sqrt(1 - b2**2) / (1 - b1**2)  # round t = 1: exponent t + 1
    expected = torch.tensor([1.0, 2.0], dtype=torch.float64) + 0.1 * correction * m / (v.sqrt() + tau)
    torch.testing.assert_close(result.tensors["w"], expected.float())
    assert result.moments is not None and set(result.moments) == {"m", "v"}
    torch.testing.assert_close(result.moments["m"]["w"], m.float(), rtol=0, atol=0)
    torch.testing.assert_close(result.moments["v"]["w"], v.float(), rtol=0, atol=0)

    # Round 2 starts from the state's moments: Delta = (0.5, 0.5) - x'.
    second = ServerState(tensors=result.tensors, round=1, server_optimizer=result.moments)
    again = step(second, [update("c0", 1.0, w=t(0.5, 0.5))])
    x = result.tensors["w"].double()
    delta = torch.tensor([0.5, 0.5], dtype=torch.float64) - x
    m2 = b1 * result.moments["m"]["w"].double() + (1 - b1) * delta
    v2 = b2 * result.moments["v"]["w"].double() + (1 - b2) * delta**2
    correction2 = math.sqrt(1 - b2**3) / (1 - b1**3)
    torch.testing.assert_close(again.tensors["w"], (x + 0.1 * correction2 * m2 / (v2.sqrt() + tau)).float())


def test_a_round_that_aggregates_nothing_passes_through_every_wrapper():
    moments = {"momentum": {"w": t(1.0)}}
    state = ServerState(tensors={"w": t(0.0)}, server_optimizer=moments)
    step = ServerOptimizer(
        DifferentialPrivacy(WeightedMean(), DPConfig(clip_norm=1.0, seed=0), lambda round_: 3),
        ServerOptimizerConfig(name="avgm"),
    )
    result = step(state, iter([]))
    assert result.tensors == {} and result.metrics == {"clients": 0.0} and result.moments is moments


# ---------------------------------------------------------------------- composed, in the documented order


def round_of_updates() -> tuple[FedITState, list[ClientUpdate]]:
    generator = torch.Generator().manual_seed(0)
    g = {"a.lora_A.weight": torch.randn(2, 3, generator=generator), "head.bias": torch.randn(3, generator=generator)}
    moments = {
        "m": {k: 0.01 * torch.randn(v.shape, generator=generator) for k, v in g.items()},
        "v": {k: 0.01 * torch.rand(v.shape, generator=generator) for k, v in g.items()},
    }
    state = FedITState(tensors=g, round=3, server_optimizer=moments)
    updates = [
        ClientUpdate(
            f"c{i}", {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in g.items()}, w, {"loss": i}
        )
        for i, w in enumerate((10.0, 30.0, 7.0, 12.0))
    ]
    return state, updates


RULES = {
    "dp": {"dp": {"clip_norm": 0.8, "noise_multiplier": 1.0, "seed": 11}},
    "trimmed_mean": {"aggregation": {"robust": "trimmed_mean", "trim_fraction": 0.25}},
    "median": {"aggregation": {"robust": "median"}},
    "clip": {"aggregation": {"robust": "clip", "clip_norm": 0.8}},
}


def by_hand(entry: dict, state: FedITState, updates: list[ClientUpdate], sampled: int) -> tuple[dict, dict, dict]:
    """The weighted mean, then the rule on the float tensors (relative to the global ones), then the optimizer."""
    tensors, metrics = weighted_mean(iter(updates)), metric_mean(iter(updates))
    if "dp" in entry:
        cfg = DPConfig(**entry["dp"])
        generator = noise_generator(cfg.seed, state.round)
        released, clipped = dp_mean(float_uploads(updates), state.tensors, cfg, sampled, generator)
        tensors, metrics = {**tensors, **released}, {**metrics, "dp_clipped_fraction": clipped}
    else:
        weights = [u.weight for u in updates]
        cfg_rule = AggregationConfig(**entry["aggregation"])
        robust, extra = robust_aggregate(float_uploads(updates), weights, state.tensors, cfg_rule)
        tensors, metrics = {**tensors, **robust}, {**metrics, **{f"robust_{k}": v for k, v in extra.items()}}
    optimizer = ServerOptimizerConfig(name="adam", lr=0.05)
    tensors, moments = server_step(optimizer, state.tensors, tensors, state.server_optimizer, state.round + 1)
    return tensors, metrics, moments


@pytest.mark.parametrize("rule", list(RULES))
def test_the_composed_step_is_the_mean_then_the_rule_then_the_optimizer(rule):
    state, updates = round_of_updates()
    entry = {"name": "fedit", "fraction": 0.5, **RULES[rule], "server_optimizer": {"name": "adam", "lr": 0.05}}
    method = build_method(entry)
    method.bind_pool([f"c{i}" for i in range(10)])  # m = 5: one sampled client failed
    step = method_server_step(method)
    assert isinstance(step, ServerOptimizer)
    assert isinstance(step.inner, DifferentialPrivacy if rule == "dp" else RobustRule)
    assert isinstance(step.inner.inner, WeightedMean)

    tensors, metrics, moments = by_hand(RULES[rule], state, updates, sampled=5)
    result = step(state, iter(updates))
    assert_equal(result.tensors, tensors)
    assert result.metrics == metrics
    assert result.moments is not None and list(result.moments) == list(moments)
    for name, held in moments.items():
        assert_equal(result.moments[name], held)

    new_state, new_metrics = method.aggregate(state, iter(updates))
    # The round loop, not aggregate, counts the rounds.
    assert new_metrics == metrics and new_state.round == state.round and new_state.seed == state.seed
    assert_equal(new_state.tensors, tensors)
    assert new_state.server_optimizer is not None
    for name, held in moments.items():
        assert_equal(new_state.server_optimizer[name], held)


def test_the_order_matters_the_optimizer_steps_along_the_released_aggregate():
    state, updates = round_of_updates()
    method = build_method({"name": "fedit", **RULES["dp"], "server_optimizer": {"name": "avgm", "momentum": 0.5}})
    result = method.aggregate(state, iter(updates))[0]
    released = build_method({"name": "fedit", **RULES["dp"]}).aggregate(state, iter(updates))[0].tensors
    mean = weighted_mean(iter(updates))
    assert not torch.equal(released["head.bias"], mean["head.bias"])  # the noise is in what the optimizer reads
    for key, g in state.tensors.items():
        velocity = released[key].double() - g.double()  # no avgm moment before: the velocity is Delta
        torch.testing.assert_close(result.tensors[key], (g.double() + velocity).to(g.dtype), rtol=0, atol=1e-7)
        assert result.server_optimizer is not None
        torch.testing.assert_close(result.server_optimizer["momentum"][key], velocity.float(), rtol=0, atol=1e-7)


# ---------------------------------------------------------------------- the step a method's config gives it


def test_fedit_reports_the_server_step_its_config_gives():
    assert isinstance(method_server_step(build_method({"name": "fedit"})), WeightedMean)
    optimized = method_server_step(build_method({"name": "fedit", "server_optimizer": {"name": "yogi"}}))
    assert isinstance(optimized, ServerOptimizer) and isinstance(optimized.inner, WeightedMean)
    robust = method_server_step(build_method({"name": "fedit", "aggregation": {"robust": "median"}}))
    assert isinstance(robust, RobustRule) and isinstance(robust.inner, WeightedMean)
    merged = build_method({"name": "fedit", "merge": {"operator": "ties"}})
    assert method_server_step(merged) is None  # `merge` replaces the mean: no dp, robust rule or secure aggregation
    assert isinstance(method_server_step(build_method({"name": "fedprox"})), WeightedMean)


def test_a_method_run_per_architecture_answers_with_its_inner_step():
    plain = for_architectures(build_method({"name": "fedit"}), heterogeneous=True)
    assert isinstance(method_server_step(plain), WeightedMean)
    merged = for_architectures(build_method({"name": "fedit", "merge": {"operator": "ties"}}), heterogeneous=True)
    assert method_server_step(merged) is None


def test_secure_aggregation_refuses_fedit_with_merge(tmp_path):
    merged = {**tiny_raw()["methods"][0], "merge": {"operator": "ties"}}
    engine = {"name": "flower", "secagg": SECAGG}
    with pytest.raises(UserError, match="'fedit' cannot run under secure aggregation"):
        Experiment(validate(raw(engine=engine, methods=[merged])), tmp_path / "merged").run()
    assert not (tmp_path / "merged").exists()
