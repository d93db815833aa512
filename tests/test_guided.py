"""Client guidance (hard init, l2, kd, similarity-weighted beta), ReLoRA and the ``guided`` method."""

from __future__ import annotations

import math

import pytest
import torch

from fedpeft import guidance
from fedpeft.core.config import load_config
from fedpeft.core.errors import UserError
from fedpeft.core.types import ClientUpdate, Payload
from fedpeft.merging import lora_pairs
from fedpeft.models.runtime import ClientModel
from fedpeft.worker import build_method

FAST = {"rounds": 2, "fraction": 1.0, "local_steps": 2, "lr": 1e-2}
WORDS = "red blue green black white big small old new fast".split()


@pytest.fixture(scope="module")
def generation_clients():
    """Two clients of a copy task (prompt -> the same words), so responses have several tokens."""
    import random

    from fedpeft.data.types import ClientData

    rng = random.Random(0)

    def example() -> dict:
        words = " ".join(rng.choice(WORDS) for _ in range(3))
        return {"prompt": f"copy : {words}", "response": words, "group": "copy"}

    return [ClientData(c, "copy", "seen", [example() for _ in range(16)], [example() for _ in range(4)]) for c in "ab"]


@pytest.fixture(scope="module")
def tiny_llama_runtime(generation_clients):
    from fedpeft.core.config import ModelConfig
    from fedpeft.models.runtime import ModelRuntime
    from fedpeft.models.table import load_model

    texts = [e[k] for c in generation_clients for e in c.train + c.test for k in ("prompt", "response")]
    cfg = ModelConfig(name="tiny-llama", vocab_size=300, max_length=24, overrides={"hidden_size": 32})
    loaded = load_model(cfg, task="generation", corpus=lambda: texts)
    return ModelRuntime(loaded, max_length=24, max_new_tokens=4)


def guided(**fields):
    return build_method({"name": "guided", **FAST, **fields})


def distance(a: dict, b: dict) -> float:
    return sum(float((a[k] - b[k]).norm()) for k in b)


# ------------------------------------------------------------------------------------------- pure functions


def test_kd_loss_golden_values_and_direction():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])
    # T = 1: p_s = (1/2, 1/2), p_t = (3/4, 1/4);
    # KL(p_s || p_t) = 1/2 ln(4/3), KL(p_t || p_s) = 3/4 ln(3/2) + 1/4 ln(1/2).
    forward = guidance.kd_loss(student, teacher, temperature=1.0)
    reverse = guidance.kd_loss(student, teacher, temperature=1.0, direction="teacher_student")
    assert float(forward) == pytest.approx(0.5 * math.log(4 / 3))
    assert float(reverse) == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    # T = 2 softens the teacher to (sqrt 3, 1) / (1 + sqrt 3) and multiplies by T^2.
    p = math.sqrt(3) / (1 + math.sqrt(3))
    expected = 4 * (0.5 * math.log(0.5 / p) + 0.5 * math.log(0.5 / (1 - p)))
    assert float(guidance.kd_loss(student, teacher)) == pytest.approx(expected)


def test_kd_loss_is_zero_for_equal_models_and_reads_response_tokens_only():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    labels = torch.tensor([[-100, -100, 3, 4, -100], [-100, 1, 2, 3, 4]])
    assert float(guidance.kd_loss(logits, logits.clone(), labels)) == pytest.approx(0.0, abs=1e-7)
    assert float(guidance.kd_loss(logits[:, 0], logits[:, 0].clone())) == pytest.approx(0.0, abs=1e-7)
    # Differences at positions whose next label is not a response token do not count.
    teacher = logits.clone()
    teacher[0, 0] += 5.0  # predicts labels[0, 1] = -100
    teacher[:, 4] += 5.0  # the last position predicts nothing
    assert float(guidance.kd_loss(logits, teacher, labels)) == pytest.approx(0.0, abs=1e-7)


def test_kd_loss_averages_tokens_per_sample_then_samples():
    student = torch.zeros(2, 4, 2)
    teacher = torch.zeros(2, 4, 2)
    teacher[0, 0] = torch.tensor([math.log(3.0), 0.0])  # sample 0: one response token with KL k
    teacher[1, :3] = torch.tensor([math.log(3.0), 0.0])  # sample 1: three response tokens with KL k
    teacher[1, 2] = 0.0  # ... of which the last has KL 0
    labels = torch.tensor([[-100, 1, -100, -100], [-100, 1, 1, 1]])
    k = 0.5 * math.log(4 / 3)
    got = guidance.kd_loss(student, teacher, labels, temperature=1.0)
    assert float(got) == pytest.approx((k + 2 * k / 3) / 2)


