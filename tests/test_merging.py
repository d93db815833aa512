"""Merge operators and LoRA merging spaces: golden values, identities, agreement with PEFT's merge utilities."""

from __future__ import annotations

import pytest
import torch
from peft.utils import merge_utils

from fedpeft.merging import (
    MergeConfig,
    apply_operator,
    dare_linear,
    dare_ties,
    iso_c,
    knots_factors,
    lora_factors,
    low_rank_svd,
    mean,
    merge_lora_states,
    operator_weights,
    task_arithmetic,
    ties,
    tsvd,
)

D = torch.float64


def factors(seed: int, k: int = 4, d_out: int = 12, d_in: int = 10, r: int = 3):
    g = torch.Generator().manual_seed(seed)
    Bs = [torch.randn(d_out, r, generator=g, dtype=D) for _ in range(k)]
    As = [torch.randn(r, d_in, generator=g, dtype=D) for _ in range(k)]
    return Bs, As


def adapter_states(seed: int, k: int = 3, r: int = 2) -> list[dict[str, torch.Tensor]]:
    """K PEFT-named adapter state dicts with two LoRA modules and a head."""
    g = torch.Generator().manual_seed(seed)
    states = []
    for _ in range(k):
        states.append(
            {
                "base_model.model.l0.q.lora_A.weight": torch.randn(r, 8, generator=g),
                "base_model.model.l0.q.lora_B.weight": torch.randn(6, r, generator=g),
                "base_model.model.l0.v.lora_A.weight": torch.randn(r, 8, generator=g),
                "base_model.model.l0.v.lora_B.weight": torch.randn(8, r, generator=g),
                "base_model.model.classifier.weight": torch.randn(2, 8, generator=g),
            }
        )
    return states


def product(state, module, scaling=1.0):
    prefix = f"base_model.model.{module}"
    return scaling * (state[f"{prefix}.lora_B.weight"].double() @ state[f"{prefix}.lora_A.weight"].double())


# ------------------------------------------------------------------------------------------------ operators


def test_ties_golden_by_hand():
    # density 0.5 keeps the 2 largest |entries| of each tensor: t1 -> [3, 0, 0, -2], t2 -> [0, -1, 0, -4] (|-1| ties
    # with |1|: topk keeps the first index), t3 -> [-1, 0, 5, 0]. Elected signs by sum: [+, -, +, -].
    # Disjoint means over agreeing entries: [3, -1, 5, -3].
    t1 = torch.tensor([3.0, 1.0, 0.5, -2.0])
    t2 = torch.tensor([0.5, -1.0, 0.2, -4.0])
    t3 = torch.tensor([-1.0, 0.1, 5.0, 0.2])
    merged = ties([t1, t2, t3], density=0.5)
    torch.testing.assert_close(merged, torch.tensor([3.0, -1.0, 5.0, -3.0]))


@pytest.mark.parametrize("density", [0.3, 0.7])
def test_ties_and_dare_agree_with_peft_merge_utils(density):
    g = torch.Generator().manual_seed(1)
    tensors = [torch.randn(5, 7, generator=g) for _ in range(3)]
    weights = torch.tensor([0.5, 1.0, 1.5])
    torch.testing.assert_close(ties(tensors, weights, density=density), merge_utils.ties(tensors, weights, density))
    torch.testing.assert_close(ties(tensors, density=density), merge_utils.ties(tensors, torch.ones(3), density))
    for ours, theirs in ((dare_linear, merge_utils.dare_linear), (dare_ties, merge_utils.dare_ties)):
        torch.manual_seed(11)
        expected = theirs(tensors, weights, density)
        torch.testing.assert_close(ours(tensors, weights, density=density, seed=11), expected)


def test_dare_is_seeded_and_leaves_global_randomness_alone():
    tensors = [torch.randn(20, 20) for _ in range(3)]
    state = torch.random.get_rng_state()
    a = dare_linear(tensors, density=0.5, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a, dare_linear(tensors, density=0.5, seed=3))
    assert not torch.equal(a, dare_linear(tensors, density=0.5, seed=4))
    kept = (dare_ties(tensors, density=0.5, seed=3) != 0).float().mean()
    assert 0.5 < float(kept) < 1.0  # a union of three half-dense masks, minus sign conflicts


