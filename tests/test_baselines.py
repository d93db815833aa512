"""FedMosaic's baselines: compute matching, distillation targets, Ditto's pull, FedDAT's distillation term and a
heterogeneous distillation round."""

from __future__ import annotations

import pytest
import torch

from fedpeft.core.config import validate
from fedpeft.core.costs import CostMeter
from fedpeft.engine.local import LocalEngine
from fedpeft.merging.server_step import weighted_mean
from fedpeft.methods.families.branched import PAPER_COMPUTE_SCALE, hooked_adapter, install_adapter, matched_steps
from fedpeft.methods.families.distillation import lowest_loss, vote
from fedpeft.methods.feddat import distillation
from fedpeft.worker import build_method
from tests.test_federation import HETERO, generation_data


def test_compute_matching_scales_local_steps_by_the_papers_ratios():
    steps = {
        n: matched_steps(build_method({"name": n, "local_steps": 100}).cfg)
        for n in PAPER_COMPUTE_SCALE
        if n not in ("sft", "fedit", "feddpa")
    }
    assert steps == {"ditto": 50, "fedsim": 67, "takfl": 77, "perada": 44, "feddat": 39, "fedmkt": 64, "fedmosaic": 91}
    assert matched_steps(build_method({"name": "sft_rounds", "local_steps": 100}).cfg) == 100
    assert matched_steps(build_method({"name": "ditto", "local_steps": 1}).cfg) == 1


def test_distillation_targets_by_vote_and_by_lowest_loss():
    uploads = [
        {"answers": ["a", "x", "p"], "losses": torch.tensor([0.5, 0.1, 2.0])},
        {"answers": ["a", "y", "q"], "losses": torch.tensor([0.9, 0.3, 1.0])},
        {"answers": ["b", "y", "q"], "losses": torch.tensor([0.2, 0.4, 3.0])},
    ]
    assert vote(uploads) == ["a", "y", "q"]
    assert lowest_loss(uploads) == ["b", "x", "q"]
    tie = [{"answers": ["u"], "losses": torch.tensor([0.9])}, {"answers": ["v"], "losses": torch.tensor([0.3])}]
    assert vote(tie) == ["v"]  # equal votes: the answer whose teachers have the lower loss


def test_ditto_personal_adapter_is_pulled_toward_the_global_one(toy_runtime, toy_clients):
    def distance(lam: float) -> float:
        method = build_method({"name": "ditto", "rounds": 1, "local_steps": 16, "lr": 5e-2, "lam": lam})
        state = method.init_server(toy_runtime, seed=0)
        payload = method.payload(state, "c0")
        _, client_state = method.client_update(toy_runtime, toy_clients[0], payload, None, seed=1)
        return sum(float((client_state["local"][k] - payload.tensors[k]).norm()) for k in payload.tensors)

    assert distance(200.0) < 0.5 * distance(0.0)


def test_feddat_distillation_term_vanishes_when_teacher_and_student_agree(toy_runtime, toy_clients):
    adapter = hooked_adapter(toy_runtime, 0, rank=2, pq=False, branches=("global", "frozen", "local"), mix="sum")
    g = torch.Generator().manual_seed(0)
    for key, value in adapter.tensors.items():
        if key.startswith(("global/", "frozen/")) and key.endswith("lora_B"):
            adapter.tensors[key] = 3.0 * torch.randn(value.shape, generator=g)
    adapter.active = ("global",)
    install_adapter(toy_runtime, adapter)
    model = toy_runtime.activate(None).eval()
    batch = toy_runtime.encode(toy_clients[0].train[:8])
    outputs = model(**batch)
    same = distillation(adapter, ("global",), 1.0, 1.0)(model, batch, outputs)
    other = distillation(adapter, ("frozen",), 1.0, 1.0)(model, batch, outputs)
    toy_runtime.detach_extension()
    assert float(same.detach()) == pytest.approx(0.0, abs=1e-6) and float(other.detach()) > 1e-6
    assert adapter.active == ("global",)


def test_distillation_baselines_keep_lora_within_architectures_and_distil_on_the_server(tmp_path):
    from fedpeft.worker import Worker

    raw = {
        **HETERO,
        "methods": [
            {"name": "fedmkt", "rounds": 1, "local_steps": 2, "rank": 2, "kd_samples": 4, "kd_steps": 2, "lr": 1e-2}
        ],
    }
    worker = Worker(validate(raw), tmp_path, data=generation_data())
    method = worker.methods["fedmkt"]
    assert method.federation is worker.federation
    state = method.init_server(worker.runtime, seed=0)
    uploads = []
    original = method.aggregate

    def spy(state, updates):
        updates = list(updates)
        uploads.extend(updates)
        return original(state, iter(updates))

    method.aggregate = spy  # type: ignore[method-assign]
    ids = ["c0", "c1", "c2", "c3"]
    new_state = LocalEngine(worker).run_rounds("fedmkt", method, state, ids, seed=0, meter=CostMeter())
    assert all(len(u.extras["answers"]) == 4 and u.extras["losses"].shape == (4,) for u in uploads)
    for update in uploads:
        architecture = worker.federation.architecture_of(update.client_id)
        assert all(k.startswith(f"{architecture}:") for k in update.tensors)
    averaged = weighted_mean(uploads)
    assert set(new_state.tensors) == set(averaged)
    changed = {k.split(":")[0] for k in averaged if not torch.allclose(new_state.tensors[k], averaged[k])}
    assert changed == {"llama", "qwen"}  # each architecture's average was distilled
