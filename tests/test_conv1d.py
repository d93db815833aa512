"""GPT-2-style ``Conv1D`` layers, whose weight is stored (in, out), in every method that folds LoRA factors into a
full weight or rebuilds one from them: the model a method gives equals PEFT's merge of the same factors, and the runs
complete on the local and the Flower engine.

A tiny GPT-2 (n_embd 32, 2 layers) is saved as a local checkpoint directory and loaded as ``model.name: <dir>``, as a
user's own checkpoint is; LoRA goes on the non-square ``c_attn`` (32 x 96), ``c_fc`` and MLP ``c_proj``, and on the
square attention ``c_proj``, where a product folded untransposed raises no error. The reference is PEFT's: a fresh
copy of the base with W0 + sum_k c_k Delta_k, Delta_k the tensor PEFT's merge adds to the weight for LoRA k
(``get_delta_weight``, which PEFT transposes for a ``Conv1D`` layer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from flower_helpers import ATOL as ENGINE_ATOL
from flower_helpers import read_records
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file

from fedpeft.apps.flower import run_flower_simulation
from fedpeft.core.config import ModelConfig, load_raw, validate
from fedpeft.core.types import ClientUpdate, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Method
from fedpeft.methods.families.folding import folded_weights
from fedpeft.methods.fedex_lora import adapter_of
from fedpeft.models import load_model
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.models.targets import stores_in_out, to_lora_layout, to_weight_layout
from fedpeft.runner import Experiment
from fedpeft.worker import build_method

# PEFT sets fan_in_fan_out itself, with this warning, when a LoRA config without it meets a Conv1D layer: the
# reference models and a reloaded saved adapter rely on that (a user's plain PeftModel.from_pretrained does).
pytestmark = pytest.mark.filterwarnings("ignore:fan_in_fan_out is set to False:UserWarning")

ATOL = 1e-5
PREFIX = "base_model.model."
FAST = {"local_steps": 2, "local_epochs": None, "lr": 1e-2, "batch_size": 8}
TIERS = [{"name": "small", "rank": 2}, {"name": "large", "rank": 4}]
# Every Conv1D (c_attn and c_fc non-square: an untransposed product does not fit), and the square attention c_proj
# alone (it fits untransposed, and the model is silently another).
TARGETS = {"all": None, "square": ["attn.c_proj"]}


# ------------------------------------------------------------------------------------------- the checkpoint
@pytest.fixture(scope="module")
def gpt2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 with a byte-level BPE tokenizer, written by ``save_pretrained`` (its classification head is
    initialized when fedpeft loads it, as for a hub checkpoint without one)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from fedpeft.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("gpt2")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDPEFT_CACHE", str(root / "cache"))
        texts = ["a b c d e f g h", "the quick brown fox jumps over the lazy dog", "Ein kleiner Satz."] * 10
        tokenizer = train_tokenizer(texts, 300, kind="bpe")
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    target = root / "tiny-gpt2"
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@dataclasses.dataclass
class Gpt2:
    """The runtime over the checkpoint and the base weights W0 it was loaded with."""

    checkpoint: Path
    runtime: ModelRuntime
    base: StateDict


@pytest.fixture
def gpt2(gpt2_checkpoint: Path) -> Gpt2:
    loaded = load_model(ModelConfig(name=str(gpt2_checkpoint), max_length=32), task="classification", num_labels=2)
    runtime = ModelRuntime(loaded, eval_batch_size=32)
    return Gpt2(gpt2_checkpoint, runtime, runtime.base_state())


def test_the_checkpoint_has_square_and_non_square_conv1d_targets(gpt2: Gpt2) -> None:
    shapes = {".".join(name.split(".")[-2:]): tuple(m.weight.shape) for name, m in gpt2.runtime.target_modules}
    assert shapes == {"attn.c_attn": (32, 96), "attn.c_proj": (32, 32), "mlp.c_fc": (32, 128), "mlp.c_proj": (128, 32)}
    assert all(stores_in_out(module) for _, module in gpt2.runtime.target_modules)
    assert gpt2.runtime.loaded.lora_targets == ["c_attn", "c_proj", "c_fc"]
    delta = torch.arange(6.0).reshape(3, 2)  # (out, in)
    assert to_weight_layout(delta, True).shape == (2, 3) and to_weight_layout(delta, False) is delta
    assert torch.equal(to_lora_layout(to_weight_layout(delta, True), True), delta)


# ------------------------------------------------------------------------------------------- PEFT's reference
def fresh_model(gpt2: Gpt2, weights: StateDict) -> torch.nn.Module:
    """A new GPT-2 classifier holding W0 with ``weights`` (canonical names) in place; nothing of the runtime's PEFT."""
    base = gpt2.runtime.base_model
    model = type(base)(base.config)
    assert not model.load_state_dict({**gpt2.base, **weights}, strict=False).unexpected_keys
    return model.eval()


