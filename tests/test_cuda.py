"""The GPU paths, run where a CUDA device is visible (benchmarks/gpu.sh runs them with ``-m cuda``; on a machine
without one, tests/conftest.py deselects them, so they are never counted as passed there): training on the GPU in
float32, bfloat16 and float16 (loss scaling), bitsandbytes 4-bit and 8-bit, ``device: auto``, the peak CUDA memory
in costs.jsonl, and worker processes pinned to a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedpeft.core.config import ModelConfig, load_config
from fedpeft.core.registry import METHODS as METHODS_REGISTRY
from fedpeft.methods.base import lora_spec
from fedpeft.models import load_model
from fedpeft.models.precision import check_quantization
from fedpeft.models.runtime import ClientModel, ModelRuntime, check_device, resolve_device
from fedpeft.runner import Experiment
from fedpeft.training import TrainArgs
from tests.entry_point import cli
from tests.test_llm_scale import runtime, texts, train_adapter  # noqa: F401  (texts: a fixture)
from tests.test_run_dirs import TINY

pytestmark = pytest.mark.cuda
ALL_METHODS = METHODS_REGISTRY.names()


def records(out: Path) -> list[dict]:
    """The run's records, the ``train`` split's timings left out (wall-clock seconds)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return [r for r in rows if not (r["split"] == "train" and r["metric"] == "seconds")]


def test_auto_is_the_gpu_and_a_gpu_beyond_the_visible_ones_is_refused():
    assert resolve_device("auto") == "cuda"
    check_device("cuda")
    from fedpeft.core.errors import UserError

    with pytest.raises(UserError, match="names GPU 99"):
        check_device("cuda:99")


@pytest.mark.parametrize("task", ["generation", "classification"])
def test_float32_on_the_gpu_trains_the_adapter_the_cpu_trains(texts, task):  # noqa: F811
    examples = texts[task]
    expected, expected_loss = train_adapter(runtime(texts, task), examples, batch_size=8, steps=3)
    gpu = runtime(texts, task, device="cuda")
    assert next(iter(gpu.base_params.values())).device.type == "cuda"
    got, loss = train_adapter(gpu, examples, batch_size=8, steps=3)
    for key in expected:
        torch.testing.assert_close(got[key].cpu(), expected[key].cpu(), rtol=1e-3, atol=1e-3, msg=key)
    assert loss == pytest.approx(expected_loss, rel=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_the_gpu_trains_a_float32_adapter_near_float32(texts, dtype):  # noqa: F811
    examples = texts["generation"]
    reference = runtime(texts, device="cuda")
    reference.install(ClientModel(lora=lora_spec(reference, 4)), seed=0)
    first_loss = reference.train(examples, TrainArgs(lr=0.0, batch_size=8, seed=0, steps=1))["loss"]
    rt = runtime(texts, dtype=dtype, device="cuda")
    assert all(p.dtype == getattr(torch, dtype) for p in rt.base_params.values())
    assert (rt.trainer.scaler is not None) == (dtype == "float16")
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in rt.adapter_parameters().values())
    assert rt.train(examples, TrainArgs(lr=0.0, batch_size=8, seed=0, steps=1))["loss"] == pytest.approx(
        first_loss, rel=0.02
    )
    before = rt.adapter_state()
    metrics = rt.train(examples, TrainArgs(lr=5e-2, batch_size=8, seed=0, steps=3))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    after = rt.adapter_state()
    assert any("lora_B" in k and not torch.equal(after[k], before[k]) for k in after)
    assert len(rt.predict(examples[:2])) == 2


