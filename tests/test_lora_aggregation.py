"""FLoRA, FedEX-LoRA, RoLoRA and FedSVD: golden identities on hand-built tensors, runs on the toy model, and the
same numbers on the local and the Flower engine."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import fedpeft.methods  # noqa: F401
from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.costs import CostMeter
from fedpeft.core.types import ClientUpdate, Payload
from fedpeft.engine.local import LocalEngine
from fedpeft.methods.base import per_client_base_stage, serves_as_base_stage
from fedpeft.methods.families.folding import (
    base_weight_key,
    delta_key,
    refactor,
    stack_factors,
)
from fedpeft.worker import build_method

M = "base_model.model.layer.q"  # one LoRA module
A, B, D, HEAD = f"{M}.lora_A.weight", f"{M}.lora_B.weight", delta_key(M), "base_model.model.classifier.weight"
OUT, IN = 6, 5
WEIGHTS = [10.0, 20.0, 30.0]
P = [w / sum(WEIGHTS) for w in WEIGHTS]
TOL = {"atol": 1e-12, "rtol": 1e-12}


def factors(rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rank, IN, generator=g, dtype=torch.float64), torch.randn(
        OUT, rank, generator=g, dtype=torch.float64
    )


def head(seed: int) -> torch.Tensor:
    return torch.randn(2, IN, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)


def updates(tensors: list[dict]) -> list[ClientUpdate]:
    return [ClientUpdate(f"c{i}", t, w) for i, (t, w) in enumerate(zip(tensors, WEIGHTS, strict=True))]


# ---------------------------------------------------------------------------------------------- FLoRA
def test_stacked_factors_multiply_to_the_weighted_sum_of_products_for_any_ranks():
    pairs = [factors(r, r) for r in (1, 3, 4)]
    a, b = stack_factors(pairs, [0.5, -2.0, 0.25])
    assert a.shape == (8, IN) and b.shape == (OUT, 8)
    expected = sum(c * bk @ ak for (ak, bk), c in zip(pairs, [0.5, -2.0, 0.25], strict=True))
    torch.testing.assert_close(b @ a, expected, **TOL)


def test_flora_folds_the_weighted_sum_of_scaled_products_of_heterogeneous_ranks():
    method = build_method({"name": "flora", "alpha": 16.0, "ranks": [2, 3, 4]})
    assert [method.rank_of(f"c{i}") for i in range(4)] == [2, 3, 4, 2]
    from fedpeft.methods.flora import FloraState

    state = FloraState(tensors={D: torch.zeros(OUT, IN, dtype=torch.float64), HEAD: torch.zeros(2, IN)})
    payload = method.payload(state, "c1")
    assert method.update_spec(payload) == {A: (3, IN), B: (OUT, 3), HEAD: (2, IN)}
    ranks = [2, 3, 4]
    pairs = [factors(r, 10 + r) for r in ranks]
    uploads = updates([{A: a, B: b, HEAD: head(i)} for i, (a, b) in enumerate(pairs)])
    new, metrics = method.aggregate(state, iter(uploads))
    expected = sum(p * (16.0 / r) * b @ a for p, r, (a, b) in zip(P, ranks, pairs, strict=True))
    torch.testing.assert_close(new.tensors[D], expected, **TOL)
    torch.testing.assert_close(new.tensors[HEAD], sum(p * head(i) for i, p in enumerate(P)), **TOL)
    # The round loop, not aggregate, counts the rounds.
    assert new.stacked_rank == 9 and metrics["stacked_rank"] == 9.0 and new.round == state.round
    # The next round adds its own folded update to the cumulative one.
    again, _ = method.aggregate(new, iter(uploads))
    torch.testing.assert_close(again.tensors[D], 2 * expected, **TOL)


# ---------------------------------------------------------------------------------------------- FedEX-LoRA
def test_fedex_lora_residual_makes_the_global_model_exact():
    from fedpeft.methods.fedex_lora import FedExLoraState

    # Weighted by data size here; the default, uniform weights, is in tests/test_official_formulas.py.
    method = build_method({"name": "fedex_lora", "rank": 2, "alpha": 8.0, "weighting": "examples"})
    s = 8.0 / 2
    start = factors(2, 0)
    state = FedExLoraState(
        tensors={A: start[0], B: start[1], HEAD: head(0), D: torch.zeros(OUT, IN, dtype=torch.float64)}
    )
    assert method.update_spec(method.payload(state, "c0")) == {A: (2, IN), B: (OUT, 2), HEAD: (2, IN)}
    pairs = [factors(2, 20 + i) for i in range(3)]
    new, metrics = method.aggregate(
        state, iter(updates([{A: a, B: b, HEAD: head(i)} for i, (a, b) in enumerate(pairs)]))
    )
    a_avg, b_avg = (
        sum(p * a for p, (a, _) in zip(P, pairs, strict=True)),
        sum(p * b for p, (_, b) in zip(P, pairs, strict=True)),
    )
    torch.testing.assert_close(new.tensors[A], a_avg, **TOL)
    torch.testing.assert_close(new.tensors[B], b_avg, **TOL)
    mean_of_products = sum(p * s * b @ a for p, (a, b) in zip(P, pairs, strict=True))
    base = torch.randn(OUT, IN, dtype=torch.float64)
    # base + s B_avg A_avg + residual == base + sum_k p_k s B_k A_k
    torch.testing.assert_close(
        base + s * new.tensors[B] @ new.tensors[A] + new.tensors[D], base + mean_of_products, **TOL
    )
    assert metrics["residual_norm"] > 0
    torch.testing.assert_close(method.global_deltas(new)[D], mean_of_products, **TOL)


# ---------------------------------------------------------------------------------------------- RoLoRA
def test_rolora_alternates_the_trained_factor_and_averages_it_exactly():
    from fedpeft.methods.rolora import RoLoraState

    method = build_method({"name": "rolora", "rank": 2})
    a0, b0 = factors(2, 1)
    state = RoLoraState(tensors={A: a0, B: b0, HEAD: head(0)})
    payload = method.payload(state, "c0")
    assert payload.config["factor"] == "B" and method.update_spec(payload) == {B: (OUT, 2), HEAD: (2, IN)}
    bs = [factors(2, 30 + i)[1] for i in range(3)]
    new, _ = method.aggregate(state, iter(updates([{B: b, HEAD: head(i)} for i, b in enumerate(bs)])))
    assert torch.equal(new.tensors[A], a0)  # A kept from the state
    torch.testing.assert_close(
        new.tensors[B] @ new.tensors[A], sum(p * b @ a0 for p, b in zip(P, bs, strict=True)), **TOL
    )
    new = dataclasses.replace(new, round=1)  # the round loop counts the round
    payload = method.payload(new, "c0")
    assert payload.config["factor"] == "A" and method.update_spec(payload) == {A: (2, IN), HEAD: (2, IN)}
    As = [factors(2, 40 + i)[0] for i in range(3)]
    b1 = new.tensors[B]
    last, _ = method.aggregate(new, iter(updates([{A: a, HEAD: head(i)} for i, a in enumerate(As)])))
    assert torch.equal(last.tensors[B], b1)
    torch.testing.assert_close(
        last.tensors[B] @ last.tensors[A], sum(p * b1 @ a for p, a in zip(P, As, strict=True)), **TOL
    )
    assert build_method({"name": "rolora", "first": "A"}).factor(0) == "A"


# ---------------------------------------------------------------------------------------------- FedSVD
def test_refactor_keeps_the_product_with_orthonormal_a():
    a, b = factors(3, 2)
    a2, b2 = refactor(a, b)
    torch.testing.assert_close(b2 @ a2, b @ a, **TOL)
    torch.testing.assert_close(a2 @ a2.T, torch.eye(3, dtype=torch.float64), **TOL)
    # Singular values in B's columns: ||B' e_i|| is non-increasing.
    norms = b2.norm(dim=0)
    assert bool((norms[:-1] >= norms[1:] - 1e-12).all())
    za, zb = refactor(a, torch.zeros_like(b))  # nothing learnt yet: A stays an orthonormal basis, B zero
    torch.testing.assert_close(za @ za.T, torch.eye(3, dtype=torch.float64), **TOL)
    assert torch.count_nonzero(zb) == 0


def test_fedsvd_averages_b_and_refactorizes_the_product():
    from fedpeft.methods.fedsvd import FedSvdState

    # The head trained and averaged (`train_head`); frozen by default, as tests/test_official_formulas.py checks.
    method = build_method({"name": "fedsvd", "rank": 2, "train_head": True})
    a0, b0 = factors(2, 3)
    state = FedSvdState(tensors={A: a0, B: b0, HEAD: head(0)})
    assert method.update_spec(method.payload(state, "c0")) == {B: (OUT, 2), HEAD: (2, IN)}
    bs = [factors(2, 50 + i)[1] for i in range(3)]
    new, _ = method.aggregate(state, iter(updates([{B: b, HEAD: head(i)} for i, b in enumerate(bs)])))
    torch.testing.assert_close(
        new.tensors[B] @ new.tensors[A], sum(p * b @ a0 for p, b in zip(P, bs, strict=True)), **TOL
    )
    torch.testing.assert_close(new.tensors[A] @ new.tensors[A].T, torch.eye(2, dtype=torch.float64), **TOL)
    every_other = build_method({"name": "fedsvd", "rank": 2, "refactor_every": 2, "train_head": True})
    kept, _ = every_other.aggregate(state, iter(updates([{B: b, HEAD: head(i)} for i, b in enumerate(bs)])))
    assert torch.equal(kept.tensors[A], a0)


# ---------------------------------------------------------------------------------------------- identical updates
@pytest.mark.parametrize("name", ["flora", "fedsvd"])
def test_identical_updates_keep_their_product(name, toy_runtime, toy_clients):
    """The method matrix's identity check for the methods whose state re-expresses the uploads."""
    method = build_method({"name": name, "rank": 2, "local_steps": 2, "lr": 1e-2})
    state = method.init_server(toy_runtime, seed=0)
    update, _ = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    copies = [ClientUpdate(str(i), {k: v.clone() for k, v in update.tensors.items()}, 10.0 + i) for i in range(3)]
    new, _ = method.aggregate(state, iter(copies))
    modules = [k[: -len(".lora_B.weight")] for k in update.tensors if k.endswith(".lora_B.weight")]
    assert modules
    for module in modules:
        b = update.tensors[f"{module}.lora_B.weight"].double()
        if name == "flora":  # the fresh LoRA's scaled product, folded
            a = update.tensors[f"{module}.lora_A.weight"].double()
            expected, got = 2.0 * b @ a, new.tensors[delta_key(module)].double()
        else:  # B times the A the clients trained with, re-factorized
            a = state.tensors[f"{module}.lora_A.weight"].double()
            got = new.tensors[f"{module}.lora_B.weight"].double() @ new.tensors[f"{module}.lora_A.weight"].double()
            expected = b @ a
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- on the toy model
FAST = {"rounds": 1, "fraction": 1.0, "local_steps": 2, "local_epochs": None, "lr": 1e-2, "rank": 2}


