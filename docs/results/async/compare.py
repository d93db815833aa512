"""The comparisons of docs/results/async.md, from a run's results.jsonl (a run directory or a .jsonl(.gz) file).

    python docs/results/async/compare.py RUN [SYNC_EVERY_ROUND_RUN]

Per run: each method's ROUGE-L (x100, mean over the clients) at its end and at the common virtual time (the
earliest end among the methods, per seed: each method's last evaluation at or before it), mean ± SD over seeds;
the paired differences against `sync` over the clients (each client's mean over seeds) with 95 % t intervals
(fedpeft.report.intervals); and per seed the virtual time at the end and the time to the lowest final ROUGE-L.
SYNC_EVERY_ROUND_RUN, a run of the `sync` method alone evaluated every round (`--set eval.every=1`), gives `sync`
the curve of every round (its training and final records are those of RUN: checked).
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from fedpeft.report.intervals import format_interval, paired_interval

METRIC = "rougeL"


def load(run: Path) -> list[dict]:
    path = run / "results.jsonl" if run.is_dir() else run
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def curves(records: list[dict]) -> dict[tuple[str, int], dict[int, tuple[float, dict[str, float]]]]:
    """(method, seed) -> round -> (virtual time, client -> ROUGE-L) of the evaluations during training."""
    times: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    values: dict[tuple[str, int], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("round") is None:
            continue
        key = (r["method"], r["seed"])
        if r["split"] == "train" and r["metric"] == "virtual_time":
            times[key][r["round"]] = r["value"]
        elif r["split"] == "test" and r["metric"] == METRIC and r["pool"] == "seen":
            values[key][r["round"]][r["client"]] = r["value"]
    return {
        key: {n: (times[key][n], clients) for n, clients in sorted(rounds.items()) if n in times[key]}
        for key, rounds in values.items()
    }


def at_time(
    curve: dict[int, tuple[float, dict[str, float]]], limit: float, start: dict[str, float]
) -> dict[str, float]:
    """The clients' values at the last evaluation at or before virtual time ``limit`` (``start``, the base model's,
    before the first)."""
    chosen = [clients for _, (t, clients) in sorted(curve.items()) if t <= limit + 1e-9]
    return chosen[-1] if chosen else start


def mean_sd(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def with_fine_sync(records: list[dict], fine: list[dict]) -> list[dict]:
    """``records`` with the per-round evaluations of ``sync`` taken from ``fine`` (the same run of ``sync``,
    evaluated every round: its final evaluation must be the same)."""

    def final(rows: list[dict]) -> dict:
        last = max(r["round"] for r in rows if r["method"] == "sync" and r["round"] is not None)
        return {
            (r["client"], r["seed"], r["metric"]): r["value"]
            for r in rows
            if r["method"] == "sync" and r["round"] == last and r["split"] == "test"
        }

    assert final(records) == final(fine), "the two runs of sync differ"
    evaluated = [r for r in fine if r["method"] == "sync" and r["round"] is not None and r["split"] == "test"]
    kept = [r for r in records if not (r["method"] == "sync" and r["round"] is not None and r["split"] == "test")]
    return kept + evaluated


def report(run: Path, fine: Path | None = None) -> None:
    records = load(run)
    if fine is not None:
        records = with_fine_sync(records, load(fine))
    found = curves(records)
    base = {
        s: {
            r["client"]: r["value"]
            for r in records
            if r["method"] == "base" and r["metric"] == METRIC and r["seed"] == s
        }
        for s in {r["seed"] for r in records}
    }
    methods = list(dict.fromkeys(m for m, _ in found))
    seeds = sorted({s for _, s in found})
    common = {s: min(max(t for t, _ in found[m, s].values()) for m in methods) for s in seeds}
    end = {(m, s): found[m, s][max(found[m, s])] for m in methods for s in seeds}
    finals = {m: statistics.fmean(statistics.fmean(end[m, s][1].values()) for s in seeds) for m in methods}
    target = min(finals.values())
    print(f"\n{run}: ROUGE-L x100; common virtual time per seed: {', '.join(f'{common[s]:.1f}' for s in seeds)}")
    print(f"target (lowest final mean): {100 * target:.2f}; a method not evaluated yet counts as the base model\n")
    print("| method | at its end | at the common time | virtual time at the end | time to the target, per seed |")
    print("|---|---|---|---|---|")
    for m in methods:
        at_end = [100 * statistics.fmean(end[m, s][1].values()) for s in seeds]
        at_common = [100 * statistics.fmean(at_time(found[m, s], common[s], base[s]).values()) for s in seeds]
        ends = [end[m, s][0] for s in seeds]
        reach = []
        for s in seeds:
            hit = [t for t, clients in found[m, s].values() if statistics.fmean(clients.values()) >= target - 1e-12]
            reach.append(f"{min(hit):.1f}" if hit else "—")
        print(f"| {m} | {mean_sd(at_end)} | {mean_sd(at_common)} | {mean_sd(ends)} | {', '.join(reach)} |")
    print("\n| A - sync | at their ends [95 % CI] | at the common time [95 % CI] |\n|---|---|---|")
    for m in methods:
        if m == "sync":
            continue
        pairs = []
        for pick in (lambda k: end[k][1], lambda k: at_time(found[k], common[k[1]], base[k[1]])):
            a = {(c, s): v for s in seeds for c, v in pick((m, s)).items()}
            b = {(c, s): v for s in seeds for c, v in pick(("sync", s)).items()}
            pairs.append(format_interval(paired_interval(a, b)))
        print(f"| {m} | {pairs[0]} | {pairs[1]} |")


if __name__ == "__main__":
    report(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
