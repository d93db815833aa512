"""LLM-scale training on tiny models: dtype and autocast, gradient checkpointing, gradient accumulation,
quantization refusals, chat templates, ``device: auto`` and the paper-scale presets' dtype."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from fedpeft.core.config import ExperimentConfig, ModelConfig, load_config
from fedpeft.core.errors import UserError
from fedpeft.methods.base import lora_spec
from fedpeft.models import load_model
from fedpeft.models import precision as precision_module
from fedpeft.models.precision import check_quantization, quantization_config
from fedpeft.models.runtime import ClientModel, ModelRuntime, resolve_device
from fedpeft.training import TrainArgs

WORDS = "the a cat dog sees runs red blue small big house tree river sky bird fish".split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


@pytest.fixture(scope="module")
def texts() -> dict[str, list[dict]]:
    rng = random.Random(0)
    generation = [{"prompt": sentence(rng, 2, 6), "response": sentence(rng, 1, 7)} for _ in range(40)]
    classification = []
    for _ in range(40):
        text = sentence(rng, 3, 8)
        classification.append({"text": text, "text_pair": None, "label": int("cat" in text.split())})
    return {"generation": generation, "classification": classification}


@pytest.fixture(autouse=True)
def cache_root(tmp_path_factory, monkeypatch) -> Path:
    root = tmp_path_factory.getbasetemp() / "fedpeft-cache-llm"
    monkeypatch.setenv("FEDPEFT_CACHE", str(root))
    return root


def corpus(examples: dict[str, list[dict]]):
    def texts() -> list[str]:
        return [" ".join(str(v) for v in ex.values() if isinstance(v, str)) for exs in examples.values() for ex in exs]

    return texts


def runtime(texts, task: str = "generation", **settings) -> ModelRuntime:
    model_keys = {"dtype", "gradient_checkpointing", "chat_template"}
    cfg = ModelConfig(name="tiny-llama", vocab_size=400, **{k: v for k, v in settings.items() if k in model_keys})
    loaded = load_model(cfg, task=task, num_labels=2, corpus=corpus(texts))
    rest = {k: v for k, v in settings.items() if k not in model_keys}
    return ModelRuntime(loaded, dtype=cfg.dtype, chat_template=cfg.chat_template, **rest)


def train_adapter(rt: ModelRuntime, examples: list[dict], *, batch_size: int, steps: int) -> tuple[dict, float]:
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    metrics = rt.train(examples, TrainArgs(lr=5e-2, batch_size=batch_size, seed=3, steps=steps))
    return rt.adapter_state(), metrics["loss"]


# ------------------------------------------------------------------------------------------- config, device


def test_defaults_keep_cpu_runs_as_they_were():
    cfg = ExperimentConfig()
    assert (cfg.model.dtype, cfg.model.gradient_checkpointing, cfg.model.quantization) == ("float32", False, None)
    assert cfg.model.chat_template is False and cfg.train.grad_accum_steps == 1 and cfg.device == "cpu"


def test_config_keys_validate():
    cfg = load_config("quickstart", ["train.grad_accum_steps=4", "model.dtype=bfloat16", "device=cuda:1"])
    assert cfg.train.grad_accum_steps == 4 and cfg.model.dtype == "bfloat16" and cfg.device == "cuda:1"
    for bad in ["train.grad_accum_steps=0", "model.dtype=float8", "model.quantization=2bit"]:
        with pytest.raises(UserError):
            load_config("quickstart", [bad])
    with pytest.raises(UserError, match="`device` must be cpu, cuda, cuda:N, mps or auto"):
        load_config("quickstart", ["device=gpu"])


def test_device_auto(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cuda:1") == "cuda:1"


# ---------------------------------------------------------------------------------------- gradient accumulation


@pytest.mark.parametrize("task", ["generation", "classification"])
def test_accumulation_equals_the_larger_batch(texts, task):
    """6 x 3 micro-batches per step = batches of 18: the same examples, weights and loss (40 examples: the
    third step is the pass's last 4 examples, one micro-batch; responses of unequal length weight by tokens)."""
    examples = texts[task]
    big, big_loss = train_adapter(runtime(texts, task), examples, batch_size=18, steps=4)
    small, small_loss = train_adapter(runtime(texts, task, grad_accum_steps=3), examples, batch_size=6, steps=4)
    assert big.keys() == small.keys()
    # Summing micro-batch gradients rounds differently from one batch; AdamW's normalization lifts those
    # float32 rounding differences where a gradient is near 0: ~1e-5 with AVX2 kernels, up to 5.7e-5 with
    # AVX-512 ones (each step moves a weight by up to 5e-2, so 1e-4 is 0.2 % of one step).
    for key in big:
        torch.testing.assert_close(small[key], big[key], rtol=1e-4, atol=1e-4, msg=key)
    assert small_loss == pytest.approx(big_loss, rel=1e-5)
    moved = train_adapter(runtime(texts, task), examples, batch_size=6, steps=4)[0]
    assert max(float((moved[k] - big[k]).abs().max()) for k in big) > 1e-2  # without accumulation: other steps


def test_accumulated_steps_count_epochs_of_the_larger_batch(texts):
    rt = runtime(texts, grad_accum_steps=2)
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    assert rt.train(texts["generation"], TrainArgs(lr=1e-2, batch_size=8, seed=0, epochs=1))["steps"] == 3  # 40 / 16


# ---------------------------------------------------------------------------------------- checkpointing, dtype


def test_gradient_checkpointing_trains_the_same_adapter(texts):
    plain = runtime(texts)
    checkpointed = runtime(texts, gradient_checkpointing=True)
    assert checkpointed.base_model.is_gradient_checkpointing and not plain.base_model.is_gradient_checkpointing
    expected, expected_loss = train_adapter(plain, texts["generation"], batch_size=8, steps=3)
    got, loss = train_adapter(checkpointed, texts["generation"], batch_size=8, steps=3)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=5e-5, msg=key)
    assert loss == pytest.approx(expected_loss, rel=1e-5)


