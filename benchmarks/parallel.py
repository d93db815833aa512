"""The local engine with its default settings (``engine.workers: auto``), with one process and with a number of
worker processes (``engine.workers``), on the same config.

Runs ``fedpeft run PRESET`` once per setting, one after the other, each into a fresh directory, and reports the
wall time of each, its ratio to the first, what it ran on (the run's first line) and whether the records are
identical (results.jsonl compared value by value, the ``train`` split's ``seconds`` left out). Run it on an
otherwise idle machine: the ratio is the point, and another process on the cores moves it; each row keeps the
machine's load average when it started, and ``--repeat N`` runs the settings N times, in turn.

A setting is a number of worker processes, or ``default``: the config as it is, without ``FEDPEFT_WORKERS``. ``--flower
N`` adds a row for the Flower simulation engine with N virtual SuperNodes (Ray; its ``workers`` column counts them)
on the same config, so the table says which engine to pick on this machine.

Usage: python benchmarks/parallel.py [--preset quickstart] [--set seeds=[0] ...] [--workers 1 default 2]
       [--flower 2] [--repeat 1] [--out benchmarks/results/parallel.json]
       python benchmarks/parallel.py --quick   (the smoke preset cut to 4 clients: checks that it runs)
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

QUICK = [
    "data.groups=[lat1]",
    "data.train_per_group=40",
    "data.test_per_group=20",
    "data.base_samples=200",
    "budgets=[2]",
    "methods=[{name: fedit, rounds: 2, fraction: 1.0, local_steps: 2, lr: 0.005}, {name: lora, lr: 0.005, epochs: 1}]",
    "output.plots=false",
]


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


def ran_on(stderr: str) -> str:
    """What the run said it runs on: its line that starts with ``Running`` (none on the Flower engine)."""
    return next((line for line in stderr.splitlines() if line.startswith("Running ")), "")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quickstart")
    parser.add_argument("--set", dest="overrides", action="append", default=["seeds=[0]"])
    parser.add_argument("--workers", nargs="+", default=["1", "2"], help="numbers of processes, or default")
    parser.add_argument("--flower", type=int, default=0, help="also the Flower simulation with this many SuperNodes")
    parser.add_argument("--repeat", type=int, default=1, help="run every setting this many times, in turn")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/parallel.json"))
    parser.add_argument("--quick", action="store_true", help="the smoke preset on 4 clients: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.overrides, args.workers = "smoke", [*args.overrides, *QUICK], ["1", "default"]
    for setting in args.workers:
        if setting != "default" and not setting.isdigit():
            parser.error(f"--workers takes numbers of processes or `default`, not {setting!r}")
    env = {name: value for name, value in os.environ.items() if name != "FEDPEFT_WORKERS"}
    root = Path(tempfile.mkdtemp(prefix="fedpeft-parallel-"))
    rows: list[dict] = []
    firsts: dict[int, tuple[float, dict[str, float]]] = {}
    try:
        runs = [(f"workers{w}", [] if w == "default" else ["--set", f"engine.workers={w}"]) for w in args.workers]
        if args.flower:
            supernodes = f"engine.num_supernodes={args.flower}"
            runs.append((f"flower{args.flower}", ["--engine", "flower", "--set", supernodes]))
        for repeat in range(args.repeat):
            for name, settings in runs:
                out = root / f"{name}-{repeat}"
                command = [sys.executable, "-m", "fedpeft.cli", "run", args.preset, "--out", str(out), *settings]
                for item in args.overrides:
                    command += ["--set", item]
                load = os.getloadavg()[0]
                started = time.perf_counter()
                done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
                seconds = time.perf_counter() - started
                if done.returncode:
                    sys.stderr.write(done.stderr)
                    raise SystemExit(f"{name} failed with exit code {done.returncode}")
                got = records(out)
                first = firsts.setdefault(repeat, (seconds, got))
                setting = name.removeprefix("workers").removeprefix("flower")
                rows.append(
                    {
                        "engine": "flower simulation" if name.startswith("flower") else "local",
                        "workers": setting if setting == "default" else int(setting),
                        "ran_on": ran_on(done.stderr),
                        "repeat": repeat,
                        "load_before": round(load, 2),
                        "wall_seconds": round(seconds, 1),
                        "ratio": round(seconds / first[0], 3),
                        "records": len(got),
                        "identical_to_first": got == first[1] and got == firsts[0][1],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
                shutil.rmtree(out, ignore_errors=True)
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
    return result


if __name__ == "__main__":
    main()