def run_one_round(name: str, worker, clients, **extra):
    method = worker.methods[name]
    state = method.init_server(worker.runtime_for(clients[0].client_id), seed=0)
    uploads: list[ClientUpdate] = []
    original = method.aggregate

    def spy(state, updates):
        def recorded():
            for u in updates:
                uploads.append(u)
                yield u

        return original(state, recorded())

    method.aggregate = spy  # type: ignore[method-assign]
    ids = [c.client_id for c in clients]
    state = LocalEngine(worker).run_rounds(name, method, state, ids, seed=0, meter=CostMeter())
    return method, state, uploads


def test_flora_global_model_is_the_base_plus_the_clients_products(toy_runtime, toy_clients, toy_worker_factory):
    worker = toy_worker_factory([{"name": "flora", **FAST, "alpha": 8.0, "ranks": [2, 3]}])
    initial = toy_runtime.base_state()
    method, state, uploads = run_one_round("flora", worker, toy_clients)
    assert sorted(u.tensors[f"{next(iter(_modules(u)))}.lora_A.weight"].shape[0] for u in uploads) == [2, 2, 3, 3]
    total = sum(u.weight for u in uploads)
    base = method.export_base(toy_runtime, state)
    for module in _modules(uploads[0]):
        name = base_weight_key(module)
        expected = initial[name].double() + sum(
            u.weight / total * (8.0 / u.tensors[f"{module}.lora_A.weight"].shape[0])
            * u.tensors[f"{module}.lora_B.weight"].double() @ u.tensors[f"{module}.lora_A.weight"].double()
            for u in uploads
        )  # fmt: skip
        torch.testing.assert_close(base[name].double(), expected, atol=1e-6, rtol=1e-5)
    assert set(base) == set(initial)
    torch.testing.assert_close(base["classifier.weight"], state.tensors["base_model.model.classifier.weight"])
    # The personalized model is that global model; the runtime's base weights are left as they were.
    model = method.personalize(toy_runtime, toy_clients[0], state, None, None, seed=0)
    assert model.lora is None and all(torch.equal(model.base[k], base[k]) for k in model.base)
    assert all(torch.equal(v, toy_runtime.base_state()[k]) for k, v in initial.items())