def test_bfloat16_base_with_float32_adapter_trains_under_autocast(texts):
    rt = runtime(texts, dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in rt.base_params.values())
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    assert all(p.dtype == torch.float32 for p in rt.adapter_parameters().values())
    before = rt.adapter_state()
    metrics = rt.train(texts["generation"], TrainArgs(lr=5e-2, batch_size=8, seed=0, steps=3))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    after = rt.adapter_state()
    assert any("lora_B" in k and not torch.equal(after[k], before[k]) for k in after)
    assert len(rt.predict(texts["generation"][:2])) == 2


def test_bfloat16_classification_head_is_trained_in_float32(texts):
    rt = runtime(texts, "classification", dtype="bfloat16")
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    heads = {k: p for k, p in rt.adapter_parameters().items() if "score" in k}
    assert heads and all(p.dtype == torch.float32 for p in heads.values())
    rt.train(texts["classification"], TrainArgs(lr=1e-2, batch_size=8, seed=0, steps=2))
    assert set(rt.predict(texts["classification"][:4])) <= {0, 1}


def test_bfloat16_per_sample_gradients_and_statistics_follow_float32(texts):
    """Code that calls the model outside train and predict (per-sample gradients of a float32 adapter, feature
    statistics of the base) computes under autocast on a bfloat16 base and gives float32's numbers to bfloat16
    precision."""
    from fedpeft.adapters.gradients import per_sample_gradients
    from fedpeft.adapters.statistics import feature_statistics

    examples = texts["generation"][:6]
    results = []
    for dtype in ("float32", "bfloat16"):
        rt = runtime(texts, dtype=dtype)
        rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
        with torch.no_grad():  # a non-zero B, so that every adapter tensor has a gradient
            for name, param in rt.adapter_parameters().items():
                if "lora_B" in name:
                    param.copy_(torch.linspace(-0.1, 0.1, param.numel()).reshape(param.shape))
        grads, _ = per_sample_gradients(rt, examples)
        rt.install(ClientModel())
        results.append((grads, feature_statistics(rt, examples)))
    (grads32, stats32), (grads16, stats16) = results
    assert grads16.dtype == torch.float32 and grads16.shape == grads32.shape
    cosine = torch.nn.functional.cosine_similarity(grads16, grads32, dim=1)
    assert bool((cosine > 0.99).all()), cosine
    torch.testing.assert_close(stats16, stats32, rtol=0.03, atol=0.03)


