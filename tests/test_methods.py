"""Invariants every registered method must keep (the method matrix), and golden checks per method."""

from __future__ import annotations

import pytest
import torch

import fedpeft.methods  # noqa: F401
from fedpeft.core.costs import CostMeter
from fedpeft.core.registry import METHODS
from fedpeft.core.types import ClientUpdate
from fedpeft.engine.local import LocalEngine
from fedpeft.engine.phase import AfterRound
from fedpeft.models.runtime import ClientModel
from fedpeft.worker import build_method

FAST = {"rounds": 2, "fraction": 0.5, "local_steps": 2, "local_epochs": None, "lr": 1e-2}
# Lengths of phases that some methods run besides their federated rounds (e.g. Potara's local phase).
SHORT = {"local_rounds": 2}
FEDERATED = [n for n in METHODS.names() if METHODS.get(n).federated]
ALL = METHODS.names()
# Methods that need a sparse mixture-of-experts model run on a toy OLMoE (generation) instead of the toy BERT.
MOE_ONLY = {"flame"}
# Methods whose aggregation re-factorizes the LoRA (an SVD): identical updates give back the same product B A.
SAME_PRODUCT = {"flexlora"}
# Methods whose state re-expresses the uploads in another form (FLoRA folds the products into a base update, FedSVD
# re-factorizes B A with the server's A): tests/test_lora_aggregation.py checks their identical updates.
REEXPRESSED = {"flora", "fedsvd"}


def toy_setup(name: str, request) -> tuple:
    """(runtime, clients, worker factory) of the toy model the method runs on."""
    prefix = "toy_moe" if name in MOE_ONLY else "toy"
    return tuple(request.getfixturevalue(f"{prefix}_{part}") for part in ("runtime", "clients", "worker_factory"))


def lora_products(tensors: dict) -> dict:
    """B @ A of every plain LoRA module, by module key."""
    return {
        k[: -len(".lora_A.weight")]: tensors[k.replace("lora_A", "lora_B")] @ v
        for k, v in tensors.items()
        if k.endswith(".lora_A.weight")
    }


def make(name: str, **extra):
    cls = METHODS.get(name)
    fields = {k: v for k, v in {**FAST, **SHORT, **extra}.items() if k in cls.Config.model_fields}
    return build_method({"name": name, **fields})


# flora and fedsvd re-express the update (folded into the weights, re-factorized): their identity is on the
# product, in tests/test_lora_aggregation.py::test_identical_updates_keep_their_product.
@pytest.mark.parametrize("name", [n for n in FEDERATED if n not in REEXPRESSED])
def test_aggregating_identical_updates_is_identity(name, request):
    toy_runtime, toy_clients, _ = toy_setup(name, request)
    method = make(name)
    state = method.init_server(toy_runtime, seed=0)
    update, _ = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    copies = [
        ClientUpdate(str(i), {k: v.clone() for k, v in update.tensors.items()}, 10.0 + i, extras=update.extras)
        for i in range(3)
    ]
    new_state, _ = method.aggregate(state, iter(copies))
    if name in SAME_PRODUCT:
        expected, got = lora_products(update.tensors), lora_products(new_state.tensors)
        assert expected
        for key, product in expected.items():
            torch.testing.assert_close(got[key], product, atol=1e-6, rtol=1e-5, msg=key)
        return
    for key, tensor in update.tensors.items():
        torch.testing.assert_close(new_state.tensors[key], tensor, msg=key)


@pytest.mark.parametrize("name", FEDERATED)
def test_federated_round_runs_and_keeps_private_keys_home(name, request):
    toy_runtime, toy_clients, toy_worker_factory = toy_setup(name, request)
    worker = toy_worker_factory(
        [{"name": name, **{k: v for k, v in FAST.items() if k in METHODS.get(name).Config.model_fields}}]
    )
    method = worker.methods[name]
    state = method.init_server(toy_runtime, seed=0)
    uploads: list[ClientUpdate] = []
    original = method.aggregate

    def spy(state, updates):
        def recorded():
            for u in updates:
                uploads.append(u)
                yield u

        return original(state, recorded())

    method.aggregate = spy  # type: ignore[method-assign]
    meter = CostMeter()
    ids = [c.client_id for c in toy_clients]
    state = LocalEngine(worker).run_rounds(name, method, state, ids, seed=0, meter=meter)
    assert state.round == 2 and len(uploads) == 4 and meter.client_rounds == 4
    if method.communicates:  # sft_rounds runs in rounds but shares nothing
        assert meter.bytes_up > 0 and meter.bytes_down > 0
    for update in uploads:
        assert not any(p in key for key in update.tensors for p in method.private_keys)


