"""Scale in the clients: what a run and its report cost from 10 to 5,000 clients.

Each size runs `fedpeft run` in a process of its own, then `fedpeft report` on its output in another, and records:

- the run's wall seconds and peak RSS (the run's process, from ``wait4``; with worker processes also their peaks
  as costs.jsonl records them),
- the federated phase's seconds per round and per client-round, personalization's seconds per client, the
  evaluation between rounds' seconds (with ``--eval-every``),
- the run directory's bytes per client,
- the report's wall seconds and peak RSS, and the longest line of its summary.md and the widest plot (pixels).

The federation: the tiny BERT, no base stage, about 6 training and 2 test rows per client, FedIT for 3 rounds at 10
clients per round, then a per-client LoRA; every client is evaluated. Two kinds of groups:

- ``--groups languages`` (default): the synthetic XNLI-style benchmark, clients spread over two languages;
- ``--groups clients``: a ``files`` dataset whose every client is its own group (a user's own data with a
  ``client`` column), the case where a report has one group per client.

Each part should be flat or linear in the clients: per round and per client seconds flat, RSS and report time
growing at most linearly, bytes per client flat.

Usage:
    python benchmarks/scale.py [--clients 10 100 1000 5000] [--groups languages|clients] [--workers 1]
        [--eval-every 0] [--out benchmarks/results/scale.json]
    python benchmarks/scale.py --quick            # one tiny size (12 clients), seconds: the benchmark still runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the report's measurement, shared with report_scale.py
from report_scale import output_sizes, report_measured  # noqa: E402

ROWS_PER_CLIENT = 6
TEST_ROWS_PER_CLIENT = 2
CLIENTS_PER_ROUND = 10
WORDS = "alpha beta gamma delta sun moon river stone green blue quick slow open close light dark".split()


def fedpeft_command(*args: str) -> list[str]:
    """The `fedpeft` command line run by this interpreter (the one of the benchmark's environment)."""
    return [sys.executable, "-c", "from fedpeft.cli import main; main()", *args]


def run_measured(command: list[str]) -> tuple[float, float, str]:
    """Run ``command``; its wall seconds, its peak RSS in MiB (its own process, from ``wait4``) and its stderr."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - started
        err.seek(0)
        stderr = err.read()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command[3:])} exited {process.returncode}:\n{stderr[-4000:]}")
    return seconds, usage.ru_maxrss / 1024, stderr


def client_files(path: Path, clients: int, seed: int = 0) -> Path:
    """A ``files`` dataset of ``clients`` clients, each its own group, with 6 training and 2 test rows each."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for client in range(clients):
            for row in range(ROWS_PER_CLIENT + TEST_ROWS_PER_CLIENT):
                label = rng.choice(["negative", "positive"])
                words = rng.sample(WORDS, 5) + [label[:3]]
                record = {
                    "text": " ".join(words),
                    "label": label,
                    "client": f"c{client:05d}",
                    "split": "train" if row < ROWS_PER_CLIENT else "test",
                }
                handle.write(json.dumps(record) + "\n")
    return path


def overrides(
    clients: int, groups: str, workers: int, eval_every: int, rounds: int, data_path: Path | None
) -> list[str]:
    """The ``--set`` values of the smoke preset that make the federation of ``clients`` clients."""
    fraction = min(1.0, CLIENTS_PER_ROUND / clients)
    values = [
        "name=scale",
        "seeds=[0]",
        "base.kind=pretrained",
        "budgets=[4]",
        f"engine.workers={workers}",
        "output.save_adapters=false",
        "output.plots=false",
        f"methods=[{{name: fedit, rounds: {rounds}, fraction: {fraction}, local_steps: 2, lr: 0.005}}, "
        "{name: lora, epochs: 1, lr: 0.005}]",
    ]
    if eval_every:
        values.append(f"eval.every={eval_every}")
    if groups == "clients":
        assert data_path is not None
        values += ["data.name=files", f"data.path={data_path}", "data.label_names=[negative, positive]"]
    else:
        per_group = max(1, clients // 2)
        values += [
            "data.groups=[lat1, cyr1]",
            f"data.clients_per_group={per_group}",
            f"data.train_per_group={ROWS_PER_CLIENT * per_group}",
            f"data.test_per_group={TEST_ROWS_PER_CLIENT * per_group}",
            "data.unseen_pool=false",
            "data.partition=iid",  # a Dirichlet draw cannot split 6 rows per client over 3 labels
        ]
    return [item for value in values for item in ("--set", value)]


def cost(rows: list[dict], method: str, phase: str, metric: str) -> float | None:
    """One value of costs.jsonl (the first seed's), None when the run has none."""
    for row in rows:
        if (row["method"], row["phase"], row["metric"]) == (method, phase, metric) and "client" not in row:
            return float(row["value"])
    return None


def directory_bytes(root: Path) -> int:
    """The bytes of every file under ``root``."""
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def measure(clients: int, groups: str, workers: int, eval_every: int, rounds: int, tmp: Path) -> dict:
    """One size: the run, then its report, each in its own process."""
    data_path = client_files(tmp / f"clients-{clients}.jsonl", clients) if groups == "clients" else None
    out = tmp / f"run-{clients}"
    command = fedpeft_command(
        "run", "smoke", "--out", str(out), *overrides(clients, groups, workers, eval_every, rounds, data_path)
    )
    run_s, run_rss, _ = run_measured(command)
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    records = sum(1 for _ in (out / "results.jsonl").open())
    report_dir = tmp / f"report-{clients}"
    report = report_measured(out, report_dir)
    sizes = output_sizes(report_dir)
    run_bytes = directory_bytes(out)
    federated_s = cost(costs, "fedit", "federated", "wall_s") or 0.0
    evaluation_s = cost(costs, "fedit", "round_evaluation", "wall_s")  # the evaluation between rounds
    return {
        "clients": clients,
        "groups": groups,
        "workers": workers,
        "eval_every": eval_every,
        "records": records,
        "run_s": round(run_s, 2),
        "run_peak_rss_mb": round(run_rss, 1),
        "worker_peak_rss_mb": max(
            (r["value"] for r in costs if r["metric"] == "peak_rss_mb" and r.get("node") is not None), default=None
        ),
        "round_s": round(federated_s / rounds, 3),
        "client_round_s": cost(costs, "fedit", "federated", "wall_s_per_client_round"),
        "personalization_client_s": cost(costs, "lora", "personalization", "wall_s_per_client"),
        "evaluation_s": evaluation_s,
        "run_bytes_per_client": round(run_bytes / clients),
        **report,
        "summary_longest_line": sizes["summary_longest_line"],
        "widest_plot_px": max((width for width, _ in sizes["plot_pixels"].values()), default=0),
    }


COLUMNS = [
    ("clients", "N"),
    ("run_s", "run s"),
    ("round_s", "s / round"),
    ("client_round_s", "s / client-round"),
    ("personalization_client_s", "s / client (LoRA)"),
    ("evaluation_s", "eval s"),
    ("run_peak_rss_mb", "run RSS MiB"),
    ("run_bytes_per_client", "disk B / client"),
    ("report_s", "report s"),
    ("report_peak_rss_mb", "report RSS MiB"),
    ("summary_longest_line", "longest line"),
    ("widest_plot_px", "widest plot px"),
]


def table(rows: list[dict]) -> str:
    """The measurements as a markdown table (the one docs/benchmarks.md shows)."""

    def cell(value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(name for _, name in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(row[key]) for key, _ in COLUMNS) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000, 5000])
    parser.add_argument("--groups", choices=["languages", "clients"], default="languages")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="12 clients and one round: checks that it runs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scale.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.rounds = [12], 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for clients in args.clients:
            rows.append(measure(clients, args.groups, args.workers, args.eval_every, args.rounds, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "groups": args.groups,
        "workers": args.workers,
        "eval_every": args.eval_every,
        "rounds": args.rounds,
        "rows": rows,
        "self_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    return result


if __name__ == "__main__":
    main()
