"""Multi-client batched training: the wall time of FedIT's federated rounds with ``engine.batch_clients`` K.

Runs ``fedpeft run smoke`` once per K with the same data (16 clients of synthetic-xnli, every client every round),
model (``--model``: a registered name or a checkpoint directory) and method (FedIT, 2 rounds of 5 local steps,
batch 8), on ``--device``; reports for each K the federated phase's wall seconds (costs.jsonl), its ratio to K = 1
and the largest difference of any record from K = 1's (batched training equals one-by-one training within
float rounding).

Usage: python benchmarks/batch_clients.py [--model tiny-bert] [--device cpu] [--clients 1 4 16] [--out FILE.jsonl]
       [--quick]   (K = 1 and 2 on 4 clients, 1 round of 2 steps: checks that it runs)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OVERRIDES = [
    "data.groups=[lat1, lat3, cyr1, lat4]",
    "data.clients_per_group=4",
    "data.train_per_group=320",
    "data.test_per_group=80",
    "base.kind=pretrained",
    "budgets=[8]",
    "methods=[{name: fedit, rounds: 2, fraction: 1.0, local_steps: 5, lr: 0.0005, batch_size: 8}]",
    "output.plots=false",
    "engine.workers=1",  # every K in one process (batched training runs in the run's own)
    # Every client draws its own dropout masks: batched training needs a model without dropout (BERT's keys).
    "model.overrides={hidden_dropout_prob: 0, attention_probs_dropout_prob: 0}",
]
QUICK = [
    "data.groups=[lat1]",
    "data.train_per_group=32",
    "data.test_per_group=8",
    "data.unseen_pool=false",
    "methods=[{name: fedit, rounds: 1, fraction: 1.0, local_steps: 2, lr: 0.0005, batch_size: 4}]",
]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-bert")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", nargs="+", type=int, default=None, help="the Ks (default 1 4 16; --quick 1 2)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="K = 1 and 2 on 4 clients, 1 round of 2 steps")
    args = parser.parse_args(argv)
    overrides = [*OVERRIDES, *QUICK] if args.quick else OVERRIDES
    ks = args.clients or ([1, 2] if args.quick else [1, 4, 16])
    root = Path(tempfile.mkdtemp(prefix="fedpeft-batch-clients-"))
    first: tuple[float, dict[tuple, float]] | None = None
    rows = []
    try:
        for k in ks:
            out = root / f"k{k}"
            command = [sys.executable, "-m", "fedpeft.cli", "run", "smoke", "--out", str(out)]
            for item in [*overrides, f"model.name={args.model}", f"device={args.device}", f"engine.batch_clients={k}"]:
                command += ["--set", item]
            started = time.perf_counter()
            done = subprocess.run(command, stdout=subprocess.DEVNULL)
            seconds = time.perf_counter() - started
            row: dict = {"model": args.model, "device": args.device, "batch_clients": k, "exit": done.returncode}
            if done.returncode == 0:
                costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
                federated = next(
                    c["value"] for c in costs if c["phase"] == "federated" and c["metric"] == "wall_s"
                )  # fmt: skip
                records = {
                    (r["method"], r["client"], r["split"], r["metric"], r["round"], r["budget"]): r["value"]
                    for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
                    if not (r["split"] == "train" and r["metric"] == "seconds")
                }
                first = first or (federated, records)
                row.update(
                    run_seconds=round(seconds, 1),
                    federated_seconds=round(federated, 2),
                    ratio=round(federated / first[0], 3),
                    max_record_difference=max(abs(v - first[1].get(key, float("nan"))) for key, v in records.items()),
                )
            print(json.dumps(row), flush=True)
            rows.append(row)
            if args.out is not None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                with args.out.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    main()
