"""RELA and FedMosaic: relevance weights, the shared mask, customized globals, the frozen-model gradient, and a
heterogeneous federation end to end (alignment, per-client globals, LoRA kept within architectures)."""

from __future__ import annotations

import math

import pytest
import torch

from fedpeft.core.config import validate
from fedpeft.core.costs import CostMeter
from fedpeft.engine.local import LocalEngine
from fedpeft.merging import rela
from fedpeft.methods.families.branched import (
    example_batches,
    frozen_gradient,
    gradient_module,
    hooked_adapter,
    matched_steps,
)
from fedpeft.methods.fedmosaic import FedMosaicConfig
from fedpeft.models.runtime import ClientModel
from tests.test_federation import HETERO, generation_data


def test_defaults_are_the_papers_text_protocol():
    # Sec. A.6 (text-only runs), Table 15 and Sec. A.17: the values docs/methods/fedmosaic.md#fidelity checks.
    cfg = FedMosaicConfig(name="fedmosaic")
    assert (cfg.rounds, cfg.local_steps, cfg.batch_size, cfg.fraction) == (20, 100, 4, 1.0)
    assert (cfg.rank, cfg.lr, cfg.pq_lr, cfg.weight_decay, cfg.blocks) == (16, 3e-4, None, 0.0, 4)
    assert (cfg.tau, cfg.ema, cfg.noise, cfg.keep, cfg.grad_every) == (0.5, 0.5, 1e-4, 0.4, 10)
    assert (cfg.align_samples, cfg.align_lr, cfg.align_epochs, cfg.align_batch_size, cfg.align_lambda) == (
        5000,
        5e-5,
        1.0,
        4,
        0.5,
    )
    assert matched_steps(cfg) == 91  # 100 steps / 1.098, SFT's compute per round


def test_relevance_weights_match_a_hand_computed_softmax():
    vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    weights = rela.relevance_weights(vectors, tau=0.5)
    c = 1 / math.sqrt(2)
    row0 = torch.tensor([math.exp(2), math.exp(0), math.exp(2 * c)], dtype=torch.float64)
    torch.testing.assert_close(weights[0], row0 / row0.sum())
    torch.testing.assert_close(weights.sum(1), torch.ones(3, dtype=torch.float64))


def test_each_client_weighs_itself_most_when_its_gradient_differs():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(50, generator=g)
    vectors = torch.stack([torch.randn(50, generator=g), base, base + 0.3 * torch.randn(50, generator=g)])
    weights = rela.relevance_weights(vectors, tau=0.5)
    torch.testing.assert_close(weights.sum(1), torch.ones(3, dtype=torch.float64))
    assert weights.argmax(1).tolist() == [0, 1, 2]
    # The two related clients weigh each other more than the unrelated one.
    assert weights[1, 2] > weights[1, 0] and weights[2, 1] > weights[2, 0]


def test_the_mask_is_shared_and_keeps_forty_percent():
    first, second = rela.shared_mask(1000, 0.4, seed=7), rela.shared_mask(1000, 0.4, seed=7)
    assert torch.equal(first, second) and len(first) == 400 and len(set(first.tolist())) == 400
    assert torch.equal(first, first.sort().values) and not torch.equal(first, rela.shared_mask(1000, 0.4, seed=8))


def test_ema_and_sanitizing():
    g = torch.tensor([2.0, -4.0])
    torch.testing.assert_close(rela.ema(None, g, 0.5), torch.tensor([1.0, -2.0]))
    torch.testing.assert_close(rela.ema(torch.tensor([4.0, 0.0]), g, 0.5), torch.tensor([3.0, -2.0]))
    noisy = rela.sanitize(torch.zeros(10_000), 1e-4, torch.Generator().manual_seed(0))
    assert abs(float(noisy.std()) - 1e-4) < 5e-6


def test_customized_global_renormalizes_within_the_architecture_and_keeps_a_lone_client_its_own():
    adapters = [
        {"pq1.q.P": torch.tensor([1.0]), "big:m.lora_A": torch.tensor([10.0])},
        {"pq1.q.P": torch.tensor([2.0]), "big:m.lora_A": torch.tensor([20.0])},
        {"pq1.q.P": torch.tensor([4.0]), "small:m.lora_A": torch.tensor([7.0])},
    ]
    weights = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    result = rela.customized_global(weights, adapters)
    torch.testing.assert_close(result["pq1.q.P"], torch.tensor([0.5 * 1 + 0.3 * 2 + 0.2 * 4]))
    torch.testing.assert_close(result["big:m.lora_A"], torch.tensor([(0.5 * 10 + 0.3 * 20) / 0.8]))
    torch.testing.assert_close(result["small:m.lora_A"], torch.tensor([7.0]))  # alone in its group: its own


