"""The one-time alignment of PQ-LoRA frames: A by L2 fit + orthogonality, B by regularized CCA."""

from __future__ import annotations

import torch

from fedpeft.adapters import alignment
from fedpeft.adapters.alignment import (
    AlignmentSettings,
    align_input_frame,
    align_output_frame,
    low_rank_cca,
    module_groups,
    paired_rows,
    regularized_cca,
    select_rows,
)
from fedpeft.adapters.pq_lora import orthonormal_columns, orthonormal_rows


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_a_alignment_recovers_a_rotated_space_and_ends_orthonormal():
    g = generator(0)
    rotation = torch.linalg.qr(torch.randn(12, 12, generator=g)).Q
    x_other = torch.randn(400, 12, generator=g)
    x_pivot = x_other @ rotation  # the pivot sees the same inputs in a rotated basis
    a_pivot = orthonormal_rows(3, 12, g)
    a_init = orthonormal_rows(3, 12, g)
    owner = torch.arange(400) // 4
    settings = AlignmentSettings(lr=0.1, epochs=5, batch_size=8)
    a_j = align_input_frame(x_pivot, a_pivot, x_other, a_init, owner, settings, g)
    torch.testing.assert_close(a_j @ a_j.T, torch.eye(3), atol=1e-5, rtol=0)
    target = x_pivot @ a_pivot.T
    before = (x_other @ a_init.T - target).norm() / target.norm()
    after = (x_other @ a_j.T - target).norm() / target.norm()
    assert before > 1.0 and after < 0.1
    # The exact solution is A_p R^T (orthonormal too).
    torch.testing.assert_close(a_j, a_pivot @ rotation.T, atol=0.1, rtol=0)


def test_cca_finds_perfectly_correlated_directions():
    g = generator(1)
    shared = torch.randn(300, 3, generator=g)
    x = shared @ torch.randn(3, 8, generator=g)  # rank 3 in 8 dims
    y = shared @ torch.randn(3, 5, generator=g) + 1e-4 * torch.randn(300, 5, generator=g)
    pi_x, pi_y, correlations = regularized_cca(x, y, 3, reg=1e-6)
    assert pi_x.shape == (8, 3) and pi_y.shape == (5, 3)
    assert torch.all(correlations > 0.999)
    u, v = (x - x.mean(0)) @ pi_x, (y - y.mean(0)) @ pi_y
    for i in range(3):
        assert torch.corrcoef(torch.stack([u[:, i], v[:, i]]))[0, 1] > 0.999


def test_b_alignment_keeps_orthonormal_columns_and_matches_outputs():
    g = generator(2)
    codes = torch.randn(200, 3, generator=g)
    b_pivot = orthonormal_columns(9, 3, g)
    b_init = orthonormal_columns(7, 3, g)
    b_j = align_output_frame(codes, b_pivot, codes, b_init, reg=1e-6)
    torch.testing.assert_close(b_j.T @ b_j, torch.eye(3), atol=1e-5, rtol=0)
    assert b_j.shape == (7, 3)
    # Same codes on both sides: after alignment the j-side outputs carry the pivot's code directions, i.e.
    # B_j^T B_j z reproduces z up to the same rotation for every sample (the code space is preserved).
    out_j = codes @ b_j.T
    recovered = torch.linalg.lstsq(out_j, codes).solution
    torch.testing.assert_close(out_j @ recovered, codes, atol=1e-4, rtol=0)


def test_cca_from_factors_equals_the_cca_of_the_outputs_formed_in_double():
    g = generator(5)
    codes_x = torch.randn(500, 4, generator=g)
    codes_y = codes_x @ torch.randn(4, 4, generator=g) + 0.3 * torch.randn(500, 4, generator=g)
    b_x, b_y = torch.randn(30, 4, generator=g), torch.randn(20, 4, generator=g)
    x, y = codes_x.double() @ b_x.double().T, codes_y.double() @ b_y.double().T
    pi_x, pi_y, formed = regularized_cca(x, y, 4, reg=1e-3)
    fx, fy, factored = low_rank_cca(codes_x, b_x, codes_y, b_y, 4, reg=1e-3)
    torch.testing.assert_close(factored, formed, atol=1e-6, rtol=0)
    for data, formed_pi, factored_pi in ((x, pi_x, fx), (y, pi_y, fy)):
        centred = (data - data.mean(0)).float()
        a, b = centred @ formed_pi, centred @ factored_pi  # the canonical variates, each up to its sign
        torch.testing.assert_close(b * torch.sign((a * b).sum(0)), a, atol=1e-5, rtol=0)


