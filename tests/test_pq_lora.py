"""PQ-LoRA: placement, orthonormal frames, zero aggregation error, r^2 span, and the hooked multi-branch adapter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedpeft.adapters.hooked import HookedAdapter
from fedpeft.adapters.pq_lora import (
    Site,
    layer_of,
    nearest_orthonormal_columns,
    nearest_orthonormal_rows,
    orthonormal_columns,
    orthonormal_rows,
    plan_sites,
    pq_delta,
    pq_layer_indices,
    pq_weight_update,
)


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("layers", "expected"),
    [(28, [7, 14, 21, 28]), (16, [4, 8, 12, 16]), (6, [1, 2, 3, 6]), (9, [2, 4, 6, 9]), (4, [1, 2, 3, 4]), (2, [1, 2])],
)
def test_pq_layers_are_the_last_layer_of_each_depth_block(layers, expected):
    assert pq_layer_indices(layers) == expected


def test_layer_of_reads_the_transformer_layer():
    assert layer_of("model.layers.12.mlp.down_proj") == 12
    assert layer_of("bert.encoder.layer.1.attention.self.query") == 1
    assert layer_of("lm_head") is None


def test_frames_are_orthonormal_and_projection_restores_orthonormality():
    A = orthonormal_rows(4, 10, generator(1))
    B = orthonormal_columns(7, 4, generator(2))
    torch.testing.assert_close(A @ A.T, torch.eye(4), atol=1e-6, rtol=0)
    torch.testing.assert_close(B.T @ B, torch.eye(4), atol=1e-6, rtol=0)
    noisy = A + 0.3 * torch.randn(4, 10, generator=generator(3))
    projected = nearest_orthonormal_rows(noisy)
    torch.testing.assert_close(projected @ projected.T, torch.eye(4), atol=1e-6, rtol=0)
    # U V^T is the nearest orthonormal-row matrix: closer to the noisy one than the original frame.
    assert (projected - noisy).norm() <= (A - noisy).norm()
    columns = nearest_orthonormal_columns(B + 0.2 * torch.randn(7, 4, generator=generator(4)))
    torch.testing.assert_close(columns.T @ columns, torch.eye(4), atol=1e-6, rtol=0)


def test_averaging_p_is_averaging_the_updates_exactly():
    g = generator(5)
    A = orthonormal_rows(3, 8, g).double()
    B = orthonormal_columns(6, 3, g).double()
    Ps = [torch.randn(3, 3, generator=g, dtype=torch.float64) for _ in range(5)]
    mean_p = torch.stack(Ps).mean(0)
    mean_update = torch.stack([pq_weight_update(A, B, P) for P in Ps]).mean(0)
    torch.testing.assert_close(pq_weight_update(A, B, mean_p), mean_update, rtol=0, atol=1e-14)


def test_pq_updates_span_r_squared_directions():
    g = generator(6)
    r = 3
    A = orthonormal_rows(r, 8, g)
    B = orthonormal_columns(6, r, g)
    directions = torch.stack([torch.outer(B[:, i], A[j]).reshape(-1) for i in range(r) for j in range(r)])
    assert torch.linalg.matrix_rank(directions) == r * r
    # ... and every B P A lies in that span.
    P = torch.randn(r, r, generator=g)
    coefficients = torch.linalg.lstsq(directions.T, pq_weight_update(A, B, P).reshape(-1, 1)).solution
    torch.testing.assert_close(directions.T @ coefficients, pq_weight_update(A, B, P).reshape(-1, 1), atol=1e-5, rtol=0)


def test_pq_delta_is_b_of_p_a_x_plus_q():
    g = generator(7)
    A, B = orthonormal_rows(2, 5, g), orthonormal_columns(4, 2, g)
    P, Q, x = torch.randn(2, 2, generator=g), torch.randn(2, generator=g), torch.randn(3, 5, generator=g)
    expected = torch.stack([B @ (P @ (A @ row) + Q) for row in x])
    torch.testing.assert_close(pq_delta(x, A, B, P, Q), expected)


def _fake_runtime(layers: int = 4, width: int = 6):
    modules = [(f"model.layers.{i}.mlp.down_proj", torch.nn.Linear(width, width)) for i in range(layers)]
    return SimpleNamespace(target_modules=modules, loaded=SimpleNamespace(lora_targets=["down_proj"]))


def test_plan_puts_pq_lora_on_the_last_layer_of_each_block():
    runtime = _fake_runtime(layers=6)
    sites = plan_sites(runtime.target_modules, ["down_proj"], "small")
    assert [s.kind for s in sites] == ["pq", "pq", "pq", "lora", "lora", "pq"]
    assert [s.key for s in sites if s.kind == "pq"] == [f"pq{k}.mlp.down_proj" for k in (1, 2, 3, 4)]
    assert sites[3].key == "small:model.layers.3.mlp.down_proj"


def test_hooked_adapter_adds_exactly_the_gated_branches():
    runtime = _fake_runtime(layers=4)
    sites = [Site("model.layers.0.mlp.down_proj", 0, "pq", "pq1.down_proj", 6, 6)]
    sites.append(Site("model.layers.1.mlp.down_proj", 1, "lora", "a:model.layers.1.mlp.down_proj", 6, 6))
    adapter = HookedAdapter(sites, rank=2, alpha=4.0).initialize(generator(8))
    x = torch.randn(5, 6, generator=generator(9))
    pq_module, lora_module = runtime.target_modules[0][1], runtime.target_modules[1][1]
    base_pq, base_lora = pq_module(x), lora_module(x)
    detach = adapter.attach(runtime)
    # At the start P = Q = 0 and LoRA B = 0: the model is the base model.
    torch.testing.assert_close(pq_module(x), base_pq)
    torch.testing.assert_close(lora_module(x), base_lora)
    g = generator(10)
    for branch in ("local", "global"):
        for name in ("pq1.down_proj.P", "pq1.down_proj.Q", "a:model.layers.1.mlp.down_proj.lora_B"):
            key = f"{branch}/{name}"
            adapter.tensors[key] = torch.randn(adapter.tensors[key].shape, generator=g)
    adapter.tensors["gate/0"] = torch.tensor(0.7)
    t = adapter.tensors
    A, B, w = t["frame/pq1.down_proj.A"], t["frame/pq1.down_proj.B"], torch.sigmoid(torch.tensor(0.7))
    expected = base_pq + (1 - w) * pq_delta(x, A, B, t["local/pq1.down_proj.P"], t["local/pq1.down_proj.Q"])
    expected = expected + w * pq_delta(x, A, B, t["global/pq1.down_proj.P"], t["global/pq1.down_proj.Q"])
    torch.testing.assert_close(pq_module(x), expected)
    key = "a:model.layers.1.mlp.down_proj"
    lora = [x @ t[f"{b}/{key}.lora_A"].T @ t[f"{b}/{key}.lora_B"].T for b in ("local", "global")]
    torch.testing.assert_close(lora_module(x), base_lora + 2.0 * 0.5 * (lora[0] + lora[1]))
    detach()
    torch.testing.assert_close(pq_module(x), base_pq)


def test_gate_starts_at_one_half_and_only_trainable_tensors_train(tmp_path):
    runtime = _fake_runtime(layers=4)
    sites = plan_sites(runtime.target_modules, ["down_proj"], "a")
    adapter = HookedAdapter(sites, rank=2).initialize(generator(11))
    assert all(float(adapter.gate(layer)) == 0.5 for layer in range(4))
    params = adapter.trainable(["local/", "gate/"])
    assert params and all(k.startswith(("local/", "gate/")) for k in params)
    frozen = {k: v.clone() for k, v in adapter.tensors.items() if not k.startswith(("local/", "gate/"))}
    detach = adapter.attach(runtime)
    optimizer = torch.optim.SGD(params.values(), lr=0.5)
    x = torch.randn(8, 6, generator=generator(12))
    for _ in range(3):
        out = sum(module(x).pow(2).sum() for _, module in runtime.target_modules)
        optimizer.zero_grad()
        out.backward()
        optimizer.step()
    detach()
    assert any(not torch.equal(params[k], torch.zeros_like(params[k])) for k in params if k.endswith(".P"))
    for key, value in frozen.items():
        torch.testing.assert_close(adapter.tensors[key], value, msg=key)
    reloaded = HookedAdapter.load_file(adapter.save(tmp_path))
    assert reloaded.sites == adapter.sites and reloaded.rank == 2
    for key, value in adapter.tensors.items():
        torch.testing.assert_close(reloaded.tensors[key], value.detach())
