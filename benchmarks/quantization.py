"""Gemma 3 270M (the packaged weights) with a LoRA on the CPU in float32, bfloat16, 8-bit and 4-bit (QLoRA).

Each setting runs in its own process (so the peak RSS figures are independent): the de-quantized checkpoint of the
packaged GGUF file is loaded as a local checkpoint with ``model.dtype`` and ``model.quantization``, a rank-8 LoRA
on the attention projections trains for ``--steps`` AdamW steps (batch 4, responses of synthetic instructions,
``max_length`` 128) and predicts nothing. Reported: the model's weight bytes (``get_memory_footprint``), the peak
RSS of the process, the mean seconds per training step after the first, and the training loss of the first step
(the same examples in every setting, so it shows what the precision does to the model's outputs).

``--quick``: a checkpoint of the tiny Llama (random weights, its tokenizer trained on the examples) instead, in
float32 and float32 + 4-bit, 2 steps: checks that it runs.

Usage: python benchmarks/quantization.py [--steps 6] [--out benchmarks/results/quantization.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SETTINGS = ["float32", "float32+8bit", "float32+4bit", "bfloat16", "bfloat16+4bit"]
"""``dtype`` or ``dtype+quantization``; the quantized layers compute in ``dtype``."""

CHILD = r"""
import json, sys, time
import torch
from fedpeft.core.config import ModelConfig
from fedpeft.core.costs import peak_rss_mb
from fedpeft.methods.base import lora_spec
from fedpeft.models import load_model
from fedpeft.models.gguf import cached_gguf_checkpoint
from fedpeft.models.packaged import packaged_gemma3_source
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.training import TrainArgs

import random
dtype, quantization, steps = sys.argv[1], (sys.argv[2] if sys.argv[2] != "none" else None), int(sys.argv[3])
checkpoint = sys.argv[4] if len(sys.argv) > 4 else None  # another checkpoint than the packaged Gemma
torch.set_num_threads(2)
rng = random.Random(0)
words = "the river runs past a red house where two small birds sing every morning while the baker opens".split()
EXAMPLES = [
    {"prompt": "Write one sentence about: " + " ".join(rng.sample(words, 4)),
     "response": " ".join(rng.choice(words) for _ in range(24))}
    for _ in range(4 * steps)
]
checkpoint = checkpoint or cached_gguf_checkpoint(packaged_gemma3_source())
cfg = ModelConfig(name=str(checkpoint), dtype=dtype, quantization=quantization, max_length=128)
loaded = load_model(cfg, task="generation", device="cpu")
weights = loaded.model.get_memory_footprint()
runtime = ModelRuntime(loaded, max_length=128, dtype=dtype)
runtime.install(ClientModel(lora=lora_spec(runtime, 8)), seed=0)
examples = EXAMPLES[: 4 * steps]
times, losses = [], []
for step in range(steps):
    started = time.perf_counter()
    metrics = runtime.train(examples[4 * step : 4 * step + 4], TrainArgs(lr=1e-4, batch_size=4, seed=step, steps=1))
    times.append(time.perf_counter() - started)
    losses.append(metrics["loss"])
print(json.dumps({
    "dtype": dtype, "quantization": quantization, "weights_mb": weights / 2**20, "peak_rss_mb": peak_rss_mb(),
    "seconds_per_step": sum(times[1:]) / max(len(times) - 1, 1), "first_loss": losses[0],
}))
"""


def run(dtype: str, quantization: str | None, steps: int, checkpoint: Path | None = None) -> dict:
    """One setting in a fresh interpreter (``checkpoint``: another than the packaged Gemma's); its JSON line."""
    extra = [str(checkpoint)] if checkpoint is not None else []
    done = subprocess.run(
        [sys.executable, "-c", CHILD, dtype, quantization or "none", str(steps), *extra],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, e.g. float32,float32+4bit")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/quantization.json"))
    parser.add_argument("--quick", action="store_true", help="the tiny Llama, float32 and 4-bit, 2 steps")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quantization-") as tmp:
        checkpoint = None
        if args.quick:
            args.steps, args.settings, checkpoint = 2, "float32,float32+4bit", tiny_checkpoint(Path(tmp))
        return table(args.settings.split(","), args.steps, checkpoint, args.out)


def tiny_checkpoint(directory: Path) -> Path:
    """A checkpoint of the tiny Llama (random weights, a tokenizer trained on the words of the examples)."""
    from fedpeft.core.config import ModelConfig
    from fedpeft.models import load_model

    words = "the river runs past a red house where two small birds sing every morning while the baker opens"
    loaded = load_model(ModelConfig(name="tiny-llama"), task="generation", device="cpu", corpus=lambda: [words] * 20)
    loaded.model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)
    return directory


def table(settings: list[str], steps: int, checkpoint: Path | None, out: Path) -> list[dict]:
    """Each setting's row, printed as a table and written to ``out``."""
    print("| dtype | quantization | weights MB | peak RSS MB | s / step | first-step loss |")
    print("|---|---|---|---|---|---|", flush=True)
    rows = []
    for setting in settings:
        dtype, _, quantization = setting.partition("+")
        row = run(dtype, quantization or None, steps, checkpoint)
        rows.append(row)
        print(
            f"| {row['dtype']} | {row['quantization'] or '-'} | {row['weights_mb']:.0f} | {row['peak_rss_mb']:.0f} "
            f"| {row['seconds_per_step']:.2f} | {row['first_loss']:.4f} |",
            flush=True,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