def test_energy_rank_and_sar_inside_and_orthogonal_to_the_global_subspace():
    assert guidance.energy_rank(torch.tensor([4.0, 3.0]), 0.95) == 2
    assert guidance.energy_rank(torch.tensor([4.0, 3.0]), 0.8) == 1
    assert guidance.energy_rank(torch.zeros(3)) == 0
    eye = torch.eye(6)
    g = torch.Generator().manual_seed(1)
    # Delta_G has singular values 3 and 2: the top one holds 3 / sqrt(13) < 0.95 of the energy, so k = 2.
    global_ = {"m.lora_B.weight": eye[:, :2] * torch.tensor([3.0, 2.0]), "m.lora_A.weight": torch.eye(2, 5)}
    inside = {"m.lora_B.weight": eye[:, :2] @ torch.randn(2, 2, generator=g), "m.lora_A.weight": torch.randn(2, 5)}
    outside = {"m.lora_B.weight": eye[:, 3:5] @ torch.randn(2, 2, generator=g), "m.lora_A.weight": torch.randn(2, 5)}
    assert guidance.subspace_alignment_ratio(inside, global_) == pytest.approx(1.0)
    assert guidance.subspace_alignment_ratio(outside, global_) == pytest.approx(0.0, abs=1e-7)
    # Two modules: the mean of their ratios.
    double_global = {**global_, **{k.replace("m.", "n."): v for k, v in global_.items()}}
    mixed = {**inside, **{k.replace("m.", "n."): v for k, v in outside.items()}}
    assert guidance.subspace_alignment_ratio(mixed, double_global) == pytest.approx(0.5)


def test_cosine_on_products_ignores_how_the_update_is_split():
    g = torch.Generator().manual_seed(2)
    global_ = {"m.lora_A.weight": torch.randn(2, 5, generator=g), "m.lora_B.weight": torch.randn(4, 2, generator=g)}
    rescaled = {"m.lora_A.weight": 3.0 * global_["m.lora_A.weight"], "m.lora_B.weight": global_["m.lora_B.weight"] / 3}
    assert guidance.cosine_similarity(global_, global_) == pytest.approx(1.0)
    assert guidance.cosine_similarity(rescaled, global_, on="products") == pytest.approx(1.0)
    assert guidance.cosine_similarity(rescaled, global_) < 0.99
    negated = {k: -v if "lora_B" in k else v for k, v in global_.items()}
    assert guidance.cosine_similarity(negated, global_, on="products") == pytest.approx(-1.0)
    assert guidance.weighted_beta(0.5, -1.0) == 0.0 and guidance.weighted_beta(0.5, 0.4) == pytest.approx(0.2)
    assert guidance.weighted_beta(0.5, 1.7) == 0.5


# ------------------------------------------------------------------------------------------ runtime helper


def test_using_adapter_computes_with_the_teacher_and_restores_the_student(toy_runtime, toy_clients):
    import dataclasses

    method = guided()
    spec = method.spec(toy_runtime)
    teacher = dataclasses.replace(spec, slot="global")
    g = torch.Generator().manual_seed(3)
    toy_runtime.install(ClientModel(lora=teacher), seed=1)
    teacher_state = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in toy_runtime.adapter_state().items()}
    toy_runtime.load_adapter(teacher_state)
    batch = toy_runtime.encode(toy_clients[0].test[:4])
    batch.pop("labels")
    expected = toy_runtime.activate(teacher).eval()(**batch).logits
    model = toy_runtime.install(ClientModel(lora=spec), seed=2)
    student = model(**batch).logits
    params = toy_runtime.adapter_parameters()
    for p in params.values():
        p.requires_grad_(True)
    model.train()
    with toy_runtime.using_adapter(teacher) as teacher_model:
        assert not teacher_model.training
        torch.testing.assert_close(teacher_model(**batch).logits, expected)
    assert toy_runtime.active == spec and model.training
    assert all(p.requires_grad for p in params.values())
    model.eval()
    torch.testing.assert_close(model(**batch).logits, student)
    with toy_runtime.using_adapter(None) as base_model:
        base_logits = base_model(**batch).logits
    toy_runtime.install(ClientModel())
    torch.testing.assert_close(toy_runtime._model()(**batch).logits, base_logits)


