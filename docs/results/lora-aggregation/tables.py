"""The tables of docs/results/lora-aggregation.md, from the runs' results.jsonl and costs.jsonl.

    python docs/results/lora-aggregation/tables.py [RUNS]
    python docs/results/lora-aggregation/tables.py docs/results/lora-aggregation/records   # the page's own runs

reads RUNS/lora-aggregation-hetero-*, RUNS/lora-aggregation-potara-s* and
RUNS/lora-aggregation-server-optimizers-s* (runs of any seeds, or of some of the methods; RUNS defaults to runs).
A run that has not finished, or was stopped, is read from its finished units (parts/).

A cell is computed as in summary.md (docs/outputs.md): per seed the mean of the metric over the clients (or
over the one client of a column), then mean ± sample SD over the seeds, x100. The gain over base is per seed the
mean over clients of (method - base) on the same client. Tiered methods record their tier as the budget; the
others no budget; a row here is a method (label) whatever its budget.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from fedpeft.report import records as run_records

METRICS = ("meteor", "rouge1", "rougeL")
METRIC_NAMES = {"meteor": "METEOR", "rouge1": "ROUGE-1", "rougeL": "ROUGE-L"}


KEY = ("method", "budget", "pool", "client", "seed", "split", "metric", "round")


def _gzipped(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def read_records(runs: list[Path]) -> tuple[list[dict], list[dict]]:
    """Results and costs of ``runs`` (merged as `fedpeft report` does); a run without results.jsonl yet gives the
    records of its finished units."""
    finished = [run for run in runs if (run / "results.jsonl").is_file()]
    results, costs = run_records.read_records(finished) if finished else ([], [])
    for run in runs:
        if run in finished:
            continue
        if (run / "results.jsonl.gz").is_file():  # the page's own records (records/ beside this script)
            results += _gzipped(run / "results.jsonl.gz")
            costs += _gzipped(run / "costs.jsonl.gz") if (run / "costs.jsonl.gz").is_file() else []
            continue
        for part in sorted((run / "parts").glob("*.jsonl")):
            for record in run_records.read_jsonl(part):
                (costs.append(record["_cost"]) if "_cost" in record else results.append(record))
    # The same record in two runs (the base model of a seed, run once per process) counts once.
    unique = {tuple(str(r.get(k)) for k in KEY): r for r in results}
    return list(unique.values()), costs


def cell(values: list[float], scale: float = 100.0, sign: bool = False) -> str:
    """Mean ± sample SD over seeds (no ± when the seeds agree or there is one seed)."""
    mean = statistics.fmean(values) * scale
    text = f"{mean:+.2f}" if sign else f"{mean:.2f}"
    if len(values) > 1:
        sd = statistics.stdev(values) * scale
        if sd > 0.005:
            text += f" ± {sd:.2f}"
    return text


def per_seed(records: list[dict], method: str, metric: str, clients: set[str] | None = None) -> dict[int, float]:
    """Seed -> mean of ``metric`` over the method's clients (those in ``clients`` only, when given)."""
    values: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r["method"] == method and r["metric"] == metric and (clients is None or r["client"] in clients):
            values[r["seed"]].append(r["value"])
    return {seed: statistics.fmean(v) for seed, v in sorted(values.items())}


def gain(records: list[dict], method: str, metric: str) -> list[float]:
    """Per seed, the mean over clients of (method - base) on the same client and seed."""
    base = {(r["client"], r["seed"]): r["value"] for r in records if r["method"] == "base" and r["metric"] == metric}
    diffs: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r["method"] == method and r["metric"] == metric and (r["client"], r["seed"]) in base:
            diffs[r["seed"]].append(r["value"] - base[(r["client"], r["seed"])])
    return [statistics.fmean(v) for _, v in sorted(diffs.items())]


def final_loss(train: list[dict], method: str) -> list[float]:
    """Per seed, the mean training loss of the clients in the method's last round."""
    last: dict[int, tuple[int, float]] = {}
    for r in train:
        if r["method"] == method and r["metric"] == "loss":
            if r["seed"] not in last or r["round"] > last[r["seed"]][0]:
                last[r["seed"]] = (r["round"], r["value"])
    return [value for _, (_, value) in sorted(last.items())]


def cost(costs: list[dict], method: str, metric: str) -> float | None:
    values = [
        c["value"] for c in costs if c["method"] == method and c["phase"] == "federated" and c["metric"] == metric
    ]
    return statistics.fmean(values) if values else None