class Regression(torch.nn.Module):
    """A linear regression with the model interface train_loop expects (batch dict in, ``.loss`` out)."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor):  # noqa: ANN201
        from types import SimpleNamespace

        return SimpleNamespace(loss=((self.linear(x).squeeze(-1).float() - labels) ** 2).mean())


def scaled_run(batches: list[dict], scaler) -> tuple[list[dict], list[dict]]:
    """Gradients seen by after_backward and weights after each step of float16 autocast training."""
    from fedpeft.training import train_loop

    model = Regression()
    params = dict(model.named_parameters())
    grads, weights = [], []
    train_loop(
        model,
        iter(batches),
        params,
        TrainArgs(
            lr=0.1,
            batch_size=8,
            seed=0,
            max_grad_norm=None,
            after_backward=lambda step: grads.append({k: p.grad.clone() for k, p in params.items()}),
            after_step=lambda step: weights.append({k: p.detach().clone() for k, p in params.items()}),
        ),
        steps=len(batches),
        autocast=lambda: torch.autocast("cpu", dtype=torch.float16),
        scaler=scaler,
    )
    return grads, weights


def test_float16_loss_scaling_unscales_before_hooks_and_skips_an_overflowing_step():
    """The float16 path of train_loop (a GPU's, run here with the CPU's float16 autocast and GradScaler): hooks see
    the unscaled gradients, and a step whose gradients overflow leaves the weights as they were and halves the
    scale."""
    generator = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(8, 4, generator=generator), "labels": torch.randn(8, generator=generator)}]
    batches.append({"x": torch.full((8, 4), 1e5), "labels": torch.zeros(8)})  # overflows float16 in the forward pass
    batches.append(batches[0])
    plain_grads, plain_weights = scaled_run(batches[:1], scaler=None)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    grads, weights = scaled_run(batches, scaler)
    for key in plain_grads[0]:
        torch.testing.assert_close(grads[0][key], plain_grads[0][key], rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(weights[0][key], plain_weights[0][key])
        assert not torch.isfinite(grads[1][key]).all()
        torch.testing.assert_close(weights[1][key], weights[0][key], rtol=0, atol=0)  # the step was skipped
        assert not torch.equal(weights[2][key], weights[1][key])  # the next one was not
    assert scaler.get_scale() == 2.0**11


def test_float16_on_the_cpu_is_refused(texts):
    with pytest.raises(UserError, match="float16 needs a GPU"):
        runtime(texts, dtype="float16")


def test_full_fine_tuning_on_a_float16_or_quantized_base_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """Checked from the config, before the model loads (so before the CPU's own float16 refusal here)."""
    from tests.entry_point import cli

    out = tmp_path / "out"
    code, _, err = cli(monkeypatch, capsys, "run", "smoke", "--out", str(out), "--set", "model.dtype=float16")
    assert code == 2 and not out.exists()
    assert err.strip().splitlines()[-1] == (
        "error: model.dtype float16 trains adapters only (loss scaling cannot update float16 weights), and base.kind "
        "centralized, method 'fedavg_full' train(s) the base weights; use model.dtype bfloat16, or leave them out."
    )
    code, _, err = cli(monkeypatch, capsys, "run", "smoke", "--out", str(out), "--set", "model.quantization=8bit")
    assert code == 2 and not out.exists()
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            "error: model.quantization 8bit keeps the base weights frozen (QLoRA), and base.kind centralized, method "
            "'fedavg_full' train(s) them;"
        )
    )


# ------------------------------------------------------------------------------------------------ quantization