def test_iso_c_has_a_flat_spectrum_with_the_mean_of_the_sum():
    g = torch.Generator().manual_seed(2)
    tensors = [torch.randn(6, 9, generator=g, dtype=D) for _ in range(3)]
    expected_mean = torch.linalg.svdvals(sum(tensors)).mean()
    values = torch.linalg.svdvals(iso_c(tensors))
    torch.testing.assert_close(values, torch.full((6,), float(expected_mean), dtype=D))
    # Same singular vectors as the sum: iso_c(M) M^T is symmetric positive semi-definite.
    gram = iso_c(tensors) @ sum(tensors).T
    torch.testing.assert_close(gram, gram.T)
    assert float(torch.linalg.eigvalsh(gram).min()) > -1e-9


def test_iso_c_keeps_a_low_rank_sum_in_its_subspace():
    Bs, As = factors(3, k=2, d_out=10, d_in=10, r=2)
    deltas = [B @ A for B, A in zip(Bs, As, strict=True)]
    merged = iso_c(deltas)
    values = torch.linalg.svdvals(merged)
    assert int((values > 1e-9).sum()) == 4
    kept = torch.linalg.svdvals(sum(deltas))[:4]
    torch.testing.assert_close(values[:4], torch.full((4,), float(kept.mean()), dtype=D))


@pytest.mark.parametrize(
    ("name", "weights", "options"),
    [
        ("mean", None, {}),
        ("mean", [1.0, 5.0, 2.0], {}),
        ("task_arithmetic", [1 / 3] * 3, {}),
        ("ties", None, {"density": 1.0}),
        ("dare_linear", None, {"density": 1.0}),
        ("dare_ties", None, {"density": 1.0}),
    ],
)
def test_identical_tensors_merge_to_themselves(name, weights, options):
    t = torch.randn(4, 5)
    merged = apply_operator(name, [t.clone() for _ in range(3)], weights, **options)
    torch.testing.assert_close(merged, t)


def test_operator_weights_follow_each_operators_normalization():
    assert operator_weights("mean", [1, 3]) == [0.25, 0.75]
    assert operator_weights("ties", [1, 3]) == [0.5, 1.5]
    assert operator_weights("iso_c", [2, 2, 2]) == [1.0, 1.0, 1.0]
    torch.testing.assert_close(mean([torch.ones(2), torch.zeros(2)], [1, 3]), torch.full((2,), 0.25))
    torch.testing.assert_close(task_arithmetic([torch.ones(2), torch.ones(2)]), torch.full((2,), 2.0))


# ------------------------------------------------------------------------------------------ SVD machinery


def test_low_rank_svd_matches_the_dense_svd():
    Bs, As = factors(4, k=1, d_out=9, d_in=7, r=3)
    U, S, Vh = low_rank_svd(Bs[0], As[0])
    torch.testing.assert_close(S, torch.linalg.svdvals(Bs[0] @ As[0])[:3])
    torch.testing.assert_close((U * S) @ Vh, Bs[0] @ As[0])


@pytest.mark.parametrize("split", ["sqrt", "a", "b"])
def test_truncated_lora_has_rank_r_and_is_the_best_rank_r_approximation(split):
    g = torch.Generator().manual_seed(5)
    matrix = torch.randn(10, 8, generator=g, dtype=D)
    U, S, Vh = torch.linalg.svd(matrix, full_matrices=False)
    B, A = lora_factors(U, S, Vh, 3, scaling=2.0, split=split)
    approx = 2.0 * B @ A
    assert B.shape == (10, 3) and A.shape == (3, 8)
    assert int(torch.linalg.matrix_rank(approx)) == 3
    torch.testing.assert_close(approx, tsvd(matrix, 3))
    error = float(torch.linalg.matrix_norm(matrix - approx))
    # Eckart-Young: the error is the norm of the dropped singular values ...
    torch.testing.assert_close(error, float(S[3:].norm()))
    # ... and no other rank-3 matrix does better (random ones, and the projections on random 3-d subspaces).
    for _ in range(20):
        q, _ = torch.linalg.qr(torch.randn(10, 3, generator=g, dtype=D))
        assert float(torch.linalg.matrix_norm(matrix - q @ q.T @ matrix)) >= error - 1e-12
        other = torch.randn(10, 3, generator=g, dtype=D) @ torch.randn(3, 8, generator=g, dtype=D)
        assert float(torch.linalg.matrix_norm(matrix - other)) > error
    if split == "sqrt":
        torch.testing.assert_close(B.norm(dim=0), A.norm(dim=1))