def test_fedex_lora_global_model_is_the_mean_of_the_clients_models(toy_runtime, toy_clients, toy_worker_factory):
    worker = toy_worker_factory([{"name": "fedex_lora", **FAST}])
    initial = toy_runtime.base_state()
    method, state, uploads = run_one_round("fedex_lora", worker, toy_clients)
    total = sum(u.weight for u in uploads)
    base = method.export_base(toy_runtime, state)
    for module in _modules(uploads[0]):
        name = base_weight_key(module)
        # Every client started from B = 0 on W0, so its model is W0 + s B_k A_k (s = 4 / 2).
        expected = initial[name].double() + sum(
            u.weight / total * 2.0 * u.tensors[f"{module}.lora_B.weight"].double()
            @ u.tensors[f"{module}.lora_A.weight"].double()
            for u in uploads
        )  # fmt: skip
        torch.testing.assert_close(base[name].double(), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["rolora", "fedsvd"])
def test_one_factor_methods_upload_one_factor(name, toy_clients, toy_worker_factory):
    worker = toy_worker_factory([{"name": name, **FAST, "rounds": 2}])
    method = worker.methods[name]
    rounds: list[set[str]] = []
    original = method.aggregate

    def spy(state, updates):
        received = list(updates)
        rounds.append({k.rsplit(".", 2)[-2] for u in received for k in u.tensors if ".lora_" in k})
        return original(state, iter(received))

    method.aggregate = spy  # type: ignore[method-assign]
    state = method.init_server(worker.runtime_for("c0"), seed=0)
    LocalEngine(worker).run_rounds(name, method, state, [c.client_id for c in toy_clients], seed=0, meter=CostMeter())
    assert rounds == ([{"lora_B"}, {"lora_A"}] if name == "rolora" else [{"lora_B"}, {"lora_B"}])


