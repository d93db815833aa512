"""Command-line start-up: wall time of `fedpeft --help` and `fedpeft list methods|datasets|models|presets`.

Each command runs in a fresh process (the installed ``fedpeft`` console script, or ``python -m fedpeft.cli`` when
the script is not on PATH) ``--repeats`` times; the table gives the best and the median wall time, and every
time goes to ``--out``.

Usage: python benchmarks/cli_startup.py [--repeats 5] [--out benchmarks/results/cli_startup.json] [--quick]
       (--quick: each command once)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = [["--help"], ["list", "methods"], ["list", "datasets"], ["list", "models"], ["list", "presets"]]


def fedpeft_command() -> list[str]:
    script = shutil.which("fedpeft")
    return [script] if script else [sys.executable, "-m", "fedpeft.cli"]


def wall_times(command: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cli_startup.json"))
    parser.add_argument("--quick", action="store_true", help="each command once: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    base = fedpeft_command()
    print(f"{' '.join(base)}, {args.repeats} runs each\n")
    print("| command | best s | median s |")
    print("|---|---|---|")
    results = {}
    for argv in COMMANDS:
        name = f"fedpeft {' '.join(argv)}"
        times = wall_times(base + argv, args.repeats)
        results[name] = {"best_s": min(times), "median_s": statistics.median(times), "times_s": times}
        print(f"| `{name}` | {min(times):.2f} | {statistics.median(times):.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "command": [Path(base[0]).name, *base[1:]]}
    report = {"machine": machine, "results": results}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
