"""Golden numbers against the formulas of the authors' code: FedEx-LoRA, FedSVD and FLoRA aggregate hand-built
uploads of clients of unequal sizes (and ranks) as the authors' aggregation functions do, each written out here
from its repository's formula (cited in docs/methods/<name>.md, "Fidelity"), not computed by fedpeft; FedSVD's
head stays frozen; RoLoRA's local AdamW counts its steps per round and factor."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import fedpeft.methods  # noqa: F401
from fedpeft.core.costs import CostMeter
from fedpeft.core.types import ClientUpdate
from fedpeft.engine.local import LocalEngine
from fedpeft.methods.families.folding import delta_key
from fedpeft.worker import build_method

M = "base_model.model.layer.q"  # one LoRA module
A, B, D, HEAD = f"{M}.lora_A.weight", f"{M}.lora_B.weight", delta_key(M), "base_model.model.classifier.weight"
OUT, IN = 6, 5
SIZES = [10.0, 30.0, 60.0]  # unequal clients: n_k / n = 0.1, 0.3, 0.6 against 1/3 each
TOL = {"atol": 1e-12, "rtol": 1e-12}


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def uploads(tensors: list[dict[str, torch.Tensor]]) -> list[ClientUpdate]:
    return [ClientUpdate(f"c{i}", t, n) for i, (t, n) in enumerate(zip(tensors, SIZES, strict=True))]


# ---------------------------------------------------------------------------------------------- FedEx-LoRA
def fedex_official(clients: list[dict[str, torch.Tensor]], scaling: float) -> dict[str, torch.Tensor]:
    """RaghavSinghal10/fedex-lora, fed_agg.py, aggregate_models_ours: every mean over the K clients is 1/K.

    M = sum_i B_i A_i / K; A_avg, B_avg and the classifier: plain means; the base weight gains
    scaling * (M - B_avg A_avg) (the repository adds its transpose, see docs/methods/fedex_lora.md)."""
    k = len(clients)
    m = sum(c[B] @ c[A] for c in clients) / k
    a_avg = torch.stack([c[A] for c in clients]).mean(0)
    b_avg = torch.stack([c[B] for c in clients]).mean(0)
    head = torch.stack([c[HEAD] for c in clients]).mean(0)
    return {A: a_avg, B: b_avg, HEAD: head, D: scaling * (m - b_avg @ a_avg)}


def fedex_clients() -> list[dict[str, torch.Tensor]]:
    return [{A: randn(2, IN, seed=i), B: randn(OUT, 2, seed=10 + i), HEAD: randn(2, IN, seed=20 + i)} for i in range(3)]


def fedex_start():
    from fedpeft.methods.fedex_lora import FedExLoraState

    return FedExLoraState(
        tensors={A: randn(2, IN, seed=90), B: randn(OUT, 2, seed=91), HEAD: randn(2, IN, seed=92)}
        | {D: torch.zeros(OUT, IN, dtype=torch.float64)}
    )


def test_fedex_lora_default_is_the_official_uniform_mean_on_unequal_clients():
    method = build_method({"name": "fedex_lora", "rank": 2, "alpha": 8.0})
    assert method.cfg.weighting == "uniform"
    clients = fedex_clients()
    new, _ = method.aggregate(fedex_start(), iter(uploads(clients)))
    for key, expected in fedex_official(clients, scaling=8.0 / 2).items():
        torch.testing.assert_close(new.tensors[key], expected, **TOL, msg=key)


def test_fedex_lora_weighting_examples_weights_every_mean_by_data_size():
    method = build_method({"name": "fedex_lora", "rank": 2, "alpha": 8.0, "weighting": "examples"})
    clients = fedex_clients()
    new, _ = method.aggregate(fedex_start(), iter(uploads(clients)))
    weighted = [(n / sum(SIZES), c) for n, c in zip(SIZES, clients, strict=True)]
    a_avg, b_avg = sum(p * c[A] for p, c in weighted), sum(p * c[B] for p, c in weighted)
    torch.testing.assert_close(new.tensors[A], a_avg, **TOL)
    torch.testing.assert_close(new.tensors[B], b_avg, **TOL)
    torch.testing.assert_close(new.tensors[HEAD], sum(p * c[HEAD] for p, c in weighted), **TOL)
    residual = 4.0 * (sum(p * c[B] @ c[A] for p, c in weighted) - b_avg @ a_avg)
    torch.testing.assert_close(new.tensors[D], residual, **TOL)
    # The two weightings are far apart on these clients (the 0.11 was one such gap).
    uniform = fedex_official(clients, scaling=4.0)
    assert float((new.tensors[A] - uniform[A]).abs().max()) > 0.05


# ---------------------------------------------------------------------------------------------- FedSVD
def fedsvd_official(a: torch.Tensor, b: torch.Tensor, clients: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """sw-programmer/FedSVD: fedmm/fedavg/server.py, Server.aggregate ('ffa' branch): B <- B + sum_k (n_k / n)
    (B_k - B), the uploads being differences to the global tensors; then misc/utils.py, reinit_lora:
    V, S, Uh = svd(B A), A <- Uh[:r], B <- V[:, :r] diag(S[:r])."""
    ratio = [n / sum(SIZES) for n in SIZES]
    b_new = b + sum(rk * (bk - b) for rk, bk in zip(ratio, clients, strict=True))
    v, s, uh = torch.linalg.svd(b_new @ a, full_matrices=False)
    r = a.shape[0]
    return uh[:r], v[:, :r] @ torch.diag(s[:r])


def fedsvd_state():
    from fedpeft.methods.fedsvd import FedSvdState

    return FedSvdState(tensors={A: randn(3, IN, seed=30), B: randn(OUT, 3, seed=31), HEAD: randn(2, IN, seed=32)})


def test_fedsvd_aggregation_and_refactorization_follow_the_official_formulas():
    method = build_method({"name": "fedsvd", "rank": 3})
    state = fedsvd_state()
    clients = [randn(OUT, 3, seed=40 + i) for i in range(3)]
    new, _ = method.aggregate(state, iter(uploads([{B: b} for b in clients])))
    a_official, b_official = fedsvd_official(state.tensors[A], state.tensors[B], clients)
    # An SVD fixes each singular pair up to its sign: align the signs, then the factors are the official ones.
    signs = torch.sign((new.tensors[A] * a_official).sum(dim=1))
    torch.testing.assert_close(new.tensors[A], signs[:, None] * a_official, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(new.tensors[B], b_official * signs[None, :], atol=1e-10, rtol=1e-10)
    assert torch.equal(new.tensors[HEAD], state.tensors[HEAD])  # not aggregated


def test_fedsvd_warmup_rounds_skip_the_refactorization_as_the_official_warmup():
    """server.py, on_round_complete: re-factorize when (round + 1) % period == 0 and round + 1 > warmup."""
    method = build_method({"name": "fedsvd", "rank": 3, "svd_warmup_rounds": 2})
    state = fedsvd_state()
    clients = [randn(OUT, 3, seed=50 + i) for i in range(3)]
    for round_, refactored in ((0, False), (1, False), (2, True)):
        new, _ = method.aggregate(dataclasses.replace(state, round=round_), iter(uploads([{B: b} for b in clients])))
        assert torch.equal(new.tensors[A], state.tensors[A]) is not refactored, round_
    assert build_method({"name": "fedsvd"}).cfg.svd_warmup_rounds == 0


def test_fedsvd_scaling_is_one_by_default_as_the_official_alpha_8_rank_8(toy_runtime):
    assert build_method({"name": "fedsvd", "rank": 8}).spec(toy_runtime).alpha == 8.0
    assert build_method({"name": "fedsvd", "rank": 4, "alpha": 8.0}).spec(toy_runtime).alpha == 8.0


FAST = {"fraction": 1.0, "local_steps": 2, "local_epochs": None, "lr": 1e-2, "rank": 2}


@pytest.mark.parametrize("train_head", [False, True])
def test_fedsvd_head_is_frozen_unless_asked(train_head, toy_clients, toy_worker_factory):
    entry = {"name": "fedsvd", **FAST, "rounds": 2, **({"train_head": True} if train_head else {})}
    worker = toy_worker_factory([entry])
    method = worker.methods["fedsvd"]
    uploaded: list[set[str]] = []
    original = method.aggregate

    def spy(state, updates):
        received = list(updates)
        uploaded.extend(set(u.tensors) for u in received)
        return original(state, iter(received))

    method.aggregate = spy  # type: ignore[method-assign]
    start = method.init_server(worker.runtime_for("c0"), seed=0)
    heads = [k for k in start.tensors if ".lora_" not in k]
    assert heads  # the toy BERT has a classification head
    assert bool(set(heads) & set(method.update_spec(method.payload(start, "c0")))) is train_head
    ids = [c.client_id for c in toy_clients]
    end = LocalEngine(worker).run_rounds("fedsvd", method, start, ids, seed=0, meter=CostMeter())
    assert len(uploaded) == 2 * len(toy_clients)
    assert all(bool(set(heads) & keys) is train_head for keys in uploaded)
    assert all(torch.equal(end.tensors[k], start.tensors[k]) is not train_head for k in heads)


# ---------------------------------------------------------------------------------------------- FLoRA
def flora_official(pairs: list[tuple[torch.Tensor, torch.Tensor]], lora_alpha: float, lora_r: float) -> torch.Tensor:
    """ATP-1010/FederatedLLM: fed_utils/model_aggregation.py, FedAvg (stacking): A_k * p_k stacked as rows (p_k:
    data sizes normalized to sum 1), B_k as columns; main.py merges the stacked LoRA at lora_alpha / lora_r."""
    p = [n / sum(SIZES) for n in SIZES]
    a = torch.cat([ak * pk for (ak, _), pk in zip(pairs, p, strict=True)], dim=0)
    b = torch.cat([bk for _, bk in pairs], dim=1)
    return lora_alpha / lora_r * b @ a


def flora_round(method) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    from fedpeft.methods.flora import FloraState

    state = FloraState(tensors={D: torch.zeros(OUT, IN, dtype=torch.float64)})
    pairs = [(randn(r, IN, seed=60 + r), randn(OUT, r, seed=70 + r)) for r in (2, 3, 4)]
    new, _ = method.aggregate(state, iter(uploads([{A: a, B: b} for a, b in pairs])))
    return new.tensors[D], pairs


def test_flora_default_equals_the_official_code_at_its_defaults():
    """Clients train at alpha_k = 2 r_k (main.py, heterogeneous ranks), merged at lora_alpha / lora_r = 32 / 16."""
    method = build_method({"name": "flora", "ranks": [2, 3, 4]})
    assert [method.scaling(r) for r in (2, 3, 4)] == [2.0, 2.0, 2.0]
    delta, pairs = flora_round(method)
    torch.testing.assert_close(delta, flora_official(pairs, lora_alpha=32, lora_r=16), **TOL)


def test_flora_merge_scaling_is_the_official_merge_at_any_alpha():
    method = build_method({"name": "flora", "ranks": [2, 3, 4], "merge_scaling": 8 / 16})
    delta, pairs = flora_round(method)
    torch.testing.assert_close(delta, flora_official(pairs, lora_alpha=8, lora_r=16), **TOL)


# ---------------------------------------------------------------------------------------------- RoLoRA
def test_rolora_adam_counts_its_steps_per_round_and_factor(toy_runtime, toy_clients):
    """A fresh AdamW per round over the round's factor: the first step of B (round 0) and of A (round 1) are both
    bias-corrected as step 1, so each entry moves by lr * |g| / (|g| + eps): lr, less where |g| is near eps (A's
    gradients through a B of one step are about 5e-5, so its largest move is 0.9998 lr). Had the step count run over
    the global rounds, A's first step (step 2 with fresh moments) would be lr * sqrt(1 + beta2) / (1 + beta1) =
    0.744 lr."""
    lr = 1e-2
    method = build_method({"name": "rolora", "rank": 2, "local_steps": 1, "local_epochs": None, "lr": lr})
    state = method.init_server(toy_runtime, seed=0)
    moved = {}
    for round_, factor in ((0, ".lora_B."), (1, ".lora_A.")):
        state = dataclasses.replace(state, round=round_)
        payload = method.payload(state, "c0")
        update, _ = method.client_update(toy_runtime, toy_clients[0], payload, None, seed=1)
        keys = [k for k in update.tensors if factor in k]
        assert keys
        moved[factor] = max(float((update.tensors[k] - state.tensors[k]).abs().max()) for k in keys)
        state, _ = method.aggregate(state, iter([update]))
    for factor, step in moved.items():
        assert step == pytest.approx(lr, rel=1e-3), factor
