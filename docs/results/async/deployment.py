"""The deployment comparison of docs/results/async.md, from the run of benchmarks/async_deployment.py.

    python docs/results/async/deployment.py RUN

RUN is the run directory (or its results.jsonl(.gz)). Per method: the wall seconds of its federated phase (the sum
of its server steps' ``seconds``), its server steps and mean staleness, mean ± SD over seeds; its final ROUGE-L
(x100, mean over the clients), mean ± SD over seeds; and against ``sync``: the ratio of phase wall times (per seed,
then mean) and the paired difference in final ROUGE-L over the clients (each client's mean over seeds) with its
95 % t interval (fedpeft.report.intervals).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from compare import load  # this directory's: the records of a run directory or file

from fedpeft.report.intervals import format_interval, paired_interval

METRIC = "rougeL"
REFERENCE = "sync"


def mean_sd(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    mean = statistics.fmean(values) * scale
    sd = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def main(run: Path) -> None:
    records = [r for r in load(run) if r["method"] != "base"]
    seconds: dict[tuple[str, int], float] = defaultdict(float)
    steps: dict[tuple[str, int], int] = defaultdict(int)
    staleness: dict[tuple[str, int], list[float]] = defaultdict(list)
    last_round: dict[tuple[str, int], int] = defaultdict(int)
    for r in records:
        key = (r["method"], r["seed"])
        if r["split"] == "train" and r["metric"] == "seconds":
            seconds[key] += r["value"]
            steps[key] += 1
        elif r["split"] == "train" and r["metric"] == "staleness":
            staleness[key].append(r["value"])
        elif r["split"] == "test" and r["metric"] == METRIC:
            last_round[key] = max(last_round[key], r["round"] or 0)
    finals: dict[str, dict[tuple[str, int], float]] = defaultdict(dict)
    for r in records:
        key = (r["method"], r["seed"])
        if r["split"] == "test" and r["metric"] == METRIC and (r["round"] or 0) == last_round[key]:
            finals[r["method"]][r["client"], r["seed"]] = r["value"]
    methods = sorted({m for m, _ in seconds}, key=lambda m: (m != REFERENCE, m))
    seeds = sorted({s for _, s in seconds})
    print(f"seeds {seeds}\n")
    print(
        f"| method | server steps | phase wall s | wall / {REFERENCE} | mean staleness | final ROUGE-L | "
        f"final - {REFERENCE} [95 % CI] |"
    )
    print("|---|---|---|---|---|---|---|")
    for method in methods:
        walls = [seconds[method, s] for s in seeds]
        ratios = [seconds[method, s] / seconds[REFERENCE, s] for s in seeds]
        stale = [statistics.fmean(staleness[method, s]) if staleness[method, s] else 0.0 for s in seeds]
        final = [
            statistics.fmean(v for (_, seed), v in finals[method].items() if seed == s)
            for s in seeds
            if any(seed == s for _, seed in finals[method])
        ]
        difference = "—" if method == REFERENCE else format_interval(paired_interval(finals[method], finals[REFERENCE]))
        print(
            f"| {method} | {steps[method, seeds[0]]} | {mean_sd(walls)} | {mean_sd(ratios, digits=2)} | "
            f"{mean_sd(stale, digits=2)} | {mean_sd(final, scale=100, digits=2)} | {difference} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