def peft_deltas(gpt2: Gpt2, adapter: StateDict, spec: LoraSpec) -> StateDict:
    """What PEFT's merge adds to each adapted weight for the LoRA factors of ``adapter`` (shape ``spec``), by
    canonical weight name, in the weight's own layout; PEFT alone decides the layout (fan_in_fan_out)."""
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=list(spec.targets))
    peft = get_peft_model(fresh_model(gpt2, {}), config)
    set_peft_model_state_dict(peft, {k: v for k, v in adapter.items() if ".lora_A." in k or ".lora_B." in k})
    deltas = {}
    with torch.no_grad():
        for name, module in peft.named_modules():
            if isinstance(module, LoraLayer):
                deltas[name.removeprefix(PREFIX) + ".weight"] = module.get_delta_weight("default").double()
    return deltas


def combine(terms: list[tuple[float, StateDict]]) -> StateDict:
    """sum_k c_k Delta_k, module by module, in float64."""
    out: StateDict = {}
    for coefficient, deltas in terms:
        for name, delta in deltas.items():
            out[name] = out.get(name, torch.zeros_like(delta)) + coefficient * delta
    return out


def with_deltas(gpt2: Gpt2, deltas: StateDict) -> StateDict:
    """W0 + delta for every weight in ``deltas``."""
    return {name: (gpt2.base[name].double() + delta).float() for name, delta in deltas.items()}


def canonical_head(tensors: StateDict) -> StateDict:
    """The task head of an adapter state, under the base model's names."""
    return {k.removeprefix(PREFIX): v for k, v in tensors.items() if k.startswith(PREFIX + "score.")}


def logits(
    model: torch.nn.Module, runtime: ModelRuntime, client: ClientData, context: Callable = contextlib.nullcontext
) -> torch.Tensor:
    batch = runtime.encode(client.test)
    batch.pop("labels", None)
    model.eval()
    with torch.no_grad(), context():
        return model(**batch).logits


def method_logits(gpt2: Gpt2, model: ClientModel, client: ClientData) -> torch.Tensor:
    """The logits of a method's model as the runtime computes them (base overrides, LoRA, head; without an adapter
    the runtime computes on the base alone)."""
    installed = gpt2.runtime.install(model, seed=4)
    return logits(installed, gpt2.runtime, client, gpt2.runtime.forward_context)


def assert_logits_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    difference = float((got - expected).abs().max())
    assert difference <= ATOL, f"max |logit difference| {difference:.3g}"


def peft_logits(gpt2: Gpt2, deltas: StateDict, head: StateDict, client: ClientData) -> torch.Tensor:
    """PEFT's merged model: W0 + ``deltas`` and ``head``."""
    return logits(fresh_model(gpt2, {**with_deltas(gpt2, deltas), **head}), gpt2.runtime, client)


def assert_export_reads_back(gpt2: Gpt2, model: ClientModel, client: ClientData, tmp_path: Path) -> None:
    """The model's adapter written as fedpeft exports it (the worker's ``save_adapter``) reloads with plain
    ``PeftModel.from_pretrained`` onto the base and gives the model's logits."""
    expected = method_logits(gpt2, model, client)
    target = tmp_path / "adapter"
    target.mkdir()
    config = gpt2.runtime.saved_adapter_config(str(gpt2.checkpoint))
    assert config.fan_in_fan_out  # GPT-2's Conv1D layers store (in, out): PEFT reads the adapter so, unwarned
    config.save_pretrained(str(target))
    save_file(
        {k: v.contiguous() for k, v in gpt2.runtime.adapter_state().items()}, str(target / "adapter_model.safetensors")
    )
    reloaded = PeftModel.from_pretrained(fresh_model(gpt2, dict(model.base or {})), str(target))
    assert_logits_close(logits(reloaded, gpt2.runtime, client), expected)