def test_truncation_of_a_lower_rank_update_keeps_the_spare_directions_trainable():
    Bs, As = factors(6, k=1, d_out=6, d_in=5, r=1)
    U, S, Vh = low_rank_svd(Bs[0], As[0])
    B, A = lora_factors(U, S, Vh, 3, seed=1)
    torch.testing.assert_close(B @ A, Bs[0] @ As[0])
    assert float(B[:, 1:].abs().max()) == 0.0
    assert float(A[1:].abs().min()) > 0.0 and float(A[1:].abs().max()) <= 1 / 5**0.5


# -------------------------------------------------------------------------------------------- spaces


def test_knots_with_mean_equals_the_mean_of_the_products():
    Bs, As = factors(7)
    weights = [0.1, 0.2, 0.3, 0.4]
    U, M = knots_factors(Bs, As, [2.0] * 4, operator="mean", weights=weights)
    expected = sum(w * 2.0 * B @ A for w, B, A in zip(weights, Bs, As, strict=True))
    torch.testing.assert_close(U @ M, expected)
    torch.testing.assert_close(U.T @ U, torch.eye(U.shape[1], dtype=D))


def test_knots_drops_null_directions_and_iso_c_in_knots_is_iso_c_of_the_sum():
    Bs, As = factors(8, k=3)
    Bs[2] = Bs[0].clone()
    As[2] = As[0].clone()  # a duplicated client adds no direction: rank 6, not 9
    U, M = knots_factors(Bs, As, [1.0] * 3, operator="iso_c")
    assert U.shape[1] == 6
    torch.testing.assert_close(U @ M, iso_c([B @ A for B, A in zip(Bs, As, strict=True)]))


@pytest.mark.parametrize("space", ["ab", "knots"])
@pytest.mark.parametrize(
    ("operator", "options"),
    [("mean", {}), ("ties", {"density": 1.0}), ("dare_ties", {"density": 1.0}), ("dare_linear", {"density": 1.0})],
)
def test_identical_adapters_merge_to_the_same_adapter(space, operator, options):
    state = adapter_states(9, k=1)[0]
    copies = [{k: v.clone() for k, v in state.items()} for _ in range(3)]
    cfg = MergeConfig(operator=operator, space=space, **options)
    merged = merge_lora_states(copies, [10, 20, 30], cfg, scaling=2.0)
    assert set(merged) == set(state)
    for module in ("l0.q", "l0.v"):
        torch.testing.assert_close(product(merged, module), product(state, module), atol=1e-5, rtol=1e-5)
    head = "base_model.model.classifier.weight"
    torch.testing.assert_close(merged[head], state[head])
    if space == "ab":
        for key in state:
            torch.testing.assert_close(merged[key], state[key])


def test_knots_merge_of_adapters_is_the_tsvd_of_alpha_times_the_mean_update():
    states = adapter_states(10, k=3, r=2)
    sizes = [1.0, 2.0, 3.0]
    merged = merge_lora_states(states, sizes, MergeConfig(space="knots", alpha=0.7), scaling=4.0)
    for module in ("l0.q", "l0.v"):
        mean_update = sum(w / 6 * product(s, module, 4.0) for w, s in zip(sizes, states, strict=True))
        torch.testing.assert_close(product(merged, module, 4.0), tsvd(0.7 * mean_update, 2), atol=1e-5, rtol=1e-5)
    head = sum(w / 6 * s["base_model.model.classifier.weight"] for w, s in zip(sizes, states, strict=True))
    torch.testing.assert_close(merged["base_model.model.classifier.weight"], head)


