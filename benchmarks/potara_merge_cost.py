"""Potara's merge cost as a share of the run's training time, on the CPU language preset's settings.

Runs Potara exactly as ``potara-tasks-cpu`` configures it (8 synthetic-tasks clients, tiny Llama, LoRA r 8 on
every linear layer, T_F = 10 FedIT rounds and T_L = 20 local rounds of E = 5 steps of batch 8, a merge from 30
samples), one seed, on the model as loaded (the base stage changes weights, not shapes, so it is skipped), and
reports

    merge share = summed merge seconds of all clients / summed training seconds of all clients

where training is every client's work in the FedIT rounds plus its local phase, and the merge is phase 3 (the
per-sample gradients at both models, the closed-form weight and the merged tensors). Also reported: the same
for Fisher merging, and the merge's seconds per client. Each method runs ``--repeats`` times (the machine is
shared, timings vary by some 20 %); the median share is the result. Target: <= 5 %.

``--quick``: 2 clients, one FedIT round and one local round of one step, once: checks that it runs.

Usage: python benchmarks/potara_merge_cost.py [--repeats 3] [--out benchmarks/results/potara_merge_cost.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedpeft.core.config import load_config
from fedpeft.core.costs import CostMeter
from fedpeft.engine.local import LocalEngine
from fedpeft.worker import Worker

PRESET = "potara-tasks-cpu"
METHODS = {"potara": 6, "fisher_merge": 5}  # index of the entry in the preset's methods
QUICK = ["data.options={num_clients: 2}"]
QUICK_ROUNDS = {"rounds": 1, "local_rounds": 1, "local_steps": 1}


def measure(label: str, index: int, run_dir: Path, quick: bool = False) -> dict:
    cfg = load_config(PRESET, ["seeds=[0]", "base.kind=pretrained", "output.plots=false", *(QUICK if quick else [])])
    entry = cfg.methods[index]
    cfg.methods = [entry.model_copy(update=QUICK_ROUNDS) if quick else entry]
    worker = Worker(cfg, run_dir)
    method = worker.methods[label]
    worker.bases.use_base(0)
    seen = [c.client_id for c in worker.data.pool("seen")]
    meter = CostMeter()
    state = LocalEngine(worker).run_rounds(
        label, method, method.init_server(worker.runtime, 0), seen, seed=0, meter=meter
    )
    train_s, merge_s = [], []
    for client_id in seen:
        model = method.personalize(worker.runtime, worker.clients[client_id], state, None, None, seed=1)
        train_s.append(model.info["train_s"])
        merge_s.append(model.info["merge_s"])
    training = meter.client_seconds + sum(train_s)
    return {
        "clients": len(seen),
        "federated_client_seconds": round(meter.client_seconds, 3),
        "local_phase_seconds": round(sum(train_s), 3),
        "merge_seconds": round(sum(merge_s), 3),
        "merge_seconds_per_client": round(sum(merge_s) / len(seen), 4),
        "merge_share": round(sum(merge_s) / training, 4),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/potara_merge_cost.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 clients, one round of each phase: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, index in METHODS.items():
            runs = []
            for repeat in range(args.repeats):
                started = time.perf_counter()
                run = measure(label, index, Path(tmp) / f"{label}-{repeat}", args.quick)
                run["wall_seconds"] = round(time.perf_counter() - started, 1)
                print(label, run)
                runs.append(run)
            shares = [run["merge_share"] for run in runs]
            results[label] = {"median_merge_share": statistics.median(shares), "runs": runs}
    report = {"preset": PRESET, "torch": torch.__version__, "machine": platform.machine(), "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
