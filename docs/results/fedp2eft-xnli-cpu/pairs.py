"""The paired comparisons of docs/results/fedp2eft-xnli-cpu.md, from the records of its two runs.

    python docs/results/fedp2eft-xnli-cpu/pairs.py RUN [RUN ...]
    python docs/results/fedp2eft-xnli-cpu/pairs.py docs/results/fedp2eft-xnli-cpu/records/*.jsonl.gz

Each RUN is a run directory or a results.jsonl(.gz) file; their records are read together (the page's two runs
share one base model and hold different methods). For each pool and budget: the mean test accuracy (x100) of each
method over clients and seeds, then each pair (A, B) the page discusses: the mean over the pool's clients of each
client's mean over seeds of A - B, x100, with its 95 % t interval over the clients (fedpeft.report.intervals, as
summary.md computes them). An interval that excludes 0 is marked with *.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

from fedpeft.report.intervals import format_interval, paired_interval
from fedpeft.report.records import read_records

METHODS = ["lora", "bayestune_lora", "fedp2eft", "fedp2eft-psglr-0.01", "fedp2eft-old"]
PAIRS = [
    ("fedp2eft", "lora"),
    ("fedp2eft", "bayestune_lora"),
    ("bayestune_lora", "lora"),
    ("fedp2eft", "fedp2eft-psglr-0.01"),  # the PSG's learning rate: the paper's 1e-4 against 0.01
    ("fedp2eft-psglr-0.01", "fedp2eft-old"),  # official against old protocol, both at psg_lr 0.01
]
BUDGETS = [2, 4, 8, 16]


def values(records: list[dict], method: str, pool: str, budget: int) -> dict[tuple[str, object], float]:
    """``(client, seed) -> accuracy`` of the method's test records in ``pool`` at ``budget``."""
    return {
        (r["client"], r["seed"]): float(r["value"])
        for r in records
        if r["method"] == method
        and r["metric"] == "accuracy"
        and r["split"] == "test"
        and r["pool"] == pool
        and r["budget"] == budget
    }


def load(run: Path) -> list[dict]:
    """The records of a run directory, or of a results.jsonl file (gzipped or not)."""
    if run.is_dir():
        return read_records([run])[0]
    opener = gzip.open if run.suffix == ".gz" else open
    with opener(run, "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return [row for row in rows if "split" in row]  # a run's parts/ files also hold its cost rows


def marked(text: str, interval: object) -> str:
    low, high = getattr(interval, "low", None), getattr(interval, "high", None)
    return text + (" *" if low is not None and high is not None and (low > 0 or high < 0) else "")


def main(runs: list[str]) -> None:
    records = [r for run in runs for r in load(Path(run))]
    present = [m for m in METHODS if any(r["method"] == m for r in records)]
    print("| Pool | r | " + " | ".join(present) + " |")
    print("|---|---|" + "---|" * len(present))
    for pool in ("seen", "unseen"):
        for budget in BUDGETS:
            means = []
            for method in present:
                found = values(records, method, pool, budget)
                means.append(f"{statistics.fmean(found.values()) * 100:.2f}" if found else "—")
            print(f"| {pool} | {budget} | " + " | ".join(means) + " |")
    pairs = [(a, b) for a, b in PAIRS if a in present and b in present]
    print("\nA - B, x100, [95 % CI over clients]; * where the interval excludes 0\n")
    print("| Pool | r | " + " | ".join(f"{a} - {b}" for a, b in pairs) + " |")
    print("|---|---|" + "---|" * len(pairs))
    for pool in ("seen", "unseen"):
        for budget in BUDGETS:
            cells = []
            for a, b in pairs:
                interval = paired_interval(values(records, a, pool, budget), values(records, b, pool, budget))
                cells.append(marked(format_interval(interval), interval))
            print(f"| {pool} | {budget} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