# ------------------------------------------------------------------------------------------------ method


def test_defaults_are_fedit_with_the_clients_own_adapters_kept(toy_runtime, toy_clients):
    method = guided()
    fedit = build_method({"name": "fedit", **FAST, "batch_size": method.cfg.batch_size})
    state = method.init_server(toy_runtime, seed=0)
    ours, client_state = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    theirs, _ = fedit.client_update(toy_runtime, toy_clients[0], fedit.payload(state, "c0"), None, seed=1)
    for key in theirs.tensors:
        torch.testing.assert_close(ours.tensors[key], theirs.tensors[key])
    model = method.personalize(toy_runtime, toy_clients[0], state, client_state, None, seed=3)
    assert all(torch.equal(model.adapter[k], ours.tensors[k]) for k in ours.tensors)


def test_defaults_are_the_papers_protocol(toy_runtime, toy_clients):
    # Section 3: 20 rounds, every client, one local epoch of batch 32 per round, AdamW at lr 5e-5, rank 8.
    method = build_method({"name": "guided"})
    cfg = method.cfg
    assert (cfg.rounds, cfg.fraction, cfg.local_epochs, cfg.local_steps) == (20, 1.0, 1.0, None)
    assert (cfg.batch_size, cfg.lr, cfg.rank, cfg.guidance) == (32, 5e-5, 8, "hard_init")
    state = method.init_server(toy_runtime, seed=0)
    update, _ = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
    assert update.metrics["steps"] == math.ceil(len(toy_clients[0].train) / 32)
    # Steps given without epochs replace the epoch (the CPU preset's rounds of 6 steps); both given: epochs win.
    stepped = build_method({"name": "guided", "local_steps": 6}).cfg
    assert (stepped.local_steps, stepped.local_epochs) == (6, None)
    both = build_method({"name": "guided", "local_steps": 6, "local_epochs": 2.0}).cfg
    assert both.local_epochs == 2.0
    for entry in load_config("guidance-tasks-cpu").methods:
        if entry.name == "guided":
            assert (entry.local_steps, entry.local_epochs) == (6, None)


def test_first_round_trains_without_guidance(toy_runtime, toy_clients):
    hard, l2 = guided(), guided(guidance="l2", beta=1.0, similarity="sar")
    state = hard.init_server(toy_runtime, seed=0)
    a, _ = hard.client_update(toy_runtime, toy_clients[0], hard.payload(state, "c0"), None, seed=1)
    b, _ = l2.client_update(toy_runtime, toy_clients[0], l2.payload(state, "c0"), None, seed=1)
    assert "beta" not in b.metrics
    for key in a.tensors:
        torch.testing.assert_close(a.tensors[key], b.tensors[key])


def test_l2_guidance_pulls_toward_the_global_adapter(toy_runtime, toy_clients):
    trained = guided(local_steps=10, lr=5e-2)
    state = trained.init_server(toy_runtime, seed=0)
    _, local = trained.client_update(toy_runtime, toy_clients[0], trained.payload(state, "c0"), None, seed=1)
    payload = Payload(tensors=state.tensors, config={"round": 1})  # round > 0: guidance is on
    results = {}
    for beta in (0.0, 0.9):
        method = guided(guidance="l2", beta=beta, local_steps=10, lr=5e-2)
        update, _ = method.client_update(toy_runtime, toy_clients[0], payload, local, seed=2)
        results[beta] = distance(update.tensors, state.tensors)
        assert update.metrics["beta"] == beta
    assert results[0.9] < 0.5 * results[0.0]
    # The similarity-weighted beta shrinks with the distance between the local and the global adapter.
    method = guided(guidance="l2", beta=0.9, similarity="cosine_products")
    update, _ = method.client_update(toy_runtime, toy_clients[0], payload, local, seed=2)
    assert 0.0 <= update.metrics["beta"] < 0.9