# ------------------------------------------------------------------------------------------- rounds by hand
@dataclasses.dataclass
class Round:
    state_before: object
    updates: list[ClientUpdate]


def run_rounds(method: Method, gpt2: Gpt2, clients: list[ClientData], rounds: int) -> tuple[object, list[Round], dict]:
    """``rounds`` rounds of every client, as the round loop runs them; each upload is checked against the
    method's ``update_spec`` (the server's check, which refused FLoRA's uploads on a non-square Conv1D)."""
    state = method.init_server(gpt2.runtime, seed=0)
    history, client_states = [], {}
    for index in range(rounds):
        updates = []
        for client in clients:
            payload = method.payload(state, client.client_id)
            update, client_state = method.client_update(
                gpt2.runtime, client, payload, client_states.get(client.client_id), seed=10 * index + len(updates)
            )
            assert {k: v.shape for k, v in update.tensors.items()} == dict(method.update_spec(payload))
            updates.append(update)
            client_states[client.client_id] = client_state
        history.append(Round(state, updates))
        state, _ = method.aggregate(state, iter(updates))
        state = dataclasses.replace(state, round=index + 1)  # the round loop's job
    return state, history, client_states


def shares(updates: list[ClientUpdate]) -> list[float]:
    total = sum(u.weight for u in updates)
    return [u.weight / total for u in updates]


def personalized(
    method: Method, gpt2: Gpt2, client: ClientData, state: object, client_state: object = None
) -> ClientModel:
    budgets = method.budgets_of(client, [2])
    return method.personalize(gpt2.runtime, client, state, client_state, budgets[0] if budgets else None, seed=4)


# ------------------------------------------------------------------------------------------- the matrix
@pytest.mark.parametrize("targets", sorted(TARGETS))
def test_flora_folds_the_stacked_products_as_peft_merges_them(
    targets: str, gpt2: Gpt2, toy_clients: list[ClientData]
) -> None:
    """FLoRA (heterogeneous ranks 2 and 3): W0 + sum_k p_k s_k B_k A_k, each product folded in the weight's layout."""
    method = build_method({"name": "flora", "rounds": 1, "ranks": [2, 3], "targets": TARGETS[targets], **FAST})
    clients = toy_clients[:2]
    state, history, _ = run_rounds(method, gpt2, clients, rounds=1)
    updates = history[0].updates
    terms = [
        (p, peft_deltas(gpt2, u.tensors, method.spec(gpt2.runtime, method.rank_of(u.client_id))))
        for p, u in zip(shares(updates), updates, strict=True)
    ]
    expected = peft_logits(gpt2, combine(terms), canonical_head(state.tensors), clients[1])
    model = personalized(method, gpt2, clients[1], state)
    assert model.lora is None
    assert_logits_close(method_logits(gpt2, model, clients[1]), expected)


@pytest.mark.parametrize("targets", sorted(TARGETS))
def test_fedex_lora_global_model_is_the_exact_mean_peft_merges(
    targets: str, gpt2: Gpt2, toy_clients: list[ClientData]
) -> None:
    """FedEX-LoRA: W0 + residual + s B_avg A_avg = W0 + sum_k p_k s B_k A_k after a round, and a client of the next
    round starts from that model (the residual folded into its base, the mean adapter on top)."""
    method = build_method({"name": "fedex_lora", "rounds": 1, "rank": 2, "targets": TARGETS[targets], **FAST})
    clients = toy_clients[:2]
    state, history, _ = run_rounds(method, gpt2, clients, rounds=1)
    updates = history[0].updates
    spec = method.spec(gpt2.runtime)
    terms = [(p, peft_deltas(gpt2, u.tensors, spec)) for p, u in zip(shares(updates), updates, strict=True)]
    expected = peft_logits(gpt2, combine(terms), canonical_head(state.tensors), clients[1])
    assert_logits_close(method_logits(gpt2, personalized(method, gpt2, clients[1], state), clients[1]), expected)

    payload = method.payload(state, clients[0].client_id)
    start = ClientModel(
        base=folded_weights(gpt2.runtime, payload.tensors), lora=spec, adapter=adapter_of(payload.tensors)
    )
    assert_logits_close(method_logits(gpt2, start, clients[1]), expected)


