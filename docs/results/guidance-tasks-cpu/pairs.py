"""The paired comparisons of docs/results/guidance-tasks-cpu.md, from a run's results.jsonl.

    python docs/results/guidance-tasks-cpu/pairs.py RUN [RUN ...]
    python docs/results/guidance-tasks-cpu/pairs.py docs/results/guidance-tasks-cpu/results.jsonl.gz

RUN is a run directory, or a results.jsonl(.gz) file (the page's run keeps its records beside this script). For
each pair (A, B) of configs the page discusses: the mean over the 10 clients of each client's mean over seeds
of A - B, x100, and its 95 % t interval over the clients (fedpeft.report.intervals, as summary.md computes them),
for METEOR and ROUGE-L. Several RUN directories (one per machine) print one block each.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from fedpeft.report.intervals import format_interval, paired_interval
from fedpeft.report.records import read_records

PAIRS = [
    # Table 2 against Table 1: guidance against hard initialization, same merge
    ("fedavg-ab-l2", "fedavg-ab"),
    ("fedavg-ab-kd", "fedavg-ab"),
    ("isoc-knots-l2", "isoc-knots"),
    ("isoc-knots-kd", "isoc-knots"),
    # kd against l2
    ("fedavg-ab-kd", "fedavg-ab-l2"),
    ("isoc-knots-kd", "isoc-knots-l2"),
    # Table 3: similarity-weighted beta against the fixed one
    ("isoc-knots-kd-cos", "isoc-knots-kd"),
    ("isoc-knots-kd-sar", "isoc-knots-kd"),
    ("fedavg-ab-l2-sar", "fedavg-ab-l2"),
    ("fedavg-ab-l2-cos", "fedavg-ab-l2"),
    # the best federated rows against each other and against local training
    ("isoc-knots-kd-cos", "isoc-knots-kd-sar"),
    ("isoc-knots-kd-cos", "fedavg-ab-kd"),
    ("isoc-knots-kd-cos", "local"),
    # Table 1: the hard-init merges, and ReLoRA
    ("fedavg-ab", "ties-ab"),
    ("fedavg-knots", "ties-knots"),
    ("isoc-knots", "fedavg-knots"),
    ("ties-ab-relora", "ties-ab"),
    ("ties-knots-relora", "ties-knots"),
    ("fedavg-ab-relora", "fedavg-ab"),
    ("fedavg-knots-relora", "fedavg-knots"),
    ("isoc-ab-relora", "isoc-ab"),
    ("isoc-knots-relora", "isoc-knots"),
    ("ties-knots-relora", "fedavg-ab"),
]
METRICS = {"meteor": "METEOR", "rougeL": "ROUGE-L"}


def values(records: list[dict], method: str, metric: str) -> dict[tuple[str, object], float]:
    """``(client, seed) -> value`` of the method's test records of ``metric`` in the seen pool."""
    return {
        (r["client"], r["seed"]): float(r["value"])
        for r in records
        if r["method"] == method and r["metric"] == metric and r["split"] == "test" and r["pool"] == "seen"
    }


def load(run: Path) -> list[dict]:
    """The records of a run directory, or of a results.jsonl file (gzipped or not)."""
    if run.is_dir():
        return read_records([run])[0]
    opener = gzip.open if run.suffix == ".gz" else open
    with opener(run, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def main(runs: list[str]) -> None:
    for run in runs:
        records = load(Path(run))
        print(f"\n{run}\n")
        print("| A | B | " + " | ".join(f"{name}: A - B [95 % CI]" for name in METRICS.values()) + " |")
        print("|---|---|" + "---|" * len(METRICS))
        for a, b in PAIRS:
            cells = [format_interval(paired_interval(values(records, a, m), values(records, b, m))) for m in METRICS]
            print(f"| {a} | {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