def test_kd_guidance_trains_the_student_and_leaves_the_teacher(toy_runtime, toy_clients):
    import dataclasses

    method = guided(guidance="kd", beta=0.5, start="global", local_steps=3)
    state = method.init_server(toy_runtime, seed=0)
    g = torch.Generator().manual_seed(4)
    global_ = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in state.tensors.items()}
    payload = Payload(tensors=global_, config={"round": 1})
    update, client_state = method.client_update(toy_runtime, toy_clients[0], payload, None, seed=5)
    assert update.metrics["beta"] == 0.5 and distance(update.tensors, global_) > 0
    toy_runtime.activate(dataclasses.replace(method.spec(toy_runtime), slot="global"))
    teacher_after = toy_runtime.adapter_state()
    for key, tensor in global_.items():
        torch.testing.assert_close(teacher_after[key], tensor)


def test_kd_on_a_causal_lm_uses_the_response_tokens(tiny_llama_runtime, generation_clients):
    method = guided(guidance="kd", beta=0.5, local_steps=2)
    state = method.init_server(tiny_llama_runtime, seed=0)
    _, local = method.client_update(tiny_llama_runtime, generation_clients[0], method.payload(state, "a"), None, 1)
    payload = Payload(tensors=state.tensors, config={"round": 1})
    update, _ = method.client_update(tiny_llama_runtime, generation_clients[0], payload, local, seed=2)
    assert update.metrics["beta"] == 0.5 and math.isfinite(update.metrics["loss"])


def test_relora_folds_every_global_update_into_the_backbone(toy_runtime, toy_clients):
    method = guided(relora=True, merge={"operator": "mean", "space": "knots"})
    state = method.init_server(toy_runtime, seed=0)
    W0 = {k: v.detach().clone() for k, v in toy_runtime.base_params.items()}
    for _ in range(2):
        updates = []
        for client in toy_clients[:2]:
            payload = method.payload(state, client.client_id)
            assert not lora_pairs(payload.tensors) or all(k.startswith("fold.") for k in lora_pairs(payload.tensors))
            update, client_state = method.client_update(toy_runtime, client, payload, None, seed=len(updates))
            updates.append(update)
        state, _ = method.aggregate(state, iter(updates))
    folds = state.folds
    assert len(folds) == 2 and client_state["folds"] == 1
    assert sum(k.startswith("fold.") for k in method.payload(state, "c0").tensors) == 2 * len(folds[0])
    unseen = method.personalize(toy_runtime, toy_clients[3], state, None, None, seed=1)
    assert unseen.base is None and unseen.lora.rank == 2 * method.cfg.rank
    for module, (a_key, b_key) in lora_pairs(folds[0]).items():
        name = module.removeprefix("base_model.model.") + ".weight"
        delta = sum(method.scaling * (f[b_key] @ f[a_key]) for f in folds)
        torch.testing.assert_close(method.folded_base(toy_runtime, folds)[name], W0[name] + delta)
        stacked = unseen.lora.alpha / unseen.lora.rank * (unseen.adapter[b_key] @ unseen.adapter[a_key])
        torch.testing.assert_close(stacked, delta)
    # A seen client's model is the backbone it trained on (one fold) plus its own LoRA, as one stacked LoRA.
    seen = method.personalize(toy_runtime, toy_clients[1], state, client_state, None, seed=1)
    assert seen.lora.rank == 2 * method.cfg.rank
    batch = toy_runtime.encode(toy_clients[1].test[:6])
    batch.pop("labels")
    own = ClientModel(lora=method.spec(toy_runtime), adapter=client_state["adapter"], base=method.folded_base(
        toy_runtime, folds[:1]))  # fmt: skip
    expected = toy_runtime.install(own).eval()(**batch).logits
    torch.testing.assert_close(toy_runtime.install(seen).eval()(**batch).logits, expected, atol=1e-5, rtol=1e-5)
    a_key, b_key = next(iter(lora_pairs(folds[0]).values()))
    # Every client of a round starts from the same fresh LoRA (B = 0) on the folded backbone.
    payload = method.payload(state, "c0")
    toy_runtime.install(ClientModel(lora=method.spec(toy_runtime)), seed=payload.config["init_seed"])
    fresh = toy_runtime.adapter_state()
    assert float(fresh[b_key].abs().max()) == 0.0


def test_guided_config_errors_are_user_errors():
    with pytest.raises(UserError, match="relora"):
        guided(relora=True, guidance="l2")
    with pytest.raises(UserError, match="similarity"):
        guided(similarity="sar")
    with pytest.raises(UserError, match="operator"):
        guided(merge={"operator": "fisher"})