def test_fedsvd_refactorization_keeps_the_product_peft_merges(
    gpt2: Gpt2, toy_clients: list[ClientData], tmp_path: Path
) -> None:
    """FedSVD: the re-factorized global LoRA is the mean of B with the shared A, W0 + s mean(B_k) A."""
    method = build_method({"name": "fedsvd", "rounds": 1, "rank": 2, **FAST})
    clients = toy_clients[:2]
    state, history, _ = run_rounds(method, gpt2, clients, rounds=1)
    updates = history[0].updates
    before = history[0].state_before.tensors
    mean_b = {
        k: sum(p * u.tensors[k] for p, u in zip(shares(updates), updates, strict=True)) for k in updates[0].tensors
    }
    spec = method.spec(gpt2.runtime)
    expected = peft_logits(
        gpt2, peft_deltas(gpt2, {**before, **mean_b}, spec), canonical_head(state.tensors), clients[1]
    )
    model = personalized(method, gpt2, clients[1], state)
    assert_logits_close(method_logits(gpt2, model, clients[1]), expected)
    assert_export_reads_back(gpt2, model, clients[1], tmp_path)


def truncated(deltas: StateDict, rank: int) -> StateDict:
    """The best rank-``rank`` approximation of every delta (Eckart-Young; the same in either layout)."""
    out = {}
    for name, delta in deltas.items():
        u, s, vh = torch.linalg.svd(delta, full_matrices=False)
        out[name] = (u[:, :rank] * s[:rank]) @ vh[:rank]
    return out


def test_flexlora_global_model_is_the_truncated_mean_peft_merges(
    gpt2: Gpt2, toy_clients: list[ClientData], tmp_path: Path
) -> None:
    """FlexLoRA (both clients at rank 2): W0 + the rank-2 truncation of sum_k p_k s B_k A_k."""
    method = build_method({"name": "flexlora", "rounds": 1, "tiers": TIERS[:1], **FAST})
    clients = toy_clients[:2]
    state, history, _ = run_rounds(method, gpt2, clients, rounds=1)
    updates = history[0].updates
    spec = method.spec(gpt2.runtime, 2)
    terms = [(p, peft_deltas(gpt2, u.tensors, spec)) for p, u in zip(shares(updates), updates, strict=True)]
    expected = peft_logits(gpt2, truncated(combine(terms), 2), canonical_head(state.tensors), clients[1])
    model = personalized(method, gpt2, clients[1], state)
    assert_logits_close(method_logits(gpt2, model, clients[1]), expected)
    assert_export_reads_back(gpt2, model, clients[1], tmp_path)


def test_fedit_knots_merge_is_the_truncated_mean_peft_merges(gpt2: Gpt2, toy_clients: list[ClientData]) -> None:
    """The merge operators' KnOTS space (``mean``): W0 + the rank-r truncation of sum_k p_k s B_k A_k."""
    method = build_method({"name": "fedit", "rounds": 1, "rank": 2, "merge": {"space": "knots"}, **FAST})
    clients = toy_clients[:2]
    state, history, _ = run_rounds(method, gpt2, clients, rounds=1)
    updates = history[0].updates
    model = personalized(method, gpt2, clients[1], state)
    assert model.lora is not None
    terms = [(p, peft_deltas(gpt2, u.tensors, model.lora)) for p, u in zip(shares(updates), updates, strict=True)]
    expected = peft_logits(gpt2, truncated(combine(terms), 2), canonical_head(state.tensors), clients[1])
    assert_logits_close(method_logits(gpt2, model, clients[1]), expected)


