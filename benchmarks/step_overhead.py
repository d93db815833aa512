"""A LoRA training step of fedpeft's runtime against a bare PEFT + AdamW loop on the same model, adapter and batches.

Both sides load the same checkpoint (``--model``: ``minilm``, ``gemma3-270m``, or a local checkpoint directory),
put a rank-``--rank`` LoRA (alpha 2r, no dropout, fedpeft's default targets: every linear layer, the task head
trained too) on it and run ``--steps`` AdamW steps with gradient clipping at 1.0 on batches of ``--batch`` examples
that each fill ``--length`` tokens. fedpeft's side is ``ModelRuntime.train`` (its tokenization, batching,
autocast and loss scaling included); the bare side is ``get_peft_model`` and a plain loop over tensors tokenized
beforehand by the same encoder. Each side runs once to warm up, then ``--repeats`` times, alternating; reported:
the median seconds per step of each, their ratio (fedpeft / bare), tokens per second and, on a GPU, each side's
peak CUDA memory.

Usage: python benchmarks/step_overhead.py --model minilm [--task classification] [--device cpu] [--dtype float32]
       [--batch 16] [--length 24] [--steps 10] [--repeats 3] [--threads 1] [--out FILE.json] [--quick]

``--quick``: batch 4 of 16 tokens, 2 steps, 2 repeats: checks that it runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

WORDS = "the river runs past a red house where two small birds sing every morning while the baker opens".split()


def examples(task: str, count: int, length: int, seed: int = 0) -> list[dict]:
    """``count`` examples long enough to be cut at ``length`` tokens (every batch has the same shape)."""
    rng = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    if task == "classification":
        return [{"text": text(2 * length), "text_pair": None, "label": i % 2} for i in range(count)]
    return [{"prompt": text(length // 2), "response": text(2 * length)} for i in range(count)]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--task", default=None, help="classification or generation (default: the model's own)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="batch 4 of 16 tokens, 2 steps: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.steps, args.repeats = 4, 16, 2, 2
    torch.set_num_threads(args.threads)

    from peft import get_peft_model

    from fedpeft.core.config import ModelConfig
    from fedpeft.methods.base import lora_spec
    from fedpeft.models import load_model
    from fedpeft.models.runtime import ClientModel, ModelRuntime
    from fedpeft.training import TrainArgs

    task = args.task or ("generation" if "gemma" in args.model.lower() else "classification")
    cfg = ModelConfig(name=args.model, max_length=args.length, dtype=args.dtype, quantization=args.quantization)
    data = examples(task, args.batch * args.steps, args.length)

    loaded = load_model(cfg, task=task, num_labels=2, device=args.device)
    runtime = ModelRuntime(loaded, dtype=args.dtype, device=args.device, max_length=args.length)
    spec = lora_spec(runtime, args.rank)
    batches = [runtime.encode(data[i : i + args.batch]) for i in range(0, len(data), args.batch)]
    shapes = {tuple(b["input_ids"].shape) for b in batches}
    assert len(shapes) == 1, f"batches of unequal shapes: {shapes}"

    bare_loaded = load_model(cfg, task=task, num_labels=2, device=args.device)
    if not args.quantization:  # a quantized checkpoint loads onto the device; another one onto the CPU
        bare_loaded.model.to(args.device)
    bare = get_peft_model(bare_loaded.model, spec.to_peft(list(bare_loaded.head_modules)))
    bare_params = [p for p in bare.parameters() if p.requires_grad]
    for p in bare_params:  # the adapter in float32, as fedpeft keeps it under a half-precision base
        p.data = p.data.float()
    autocast_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(args.dtype)
    device_type = torch.device(args.device).type
    scaler = torch.amp.GradScaler(device_type) if args.dtype == "float16" else None

    def fedpeft_side() -> float:
        runtime.install(ClientModel(lora=spec), seed=0)
        synchronize(args.device)
        started = time.perf_counter()
        runtime.train(data, TrainArgs(lr=1e-4, batch_size=args.batch, seed=0, steps=args.steps))
        synchronize(args.device)
        return (time.perf_counter() - started) / args.steps

    def bare_side() -> float:
        optimizer = torch.optim.AdamW(bare_params, lr=1e-4)
        bare.train()
        synchronize(args.device)
        started = time.perf_counter()
        for batch in batches:
            batch = {k: v.to(args.device) for k, v in batch.items()}
            if autocast_dtype is not None:
                with torch.autocast(device_type, dtype=autocast_dtype):
                    loss = bare(**batch).loss
            else:
                loss = bare(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(bare_params, 1.0)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        synchronize(args.device)
        return (time.perf_counter() - started) / args.steps

    peaks: dict[str, float | None] = {}
    timings: dict[str, list[float]] = {"fedpeft": [], "bare": []}
    sides = {"fedpeft": fedpeft_side, "bare": bare_side}
    for name, side in sides.items():  # warm-up, then the peak memory of one timed pass of each side alone
        side()
        if device_type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        timings[name].append(side())
        peaks[name] = torch.cuda.max_memory_allocated() / 2**20 if device_type == "cuda" else None
    for _ in range(args.repeats - 1):
        for name, side in sides.items():
            timings[name].append(side())
    step = {name: statistics.median(values) for name, values in timings.items()}
    tokens = args.batch * next(iter(shapes))[1]
    result = {
        "model": args.model,
        "task": task,
        "device": torch.cuda.get_device_name(0) if device_type == "cuda" else "cpu",
        "dtype": args.dtype,
        "quantization": args.quantization,
        "batch": args.batch,
        "length": next(iter(shapes))[1],
        "rank": args.rank,
        "steps": args.steps,
        "threads": args.threads,
        "fedpeft_s_per_step": round(step["fedpeft"], 5),
        "bare_s_per_step": round(step["bare"], 5),
        "ratio": round(step["fedpeft"] / step["bare"], 3),
        "fedpeft_tokens_per_s": round(tokens / step["fedpeft"], 1),
        "bare_tokens_per_s": round(tokens / step["bare"], 1),
        "fedpeft_peak_cuda_mb": None if peaks["fedpeft"] is None else round(peaks["fedpeft"], 1),
        "bare_peak_cuda_mb": None if peaks["bare"] is None else round(peaks["bare"], 1),
        "timings": {name: [round(v, 5) for v in values] for name, values in timings.items()},
    }
    print(json.dumps(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as handle:
            handle.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
