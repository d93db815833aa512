"""Server merge cost: KnOTS merging of 10 clients' LoRAs against one client's local epoch.

Part 1 (tiny model): 10 clients of the Fed-Aya-style instruction benchmark train a rank-8 LoRA on every linear
layer of tiny-llama (2 layers x 7 modules) for one local epoch each (``guided`` with hard initialization, one
round); the server then merges the 10 uploads in KnOTS space with mean, TIES and Iso-C (shared SVD basis, merge,
truncated SVD back to rank 8), each repeated and the median taken. Target: one KnOTS merge of the 10 clients costs
less than one client's local epoch.

Part 2 (paper shapes): the same merges on random rank-8 factors with LLaMA-3.2-1B's q_proj (2048 x 2048) and
v_proj (512 x 2048) shapes, 16 layers, 10 clients: the server's cost at paper scale (no model is loaded).

Everything runs on one torch thread (on a shared 2-core machine more threads only add contention).

``--quick``: 3 clients of 16 samples, one repeat, 2 layers of the paper shapes: checks that it runs.

Usage: python benchmarks/merge_cost.py [--repeats 5] [--out benchmarks/results/merge_cost.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedpeft.core.config import load_config
from fedpeft.merging import MergeConfig, merge_lora_states
from fedpeft.worker import Worker

CLIENTS = 10
OVERRIDES = [
    "name=merge-cost",
    "seeds=[0]",
    "data.name=synthetic-fedaya",
    "data.groups=null",
    "model.name=tiny-llama",
    "model.max_length=64",
    "base.kind=pretrained",
    "budgets=[8]",
    "methods=[{name: guided, rounds: 1, fraction: 1.0, local_epochs: 1, batch_size: 16, lr: 0.001, rank: 8}]",
]
OPERATORS = ("mean", "ties", "iso_c")


def median_seconds(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def tiny_model(repeats: int, clients: int = CLIENTS, samples: int = 125) -> dict:
    options = f"data.options={{num_clients: {clients}, unseen_clients: 0, samples_per_client: {samples}}}"
    cfg = load_config("smoke", [*OVERRIDES, options])
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker(cfg, Path(tmp))
        method = worker.methods["guided"]
        state = method.init_server(worker.runtime, seed=0)
        updates, epoch_seconds, samples = [], [], []
        for client in worker.data.clients:
            payload = method.payload(state, client.client_id)
            started = time.perf_counter()
            updates.append(worker.train("guided", 0, 0, client.client_id, payload).update)
            epoch_seconds.append(time.perf_counter() - started)
            samples.append(len(client.train))
    states, sizes = [u.tensors for u in updates], [u.weight for u in updates]
    merges = {
        op: median_seconds(
            lambda op=op: merge_lora_states(states, sizes, MergeConfig(operator=op, space="knots"), scaling=2.0),
            repeats,
        )
        for op in OPERATORS
    }
    epoch = statistics.median(epoch_seconds)
    lora_modules = sum(1 for k in states[0] if ".lora_A." in k)
    return {
        "model": "tiny-llama (hidden 64, 2 layers)",
        "clients": clients,
        "lora_modules": lora_modules,
        "rank": 8,
        "train_samples_per_client_median": statistics.median(samples),
        "local_epoch_s_median": epoch,
        "local_epoch_s_min": min(epoch_seconds),
        "knots_merge_s": merges,
        "merge_over_epoch": {op: s / epoch for op, s in merges.items()},
        "threads": 1,
    }


def paper_shapes(repeats: int, layers: int = 16) -> dict:
    generator = torch.Generator().manual_seed(0)
    shapes = {"q_proj": (2048, 2048), "v_proj": (512, 2048)}
    states = []
    for _ in range(CLIENTS):
        state = {}
        for layer in range(layers):
            for name, (d_out, d_in) in shapes.items():
                prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
                state[f"{prefix}.lora_A.weight"] = torch.randn(8, d_in, generator=generator) / d_in**0.5
                state[f"{prefix}.lora_B.weight"] = torch.randn(d_out, 8, generator=generator) * 1e-2
        states.append(state)
    sizes = [500.0] * CLIENTS
    threads = torch.get_num_threads()
    merges = {
        op: median_seconds(
            lambda op=op: merge_lora_states(states, sizes, MergeConfig(operator=op, space="knots"), scaling=2.0),
            repeats,
        )
        for op in OPERATORS
    }
    return {"model": f"LLaMA-3.2-1B shapes (q_proj, v_proj; {layers} layers)", "clients": CLIENTS, "rank": 8,
            "lora_modules": 2 * layers, "knots_merge_s": merges, "threads": threads}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/merge_cost.json"))
    parser.add_argument("--quick", action="store_true", help="3 clients, one repeat, 2 layers: checks that it runs")
    args = parser.parse_args(argv)
    results = {"tiny": tiny_model(1, clients=3, samples=16) if args.quick else tiny_model(args.repeats)}
    print(json.dumps(results["tiny"], indent=1))
    results["paper_shapes"] = paper_shapes(1, layers=2) if args.quick else paper_shapes(max(1, args.repeats // 2))
    print(json.dumps(results["paper_shapes"], indent=1))
    results["torch"] = torch.__version__
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