def test_training_batches_are_replayed_exactly(toy_runtime, toy_clients):
    examples = toy_clients[0].train
    replay = example_batches(len(examples), 5, seed=3)
    stream = toy_runtime.batches(examples, 5, seed=3)
    for _ in range(15):  # across the end of an epoch
        expected = toy_runtime.encode([examples[i] for i in next(replay)])
        torch.testing.assert_close(next(stream)["input_ids"], expected["input_ids"])


def test_frozen_gradient_ignores_the_clients_adapter(toy_runtime, toy_clients):
    examples = toy_clients[0].train[:6]
    module = gradient_module(toy_runtime, "down_proj")
    assert module == "bert.encoder.layer.1.attention.self.value"  # no down_proj: the last adapted module
    toy_runtime.install(ClientModel())
    weight = dict(toy_runtime.target_modules)[module].weight
    flag = weight.requires_grad
    plain = frozen_gradient(toy_runtime, module, examples)
    adapter = hooked_adapter(toy_runtime, 0, rank=2)
    for key in adapter.tensors:
        if key.endswith(".P"):
            adapter.tensors[key] = torch.ones_like(adapter.tensors[key])
    toy_runtime.install(ClientModel(extension=adapter))
    adapter.enabled = False
    torch.testing.assert_close(frozen_gradient(toy_runtime, module, examples), plain)
    adapter.enabled = True
    assert not torch.allclose(frozen_gradient(toy_runtime, module, examples), plain)
    toy_runtime.detach_extension()
    assert plain.shape == (weight.numel(),) and weight.requires_grad == flag and weight.grad is None


def test_heterogeneous_federation_end_to_end(tmp_path):
    from fedpeft.worker import Worker

    raw = {
        **HETERO,
        "methods": [
            {"name": "fedmosaic", "rounds": 2, "local_steps": 6, "rank": 2, "grad_every": 3, "align_lr": 0.01},
        ],
    }
    worker = Worker(validate(raw), tmp_path, data=generation_data())
    method = worker.methods["fedmosaic"]
    state = method.init_server(worker.runtime, seed=0)
    assert state.pivot == "llama"  # the smaller of the two
    assert state.grad_module == "model.layers.4.mlp.down_proj"
    for frames in state.frames.values():
        for frame in frames.values():
            torch.testing.assert_close(frame["A"] @ frame["A"].T, torch.eye(2), atol=1e-5, rtol=0)
            torch.testing.assert_close(frame["B"].T @ frame["B"], torch.eye(2), atol=1e-5, rtol=0)
    assert state.alignment  # the qwen frames were fitted to the pivot's
    first = {c: method.payload(state, c) for c in ("c0", "c1")}
    assert first["c0"].config["mask_seed"] == first["c1"].config["mask_seed"]
    assert any(k.startswith("frame/") for k in first["c1"].tensors)
    uploads = []
    original = method.aggregate

    def spy(state, updates):
        updates = list(updates)
        uploads.extend(updates)
        return original(state, iter(updates))

    method.aggregate = spy  # type: ignore[method-assign]
    state = LocalEngine(worker).run_rounds(
        "fedmosaic", method, state, ["c0", "c1", "c2", "c3"], seed=0, meter=CostMeter()
    )
    sizes = {u.extras["relevance"].numel() for u in uploads}
    assert sizes == {round(0.4 * state.grad_size)}
    assert not any(k.startswith(("gate/", "head/", "frame/")) for u in uploads for k in u.tensors)
    assert not any(k.startswith("frame/") for k in method.payload(state, "c1").tensors)  # sent only once
    weights = state.relevance["weights"]
    torch.testing.assert_close(weights.sum(1), torch.ones(4))
    for client, architecture in worker.federation.assignment.items():
        other = "qwen" if architecture == "llama" else "llama"
        custom = state.globals[client]
        assert not any(k.startswith(f"{other}:") for k in method.payload(state, client).tensors)
        # Ordinary LoRA of client's group: RELA-weighted mean over that group only.
        group = sorted(c for c, a in worker.federation.assignment.items() if a == architecture)
        key = next(k for k in custom if k.startswith(f"{architecture}:"))
        row = state.relevance["clients"].index(client)
        columns = [state.relevance["clients"].index(c) for c in group]
        w = weights[row, columns].double() / weights[row, columns].double().sum()
        expected = sum(
            wj * next(u for u in uploads[-4:] if u.client_id == c).tensors[key].double()
            for wj, c in zip(w, group, strict=True)
        )
        torch.testing.assert_close(custom[key].double(), expected, atol=1e-6, rtol=1e-5)
    records, _ = worker.personalize("fedmosaic", 0, "c1", state)
    assert {r["metric"] for r in records} == {"meteor", "rouge1", "rougeL"}


