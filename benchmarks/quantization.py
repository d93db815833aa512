"""Gemma 3 270M (the packaged weights) with a LoRA on the CPU in float32, bfloat16, 8-bit and 4-bit (QLoRA).

Each setting runs in its own process (so the peak RSS figures are independent): the de-quantized checkpoint of the
packaged GGUF file is loaded as a local checkpoint with ``model.dtype`` and ``model.quantization``, a rank-8 LoRA
on the attention projections trains for ``--steps`` AdamW steps (batch 4, responses of synthetic instructions,
``max_length`` 128) and predicts nothing. Reported: the model's weight bytes (``get_memory_footprint``), the peak
RSS of the process, the mean seconds per training step after the first, and the training loss of the first step
(the same examples in every setting, so it shows what the precision does to the model's outputs).

Usage: python benchmarks/quantization.py [--steps 6] [--out benchmarks/results/quantization.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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

import random
dtype, quantization, steps = sys.argv[1], (sys.argv[2] if sys.argv[2] != "none" else None), int(sys.argv[3])
torch.set_num_threads(2)
rng = random.Random(0)
words = "the river runs past a red house where two small birds sing every morning while the baker opens".split()
EXAMPLES = [
    {"prompt": "Write one sentence about: " + " ".join(rng.sample(words, 4)),
     "response": " ".join(rng.choice(words) for _ in range(24))}
    for _ in range(4 * steps)
]
checkpoint = cached_gguf_checkpoint(packaged_gemma3_source())
cfg = ModelConfig(name=str(checkpoint), dtype=dtype, quantization=quantization, max_length=128)
loaded = load_model(cfg, task="generation", device="cpu")
weights = loaded.model.get_memory_footprint()
runtime = ModelRuntime(loaded, max_length=128, dtype=dtype)
runtime.install(ClientModel(lora=lora_spec(runtime, 8)), seed=0)
examples = EXAMPLES[: 4 * steps]
times, losses = [], []
for step in range(steps):
    started = time.perf_counter()
    metrics = runtime.train(examples[4 * step : 4 * step + 4], lr=1e-4, batch_size=4, seed=step, steps=1)
    times.append(time.perf_counter() - started)
    losses.append(metrics["loss"])
print(json.dumps({
    "dtype": dtype, "quantization": quantization, "weights_mb": weights / 2**20, "peak_rss_mb": peak_rss_mb(),
    "seconds_per_step": sum(times[1:]) / max(len(times) - 1, 1), "first_loss": losses[0],
}))
"""


def run(dtype: str, quantization: str | None, steps: int) -> dict:
    """One setting in a fresh interpreter; its JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, dtype, quantization or "none", str(steps)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, e.g. float32,float32+4bit")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/quantization.json"))
    args = parser.parse_args()
    print("| dtype | quantization | weights MB | peak RSS MB | s / step | first-step loss |")
    print("|---|---|---|---|---|---|", flush=True)
    rows = []
    for setting in args.settings.split(","):
        dtype, _, quantization = setting.partition("+")
        row = run(dtype, quantization or None, args.steps)
        rows.append(row)
        print(
            f"| {row['dtype']} | {row['quantization'] or '-'} | {row['weights_mb']:.0f} | {row['peak_rss_mb']:.0f} "
            f"| {row['seconds_per_step']:.2f} | {row['first_loss']:.4f} |",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
