"""The paired comparisons of docs/results/fedmosaic-text.md, from the records of its runs.

    python docs/results/fedmosaic-text/pairs.py RUN [RUN ...]
    python docs/results/fedmosaic-text/pairs.py docs/results/fedmosaic-text/records/*.jsonl.gz

Each RUN is a run directory or a results.jsonl(.gz) file; their records are read together (the page's runs share
the base-stage checkpoints and hold different methods). Per pair (A, B) the page discusses and per column (Self /
Others x A_last / A_AUC): the mean over the 10 clients of each client's mean over seeds of A - B, x100, with its
95 % t interval over the clients (fedpeft.report.continual_client_values and fedpeft.report.intervals, as
summary.md computes them). An interval that excludes 0 is marked with *.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from fedpeft.report import continual_client_values
from fedpeft.report.intervals import format_interval, paired_interval

PAIRS = [
    # the main table: FedMosaic against the rows that dominate it, and the trade-off between SFT and FedIT
    ("fedmosaic", "feddat"),
    ("fedmosaic", "fedit"),
    ("fedmosaic", "perada"),
    ("fedmosaic", "ditto"),
    ("fedmosaic", "SFT"),
    ("SFT", "fedit"),
    ("feddat", "fedit"),
    ("perada", "ditto"),
    # the ablation: PQ-LoRA against vanilla LoRA, RELA on top of PQ-LoRA (FedMosaic is the main table's row)
    ("plus-pq-lora", "vanilla"),
    ("fedmosaic", "plus-pq-lora"),
]
COLUMNS = [("test", "last", "Self A_last"), ("test", "auc", "Self A_AUC")]
COLUMNS += [("others", "last", "Others A_last"), ("others", "auc", "Others A_AUC")]


def load(run: Path) -> list[dict]:
    """The records of a run directory, or of a results.jsonl file (gzipped or not)."""
    path = run / "results.jsonl" if run.is_dir() else run
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def main(runs: list[str]) -> None:
    records = [r for run in runs for r in load(Path(run)) if r.get("round") is not None]
    values = continual_client_values(records)
    print("| A | B | " + " | ".join(f"{name}: A - B [95 % CI]" for _, _, name in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for a, b in PAIRS:
        if (a, "test", "last") not in values or (b, "test", "last") not in values:
            continue
        cells = []
        for split, stat, _ in COLUMNS:
            interval = paired_interval(values[a, split, stat], values[b, split, stat])
            text = format_interval(interval)
            cells.append(text + (" *" if interval is not None and interval.excludes_zero else ""))
        print(f"| {a} | {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