def test_vanilla_ablation_without_pq_lora_trains_every_client(tmp_path):
    # pq: false sends no frames; the clients must still train (and not fail) in every round.
    from fedpeft.worker import Worker

    raw = {
        **HETERO,
        "methods": [{"name": "fedmosaic", "rounds": 2, "local_steps": 4, "rank": 2, "pq": False, "rela": False}],
    }
    worker = Worker(validate(raw), tmp_path, data=generation_data())
    method = worker.methods["fedmosaic"]
    state = method.init_server(worker.runtime, seed=0)
    start = {k: v.clone() for k, v in state.tensors.items()}
    assert start and not any(k.startswith("pq") for k in start)
    meter = CostMeter()
    state = LocalEngine(worker).run_rounds("fedmosaic", method, state, ["c0", "c1", "c2", "c3"], seed=0, meter=meter)
    assert meter.failures == [] and meter.client_rounds == 8
    b_keys = [k for k in start if k.endswith("lora_B")]
    assert all(float(state.tensors[k].abs().max()) > 0 for k in b_keys)
    weights = state.relevance["weights"]
    torch.testing.assert_close(weights, torch.full((4, 4), 0.25))  # rela: false -> equal weights


def test_gate_starts_at_one_half_on_a_fresh_client(toy_runtime, toy_clients):
    from fedpeft.worker import build_method

    method = build_method({"name": "fedmosaic", "rounds": 1, "local_steps": 1})
    state = method.init_server(toy_runtime, seed=0)
    model = method.personalize(toy_runtime, toy_clients[0], state, None, None, seed=0)
    gates = {k: v for k, v in model.extension.tensors.items() if k.startswith("gate/")}
    assert gates and all(float(torch.sigmoid(v)) == 0.5 for v in gates.values())


@pytest.mark.parametrize("settings", [{"capture_bytes": 1}, {"max_rows": 5}])
def test_alignment_captures_sites_a_group_at_a_time_and_only_the_rows_it_fits_on(tmp_path, monkeypatch, settings):
    """Sites captured one forward pass at a time (a budget that holds one) give the frames of one pass over all;
    with fewer rows allowed than the public data has, only the drawn rows are captured, and the frames stay
    orthonormal."""
    import functools

    from fedpeft.adapters import alignment
    from fedpeft.methods import fedmosaic
    from fedpeft.worker import Worker

    raw = {**HETERO, "methods": [{"name": "fedmosaic", "rounds": 2, "local_steps": 6, "rank": 2, "align_lr": 0.01}]}
    worker = Worker(validate(raw), tmp_path, data=generation_data())
    method = worker.methods["fedmosaic"]
    whole = method.init_server(worker.runtime, seed=0)
    captured: list[int] = []
    site_inputs = alignment.site_inputs

    def counting(runtime, modules, examples, batch_size=16, **kwargs):  # noqa: ANN001, ANN202
        found = site_inputs(runtime, modules, examples, batch_size, **kwargs)
        captured.extend(len(rows) for per_module in found.values() for rows in per_module)
        return found

    monkeypatch.setattr(alignment, "site_inputs", counting)
    monkeypatch.setattr(fedmosaic, "AlignmentSettings", functools.partial(alignment.AlignmentSettings, **settings))
    parts = method.init_server(worker.runtime, seed=0)
    assert parts.alignment.keys() == whole.alignment.keys()
    for name, frames in parts.frames.items():
        for key, frame in frames.items():
            if "capture_bytes" in settings:
                torch.testing.assert_close(frame["A"], whole.frames[name][key]["A"], atol=1e-6, rtol=1e-5)
                torch.testing.assert_close(frame["B"], whole.frames[name][key]["B"], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(frame["A"] @ frame["A"].T, torch.eye(2), atol=1e-5, rtol=0)
    if "max_rows" in settings:
        sites = len(parts.alignment) // 2
        assert sum(captured) == 5 * sites * 2  # 5 rows (examples: the tokenizers differ) of every site, both models
    else:
        assert captured


def test_the_alignments_capture_budget_is_a_config_key(tmp_path, monkeypatch):
    from fedpeft.methods import fedmosaic
    from fedpeft.worker import Worker

    raw = {**HETERO, "methods": [{"name": "fedmosaic", "rounds": 1, "rank": 2, "align_capture_mb": 3}]}
    worker = Worker(validate(raw), tmp_path, data=generation_data())
    budgets = []

    def aligned(federation, sites, frames, pivot, public, settings, generator):  # noqa: ANN001, ANN202
        budgets.append(settings.capture_bytes)
        return frames, {}

    monkeypatch.setattr(fedmosaic, "align_federation", aligned)
    worker.methods["fedmosaic"].init_server(worker.runtime, seed=0)
    assert budgets == [3 * 2**20]