def kib(value: float | None) -> str:
    return "—" if value is None else f"{value / 1024:,.1f} KiB"


ORDER = ("base", "fedit", "fedex_lora", "rolora", "fedsvd", "flora", "hetlora", "flexlora")


def methods_of(records: list[dict]) -> list[str]:
    """The methods of ``records``: base, FedIT, the exact and the heterogeneous-rank rules, then the others."""
    seen = list(dict.fromkeys(r["method"] for r in records))
    return sorted(seen, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), seen.index(m)))


def bold_best(rows: list[list[str]], columns: range) -> list[list[str]]:
    """Bold the highest printed mean of each column among rows other than base (the first)."""
    for c in columns:
        means = [float(row[c].split(" ")[0]) if row[c] not in ("—", "") else float("-inf") for row in rows[1:]]
        if not means:
            continue
        best = max(means)
        for row, mean in zip(rows[1:], means, strict=True):
            if mean == best:
                row[c] = f"**{row[c]}**"
    return rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def client_table(runs: list[Path]) -> str:
    """ROUGE-L per client (one client per tier) and the mean over clients, the METEOR mean, the gain, the last
    round's loss and the bytes (ROUGE-1 equals ROUGE-L on these short answers)."""
    results, costs = read_records(runs)
    test = [r for r in results if r["split"] == "test"]
    train = [r for r in results if r["split"] == "train"]
    clients = sorted({r["client"] for r in test})
    header = [
        "Method",
        *(f"{client} (tier {i + 1})" for i, client in enumerate(clients)),
        "Mean ROUGE-L",
        "Mean METEOR",
        "ROUGE-L gain over base",
        "final train loss",
        "up / client-round",
        "down / client-round",
    ]
    rows = []
    for method in methods_of(test):
        row = [method]
        row += [cell(list(per_seed(test, method, "rougeL", {c}).values())) for c in clients]
        row += [cell(list(per_seed(test, method, m).values())) for m in ("rougeL", "meteor")]
        rows.append(row + trailing_cells(test, train, costs, method))
    return markdown(header, bold_best(rows, range(1, len(clients) + 3)))


def trailing_cells(test: list[dict], train: list[dict], costs: list[dict], method: str) -> list[str]:
    """The last columns of the per-client and pool tables: ROUGE-L gain over base, final train loss, bytes."""
    loss = final_loss(train, method)
    return [
        "—" if method == "base" else cell(gain(test, method, "rougeL"), sign=True),
        cell(loss, scale=1.0) if loss else "—",
        kib(cost(costs, method, "bytes_up_per_client_round")),
        kib(cost(costs, method, "bytes_down_per_client_round")),
    ]


def pool_table(runs: list[Path], only: set[str] | None = None) -> str:
    """The three metrics' means over the clients, the ROUGE-L gain, the last round's loss and the bytes (rows of
    the methods in ``only``, when given)."""
    results, costs = read_records(runs)
    results = [r for r in results if only is None or r["method"] in only or r["method"].startswith("fedit-")]
    test = [r for r in results if r["split"] == "test"]
    train = [r for r in results if r["split"] == "train"]
    header = [
        "Method",
        *(METRIC_NAMES[m] for m in METRICS),
        "ROUGE-L gain over base",
        "final train loss",
        "up / client-round",
        "down / client-round",
    ]
    rows = []
    for method in methods_of(test):
        row = [method, *(cell(list(per_seed(test, method, m).values())) for m in METRICS)]
        rows.append(row + trailing_cells(test, train, costs, method))
    return markdown(header, bold_best(rows, range(1, 4)))


def group_table(runs: list[Path], only: set[str] | None = None) -> str:
    """ROUGE-L per group (task family), mean ± SD over seeds."""
    results, _ = read_records(runs)
    results = [r for r in results if only is None or r["method"] in only or r["method"].startswith("fedit-")]
    test = [r for r in results if r["split"] == "test"]
    groups = list(dict.fromkeys(r["group"] for r in test))
    rows = []
    for method in methods_of(test):
        row = [method]
        for g in groups:
            members = {r["client"] for r in test if r["group"] == g}
            row.append(cell(list(per_seed(test, method, "rougeL", members).values())))
        rows.append(row)
    return markdown(["Method", *groups], bold_best(rows, range(1, len(groups) + 1)))