def test_ab_space_scales_b_by_alpha_and_weights_uniformly_on_request():
    states = adapter_states(11, k=2)
    merged = merge_lora_states(states, [1.0, 3.0], MergeConfig(alpha=2.0, weighting="uniform"))
    a_key, b_key = "base_model.model.l0.q.lora_A.weight", "base_model.model.l0.q.lora_B.weight"
    torch.testing.assert_close(merged[a_key], (states[0][a_key] + states[1][a_key]) / 2)
    torch.testing.assert_close(merged[b_key], states[0][b_key] + states[1][b_key])


def test_task_arithmetic_with_weights_one_over_k_returns_identical_adapters_in_both_spaces():
    state = adapter_states(13, k=1)[0]
    copies = [{k: v.clone() for k, v in state.items()} for _ in range(4)]
    for space in ("ab", "knots"):
        cfg = MergeConfig(operator="task_arithmetic", space=space, alpha=0.25, weighting="uniform")
        merged = merge_lora_states(copies, [1.0] * 4, cfg, scaling=2.0)
        for module in ("l0.q", "l0.v"):
            torch.testing.assert_close(product(merged, module), product(state, module), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("operator", ["task_arithmetic", "iso_c"])
def test_summing_operators_in_ab_space_keep_the_scale_of_a_over_rounds(operator):
    # Clients start each round from the merged A; a sum of the A's would grow x K per round.
    states = adapter_states(14, k=5, r=2)
    a_key, b_key = "base_model.model.l0.q.lora_A.weight", "base_model.model.l0.q.lora_B.weight"
    start = max(float(s[a_key].norm()) for s in states)
    cfg = MergeConfig(operator=operator, space="ab", alpha=0.2)
    for _ in range(4):
        merged = merge_lora_states(states, [1.0] * 5, cfg)
        states = [{k: v.clone() for k, v in merged.items()} for _ in range(5)]
    assert float(merged[a_key].norm()) <= start
    # B carries the sum: K identical B's times alpha = 1 / K give that B back.
    torch.testing.assert_close(merged[b_key], states[0][b_key])
    if operator == "task_arithmetic":
        # A is the weighted mean: with sizes 1 and 3 the data weights are 1/4 and 3/4.
        pair = adapter_states(15, k=2, r=2)
        merged = merge_lora_states(pair, [1.0, 3.0], MergeConfig(operator=operator, space="ab"))
        torch.testing.assert_close(merged[a_key], 0.25 * pair[0][a_key] + 0.75 * pair[1][a_key])
        torch.testing.assert_close(merged[b_key], 0.5 * pair[0][b_key] + 1.5 * pair[1][b_key])


def test_iso_c_in_knots_keeps_the_strongest_directions_of_the_sum_with_a_flat_spectrum():
    states = adapter_states(12, k=3, r=2)
    merged = merge_lora_states(states, [1.0, 1.0, 1.0], MergeConfig(operator="iso_c", space="knots", alpha=0.5))
    total = sum(product(s, "l0.q") for s in states)
    U, S, _ = torch.linalg.svd(total)
    kept = S > 1e-6 * S[0]
    values = torch.linalg.svdvals(product(merged, "l0.q"))
    torch.testing.assert_close(values[:2], torch.full((2,), 0.5 * float(S[kept].mean()), dtype=D), rtol=1e-5, atol=0)
    assert float(values[2:].max()) < 1e-5
    # Its column space is the sum's top-2 left singular subspace.
    left = torch.linalg.svd(product(merged, "l0.q"))[0][:, :2]
    torch.testing.assert_close(left @ left.T, U[:, :2] @ U[:, :2].T, atol=1e-5, rtol=0)


@pytest.mark.parametrize("space", ["ab", "knots"])
def test_dare_merges_of_adapters_are_reproducible_from_the_seed(space):
    states = adapter_states(13, k=3)
    cfg = MergeConfig(operator="dare_ties", space=space, density=0.5)
    first = merge_lora_states(states, [1, 1, 1], cfg, seed=3)
    again = merge_lora_states(states, [1, 1, 1], cfg, seed=3)
    other = merge_lora_states(states, [1, 1, 1], cfg, seed=4)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first if "lora_" in k)