def test_fedit_with_a_merge_block(toy_runtime, toy_clients):
    fedit = build_method({"name": "fedit", **FAST, "merge": {"operator": "ties", "density": 1.0}})
    state = fedit.init_server(toy_runtime, seed=0)
    update, _ = fedit.client_update(toy_runtime, toy_clients[0], fedit.payload(state, "c0"), None, seed=1)
    copies = [ClientUpdate(str(i), {k: v.clone() for k, v in update.tensors.items()}, 5.0 + i) for i in range(3)]
    merged, metrics = fedit.aggregate(state, iter(copies))
    assert metrics["clients"] == 3.0 and merged.round == state.round  # the round loop counts the rounds
    for key, tensor in update.tensors.items():
        torch.testing.assert_close(merged.tensors[key], tensor)


# ------------------------------------------------------------------------------------------------ presets


@pytest.mark.parametrize("preset", ["guidance-sni", "guidance-tasks-cpu"])
def test_presets_express_the_papers_grid(preset):
    cfg = load_config(preset)
    methods = [build_method(entry) for entry in cfg.methods]
    labels = [m.label for m in methods]
    assert len(set(labels)) == len(labels) and "local" in {m.name for m in methods}
    cells = {
        (m.cfg.merge.operator, m.cfg.merge.space, m.cfg.relora, m.cfg.guidance, m.cfg.similarity)
        for m in methods
        if m.name == "guided"
    }
    for operator in ("mean", "ties", "iso_c"):
        for space in ("ab", "knots"):
            for relora in (False, True):
                assert (operator, space, relora, "hard_init", "none") in cells
    for operator, space in (("mean", "ab"), ("iso_c", "knots")):
        for kind in ("l2", "kd"):
            assert (operator, space, False, kind, "none") in cells
    for cell in (("mean", "ab", "l2"), ("iso_c", "knots", "kd")):
        for similarity in ("cosine", "sar"):
            assert (*cell[:2], False, cell[2], similarity) in cells
    assert all(m.cfg.rounds == methods[0].cfg.rounds for m in methods if m.federated)


def test_clients_keep_their_own_adapters_through_the_worker(toy_runtime, toy_clients, toy_worker_factory):
    from fedpeft.core.costs import CostMeter
    from fedpeft.engine.local import LocalEngine

    entry = {"name": "guided", "label": "kd-sar", **FAST, "guidance": "kd", "similarity": "sar"}
    worker = toy_worker_factory([entry])
    method = worker.methods["kd-sar"]
    ids = [c.client_id for c in toy_clients]
    state = LocalEngine(worker).run_rounds(
        "kd-sar", method, method.init_server(toy_runtime, 0), ids, seed=0, meter=CostMeter()
    )
    stored = {c: worker.store("kd-sar", 0).get(c)["adapter"] for c in ids}
    assert distance(stored["c0"], stored["c1"]) > 0
    records, _ = worker.personalize("kd-sar", 0, "c1", state)
    assert {r["metric"] for r in records} == {"accuracy"} and all(r["round"] == 2 for r in records)
    installed = toy_runtime.adapter_state()
    assert all(torch.equal(installed[k], v) for k, v in stored["c1"].items())


def test_partial_base_override_applies_on_top_of_the_initial_weights(toy_runtime):
    name = next(n for n in toy_runtime.base_params if n.endswith("query.weight"))
    other = next(n for n in toy_runtime.base_params if n.endswith("value.weight"))
    initial = {k: v.detach().clone() for k, v in toy_runtime.base_params.items()}
    toy_runtime.install(ClientModel(base={k: v + 1.0 for k, v in initial.items()}))
    toy_runtime.install(ClientModel(base={name: initial[name] * 2}))
    torch.testing.assert_close(toy_runtime.base_params[name].detach(), initial[name] * 2)
    torch.testing.assert_close(toy_runtime.base_params[other].detach(), initial[other])


def test_local_baseline_takes_lora_targets(toy_runtime, toy_clients):
    method = build_method({"name": "local", "rounds": 1, "local_steps": 1, "targets": ["value"]})
    model = method.personalize(toy_runtime, toy_clients[0], None, None, None, seed=0)
    assert model.lora.targets == ("value",)
    assert lora_pairs(model.adapter) and all(".value" in m for m in lora_pairs(model.adapter))