def round_records(runs: list[Path]) -> list[dict]:
    """Every round's training records of ``runs`` (results.jsonl, else parts/, else results.jsonl.gz), which
    read_records reduces to the last round."""
    records: dict[tuple, dict] = {}
    for run in runs:
        files = (
            [run / "results.jsonl"] if (run / "results.jsonl").is_file() else sorted((run / "parts").glob("*.jsonl"))
        )
        rows = [r for path in files for r in run_records.read_jsonl(path)]
        if not files and (run / "results.jsonl.gz").is_file():  # the page's own records
            rows = _gzipped(run / "results.jsonl.gz")
        for r in rows:
            if "_cost" not in r and r.get("split") == "train":
                records[tuple(str(r.get(k)) for k in KEY)] = r
    return list(records.values())


def loss_curve(runs: list[Path], only: set[str] | None = None, every: int = 5) -> str:
    """Mean training loss over seeds every ``every`` rounds, a row per method."""
    results = round_records(runs)
    results = [r for r in results if only is None or r["method"] in only or r["method"].startswith("fedit-")]
    train = [r for r in results if r["split"] == "train" and r["metric"] == "loss"]
    rounds = sorted({r["round"] for r in train})
    shown = [n for n in rounds if n == 1 or n % every == 0]
    rows = []
    for method in methods_of(train):
        by_round: dict[int, list[float]] = defaultdict(list)
        for r in train:
            if r["method"] == method:
                by_round[r["round"]].append(r["value"])
        rows.append([method, *(f"{statistics.fmean(by_round[n]):.3f}" if by_round[n] else "—" for n in shown)])
    return markdown(["Method", *(f"round {n}" for n in shown)], rows)


def interval_table(runs: list[Path], pairs: list[tuple[str, str]], metric: str = "rougeL") -> str:
    """Each pair's paired difference A - B over clients (each client's mean over seeds), x100, with its 95 % t
    interval over the clients, as summary.md computes them (fedpeft.report.intervals)."""
    from fedpeft.report.intervals import format_interval, paired_interval

    results, _ = read_records(runs)
    test = [r for r in results if r["split"] == "test" and r["metric"] == metric]

    def values(method: str) -> dict[tuple[str, object], float]:
        return {(r["client"], r["seed"]): float(r["value"]) for r in test if r["method"] == method}

    rows = [[a, b, format_interval(paired_interval(values(a), values(b)))] for a, b in pairs]
    return markdown(["A", "B", f"{METRIC_NAMES[metric]}: A - B [95 % CI]"], rows)


HETERO_PAIRS = [
    ("fedit", "base"),
    *((m, "fedit") for m in ("fedex_lora", "rolora", "fedsvd", "flora", "hetlora", "flexlora")),
    ("flora", "fedex_lora"),
    ("flora", "hetlora"),
]
POTARA_PAIRS = [
    ("fedit", "base"),
    ("flexlora", "fedit"),
    ("flexlora", "fedex_lora"),
    ("fedex_lora", "fedit"),
    ("flora", "fedit"),
    ("hetlora", "fedit"),
    ("fedsvd", "fedit"),
    ("fedsvd-alpha16", "fedsvd"),
    ("fedsvd-alpha16", "fedit"),
    ("rolora", "base"),
    ("fedsvd", "base"),
]
OPTIMIZER_PAIRS = [(m, "fedit") for m in ("fedit-avgm", "fedit-adam", "fedit-yogi", "fedit-adagrad")] + [
    ("fedit-adam", "base"),
    ("fedit-adagrad", "base"),
]


def main(root: Path) -> None:
    hetero = sorted(root.glob("lora-aggregation-hetero-*"))
    potara = sorted(root.glob("lora-aggregation-potara-s*"))
    optimizers = sorted(root.glob("lora-aggregation-server-optimizers-s*"))
    print("## Heterogeneous ranks (ROUGE-L x 100 per client)\n")
    print(client_table(hetero))
    print()
    print(interval_table(hetero, HETERO_PAIRS))
    print("\n## potara-tasks-cpu: aggregation methods\n")
    print(pool_table(potara))
    print()
    print(group_table(potara))
    print()
    print(loss_curve(potara))
    print()
    print(interval_table(potara, POTARA_PAIRS))
    # FedAvg (fedit without a server optimizer, the same as `sgd` at lr 1) comes from the aggregation runs.
    print("\n## potara-tasks-cpu: server optimizers\n")
    reference = {"base", "fedit"}
    print(pool_table(potara + optimizers, reference))
    print()
    print(group_table(potara + optimizers, reference))
    print()
    print(loss_curve(potara + optimizers, reference))
    print()
    print(interval_table(potara + optimizers, OPTIMIZER_PAIRS))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs"))
