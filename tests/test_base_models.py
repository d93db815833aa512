"""Base models personalization starts from: FedIT merged into the weights, FedDPA-T and DEPT(SPEC) per client."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from fedpeft.adapters.instance_mixing import instance_weights, mixed_adapters, representations
from fedpeft.base_models import ClientBase, client_base_tensors
from fedpeft.core.checkpoints import load_checkpoint, save_checkpoint
from fedpeft.core.config import ExperimentConfig, load_config
from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import UserError
from fedpeft.core.types import ServerState, num_bytes
from fedpeft.data.types import FederatedData
from fedpeft.engine.local import LocalEngine
from fedpeft.methods.base import serves_as_base_stage
from fedpeft.methods.fedit_merged import cosine_lr
from fedpeft.models.runtime import ClientModel
from fedpeft.runner import Experiment
from fedpeft.worker import BASE_STAGE_LABEL, Worker, build_method

EMBEDDINGS = {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight"}


SMOKE_FEDP2EFT = (
    "{name: fedp2eft, rounds: 1, fraction: 0.5, r_max: 4, r_init: 8, stage1_steps: 2, psg_steps: 1, lr: 0.005, "
    "psg_lr: 0.01, finetune_epochs: 1}"
)
SMOKE_POTARA = "{name: potara, rounds: 1, fraction: 1.0, local_steps: 2, local_rounds: 1, lr: 0.005}"


def perturbed(tensors: dict[str, torch.Tensor], seed: int, size: float = 0.2) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {k: v + size * torch.randn(v.shape, generator=generator) for k, v in tensors.items()}


def logits(runtime, examples) -> torch.Tensor:
    """The logits of the model the runtime computes with right now (its active adapters, or none)."""
    batch = runtime.encode(examples)
    batch.pop("labels")
    with torch.no_grad(), runtime._adapter_context():
        return runtime._model().eval()(**batch).logits


# ---------------------------------------------------------------------------------------------- Standard FL (LoRA)
def test_fedit_merged_base_is_base_plus_scaled_b_a(toy_runtime):
    method = build_method({"name": "fedit_merged", "rank": 2, "alpha": 6.0})
    adapter = perturbed(method.init_server(toy_runtime, seed=0).tensors, seed=1)
    base = toy_runtime.base_state()
    merged = method.export_base(toy_runtime, ServerState(tensors=adapter))

    assert set(merged) == set(base)
    changed = set()
    for layer in range(2):
        for projection in ("query", "value"):  # the q, v placement of the recipe
            name = f"bert.encoder.layer.{layer}.attention.self.{projection}"
            a = adapter[f"base_model.model.{name}.lora_A.weight"]
            b = adapter[f"base_model.model.{name}.lora_B.weight"]
            torch.testing.assert_close(merged[f"{name}.weight"], base[f"{name}.weight"] + 3.0 * b @ a)
            changed.add(f"{name}.weight")
    for head in ("classifier.weight", "classifier.bias"):
        torch.testing.assert_close(merged[head], adapter[f"base_model.model.{head}"])
        changed.add(head)
    for key in set(base) - changed:
        assert torch.equal(merged[key], base[key]), key
    for key, tensor in toy_runtime.base_state().items():  # the runtime's own weights are untouched
        assert torch.equal(tensor, base[key]), key


def test_cosine_learning_rate_schedule():
    assert cosine_lr(0, 200, 2e-5, 1e-6) == pytest.approx(2e-5)
    assert cosine_lr(100, 200, 2e-5, 1e-6) == pytest.approx(1.05e-5)
    assert cosine_lr(200, 200, 2e-5, 1e-6) == pytest.approx(1e-6)
    method = build_method({"name": "standard_fl_lora", "rounds": 200})
    payload = method.payload(ServerState(round=50), "c0")
    assert payload.config["lr"] == pytest.approx(1e-6 + 0.5 * 1.9e-5 * (1 + math.cos(math.pi / 4)))


# ---------------------------------------------------------------------------------------------- DEPT(SPEC)
def test_dept_spec_keeps_embeddings_home_and_aggregates_the_rest(toy_runtime, toy_clients):
    method = build_method({"name": "dept_spec", "local_steps": 2, "lr": 1e-2})
    pretrained = toy_runtime.base_state()
    state = method.init_server(toy_runtime, seed=0)
    assert set(state.tensors) == set(pretrained) - EMBEDDINGS

    updates, own = [], {}
    for client in toy_clients[:2]:
        update, own[client.client_id] = method.client_update(
            toy_runtime, client, method.payload(state, client.client_id), None, seed=1
        )
        updates.append(update)
        assert set(update.tensors) == set(state.tensors) and set(own[client.client_id]) == EMBEDDINGS
    word = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(own["c0"][word], pretrained[word]) and not torch.equal(own["c0"][word], own["c1"][word])

    new_state, _ = method.aggregate(state, iter(updates))
    key = "classifier.weight"
    torch.testing.assert_close(new_state.tensors[key], (updates[0].tensors[key] + updates[1].tensors[key]) / 2)

    seen = method.personalize(toy_runtime, toy_clients[0], new_state, own["c0"], None, seed=2)
    unseen = method.personalize(toy_runtime, toy_clients[3], new_state, None, None, seed=2)
    assert torch.equal(seen.base[word], own["c0"][word]) and torch.equal(unseen.base[word], pretrained[word])
    assert torch.equal(seen.base[key], new_state.tensors[key])


# ---------------------------------------------------------------------------------------------- FedDPA-T
def test_feddpa_uploads_only_the_global_lora(toy_runtime, toy_clients):
    method = build_method({"name": "feddpa", "rank": 2, "alpha": 4.0, "local_steps": 3, "lr": 5e-2})
    state = method.init_server(toy_runtime, seed=0)
    assert {k for k in state.tensors if "lora_" not in k} == {
        "base_model.model.classifier.weight",
        "base_model.model.classifier.bias",
    }
    assert all(".query." in k or ".value." in k for k in state.tensors if "lora_" in k)

    update, local = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    assert set(update.tensors) == set(state.tensors) and num_bytes(update.tensors) == num_bytes(state.tensors)
    assert set(local) == {k for k in state.tensors if "lora_" in k}  # the local LoRA has no head
    for key in local:
        if "lora_B" in key:  # both adapters left their zero start, to different places
            assert local[key].abs().sum() > 0 and update.tensors[key].abs().sum() > 0
            assert not torch.allclose(local[key], update.tensors[key])

    # The next round starts the local LoRA from the kept one.
    _, local_again = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), local, seed=2)
    assert all(not torch.equal(local_again[k], local[k]) for k in local if "lora_B" in k)


def test_instance_weight_is_max_weight_times_mean_cosine_similarity():
    references = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    queries = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]])
    weights = instance_weights(queries, references, max_weight=0.5, sample=2, seed=0)
    torch.testing.assert_close(weights, torch.tensor([0.5, 0.5 / math.sqrt(2.0), 0.0, 0.0]))

    # Each query draws its own references: with one of two opposite references the weight is all or nothing.
    references = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    draws = instance_weights(torch.tensor([[1.0, 0.0]] * 64), references, max_weight=1.0, sample=1, seed=3)
    assert set(draws.tolist()) == {0.0, 1.0}
    assert torch.equal(
        draws, instance_weights(torch.tensor([[1.0, 0.0]] * 64), references, max_weight=1.0, sample=1, seed=3)
    )


def test_feddpa_mixes_per_instance_and_its_base_model_is_the_training_mixture(toy_runtime, toy_clients):
    method = build_method({"name": "feddpa", "rank": 2, "alpha": 4.0, "local_weight": 0.5})
    glob, local = method.specs(toy_runtime)
    toy_runtime.install(ClientModel(lora=local), seed=1)
    local_state = perturbed(toy_runtime.adapter_state(), seed=2, size=0.5)
    global_state = perturbed(method.init_server(toy_runtime, seed=0).tensors, seed=3, size=0.5)
    examples = toy_clients[0].test[:6]

    pretrained = toy_runtime.base_state()
    toy_runtime.install(ClientModel(lora=glob, adapter=global_state))
    global_only = logits(toy_runtime, examples)
    # The base model of a FedDPA base stage: W0 + (1 - a) dW_global + a dW_local, with the global head.
    toy_runtime.set_initial_base(method.export_base(toy_runtime, ServerState(tensors=global_state)))
    own = client_base_tensors(toy_runtime, ClientBase(lora=local, adapter=local_state, scale=0.5))
    toy_runtime.install(ClientModel(base=own))
    mixture = logits(toy_runtime, examples)
    assert not torch.allclose(mixture, global_only, atol=1e-4)

    # Instance-wise mixing on the pretrained base: alpha = 0 is the global adapter alone, alpha = a the mixture.
    toy_runtime.set_initial_base(pretrained)
    toy_runtime.install(ClientModel(lora=local, adapter=local_state))
    toy_runtime.install(ClientModel(lora=glob, adapter=global_state))
    alpha = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.5, 0.0])
    with mixed_adapters(toy_runtime, {glob: 1.0 - alpha, local: alpha}):
        mixed = logits(toy_runtime, examples)
    torch.testing.assert_close(mixed[alpha == 0], global_only[alpha == 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mixed[alpha > 0], mixture[alpha > 0], rtol=1e-4, atol=1e-5)


def test_an_instance_like_the_training_data_gets_more_local_weight(toy_runtime, toy_clients):
    method = build_method({"name": "feddpa", "rank": 2, "alpha": 4.0, "reference_instances": 3})
    familiar = toy_clients[0].train[0]
    client = replace(toy_clients[0], train=[familiar] * 6, test=[familiar, toy_clients[1].test[0]])
    glob, local = method.specs(toy_runtime)
    toy_runtime.install(ClientModel(lora=local), seed=1)
    local_state = perturbed(toy_runtime.adapter_state(), seed=2)
    toy_runtime.install(ClientModel(lora=local, adapter=local_state))
    weights = instance_weights(
        representations(toy_runtime, client.test),
        representations(toy_runtime, client.train),
        max_weight=0.5,
        sample=3,
        seed=0,
    )
    assert weights[0] == pytest.approx(0.5, abs=1e-6) and weights[1] < weights[0]

    model = method.personalize(toy_runtime, client, method.init_server(toy_runtime, 0), local_state, None, seed=4)
    assert 0.0 <= method.evaluate(toy_runtime, client, model, seed=4)["accuracy"] <= 1.0


# ---------------------------------------------------------------------------------------------- per-client base
@pytest.mark.parametrize("name", ["dept_spec", "feddpa"])
def test_every_client_starts_from_its_own_base_model(name, toy_runtime, toy_clients, tmp_path):
    clients = [*toy_clients[:3], replace(toy_clients[3], pool="unseen")]
    data = FederatedData("toy", "classification", ["no", "yes"], ["g"], clients)
    stage = {"name": name, "rounds": 1, "fraction": 1.0, "local_steps": 2, "lr": 5e-2}
    if name == "feddpa":
        stage.update(rank=2, alpha=4.0)
    cfg = ExperimentConfig(base={"kind": "federated", "method": stage}, methods=[{"name": "lora"}], budgets=[2])
    worker = Worker(cfg, tmp_path, data=data, runtime=toy_runtime)
    method = worker.methods[BASE_STAGE_LABEL]
    assert worker.bases.per_client_base
    worker.bases.use_base(None)
    seen = [c.client_id for c in clients if c.pool == "seen"]
    state = LocalEngine(worker).run_rounds(
        BASE_STAGE_LABEL, method, method.init_server(toy_runtime, 0), seen, seed=0, meter=CostMeter()
    )
    shared = method.export_base(toy_runtime, state)
    save_checkpoint({"tensors": shared}, worker.bases.base_checkpoint(0))
    for client in clients:
        assert worker.prepare_client_base(0, client.client_id) > 0
        assert worker.prepare_client_base(0, client.client_id) == 0  # kept once computed

    bases = {}
    for client in clients:
        worker.bases.use_client_base(0, client.client_id)
        bases[client.client_id] = toy_runtime.base_state()
    differs = [k for k in shared if not torch.equal(bases["c0"][k], bases["c1"][k])]
    assert differs and all(not torch.equal(bases["c0"][k], shared[k]) for k in differs)
    if name == "dept_spec":
        assert set(differs) == EMBEDDINGS
        assert all(torch.equal(bases["c3"][k], shared[k]) for k in shared)  # unseen: pretrained embeddings
        own = worker.store(BASE_STAGE_LABEL, 0).get("c0")
        assert all(torch.equal(bases["c0"][k], own[k]) for k in EMBEDDINGS)
    else:
        assert all(".query." in k or ".value." in k for k in differs)  # the local LoRA's layers
        assert any(not torch.equal(bases["c3"][k], shared[k]) for k in shared)  # unseen: trained its local LoRA

    worker.bases.use_base(0)  # back to the shared base
    assert all(torch.equal(v, shared[k]) for k, v in toy_runtime.base_state().items())
    # The base row of a client is its own base model.
    (record,) = worker.evaluate_base(0, "c1")
    toy_runtime.install(ClientModel(base=bases["c1"]))
    assert record["value"] == toy_runtime.evaluate(toy_clients[1].test)["accuracy"]
    for client in clients:
        worker.bases.use_client_base(0, client.client_id)
        assert all(torch.equal(v, bases[client.client_id][k]) for k, v in toy_runtime.base_state().items())


@pytest.mark.parametrize("name", ["lora", "fedalt", "hetlora", "ditto"])
def test_a_method_that_gives_no_base_model_is_refused(name, tmp_path):
    # lora: no federated phase; fedalt: a per-input mixer; hetlora: a model per tier; ditto: hooked branches.
    with pytest.raises(UserError, match="cannot produce a base model .*use one of: .*fedsa_lora"):
        Experiment(load_config("smoke", ["base.kind=federated", f"base.method={{name: {name}}}"]), tmp_path / "run")


# ---------------------------------------------------------------------------------------------- composed stages
@pytest.mark.parametrize("name", ["fedsa_lora", "ffa_lora", "fedit"])
def test_a_federated_lora_method_as_base_stage_gives_each_client_its_model_merged(
    name, toy_runtime, toy_clients, tmp_path
):
    data = FederatedData("toy", "classification", ["no", "yes"], ["g"], toy_clients)
    stage = {"name": name, "rounds": 2, "fraction": 1.0, "local_steps": 2, "lr": 5e-2, "rank": 2}
    cfg = ExperimentConfig(base={"kind": "federated", "method": stage}, methods=[{"name": "lora"}], budgets=[2])
    worker = Worker(cfg, tmp_path, data=data, runtime=toy_runtime)
    method = worker.methods[BASE_STAGE_LABEL]
    assert worker.bases.per_client_base and serves_as_base_stage(method)
    worker.bases.use_base(None)
    ids = [c.client_id for c in toy_clients]
    state = LocalEngine(worker).run_rounds(
        BASE_STAGE_LABEL, method, method.init_server(toy_runtime, 0), ids, seed=0, meter=CostMeter()
    )
    shared = method.export_base(toy_runtime, state)
    assert all(torch.equal(v, worker.bases.pretrained[k]) for k, v in shared.items())  # the stage started here
    save_checkpoint({"tensors": shared}, worker.bases.base_checkpoint(0))
    for client in toy_clients:
        assert worker.prepare_client_base(0, client.client_id, state) > 0
    for client in toy_clients[:2]:
        # The client's base alone computes what the stage's personalized model computes on the shared base.
        worker.bases.use_base(0)
        client_state = worker.store(BASE_STAGE_LABEL, 0).get(client.client_id)
        toy_runtime.install(method.personalize(toy_runtime, client, state, client_state, None, seed=1))
        expected = logits(toy_runtime, client.test)
        worker.bases.use_client_base(0, client.client_id)
        torch.testing.assert_close(logits(toy_runtime, client.test), expected, atol=1e-5, rtol=1e-5)
    worker.bases.use_client_base(0, "c0")
    c0 = toy_runtime.base_state()
    worker.bases.use_client_base(0, "c1")
    differs = [k for k, v in toy_runtime.base_state().items() if not torch.equal(v, c0[k])]
    if name == "fedsa_lora":  # every client merges its own B (and head) with the shared A
        assert differs
    else:  # one global adapter: every client gets the same merged base
        assert not differs


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "method"),
    [
        ("{name: fedsa_lora, rounds: 2, fraction: 1.0, local_steps: 3, lr: 0.005}", SMOKE_FEDP2EFT),
        ("{name: ffa_lora, rounds: 2, fraction: 1.0, local_steps: 3, lr: 0.005}", SMOKE_POTARA),
    ],
)
def test_personalization_runs_after_a_federated_lora_base_stage(stage, method, tmp_path):
    overrides = [
        "data.groups=[lat1, lat3]",
        "base.kind=federated",
        f"base.method={stage}",
        f"methods=[{method}]",
        "budgets=[2]",
        "output.plots=false",
    ]
    out = Experiment(load_config("smoke", overrides), tmp_path / "run").run()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    name = method.split(",")[0].split(":")[1].strip()
    ours = [r for r in records if r["method"] == name and r["metric"] == "accuracy"]
    base = {r["client"]: r["value"] for r in records if r["method"] == "base" and r["metric"] == "accuracy"}
    assert ours and len(base) == 8  # every client of both pools, each on its own base model
    assert len(list((out / "checkpoints" / "client-base" / "seed0").glob("*.safetensors"))) == 8


@pytest.mark.parametrize(
    ("doc", "start"),
    [
        ("README.md", "The base model personalization starts from"),
        ("docs/methods/README.md", "Methods usable as the federated base stage"),
        ("docs/base-models.md", "Besides the four methods above"),
    ],
)
def test_the_docs_name_every_method_usable_as_the_base_stage(doc, start):
    import re
    from pathlib import Path

    from fedpeft.core.registry import METHODS

    text = (Path(__file__).resolve().parents[1] / doc).read_text()
    paragraph = text[text.index(start) :].split("\n\n")[0]
    named = {name for name in re.findall(r"`([a-z_0-9]+)`", paragraph) if name in METHODS.names()}
    assert named == {name for name in METHODS.names() if serves_as_base_stage(METHODS.get(name))}


# ---------------------------------------------------------------------------------------------- centralized per seed
def base_records(out) -> dict[tuple[str, int], float]:
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {(r["client"], r["seed"]): r["value"] for r in records if r["method"] == "base" and r["split"] == "test"}


def test_a_centralized_base_stage_per_seed_trains_one_base_model_per_run_seed(tmp_path):
    common = [
        "data.groups=[lat1, lat3]",
        "methods=[{name: local, rounds: 1, local_steps: 1, lr: 0.005}]",
        "budgets=[]",
        "output.plots=false",
        "output.save_adapters=false",
    ]
    shared = Experiment(load_config("smoke", [*common, "seeds=[0, 1]"]), tmp_path / "shared").run()
    per_seed = Experiment(load_config("smoke", [*common, "seeds=[0, 1]", "base.per_seed=true"]), tmp_path / "own").run()
    once, each = base_records(shared), base_records(per_seed)
    clients = {client for client, _ in once}
    assert all(once[c, 0] == once[c, 1] for c in clients) and all(each[c, 0] == once[c, 0] for c in clients)
    assert [p.name for p in (shared / "checkpoints").glob("base-*.safetensors")] == ["base-centralized.safetensors"]
    assert sorted(p.name for p in (per_seed / "checkpoints").glob("base-*.safetensors")) == [
        "base-seed0.safetensors",
        "base-seed1.safetensors",
    ]
    # Seed 0 trains from base.seed + 0, the shared base's seed: the same model; seed 1 trains another.
    one = load_checkpoint(shared / "checkpoints" / "base-centralized.safetensors")["tensors"]
    own = [load_checkpoint(per_seed / "checkpoints" / f"base-seed{s}.safetensors")["tensors"] for s in (0, 1)]
    assert all(torch.equal(one[k], own[0][k]) for k in one)
    assert all(not torch.equal(own[0][k], own[1][k]) for k in one)


def test_per_seed_is_refused_where_no_centralized_base_stage_trains():
    with pytest.raises(UserError, match="per_seed"):
        load_config("smoke", ["base.kind=pretrained", "base.per_seed=true"])


def test_per_seed_is_refused_in_a_federation_of_several_models(tmp_path):
    with pytest.raises(UserError, match="several models"):
        Experiment(load_config("fedmosaic-text", ["base.per_seed=true"]), tmp_path / "run")