# Methods that train base weights by design (full fine-tuning; DEPT's shared body); every other method may change
# adapter parameters only.
TRAINS_BASE_WEIGHTS = {"fedavg_full", "dept_spec"}


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in before if not torch.equal(before[k], after[k]))


@pytest.mark.parametrize("name", ALL)
def test_training_changes_only_adapter_parameters(name, request):
    toy_runtime, toy_clients, _ = toy_setup(name, request)
    method = make(name)
    before = toy_runtime.base_state()
    state = method.init_server(toy_runtime, seed=0)
    if method.federated:
        update, _ = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
        changed = _changed(before, toy_runtime.base_state())
        if name in TRAINS_BASE_WEIGHTS:
            private = {k for k in changed if any(p in k for p in method.private_keys)}
            assert changed and set(changed) <= set(update.tensors) | private  # trained: uploaded or kept home
            return
        assert not changed, f"{name} changed base weights in local training: {changed[:3]}"
    budgets = method.budgets_of(toy_clients[1], [2])
    method.personalize(toy_runtime, toy_clients[1], state, None, budgets[0] if budgets else None, seed=4)
    assert not _changed(before, toy_runtime.base_state()), f"{name} changed base weights in personalization"


def _outputs(model: torch.nn.Module, runtime, examples) -> torch.Tensor:
    model.eval()
    batch = runtime.encode(examples)
    batch.pop("labels", None)
    with torch.no_grad():
        return model(**batch).logits


def _fresh_base(runtime, name: str) -> torch.nn.Module:
    """A new instance of the toy base model holding the runtime's base weights (nothing of the runtime's PEFT)."""
    from tests.conftest import toy_moe_model

    if name in MOE_ONLY:
        model = toy_moe_model()
    else:
        model = type(runtime.base_model)(runtime.base_model.config)
    assert not model.load_state_dict(runtime.base_state(), strict=False).unexpected_keys
    return model.eval()


# How a personalized model is written and read back, when it is not a plain PEFT adapter whose outputs the reloaded
# PEFT model reproduces: "extension" (adapters PEFT lacks: written with extension.save and read back with their
# own loader), "tensors" (the PEFT adapter alone is not the whole model: its tensors must read back unchanged).
SAVED_AS = {
    "fedalt": "tensors",  # the rest-of-world LoRA and the gate mix per input on top of the saved individual LoRA
    "feddpa": "tensors",  # instance-wise mixing of the global and local LoRA at inference
    "flame": "tensors",  # the tier's experts per token live in routing.json beside the adapter
}


