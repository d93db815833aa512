"""Run a command and measure its wall time and the peak memory of its whole process tree.

The authors' pipeline runs its clients in Ray actors, which are not the command's own process: the tree (driver,
Ray's services, the client actors) is sampled every ``--every`` seconds. Reported: the wall time, the exit code,
the peak of the tree's summed RSS, and the peaks of the largest single process and of the largest Ray actor
(``ray::`` processes other than idle workers), the figure closest to fedpeft's per-process peak RSS.

Usage:
  python measure.py --out step.json -- python main.py ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

MIB = 2**20


def tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its descendants that are still alive."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def sample(processes: list[psutil.Process]) -> tuple[int, int, int]:
    """Summed RSS, largest single RSS and largest Ray actor RSS of ``processes`` (bytes)."""
    total = largest = actor = 0
    for process in processes:
        try:
            rss = process.memory_info().rss
            name = process.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += rss
        largest = max(largest, rss)
        if name.startswith("ray::") and name != "ray::IDLE":
            actor = max(actor, rss)
    return total, largest, actor


def measure(command: list[str], every: float = 0.2) -> dict:
    """Run ``command`` to its end; its wall time, exit code and memory peaks (MiB)."""
    start = time.perf_counter()
    child = subprocess.Popen(command)
    root = psutil.Process(child.pid)
    peak_total = peak_single = peak_actor = 0
    while child.poll() is None:
        total, single, actor = sample(tree(root))
        peak_total, peak_single, peak_actor = max(peak_total, total), max(peak_single, single), max(peak_actor, actor)
        time.sleep(every)
    return {
        "command": command,
        "returncode": child.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "peak_tree_rss_mib": round(peak_total / MIB),
        "peak_process_rss_mib": round(peak_single / MIB),
        "peak_actor_rss_mib": round(peak_actor / MIB),
    }


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.exit("usage: measure.py [--out FILE] [--every S] -- COMMAND ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the measurement here as JSON")
    parser.add_argument("--every", type=float, default=0.2, help="sampling period, seconds")
    args = parser.parse_args(argv[:split])
    result = measure(argv[split + 1 :], args.every)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "command"}), file=sys.stderr)
    return result


if __name__ == "__main__":
    sys.exit(main()["returncode"])
