"""Robust aggregation and client-level DP of weighted-mean server steps: golden numbers, noise scale, the
accountant, config-time refusals, and an end-to-end run that writes epsilon per round."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import dp_accounting
import pytest
import torch
from dp_accounting import rdp

import fedpeft.methods  # noqa: F401
from fedpeft.core.config import method_config
from fedpeft.core.errors import UserError
from fedpeft.core.registry import METHODS
from fedpeft.core.types import ClientUpdate
from fedpeft.merging.dp import DPConfig, dp_mean, epsilon, noise_generator
from fedpeft.merging.robust import (
    AggregationConfig,
    clipped_mean,
    coordinate_median,
    robust_aggregate,
    trimmed_mean,
)
from fedpeft.merging.server_step import metric_mean, weighted_mean
from fedpeft.methods.base import method_server_step
from fedpeft.methods.families.per_architecture import for_architectures
from fedpeft.methods.fedit import FedITState
from fedpeft.worker import build_method

FAST = {"rounds": 2, "fraction": 0.5, "local_steps": 2, "local_epochs": None, "lr": 1e-2, "local_rounds": 2}
FEDERATED = [n for n in METHODS.names() if METHODS.get(n).federated]
MEAN = [n for n in FEDERATED if method_server_step(build_method({"name": n})) is not None]
NOT_MEAN = [n for n in FEDERATED if method_server_step(build_method({"name": n})) is None]
# Methods whose server step re-factorizes the mean (FedSVD: B A by SVD), so it keeps the product B A.
REFACTORED = {"fedsvd"}


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


ZERO = {"w": t(0.0, 0.0)}
# Norms 5, 1 and 10.
THREE = [{"w": t(3.0, 4.0)}, {"w": t(0.0, 1.0)}, {"w": t(-6.0, 8.0)}]


# ---------------------------------------------------------------------- golden numbers of the robust rules


def test_clip_scales_each_update_to_the_norm_then_takes_the_weighted_mean():
    got, clipped = clipped_mean(THREE, [1.0, 1.0, 2.0], ZERO, clip_norm=1.0)
    # (0.6, 0.8) * 1 + (0, 1) * 1 + (-0.6, 0.8) * 2, over 4.
    torch.testing.assert_close(got["w"], t(-0.15, 0.85))
    assert clipped == pytest.approx(2 / 3)


def test_clip_works_on_the_update_relative_to_the_global_tensors():
    reference = {"w": t(1.0, 1.0), "b": t(2.0)}
    uploads = [{"w": t(4.0, 5.0), "b": t(2.0)}, {"w": t(1.0, 1.0), "b": t(2.5)}]
    got, clipped = clipped_mean(uploads, [1.0, 1.0], reference, clip_norm=2.5)
    # Deltas (3, 4 | 0) of norm 5 -> (1.5, 2 | 0); (0, 0 | 0.5) kept; mean (0.75, 1 | 0.25).
    torch.testing.assert_close(got["w"], t(1.75, 2.0))
    torch.testing.assert_close(got["b"], t(2.25))
    assert clipped == 0.5


def test_a_key_the_global_tensors_lack_has_reference_zero():
    got, _ = clipped_mean([{"new": t(3.0, 4.0)}], [1.0], {}, clip_norm=1.0)
    torch.testing.assert_close(got["new"], t(0.6, 0.8))


def test_median_of_an_odd_count_is_the_middle_value():
    got = coordinate_median(THREE, ZERO)
    torch.testing.assert_close(got["w"], t(0.0, 4.0))


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values():
    four = [*THREE, {"w": t(10.0, -2.0)}]  # sorted x: -6, 0, 3, 10; y: -2, 1, 4, 8
    torch.testing.assert_close(coordinate_median(four, ZERO)["w"], t(1.5, 2.5))
    torch.testing.assert_close(coordinate_median(THREE[:2], ZERO)["w"], t(1.5, 2.5))


def test_median_ignores_weights_and_is_translation_equivariant():
    reference = {"w": t(5.0, -1.0)}
    got = coordinate_median(THREE, reference)
    torch.testing.assert_close(got["w"], t(0.0, 4.0))  # the median of the uploads themselves


def test_trimmed_mean_drops_floor_beta_k_values_at_each_end():
    five = [{"w": t(v, -v)} for v in (1.0, 2.0, 3.0, 4.0, 100.0)]
    # beta = 0.2, K = 5: one dropped at each end -> mean of 2, 3, 4.
    torch.testing.assert_close(trimmed_mean(five, ZERO, 0.2)["w"], t(3.0, -3.0))
    # beta = 0.1: floor(0.5) = 0 dropped -> the plain unweighted mean.
    torch.testing.assert_close(trimmed_mean(five, ZERO, 0.1)["w"], t(22.0, -22.0))
    # beta = 0.4: two dropped at each end -> the median.
    torch.testing.assert_close(trimmed_mean(five, ZERO, 0.4)["w"], t(3.0, -3.0))


def test_rules_keep_each_uploads_dtype():
    uploads = [{"w": torch.tensor([1.0, 2.0], dtype=torch.bfloat16)}, {"w": torch.tensor([3.0, 4.0]).bfloat16()}]
    for cfg in (AggregationConfig(robust="median"), AggregationConfig(robust="clip", clip_norm=1.0)):
        got, _ = robust_aggregate(uploads, [1.0, 1.0], {}, cfg)
        assert got["w"].dtype == torch.bfloat16


# ---------------------------------------------------------------------- DP-FedAvg


def test_dp_with_zero_noise_is_the_sum_of_clipped_updates_over_the_sampled_count():
    cfg = DPConfig(clip_norm=1.0, noise_multiplier=0.0)
    got, clipped = dp_mean(THREE, ZERO, cfg, sampled=3, generator=noise_generator(0, 0))
    # (0.6, 0.8) + (0, 1) + (-0.6, 0.8), over 3: uniform weights whatever the data sizes.
    torch.testing.assert_close(got["w"], t(0.0, 2.6 / 3))
    assert clipped == pytest.approx(2 / 3)
    # A sampled client that failed still counts in m.
    got, _ = dp_mean(THREE, ZERO, cfg, sampled=4, generator=noise_generator(0, 0))
    torch.testing.assert_close(got["w"], t(0.0, 0.65))


def test_dp_with_a_huge_norm_and_zero_noise_is_the_uniform_mean():
    reference = {"w": t(1.0, -1.0)}
    cfg = DPConfig(clip_norm=1e9, noise_multiplier=0.0)
    got, clipped = dp_mean(THREE, reference, cfg, sampled=3, generator=noise_generator(None, 0))
    torch.testing.assert_close(got["w"], t(-1.0, 13.0 / 3))
    assert clipped == 0.0


def test_dp_noise_has_standard_deviation_z_times_c_on_the_sum():
    torch.manual_seed(0)
    size, m = 200_000, 4
    reference = {"w": torch.zeros(size)}
    uploads = [{"w": torch.randn(size) * 0.001} for _ in range(3)]
    cfg = DPConfig(clip_norm=2.0, noise_multiplier=0.7, seed=5)
    noiseless, _ = dp_mean(
        uploads, reference, cfg.model_copy(update={"noise_multiplier": 0.0}), m, noise_generator(5, 0)
    )
    noisy, _ = dp_mean(uploads, reference, cfg, m, noise_generator(5, 0))
    noise = (noisy["w"].double() - noiseless["w"].double()) * m
    assert float(noise.std()) == pytest.approx(0.7 * 2.0, rel=0.02)
    assert abs(float(noise.mean())) < 0.02
    # A fixed seed reproduces the noise; without one it comes from the OS and differs.
    again, _ = dp_mean(uploads, reference, cfg, m, noise_generator(5, 0))
    assert torch.equal(again["w"], noisy["w"])
    other_round, _ = dp_mean(uploads, reference, cfg, m, noise_generator(5, 1))
    assert not torch.equal(other_round["w"], noisy["w"])
    fresh = cfg.model_copy(update={"seed": None})
    a, _ = dp_mean(uploads, reference, fresh, m, noise_generator(None, 0))
    b, _ = dp_mean(uploads, reference, fresh, m, noise_generator(None, 0))
    assert not torch.equal(a["w"], b["w"])


def test_dp_refuses_uploads_with_different_tensors():
    with pytest.raises(UserError, match="same tensors"):
        dp_mean([{"a": t(1.0)}, {"b": t(1.0)}], {}, DPConfig(clip_norm=1.0), 2, noise_generator(0, 0))


def test_epsilon_is_the_libraries_rdp_accountant():
    z, q, rounds, delta = 1.1, 0.05, 200, 1e-5
    accountant = rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    assert epsilon(z, q, rounds, delta) == accountant.get_epsilon(delta)
    series = [epsilon(z, q, r, delta) for r in (1, 10, 50, 200)]
    assert series == sorted(series) and series[0] > 0
    assert epsilon(z, q, 0, delta) == 0.0
    assert epsilon(0.0, q, 10, delta) == math.inf
    assert epsilon(2.0, q, rounds, delta) < epsilon(z, q, rounds, delta)


# ---------------------------------------------------------------------- through the methods


def fedit_updates(sizes: list[float]) -> tuple[FedITState, list[ClientUpdate]]:
    torch.manual_seed(1)
    state = FedITState(tensors={"a.lora_A.weight": torch.randn(4, 8), "a.lora_B.weight": torch.randn(8, 4)})
    updates = [
        ClientUpdate(f"c{i}", {k: v + 0.1 * torch.randn_like(v) for k, v in state.tensors.items()}, w, {"loss": i})
        for i, w in enumerate(sizes)
    ]
    return state, updates


def test_no_rule_is_bit_identical_to_the_streaming_weighted_mean():
    state, updates = fedit_updates([10.0, 30.0, 7.0])
    expected, expected_metrics = weighted_mean(iter(updates)), metric_mean(iter(updates))
    new_state, metrics = build_method({"name": "fedit"}).aggregate(state, iter(updates))
    assert metrics == expected_metrics
    for key, tensor in expected.items():
        assert torch.equal(new_state.tensors[key], tensor), key


def test_zero_noise_and_no_clipping_give_the_non_dp_numbers_for_equal_data_sizes():
    state, updates = fedit_updates([20.0, 20.0, 20.0])
    plain, _ = build_method({"name": "fedit"}).aggregate(state, iter(updates))
    method = build_method({"name": "fedit", "dp": {"clip_norm": 1e9, "noise_multiplier": 0.0}})
    private, metrics = method.aggregate(state, iter(updates))
    assert metrics["dp_clipped_fraction"] == 0.0 and metrics["train_loss"] == 1.0 and metrics["clients"] == 3.0
    for key, tensor in plain.tensors.items():
        torch.testing.assert_close(private.tensors[key], tensor, rtol=0, atol=1e-6)
    robust = build_method({"name": "fedit", "aggregation": {"robust": "clip", "clip_norm": 1e9}})
    clipped, metrics = robust.aggregate(state, iter(updates))
    assert metrics["robust_clipped_fraction"] == 0.0
    for key, tensor in plain.tensors.items():
        torch.testing.assert_close(clipped.tensors[key], tensor, rtol=0, atol=1e-6)


def test_dp_divides_by_the_clients_sampled_from_the_bound_pool():
    state, updates = fedit_updates([5.0, 5.0, 5.0])
    method = build_method({"name": "fedit", "fraction": 0.5, "dp": {"clip_norm": 1e9, "noise_multiplier": 0.0}})
    method.bind_pool([f"c{i}" for i in range(8)])
    assert method.clients_per_round() == 4
    new_state, _ = method.aggregate(state, iter(updates))  # one of the 4 sampled clients failed
    for key, g in state.tensors.items():
        mean_delta = sum(u.tensors[key].double() - g.double() for u in updates) / 4
        torch.testing.assert_close(new_state.tensors[key], (g.double() + mean_delta).float(), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "rule", [{"aggregation": {"robust": "median"}}, {"dp": {"clip_norm": 1e9, "noise_multiplier": 0.0}}]
)
@pytest.mark.parametrize("name", MEAN)
def test_every_mean_method_aggregates_identical_updates_to_the_update(name, rule, request):
    prefix = "toy_moe" if name == "flame" else "toy"
    runtime, clients = (request.getfixturevalue(f"{prefix}_{part}") for part in ("runtime", "clients"))
    cls = METHODS.get(name)
    fields = {k: v for k, v in FAST.items() if k in cls.Config.model_fields}
    method = build_method({"name": name, **fields, **rule})
    state = method.init_server(runtime, seed=0)
    update, _ = method.client_update(runtime, clients[0], method.payload(state, "c0"), None, seed=1)
    copies = [
        ClientUpdate(str(i), {k: v.clone() for k, v in update.tensors.items()}, 10.0 + i, extras=update.extras)
        for i in range(3)
    ]
    new_state, _ = method.aggregate(state, iter(copies))
    for key, tensor in update.tensors.items():
        if name in REFACTORED and ".lora_B." in key:  # the mean B times the clients' A, re-factorized
            a_key = key.replace(".lora_B.", ".lora_A.")
            got, expected = new_state.tensors[key] @ new_state.tensors[a_key], tensor @ state.tensors[a_key]
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5, msg=key)
            continue
        torch.testing.assert_close(new_state.tensors[key], tensor, msg=key)


# ---------------------------------------------------------------------- config-time refusals


@pytest.mark.parametrize("name", NOT_MEAN)
def test_a_method_whose_server_step_is_not_a_mean_refuses_dp_and_robust_rules(name):
    for rule, key in (({"dp": {"clip_norm": 1.0}}, "`dp`"), ({"aggregation": {"robust": "median"}}, "robust")):
        with pytest.raises(UserError, match="not a weighted mean") as error:
            method_config({"name": name, **rule})
        assert key in str(error.value) and str(error.value).count(". ") == 0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"dp": {"clip_norm": 1.0}, "aggregation": {"robust": "median"}}, "cannot be combined"),
        ({"dp": {"clip_norm": 1.0}, "merge": {"operator": "ties"}}, "`merge` replaces the weighted mean"),
        ({"aggregation": {"robust": "trimmed_mean"}, "merge": {"operator": "mean"}}, "`merge` replaces"),
        ({"aggregation": {"robust": "clip"}}, "needs `aggregation.clip_norm`"),
        ({"aggregation": {"robust": "median", "clip_norm": 1.0}}, "applies only to"),
        ({"aggregation": {"robust": "trimmed_mean", "trim_fraction": 0.5}}, "trim_fraction"),
        ({"dp": {"clip_norm": 0}}, "dp.clip_norm"),
        ({"dp": {"clip_norm": 1.0, "noise_multiplier": -1}}, "dp.noise_multiplier"),
        ({"dp": {"clip_norm": 1.0, "delta": 1.0}}, "dp.delta"),
    ],
)
def test_inconsistent_rules_are_one_sentence_config_errors(entry, message):
    with pytest.raises(UserError, match="of method 'fedit'") as error:
        method_config({"name": "fedit", **entry})
    assert message in str(error.value)


def test_dp_is_refused_for_one_copy_per_architecture():
    method = build_method({"name": "fedit", "dp": {"clip_norm": 1.0}})
    with pytest.raises(UserError, match="several architectures"):
        for_architectures(method, heterogeneous=True)
    robust = build_method({"name": "fedit", "aggregation": {"robust": "median"}})
    assert for_architectures(robust, heterogeneous=True) is not robust  # robust rules run within each group


# ---------------------------------------------------------------------- the CLI


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "fedpeft.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("methods=[{name: hetlora, dp: {clip_norm: 1}}]", "Method 'hetlora' cannot use `dp`"),
        ("methods.1.dp.clip_norm=-1", "dp.clip_norm"),
    ],
)
def test_refusals_reach_the_cli_as_one_sentence_and_exit_2(override, message, tmp_path):
    result = cli("run", "smoke", "--set", override, "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_dp_run_writes_epsilon_every_round_and_a_privacy_section(tmp_path):
    out = tmp_path / "run"
    method = (
        "methods=[{name: fedit, rounds: 3, fraction: 0.5, local_steps: 2, lr: 0.005, "
        "dp: {clip_norm: 1.0, noise_multiplier: 0.8, seed: 3}}]"
    )
    args = ["--set", "data.groups=[lat1, lat4]", "--set", method]
    args += ["--set", "output.plots=false", "--set", "output.save_adapters=false"]
    result = cli("run", "smoke", "--out", str(out), *args)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    privacy = [r for r in records if r["split"] == "privacy"]
    epsilons = {r["round"]: r["value"] for r in privacy if r["metric"] == "dp_epsilon"}
    assert sorted(epsilons) == [1, 2, 3]
    # 4 seen clients (2 groups x 2), 2 sampled per round.
    expected = [epsilon(0.8, 0.5, r, 1e-5) for r in (1, 2, 3)]
    assert [epsilons[r] for r in (1, 2, 3)] == pytest.approx(expected)
    assert {r["value"] for r in privacy if r["metric"] == "dp_sample_rate"} == {0.5}
    assert all(r["client"] is None and r["pool"] == "seen" for r in privacy)
    summary = (out / "summary.md").read_text()
    assert "## Privacy" in summary
    assert f"| fedit | 0 | 3 | 0.8 | 1 | 0.5 | 1e-05 | {expected[-1]:.4g} |" in summary
    assert "dp_epsilon" not in summary  # the result tables read only the test split


@pytest.mark.slow
def test_a_dp_base_stage_writes_its_epsilon_too(tmp_path):
    out = tmp_path / "run"
    base = (
        "base={kind: federated, method: {name: fedit_merged, rounds: 2, fraction: 0.5, local_steps: 1, "
        "lr: 0.005, dp: {clip_norm: 1.0, noise_multiplier: 1.0, seed: 1}}}"
    )
    args = ["--set", "data.groups=[lat1, lat4]", "--set", base, "--set", "methods=[{name: lora, epochs: 1}]"]
    args += ["--set", "output.plots=false", "--set", "output.save_adapters=false"]
    result = cli("run", "smoke", "--out", str(out), *args)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    epsilons = {r["round"]: r["value"] for r in records if r["metric"] == "dp_epsilon"}
    assert {r["method"] for r in records if r["split"] == "privacy"} == {"base-stage"}
    assert [epsilons[r] for r in (1, 2)] == pytest.approx([epsilon(1.0, 0.5, r, 1e-5) for r in (1, 2)])
    assert "| base-stage | 0 | 2 |" in (out / "summary.md").read_text()