@pytest.mark.parametrize("name", ALL)
def test_saved_adapter_reads_back(name, request, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    from fedpeft.adapters.hooked import HookedAdapter

    toy_runtime, toy_clients, toy_worker_factory = toy_setup(name, request)
    fields = {k: v for k, v in {**FAST, **SHORT}.items() if k in METHODS.get(name).Config.model_fields}
    worker = toy_worker_factory([{"name": name, **fields}])
    method = worker.methods[name]
    worker.bases.use_base(None)
    state = method.init_server(toy_runtime, seed=0)
    client = toy_clients[1]
    budgets = method.budgets_of(client, [2])
    budget = budgets[0] if budgets else None
    model = method.personalize(toy_runtime, client, state, None, budget, seed=4)
    installed = toy_runtime.install(model, seed=4)
    expected = _outputs(installed, toy_runtime, client.test)
    kind = "extension" if model.extension is not None and model.lora is None else SAVED_AS.get(name, "peft")
    if model.lora is None and model.extension is None:  # full weights (fedavg_full, ...): saved as the base model
        assert model.base is not None
        return
    if kind == "extension":
        path = model.extension.save(tmp_path / "adapter")
        loaded = HookedAdapter.load_file(path, branches=model.extension.branches)
        loaded.active = model.extension.active
        again = _outputs(toy_runtime.install(type(model)(extension=loaded), seed=4), toy_runtime, client.test)
        torch.testing.assert_close(again, expected)
        return
    target = worker.adapters.save(name, budget, client.client_id)
    saved = load_file(str(target / "adapter_model.safetensors"))
    for key, tensor in toy_runtime.adapter_state().items():
        torch.testing.assert_close(saved[key], tensor, msg=f"{name}: {key}")
    if kind == "tensors":
        return
    reloaded = PeftModel.from_pretrained(_fresh_base(toy_runtime, name), str(target)).eval()
    torch.testing.assert_close(_outputs(reloaded, toy_runtime, client.test), expected)


@pytest.mark.parametrize("name", ALL)
def test_personalize_gives_an_evaluable_model(name, request):
    toy_runtime, toy_clients, _ = toy_setup(name, request)
    method = make(name)
    state = method.init_server(toy_runtime, seed=0)
    budget = 2 if method.uses_budget else None
    model = method.personalize(toy_runtime, toy_clients[1], state, None, budget, seed=4)
    assert isinstance(model, ClientModel)
    toy_runtime.install(model, seed=4)
    metrics = toy_runtime.evaluate(toy_clients[1].test)
    assert metrics and all(0.0 <= value <= 1.0 for value in metrics.values())


@pytest.mark.parametrize("name", [n for n in ALL if not METHODS.get(n).federated])
def test_personalization_is_deterministic(name, toy_runtime, toy_clients):
    method = make(name)
    budget = 2 if method.uses_budget else None
    first = method.personalize(toy_runtime, toy_clients[0], method.init_server(toy_runtime, 0), None, budget, 5)
    second = method.personalize(toy_runtime, toy_clients[0], method.init_server(toy_runtime, 0), None, budget, 5)
    for key in first.adapter:
        torch.testing.assert_close(first.adapter[key], second.adapter[key])


def test_lora_rank_follows_budget(toy_runtime, toy_clients):
    method = make("lora")
    model = method.personalize(toy_runtime, toy_clients[0], method.init_server(toy_runtime, 0), None, 3, 0)
    assert model.lora is not None and model.lora.rank == 3 and model.lora.alpha == 6.0
    a = next(v for k, v in model.adapter.items() if "lora_A" in k)
    assert a.shape[0] == 3


def test_fedprox_with_zero_mu_equals_fedit(toy_runtime, toy_clients):
    fedit, fedprox = make("fedit"), make("fedprox", mu=0.0)
    state = fedit.init_server(toy_runtime, seed=0)
    a, _ = fedit.client_update(toy_runtime, toy_clients[0], fedit.payload(state, "c0"), None, seed=1)
    b, _ = fedprox.client_update(toy_runtime, toy_clients[0], fedprox.payload(state, "c0"), None, seed=1)
    for key in a.tensors:
        torch.testing.assert_close(a.tensors[key], b.tensors[key])


def test_fedprox_pulls_toward_global(toy_runtime, toy_clients):
    fedit, fedprox = make("fedit", lr=5e-2, local_steps=10), make("fedprox", mu=50.0, lr=5e-2, local_steps=10)
    state = fedit.init_server(toy_runtime, seed=0)

    def distance(update):
        return sum(float((update.tensors[k] - state.tensors[k]).norm()) for k in state.tensors)

    a, _ = fedit.client_update(toy_runtime, toy_clients[0], fedit.payload(state, "c0"), None, seed=1)
    b, _ = fedprox.client_update(toy_runtime, toy_clients[0], fedprox.payload(state, "c0"), None, seed=1)
    assert distance(b) < distance(a)
    # Every trained tensor is anchored, the classification head included.
    head = [k for k in state.tensors if "classifier" in k]
    assert head
    for key in head:
        assert (b.tensors[key] - state.tensors[key]).norm() < (a.tensors[key] - state.tensors[key]).norm()


def test_fedprox_anchors_every_adapter_parameter(toy_runtime):
    from fedpeft.methods.fedit import _state_key

    fedprox = make("fedprox")
    state = fedprox.init_server(toy_runtime, seed=0)
    keys = {_state_key(name, toy_runtime) for name in toy_runtime.adapter_parameters()}
    assert keys == set(state.tensors)


def test_fedavg_full_uploads_every_weight(toy_runtime, toy_clients):
    method = make("fedavg_full")
    state = method.init_server(toy_runtime, seed=0)
    update, _ = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    assert set(update.tensors) == set(toy_runtime.base_params)


def _run_rounds(worker, runtime, clients, meter, **hooks):
    """Every round of the worker's fedit over ``clients`` with the local engine."""
    method = worker.methods["fedit"]
    state = method.init_server(runtime, 0)
    ids = [c.client_id for c in clients]
    return LocalEngine(worker).run_rounds("fedit", method, state, ids, seed=0, meter=meter, **hooks)


def test_failing_client_is_left_out_and_round_goes_on(toy_runtime, toy_clients, toy_worker_factory):
    worker = toy_worker_factory([{"name": "fedit", **FAST, "fraction": 1.0}])
    method = worker.methods["fedit"]
    original = method.client_update

    def flaky(runtime, client, payload, client_state, seed):
        if client.client_id == "c2":
            raise RuntimeError("device lost")
        return original(runtime, client, payload, client_state, seed)

    method.client_update = flaky  # type: ignore[method-assign]
    meter = CostMeter()
    rounds_metrics = []
    _run_rounds(
        worker, toy_runtime, toy_clients, meter, callbacks=[AfterRound(lambda s, r, m: rounds_metrics.append(m))]
    )
    assert [m["clients"] for m in rounds_metrics] == [3.0, 3.0]
    assert len(meter.failures) == 2 and "c2" in meter.failures[0]
    rows = {r["metric"]: r["value"] for r in meter.rows("fedit", 0, "federated")}
    assert rows["failed_client_rounds"] == 2.0
    assert "failed_client_rounds" not in {r["metric"] for r in CostMeter().rows("fedit", 0, "federated")}


def test_a_round_in_which_every_client_fails_stops_the_run(toy_runtime, toy_clients, toy_worker_factory):
    worker = toy_worker_factory([{"name": "fedit", **FAST, "fraction": 1.0}])
    method = worker.methods["fedit"]

    def broken(runtime, client, payload, client_state, seed):
        raise TypeError("no frames")

    method.client_update = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=r"round 1: all 4 sampled clients failed.*no frames"):
        _run_rounds(worker, toy_runtime, toy_clients, CostMeter())