def test_quantization_without_bitsandbytes_is_refused(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    with pytest.raises(UserError, match="^model.quantization 4bit needs the bitsandbytes package, which is not"):
        check_quantization(ModelConfig(name="org/model", quantization="4bit"), "cuda")


def test_quantization_where_bitsandbytes_cannot_run_is_refused(monkeypatch):
    monkeypatch.setattr(precision_module.importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(precision_module, "runs_on_cpu", lambda quantization: False)  # an older build
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"^model.quantization 8bit needs a CUDA device, or the CPU with a bitsandb"):
        check_quantization(ModelConfig(name="org/model", quantization="8bit"), "cpu")
    with pytest.raises(UserError, match="this run's device is cuda"):
        check_quantization(ModelConfig(name="org/model", quantization="8bit"), "cuda")
    with pytest.raises(UserError, match="this run's device is mps"):
        check_quantization(ModelConfig(name="org/model", quantization="4bit"), "mps")
    check_quantization(ModelConfig(name="org/model"), "cpu")  # not asked for: nothing to check


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_quantized_checkpoint_trains_a_lora_on_the_cpu(quantization, texts, tmp_path):
    """QLoRA for real on the CPU (bitsandbytes >= 0.46): a local checkpoint loads with its linear layers
    quantized, LoRA trains in float32 on top while the quantized weights stay as they were, and the quantized
    model's loss stays near the float32 checkpoint's."""
    import bitsandbytes as bnb

    assert precision_module.runs_on_cpu(quantization)
    source = runtime(texts)
    source.loaded.model.save_pretrained(tmp_path / "ckpt")
    source.tokenizer.save_pretrained(tmp_path / "ckpt")
    cfg = ModelConfig(name=str(tmp_path / "ckpt"), quantization=quantization, dtype="bfloat16")
    check_quantization(cfg, "cpu")
    loaded = load_model(cfg, task="generation", device="cpu")
    layer = bnb.nn.Linear4bit if quantization == "4bit" else bnb.nn.Linear8bitLt
    assert loaded.model.is_quantized and isinstance(loaded.model.model.layers[0].self_attn.q_proj, layer)
    rt = ModelRuntime(loaded, dtype="bfloat16")
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    assert all(p.dtype == torch.float32 for p in rt.adapter_parameters().values())
    examples = texts["generation"][:16]
    base = rt.base_state()
    adapter = rt.adapter_state()
    metrics = rt.train(examples, TrainArgs(lr=5e-2, batch_size=8, seed=0, steps=3))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    after = rt.adapter_state()
    assert any("lora_B" in k and not torch.equal(after[k], adapter[k]) for k in after)
    assert all(torch.equal(v, rt.base_state()[k]) for k, v in base.items())
    source.install(ClientModel(lora=lora_spec(source, 4)), seed=0)
    reference = source.train(examples, TrainArgs(lr=0.0, batch_size=8, seed=0, steps=1))[
        "loss"
    ]  # float32, nothing moves
    first = ModelRuntime(load_model(cfg, task="generation", device="cpu"), dtype="bfloat16")
    first.install(ClientModel(lora=lora_spec(first, 4)), seed=0)
    assert first.train(examples, TrainArgs(lr=0.0, batch_size=8, seed=0, steps=1))["loss"] == pytest.approx(
        reference, rel=0.05
    )
    assert len(rt.predict(examples[:2])) == 2
    # The next client: the base is restored (its quantized weights stay the layers' own) and a fresh LoRA trains.
    rt.install(ClientModel())
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=1)
    assert torch.isfinite(torch.tensor(rt.train(examples, TrainArgs(lr=5e-2, batch_size=8, seed=1, steps=2))["loss"]))
    assert all(torch.equal(v, rt.base_state()[k]) for k, v in base.items())
    with pytest.raises(UserError, match="model.quantization keeps the base weights frozen, and this method replaces"):
        rt.load_base({name: torch.zeros_like(base[name]) for name in rt.weights.quantized_params})