def test_float16_loss_scaling_on_the_gpu_skips_an_overflowing_step():
    from types import SimpleNamespace

    from fedpeft.training import train_loop

    class Regression(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
            return SimpleNamespace(loss=((self.linear(x).squeeze(-1).float() - labels) ** 2).mean())

    torch.manual_seed(0)
    model = Regression().cuda()
    params = dict(model.named_parameters())
    ok = {"x": torch.randn(8, 4, device="cuda"), "labels": torch.randn(8, device="cuda")}
    overflow = {"x": torch.full((8, 4), 1e5, device="cuda"), "labels": torch.zeros(8, device="cuda")}
    weights: list[dict] = []
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**12)
    train_loop(
        model,
        iter([ok, overflow, ok]),
        params,
        TrainArgs(
            lr=0.1,
            batch_size=8,
            seed=0,
            max_grad_norm=None,
            after_step=lambda step: weights.append({k: p.detach().clone() for k, p in params.items()}),
        ),
        steps=3,
        autocast=lambda: torch.autocast("cuda", dtype=torch.float16),
        scaler=scaler,
    )
    for key in params:
        assert torch.equal(weights[1][key], weights[0][key])  # the overflowing step was skipped
        assert not torch.equal(weights[2][key], weights[1][key])
    assert scaler.get_scale() == 2.0**11


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_quantized_checkpoint_trains_a_lora_on_the_gpu(quantization, texts, tmp_path):  # noqa: F811
    import bitsandbytes as bnb

    source = runtime(texts)
    source.loaded.model.save_pretrained(tmp_path / "ckpt")
    source.tokenizer.save_pretrained(tmp_path / "ckpt")
    cfg = ModelConfig(name=str(tmp_path / "ckpt"), quantization=quantization, dtype="bfloat16")
    check_quantization(cfg, "cuda")
    loaded = load_model(cfg, task="generation", device="cuda")
    layer = bnb.nn.Linear4bit if quantization == "4bit" else bnb.nn.Linear8bitLt
    assert loaded.model.is_quantized and isinstance(loaded.model.model.layers[0].self_attn.q_proj, layer)
    rt = ModelRuntime(loaded, dtype="bfloat16", device="cuda")
    rt.install(ClientModel(lora=lora_spec(rt, 4)), seed=0)
    examples = texts["generation"][:16]
    base = {k: v.clone() for k, v in rt.base_state().items()}
    adapter = rt.adapter_state()
    metrics = rt.train(examples, TrainArgs(lr=5e-2, batch_size=8, seed=0, steps=3))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    after = rt.adapter_state()
    assert any("lora_B" in k and not torch.equal(after[k], adapter[k]) for k in after)
    assert all(torch.equal(v, rt.base_state()[k]) for k, v in base.items())
    assert torch.cuda.max_memory_allocated() > 0 and len(rt.predict(examples[:2])) == 2


def test_a_run_on_the_gpu_writes_its_peak_cuda_memory(tmp_path):
    out = tmp_path / "gpu"
    Experiment(load_config("smoke", [*TINY, "device=auto"]), out).run()
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    peaks = [row["value"] for row in costs if row["metric"] == "peak_cuda_mb"]
    assert peaks and max(peaks) > 0
    assert json.loads((out / "env.json").read_text())["accelerator"] == torch.cuda.get_device_name(0)


def test_two_worker_processes_share_one_gpu_and_give_the_records_of_one(tmp_path):
    one = tmp_path / "one"
    Experiment(load_config("smoke", [*TINY, "device=cuda"]), one).run()
    two = tmp_path / "two"
    Experiment(load_config("smoke", [*TINY, "device=cuda", "engine.workers=2", "engine.workers_per_gpu=2"]), two).run()
    expected, got = records(one), records(two)
    assert [{k: v for k, v in r.items() if k != "value"} for r in got] == [
        {k: v for k, v in r.items() if k != "value"} for r in expected
    ]
    for a, b in zip(got, expected, strict=True):
        assert a["value"] == pytest.approx(b["value"], rel=1e-4, abs=1e-4), (a, b)


def test_more_worker_processes_than_the_gpus_take_are_refused(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    gpus = torch.cuda.device_count()
    code, _, err = cli(
        monkeypatch, capsys, "run", "smoke", "--out", str(out), "--set", "device=cuda",
        "--set", f"engine.workers={gpus + 1}",
    )  # fmt: skip
    assert code == 2 and not out.exists()
    assert f"more worker processes than the {gpus} visible GPU(s) take" in err.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ALL_METHODS)
def test_every_method_runs_on_the_gpu(name, request, tmp_path):
    """Every registered method's rounds, personalization, evaluation and cost rows with the model on the GPU: what
    a method builds for itself (statistics, scales, masks, server-side models) must meet the model's device."""
    from tests.test_methods import run_through

    runtime = run_through(name, request, tmp_path, device="cuda")
    assert all(p.device.type == "cuda" for p in runtime.base_params.values())