@pytest.mark.parametrize("name", ALL)
def test_every_method_has_its_docs_page_and_row(name):
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs" / "methods"
    page = docs / f"{name}.md"
    assert page.is_file(), f"docs/methods/{name}.md is missing"
    assert f"`{name}`" in page.read_text().split("\n", 1)[0], f"the title of docs/methods/{name}.md names the method"
    assert f"| `{name}`" in (docs / "README.md").read_text(), f"docs/methods/README.md has no row for {name}"


def run_through(name: str, request, tmp_path, *, dtype: str = "float32", device: str = "cpu"):  # noqa: ANN001, ANN201
    """Method ``name`` on the toy runtime with its base in ``dtype`` on ``device``: its rounds (if federated), the
    personalized model of client 1 installed, evaluated, and its cost rows checked finite; returns the runtime."""
    from fedpeft.core.config import ExperimentConfig
    from fedpeft.data.types import FederatedData
    from fedpeft.models.runtime import ModelRuntime
    from fedpeft.worker import Worker

    toy_runtime, clients, _ = toy_setup(name, request)
    if dtype != "float32":
        toy_runtime.loaded.model.to(getattr(torch, dtype))  # as load_model does for model.dtype
    runtime = ModelRuntime(toy_runtime.loaded, eval_batch_size=32, max_new_tokens=3, dtype=dtype, device=device)
    generation = name in MOE_ONLY
    data = FederatedData(
        "toy", "generation" if generation else "classification", None if generation else ["no", "yes"], ["g"], clients
    )
    fields = {k: v for k, v in {**FAST, **SHORT}.items() if k in METHODS.get(name).Config.model_fields}
    worker = Worker(
        ExperimentConfig(methods=[{"name": name, **fields}], budgets=[2]), tmp_path, data=data, runtime=runtime
    )
    method = worker.methods[name]
    state = method.init_server(runtime, seed=0)
    if method.federated:
        ids = [c.client_id for c in clients]
        state = LocalEngine(worker).run_rounds(name, method, state, ids, seed=0, meter=CostMeter())
        assert state.round == 2
    model = method.personalize(runtime, clients[1], state, None, 2 if method.uses_budget else None, seed=4)
    runtime.install(model, seed=4)
    metrics = runtime.evaluate(clients[1].test)
    assert metrics and all(0.0 <= value <= 1.0 for value in metrics.values())
    for row in method.compute_costs(runtime, seed=0):
        assert torch.isfinite(torch.tensor(row["value"])), row
    return runtime


@pytest.mark.parametrize("name", ALL)
def test_every_method_runs_on_a_bfloat16_base_under_autocast(name, request, tmp_path):
    """A bfloat16 base with float32 adapters: every forward pass of a method (training, prediction, statistics,
    feature capture, per-sample gradients, hypergradients, distillation targets, timing) runs under autocast;
    outside it a float32 adapter meets bfloat16 activations and the matmul refuses the mix."""
    runtime = run_through(name, request, tmp_path, dtype="bfloat16")
    if runtime.active is not None:
        assert all(p.dtype == torch.float32 for p in runtime.adapter_parameters().values())
    assert all(p.dtype == torch.bfloat16 for p in runtime.base_params.values())
