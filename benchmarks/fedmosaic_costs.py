"""FedMosaic's costs: compute per round against SFT and bytes uploaded per round against FedIT.

1. Compute (FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` over whole client rounds): on the
   ``fedmosaic-text`` federation (five tiny architectures, base weights as loaded), every client of every method
   runs one round of the same number of local steps (compute matching off), and a method's compute per step is
   its FLOPs over SFT's (``sft_rounds``), summed over the ten clients. This is the measured counterpart of the
   paper's Table 15 (FedMosaic 1.098) and of the ``compute_scale`` defaults.
2. Communication: bytes one client uploads per round (adapter tensors plus tensor extras: FedMosaic's RELA
   vector), FedMosaic against FedIT at the same rank, (a) measured on that federation and (b) counted from the
   shapes of the paper's models (Llama-3.2-3B client, Llama-3.2-1B W_s, rank 128, float32), built on the meta
   device so nothing is downloaded or allocated. The paper reports 10.9 % less than FedAvg.

``--quick``: SFT, FedIT and FedMosaic only, one step, 20 alignment samples, on one client of each architecture:
checks that it runs.

Usage: python benchmarks/fedmosaic_costs.py [--steps 10] [--out benchmarks/results/fedmosaic_costs.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from fedpeft.adapters.pq_lora import plan_sites
from fedpeft.core.config import load_config
from fedpeft.core.seeds import client_seed
from fedpeft.core.types import upload_bytes
from fedpeft.methods.families.branched import PAPER_COMPUTE_SCALE
from fedpeft.worker import Worker

METHODS = ["sft_rounds", "fedit", "ditto", "fedsim", "feddat", "perada", "takfl", "fedmkt", "fedmosaic"]
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def measured(steps: int, methods: list[str] = METHODS, align_samples: int = 200, every_client: bool = True) -> dict:
    """FLOPs and seconds of one round of every method on every client (``every_client`` False: on the first client
    of each architecture), and bytes uploaded."""
    entries = []
    for name in methods:
        entry = {"name": name, "rounds": 1, "local_steps": steps, "rank": 8, "lr": 0.002, "compute_scale": 1.0}
        if name == "fedit":
            entry = {"name": name, "rounds": 1, "fraction": 1.0, "local_steps": steps, "batch_size": 4, "rank": 8}
        if name in ("perada", "takfl", "fedmkt"):
            entry.update(kd_samples=16, kd_steps=4)
        if name == "fedmosaic":
            entry.update(align_samples=align_samples)
            if methods == METHODS:
                entries.append({**entry, "label": "fedmosaic-m5", "grad_every": 5})  # the CPU presets' m
        entries.append(entry)
    overrides = ["seeds=[0]", "base.kind=pretrained", f"methods={json.dumps(entries)}"]
    cfg = load_config("fedmosaic-text", overrides)
    results: dict = {"steps": steps, "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        worker = Worker(cfg, Path(tmp))
        ids = [c.client_id for c in worker.data.clients]
        if not every_client:
            ids = [worker.federation.clients_of(name)[0] for name in worker.federation.names]
        results["clients"] = len(ids)
        for label, method in worker.methods.items():
            if label == "base-stage":
                continue
            state = method.init_server(worker.runtime, 0)
            flops = seconds = 0.0
            uploaded = []
            for client_id in ids:
                payload = method.payload(state, client_id)
                client = worker.client_in_round(client_id, 10, 20)  # mid-stream memory
                runtime = worker.runtime_for(client_id)
                seed = client_seed(0, method.name, "train", 0, client_id)
                counter = FlopCounterMode(display=False)
                started = time.perf_counter()
                with counter:
                    update, _ = method.client_update(runtime, client, payload, None, seed)
                seconds += time.perf_counter() - started
                flops += counter.get_total_flops()
                uploaded.append(upload_bytes(update))
            results["methods"][label] = {
                "flops": flops,
                "seconds": seconds,
                "bytes_up_per_client": sum(uploaded) / len(uploaded),
            }
            print(f"{label:12s} {flops / 1e9:8.2f} GFLOP {seconds:7.1f} s", flush=True)
    sft = results["methods"]["sft_rounds"]
    for name, row in results["methods"].items():
        row["compute_vs_sft"] = row["flops"] / sft["flops"]
        row["seconds_vs_sft"] = row["seconds"] / sft["seconds"]
        row["paper_compute_vs_sft"] = PAPER_COMPUTE_SCALE.get(name.replace("sft_rounds", "sft").removesuffix("-m5"))
    fedit = results["methods"]["fedit"]["bytes_up_per_client"]
    results["upload_fedmosaic_vs_fedit"] = results["methods"]["fedmosaic"]["bytes_up_per_client"] / fedit
    return results


def _meta_llama(hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int) -> torch.nn.Module:
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=128256,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def paper_scale(rank: int = 128, keep: float = 0.4, blocks: int = 4) -> dict:
    """Upload bytes per round of FedIT and FedMosaic for a Llama-3.2-3B client with a Llama-3.2-1B W_s."""
    client = _meta_llama(3072, 28, 8192, 24, 8)
    small = _meta_llama(2048, 16, 8192, 32, 8)
    modules = [
        (n, m)
        for n, m in client.named_modules()
        if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in LLAMA_TARGETS
    ]
    sites = plan_sites(modules, LLAMA_TARGETS, "3b", num_blocks=blocks)
    fedit = sum(rank * (s.d_in + s.d_out) for s in sites)
    pq_lora = sum(rank * rank + rank if s.kind == "pq" else rank * (s.d_in + s.d_out) for s in sites)
    down = dict(small.named_modules())["model.layers.15.mlp.down_proj"].weight
    relevance = round(keep * down.numel())
    return {
        "rank": rank,
        "fedit_bytes": 4 * fedit,
        "fedmosaic_adapter_bytes": 4 * pq_lora,
        "relevance_bytes": 4 * relevance,
        "pq_saving": 1 - pq_lora / fedit,
        "relevance_overhead": relevance / fedit,
        "fedmosaic_vs_fedit": (pq_lora + relevance) / fedit,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fedmosaic_costs.json"))
    parser.add_argument("--quick", action="store_true", help="SFT, FedIT and FedMosaic, one step, one client per model")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.quick:
        cpu_scale = measured(1, ["sft_rounds", "fedit", "fedmosaic"], 20, every_client=False)
    else:
        cpu_scale = measured(args.steps)
    results = {"paper_scale": paper_scale(), "cpu_scale": cpu_scale}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["paper_scale"], indent=1))
    for name, row in results["cpu_scale"]["methods"].items():
        print(f"{name:12s} compute/SFT {row['compute_vs_sft']:.3f} (paper {row['paper_compute_vs_sft']}), "
              f"seconds/SFT {row['seconds_vs_sft']:.2f}, up {row['bytes_up_per_client']:.0f} B")  # fmt: skip
    print("upload FedMosaic / FedIT:", round(results["cpu_scale"]["upload_fedmosaic_vs_fedit"], 4))
    return results


if __name__ == "__main__":
    main()