@pytest.mark.parametrize("targets", sorted(TARGETS))
def test_fedit_merged_folds_the_global_adapter_as_peft_merges_it(
    targets: str, gpt2: Gpt2, toy_clients: list[ClientData]
) -> None:
    """Standard FL with LoRA (``qv`` has no meaning for GPT-2's fused c_attn): W0 + s B_G A_G in the weights."""
    entry = {
        "name": "fedit_merged",
        "rounds": 1,
        "rank": 2,
        "targets": TARGETS[targets] or "all",
        "schedule": "constant",
    }
    method = build_method({**entry, **FAST})
    clients = toy_clients[:2]
    state, _, _ = run_rounds(method, gpt2, clients, rounds=1)
    spec = method.spec(gpt2.runtime)
    expected = peft_logits(gpt2, peft_deltas(gpt2, state.tensors, spec), canonical_head(state.tensors), clients[1])
    model = personalized(method, gpt2, clients[1], state)
    assert model.lora is None and model.base is not None
    assert_logits_close(method_logits(gpt2, model, clients[1]), expected)


@pytest.mark.parametrize("targets", sorted(TARGETS))
def test_relora_backbone_is_the_folds_peft_merges(
    targets: str, gpt2: Gpt2, toy_clients: list[ClientData], tmp_path: Path
) -> None:
    """Guided with ReLoRA: the backbone a client trains on, W0 + s B_G A_G of round 1, plus its own LoRA, is PEFT's
    merge of the two, and so is the stacked LoRA it keeps."""
    entry = {"name": "guided", "rounds": 2, "rank": 2, "relora": True, "targets": TARGETS[targets]}
    method = build_method({**entry, **FAST})
    clients = toy_clients[:2]
    state, _, client_states = run_rounds(method, gpt2, clients, rounds=2)
    client, own = clients[1], client_states[clients[1].client_id]
    assert own["folds"] == 1
    spec = method.spec(gpt2.runtime)
    terms = [(1.0, peft_deltas(gpt2, state.folds[0], spec)), (1.0, peft_deltas(gpt2, own["adapter"], spec))]
    expected = peft_logits(gpt2, combine(terms), canonical_head(own["adapter"]), client)
    trained_on = ClientModel(base=method.folded_base(gpt2.runtime, state.folds[:1]), lora=spec, adapter=own["adapter"])
    assert_logits_close(method_logits(gpt2, trained_on, client), expected)
    model = personalized(method, gpt2, client, state, own)
    assert_logits_close(method_logits(gpt2, model, client), expected)
    assert_export_reads_back(gpt2, model, client, tmp_path)


ADAPTER_METHODS: dict[str, dict] = {
    "hetlora": {"tiers": TIERS, "client_tiers": {"c0": "small", "c1": "large"}},
    "guided": {"rank": 2, "merge": {"operator": "ties", "space": "knots"}},
    "potara": {"rank": 2, "local_rounds": 1},
}


@pytest.mark.parametrize("name", sorted(ADAPTER_METHODS))
def test_adapter_models_are_what_peft_merges(
    name: str, gpt2: Gpt2, toy_clients: list[ClientData], tmp_path: Path
) -> None:
    """Methods whose model is a LoRA on the base (heterogeneous ranks, a merge operator, per-client merging): the
    runtime's model is PEFT's merge of its factors, and its exported adapter reads back."""
    method = build_method({"name": name, "rounds": 1, **FAST, **ADAPTER_METHODS[name]})
    clients = toy_clients[:2]
    state, _, client_states = run_rounds(method, gpt2, clients, rounds=1)
    client = clients[1]
    model = personalized(method, gpt2, client, state, client_states[client.client_id])
    assert model.lora is not None and model.adapter is not None
    expected = peft_logits(gpt2, peft_deltas(gpt2, model.adapter, model.lora), canonical_head(model.adapter), client)
    assert_logits_close(method_logits(gpt2, model, client), expected)
    assert_export_reads_back(gpt2, model, client, tmp_path)


@pytest.mark.parametrize("name", ["ditto", "feddat", "fedsim", "sft_rounds"])
def test_branched_adapters_take_conv1d_in_and_out_features(
    name: str, gpt2: Gpt2, toy_clients: list[ClientData]
) -> None:
    """The hooked (PQ-)LoRA branches size their factors by the layer's in and out features, which a Conv1D weight
    gives as (in, out): a round and the personalized model run (c_attn's factors were sized the other way round)."""
    method = build_method({"name": name, "rounds": 1, **FAST})
    state, _, client_states = run_rounds(method, gpt2, toy_clients[:2], rounds=1)
    client = toy_clients[1]
    model = personalized(method, gpt2, client, state, client_states[client.client_id])
    assert torch.isfinite(method_logits(gpt2, model, client)).all()