def test_quantizing_a_registered_model_is_refused(monkeypatch, texts):
    monkeypatch.setattr(precision_module.importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = ModelConfig(name="tiny-llama", quantization="4bit")
    with pytest.raises(UserError, match="applies to hub or local checkpoints"):
        load_model(cfg, task="generation", corpus=corpus(texts), device="cuda")


def test_qlora_recipe():
    config = quantization_config(ModelConfig(name="org/model", quantization="4bit", dtype="bfloat16"))
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    assert quantization_config(ModelConfig(name="org/model", quantization="8bit")).load_in_8bit
    assert quantization_config(ModelConfig(name="org/model")) is None


# ---------------------------------------------------------------------------------------------- chat template


def test_chat_template_formats_prompts_and_responses(texts, monkeypatch):
    rt = runtime(texts, max_length=256)
    tok = rt.tokenizer
    monkeypatch.setattr(tok, "chat_template", CHAT_TEMPLATE, raising=False)
    rt.chat_template = True
    example = {"prompt": "the cat sees a bird", "response": "a red bird"}
    user = [{"role": "user", "content": example["prompt"]}]
    conversation = [*user, {"role": "assistant", "content": example["response"]}]
    prompt_text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    full_text = tok.apply_chat_template(conversation, tokenize=False)
    assert prompt_text.endswith("<|assistant|>") and full_text.endswith("<|end|>")
    prompt_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    full_ids = tok(full_text, add_special_tokens=False)["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids

    batch = rt.encode([example])
    assert batch["input_ids"][0].tolist() == full_ids
    assert batch["labels"][0].tolist() == [-100] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    assert rt.text.prompt(example["prompt"]).ids == prompt_ids  # what generation is prompted with
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    rt.train([example] * 4, TrainArgs(lr=1e-2, batch_size=2, seed=0, steps=1))
    assert len(rt.predict([example])) == 1


def test_chat_template_cuts_the_user_text_not_the_template(texts, monkeypatch):
    rt = runtime(texts, max_length=120)
    monkeypatch.setattr(rt.tokenizer, "chat_template", CHAT_TEMPLATE, raising=False)
    rt.chat_template = True
    ids = rt.text.prompt(" ".join(["cat"] * 100)).ids
    assert 40 < len(ids) <= 60
    assert rt.tokenizer.decode(ids).endswith("<|end|><|assistant|>")


def test_chat_template_needs_a_template_and_generation(texts):
    with pytest.raises(UserError, match="has a tokenizer without a chat template"):
        runtime(texts, chat_template=True)
    with pytest.raises(UserError, match="formats generation prompts"):
        runtime(texts, "classification", chat_template=True)


# ------------------------------------------------------------------------------------------------- presets

PAPER_SCALE_LLM_PRESETS = [
    "fedmosaic-drake",
    "fedmosaic-fedscope",
    "fedmosaic-hflb",
    "fedp2eft-fedaya",
    "flame-alpagasus",
    "flame-alpagasus-dense",
    "flame-dolly",
    "flame-dolly-dense",
    "guidance-sni",
    "potara-commonsense",
    "potara-flan",
]


@pytest.mark.parametrize("preset", PAPER_SCALE_LLM_PRESETS)
def test_paper_scale_llm_presets_use_bfloat16(preset):
    cfg = load_config(preset)
    models = list(cfg.models.values()) or [cfg.model]
    assert all(m.dtype == "bfloat16" for m in models)


def test_fedmosaic_aligns_and_trains_two_bfloat16_architectures(tmp_path):
    """Two architectures in bfloat16: FedMosaic's feature alignment and frozen gradients call the models outside
    train and predict (under autocast); the run trains, aggregates and personalizes."""
    from fedpeft.core.config import validate
    from fedpeft.core.costs import CostMeter
    from fedpeft.engine.local import LocalEngine
    from fedpeft.worker import Worker
    from tests.test_federation import HETERO, generation_data

    entry = {"name": "fedmosaic", "rounds": 1, "local_steps": 3, "rank": 2, "grad_every": 2, "align_lr": 0.01}
    models = {k: {**v, "dtype": "bfloat16"} for k, v in HETERO["models"].items()}
    worker = Worker(validate({**HETERO, "models": models, "methods": [entry]}), tmp_path, data=generation_data())
    runtimes = [worker.federation.runtime(name) for name in models]
    assert all(p.dtype == torch.bfloat16 for rt in runtimes for p in rt.base_params.values())
    method = worker.methods["fedmosaic"]
    state = method.init_server(worker.runtime, seed=0)
    assert state.alignment and all(torch.isfinite(torch.tensor(v)) for v in state.alignment.values())
    state = LocalEngine(worker).run_rounds(
        "fedmosaic", method, state, ["c0", "c1", "c2", "c3"], seed=0, meter=CostMeter()
    )
    assert state.round == 1
    records, _ = worker.personalize("fedmosaic", 0, "c1", state)
    assert {r["metric"] for r in records} == {"meteor", "rouge1", "rougeL"}