def _modules(update: ClientUpdate) -> list[str]:
    return [k[: -len(".lora_A.weight")] for k in update.tensors if k.endswith(".lora_A.weight")]


def test_as_base_stage_the_shared_base_is_the_global_model(toy_runtime, toy_clients, toy_worker_factory):
    for name in ("flora", "fedex_lora"):
        method = build_method({"name": name, **FAST})
        assert serves_as_base_stage(method) and not per_client_base_stage(method)
    worker = toy_worker_factory([{"name": "flora", **FAST}])
    method, state, _ = run_one_round("flora", worker, toy_clients)
    base = method.export_base(toy_runtime, state)
    toy_runtime.load_base(None)
    for key, delta in state.tensors.items():
        if key.endswith(".base_delta"):
            name = base_weight_key(key[: -len(".base_delta")])
            torch.testing.assert_close(base[name], toy_runtime.base_params[name].detach() + delta)
    assert isinstance(method.payload(state, "c0"), Payload)


# ---------------------------------------------------------------------------------------------- Flower
@pytest.fixture
def flower_identity(monkeypatch):
    """The identity Flower stamps on messages (its runtimes set it in their processes)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, attribute, 1)


@pytest.mark.slow
def test_the_flower_engine_gives_the_local_numbers(tmp_path, flower_identity):
    from fedpeft.core.config import validate
    from fedpeft.engine.flower import GridEngine, flower_config
    from fedpeft.runner import Experiment
    from tests.test_flower import ATOL, InProcessGrid, read_records, tiny_raw

    common = {"rounds": 2, "fraction": 1.0, "local_steps": 2, "batch_size": 8, "lr": 1e-3, "rank": 2}
    methods = [
        {"name": "flora", **common, "ranks": [2, 3], "alpha": 8.0},
        {"name": "fedex_lora", **common},
        {"name": "rolora", **common},
        {"name": "fedsvd", **common},
    ]
    raw = tiny_raw(base={"kind": "pretrained"}, methods=methods)
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    local = Experiment(validate(raw), tmp_path / "local").run()
    grid = InProcessGrid(num_nodes=2)
    flower = Experiment(flower_config(validate(raw)), tmp_path / "flower").run(
        engine_factory=lambda worker: GridEngine(grid, worker)
    )
    expected, got = read_records(local), read_records(flower)
    assert {k[0] for k in expected} == {"base", "flora", "fedex_lora", "rolora", "fedsvd"}
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        if key[-1] != "seconds":  # wall-clock timings differ between runs
            assert got[key] == pytest.approx(value, abs=ATOL), key
    for name in ("flora", "fedex_lora", "rolora", "fedsvd"):
        a = load_checkpoint(local / "checkpoints" / name / "seed0.safetensors")["state"]
        b = load_checkpoint(flower / "checkpoints" / name / "seed0.safetensors")["state"]
        assert type(a) is type(b) and a.round == b.round == 2 and list(a.tensors) == list(b.tensors)
        for key, tensor in a.tensors.items():
            torch.testing.assert_close(b.tensors[key], tensor, atol=ATOL, rtol=0, msg=f"{name}: {key}")
