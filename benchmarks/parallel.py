"""The local engine with one and with several worker processes (``engine.workers``) on the same config.

Runs ``fedpeft run PRESET`` once per worker count, one after the other, each into a fresh directory, and reports
the wall time of each, its ratio to one worker and whether the records are identical (results.jsonl compared
value by value, the ``train`` split's ``seconds`` left out). Run it on an otherwise idle machine: the ratio is the
point, and another process on the cores moves it.

``--flower N`` adds a row for the Flower simulation engine with N virtual SuperNodes (Ray; its ``workers`` column
counts them) on the same config, so
the table says which engine to pick on this machine.

Usage: python benchmarks/parallel.py [--preset quickstart] [--set seeds=[0] ...] [--workers 1 2] [--flower 2]
       [--out benchmarks/results/parallel.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def records(run_dir: Path) -> dict[str, float]:
    """The run's result records by their contract keys, timings left out."""
    keys = ("method", "budget", "pool", "client", "group", "seed", "round", "split", "metric")
    out = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("split") == "train" and row.get("metric") == "seconds":
            continue
        out[json.dumps([row.get(k) for k in keys])] = row["value"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quickstart")
    parser.add_argument("--set", dest="overrides", action="append", default=["seeds=[0]"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--flower", type=int, default=0, help="also the Flower simulation with this many SuperNodes")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/parallel.json"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fedpeft-parallel-"))
    rows, first = [], None
    try:
        runs = [(f"workers{w}", ["--set", f"engine.workers={w}"]) for w in args.workers]
        if args.flower:
            supernodes = f"engine.num_supernodes={args.flower}"
            runs.append((f"flower{args.flower}", ["--engine", "flower", "--set", supernodes]))
        for name, settings in runs:
            out = root / name
            command = [sys.executable, "-m", "fedpeft.cli", "run", args.preset, "--out", str(out), *settings]
            for item in args.overrides:
                command += ["--set", item]
            started = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            seconds = time.perf_counter() - started
            got = records(out)
            first = first or (seconds, got)
            rows.append(
                {
                    "engine": "flower simulation" if name.startswith("flower") else "local",
                    "workers": int(name.removeprefix("workers").removeprefix("flower")),
                    "wall_seconds": round(seconds, 1),
                    "ratio": round(seconds / first[0], 3),
                    "records": len(got),
                    "identical_to_first": got == first[1],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "preset": args.preset,
        "overrides": args.overrides,
        "cpu": platform.processor() or platform.machine(),
        "cores": len(os.sched_getaffinity(0)),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