def test_output_frame_comes_from_the_factors_at_every_size(monkeypatch):
    g = generator(6)
    codes_p = torch.randn(400, 3, generator=g)
    codes_j = codes_p @ torch.randn(3, 3, generator=g) + 0.2 * torch.randn(400, 3, generator=g)
    b_pivot, b_init = orthonormal_columns(12, 3, g), orthonormal_columns(9, 3, g)
    # The frame the CCA of the formed outputs (in double) gives: the factored one within float32 rounding.
    pi_p, pi_j, _ = regularized_cca(
        codes_p.double() @ b_pivot.double().T, codes_j.double() @ b_init.double().T, 3, reg=1e-3
    )
    formed = alignment.nearest_orthonormal_columns(torch.linalg.pinv(pi_j).T @ pi_p.T @ b_pivot)

    def refused(*args, **kwargs):
        raise AssertionError("the outputs were formed")

    monkeypatch.setattr(alignment, "regularized_cca", refused)
    factored = align_output_frame(codes_p, b_pivot, codes_j, b_init)
    torch.testing.assert_close(factored.T @ factored, torch.eye(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(factored, formed, atol=1e-4, rtol=0)
    # A paper-size site (Llama-3.1-8B's MLP: 14,336 outputs, 20,000 rows, 2.3 GB formed) from n x r and d x r.
    codes = torch.randn(20_000, 8, generator=g)
    wide = align_output_frame(codes, orthonormal_columns(14_336, 8, g), codes, orthonormal_columns(14_336, 8, g))
    torch.testing.assert_close(wide.T @ wide, torch.eye(8), atol=1e-4, rtol=0)


def test_rows_pair_example_by_example_with_each_rows_owner():
    g = generator(3)
    pivot = [torch.randn(4, 4, generator=g), torch.randn(0, 4), torch.randn(3, 4, generator=g)]
    other = [torch.randn(4, 6, generator=g), torch.randn(0, 6), torch.randn(3, 6, generator=g)]
    expected_p, expected_o = torch.cat(pivot), torch.cat(other)
    last_other = other[2]
    x_p, x_o, owner = paired_rows(pivot, other)
    assert x_p.shape == (7, 4) and x_o.shape == (7, 6) and owner.tolist() == [0, 0, 0, 0, 2, 2, 2]
    assert torch.equal(x_p, expected_p) and torch.equal(x_o, expected_o) and torch.equal(x_o[4:], last_other)
    assert pivot == [] and other == []  # consumed: each example's rows are no longer held twice


def test_rows_are_all_kept_or_a_uniform_draw_over_every_example_and_position():
    lengths = [5, 3, 0, 4]
    everything = select_rows(lengths, max_rows=12, generator=generator(0))
    assert [t.tolist() for t in everything] == [[0, 1, 2, 3, 4], [0, 1, 2], [], [0, 1, 2, 3]]
    drawn = select_rows(lengths, max_rows=6, generator=generator(1))
    # the draw of the concatenated rows (example-major), as one permutation of all 12 gives it
    expected = torch.randperm(12, generator=generator(1))[:6].sort().values.tolist()
    flat = [(i, p) for i, n in enumerate(lengths) for p in range(n)]
    assert [(i, int(p)) for i, positions in enumerate(drawn) for p in positions] == [flat[k] for k in expected]
    assert len(drawn) == 4 and sum(len(t) for t in drawn) == 6


def test_sites_are_captured_in_groups_that_fit_the_memory_budget():
    widths = [4096, 4096, 14336, 4096]
    rows = 20_000
    assert module_groups(["q", "k", "down", "o"], widths, rows, budget=10**12) == [["q", "k", "down", "o"]]
    # 20,000 rows of 4,096 floats: 328 MB; of 14,336: 1.15 GB
    assert module_groups(["q", "k", "down", "o"], widths, rows, budget=1_000_000_000) == [["q", "k"], ["down"], ["o"]]
    assert module_groups(["q", "k"], widths[:2], rows, budget=1) == [["q"], ["k"]]  # one site a pass at least


def test_row_counts_are_the_rows_site_inputs_gives_and_kept_rows_are_those_positions(toy_runtime, toy_clients):
    from fedpeft.adapters.alignment import row_counts, site_inputs

    examples = toy_clients[0].train[:7]
    module = toy_runtime.target_modules[0][0]
    full = site_inputs(toy_runtime, [module], examples, batch_size=3)[module]
    assert row_counts(toy_runtime, module, examples, batch_size=3) == [len(rows) for rows in full]
    keep = select_rows([len(rows) for rows in full], max_rows=10, generator=generator(0))
    kept = site_inputs(toy_runtime, [module], examples, batch_size=3, keep=keep)[module]
    for rows, chosen, positions in zip(full, kept, keep, strict=True):
        torch.testing.assert_close(chosen, rows[positions])
    pooled = site_inputs(toy_runtime, [module], examples, batch_size=3, pooled=True)[module]
    torch.testing.assert_close(pooled[2], full[2].mean(0, keepdim=True))