def test_flame_refuses_a_dense_gpt2(gpt2: Gpt2) -> None:
    """FLAME's rescaler scales the output of a sparse MoE layer and folds nothing; a dense GPT-2 has no such layer."""
    from fedpeft.core.errors import UserError

    with pytest.raises(UserError, match="needs a sparse mixture-of-experts model"):
        build_method({"name": "flame"}).init_server(gpt2.runtime, seed=0)


# ------------------------------------------------------------------------------------------- whole runs
EXPERIMENT_METHODS: list[dict] = [
    {"name": "flora", "ranks": [2, 3]},
    {"name": "fedex_lora", "rank": 2},
    {"name": "fedsvd", "rank": 2},
    # One tier: a run expects every client's result at every evaluated tier (the matrix above mixes the ranks).
    {"name": "flexlora", "tiers": TIERS[:1], "local_epochs": None, "compute_tokens": 16},
    {"name": "hetlora", "tiers": TIERS[:1], "local_epochs": None, "compute_tokens": 16},
    {"name": "fedit_merged", "rank": 2, "targets": "all", "schedule": "constant"},
    {"name": "guided", "label": "guided-relora", "rank": 2, "relora": True, "local_epochs": None},
    {"name": "fedit", "label": "fedit-ties-knots", "rank": 2, "merge": {"operator": "ties", "space": "knots"}},
    {"name": "potara", "rank": 2, "local_rounds": 2, "merge_samples": 4},
]
COMMON = {"rounds": 2, "fraction": 1.0, "local_steps": 2, "lr": 5e-3, "batch_size": 8}


def experiment(checkpoint: Path, methods: list[dict]) -> dict:
    """The smoke preset on two synthetic languages (four clients), on the GPT-2 checkpoint, without a base stage."""
    raw = load_raw("smoke")
    raw["data"] = {**raw["data"], "groups": ["lat1", "lat3"], "train_per_group": 32, "test_per_group": 16}
    raw.update(model={"name": str(checkpoint), "max_length": 32}, base={"kind": "pretrained"}, budgets=[2])
    raw.update(output={"plots": False}, methods=[{**COMMON, **entry} for entry in methods])
    return raw


@pytest.fixture(scope="module")
def local_run(gpt2_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("local") / "run"
    return Experiment(validate(experiment(gpt2_checkpoint, EXPERIMENT_METHODS)), out).run()


@pytest.mark.slow
def test_every_method_completes_on_the_local_engine(local_run: Path) -> None:
    """Each method's rounds aggregate every client's upload (none rejected) and its personalized models evaluate."""
    rows = [json.loads(line) for line in (local_run / "results.jsonl").read_text().splitlines()]
    for entry in EXPERIMENT_METHODS:
        label = entry.get("label", entry["name"])
        ours = [r for r in rows if r["method"] == label]
        accuracies = [r["value"] for r in ours if r["metric"] == "accuracy"]
        assert accuracies and all(0.0 <= value <= 1.0 for value in accuracies), label
        clients = [r["value"] for r in ours if r["metric"] == "clients"]
        assert clients == [4.0, 4.0], label  # both rounds aggregated all four uploads


@pytest.mark.slow
def test_flower_simulation_gives_the_local_records(gpt2_checkpoint: Path, local_run: Path, tmp_path: Path) -> None:
    """FLoRA and FedEX-LoRA on the Flower simulation engine (two SuperNodes): the local engine's records."""
    methods = [e for e in EXPERIMENT_METHODS if e["name"] in ("flora", "fedex_lora")]
    flower = run_flower_simulation(validate(experiment(gpt2_checkpoint, methods)), tmp_path / "flower")
    local, simulated = read_records(local_run), read_records(flower)
    local = {key: value for key, value in local.items() if key[0] in {"base", "flora", "fedex_lora"}}
    assert local.keys() == simulated.keys() and {key[0] for key in local} == {"base", "flora", "fedex_lora"}
    for key, value in local.items():
        assert simulated[key] == pytest.approx(value, abs=ENGINE_ATOL), key
