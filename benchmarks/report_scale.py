"""The report of a run with many clients, each its own group: how its time, memory and size grow with the clients.

:func:`write_client_run` writes a run directory without training anything: ``results.jsonl`` of N clients (each
client its own group, as a ``files`` dataset with a ``client`` column gives), a few methods (``base``, two
budget-less methods, one method at two ranks) and 3 seeds, with the ``data.json`` and ``config.yaml`` a run writes
beside it. The tests import it (tests/test_report_scale.py) to check what the report of such a run looks like.

The benchmark runs ``fedpeft report`` on it in a process of its own, per size, and records its wall seconds, its
peak RSS (from ``wait4``), the longest line of its summary.md, the widest plot (pixels) and the size of every file
it wrote. The report should grow at most linearly in the clients.

Usage:
    python benchmarks/report_scale.py [--clients 1000 5000] [--seeds 3] [--no-plots]
        [--out benchmarks/results/report_scale.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = {"base": (None,), "fedit": (None,), "local": (None,), "lora": (2, 8)}
# How much each method adds to a client's base accuracy, and how much a seed moves each value.
EFFECTS = {"base": 0.0, "fedit": 0.04, "local": 0.08, "lora": 0.06}
SEED_NOISE = 0.02
TEST_PER_CLIENT = 40


def client_id(index: int) -> str:
    """The id (and group) of the ``index``-th client: ``c00042``."""
    return f"c{index:05d}"


def client_records(clients: int, seeds: int = 3, *, seed: int = 0) -> list[dict]:
    """The final test records of ``clients`` clients, each its own group, in the seen pool: every method of
    :data:`METHODS` at each of its budgets, on ``seeds`` seeds, accuracy drawn around each client's own level."""
    rng = random.Random(seed)
    levels = [rng.uniform(0.3, 0.8) for _ in range(clients)]
    records = []
    for run_seed in range(seeds):
        for method, budgets in METHODS.items():
            for budget in budgets:
                gain = EFFECTS[method] + (0.01 * budget if budget else 0.0)
                for index, level in enumerate(levels):
                    value = min(1.0, max(0.0, level + gain + rng.gauss(0.0, SEED_NOISE)))
                    records.append(
                        {
                            "method": method,
                            "budget": budget,
                            "pool": "seen",
                            "client": client_id(index),
                            "group": client_id(index),
                            "seed": run_seed,
                            "round": 3 if method != "base" else None,
                            "split": "test",
                            "metric": "accuracy",
                            "value": round(value, 4),
                        }
                    )
    return records


def write_client_run(run_dir: Path, clients: int, seeds: int = 3, *, seed: int = 0) -> Path:
    """A run directory of :func:`client_records` (``results.jsonl``), with the ``data.json`` (a row per group) and
    ``config.yaml`` a run writes; returns ``run_dir``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    records = client_records(clients, seeds, seed=seed)
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    groups = {
        client_id(i): {"seen clients": 1, "seen train/client": 6, "seen test/client": TEST_PER_CLIENT}
        for i in range(clients)
    }
    overview = {"dataset": "files", "task": "classification", "groups": groups}
    (run_dir / "data.json").write_text(json.dumps(overview, indent=2) + "\n")
    (run_dir / "config.yaml").write_text(f"name: clients-{clients}\nseeds: {list(range(seeds))}\n")
    (run_dir / ".fedpeft-run").write_text('{"format": 1, "kind": "run"}\n')
    return run_dir


def report_measured(run_dir: Path, out: Path, *, plots: bool = True) -> dict[str, float]:
    """Run ``fedpeft report`` on ``run_dir`` into ``out`` in a process of its own: wall and CPU seconds, peak RSS
    (MiB)."""
    command = [sys.executable, "-c", "from fedpeft.cli import main; main()", "report", str(run_dir), "--out", str(out)]
    # PYTHONPATH=<another checkout> measures that checkout's report (the same generator, another fedpeft).
    command += [] if plots else ["--no-plots"]
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        # From the scratch directory: `python -c` puts its working directory first on the path, before PYTHONPATH.
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "COLUMNS": "100"}, cwd=out.parent
        )
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"fedpeft report exited {os.waitstatus_to_exitcode(status)}:\n{err.read()[-4000:]}")
    return {
        "report_s": round(seconds, 2),
        "report_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),  # what a busy machine's wall time hides
        "report_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def output_sizes(out: Path) -> dict[str, object]:
    """The longest line of ``out/summary.md``, the widest plot in pixels and every file's bytes."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # a heatmap of a column per client passes PIL's guard against decompression bombs
    summary = (out / "summary.md").read_text()
    widths = {p.name: Image.open(p).size for p in sorted((out / "plots").glob("*.png"))}
    return {
        "summary_longest_line": max(map(len, summary.splitlines())),
        "summary_lines": len(summary.splitlines()),
        "plot_pixels": widths,
        "bytes": {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()},
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="10 and 40 clients, 2 seeds: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.seeds = [10, 40], 2
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for clients in args.clients:
            run_dir = write_client_run(Path(scratch) / f"run{clients}", clients, args.seeds)
            out = Path(scratch) / f"report{clients}"
            row: dict[str, object] = {"clients": clients, "seeds": args.seeds}
            row.update(report_measured(run_dir, out, plots=not args.no_plots))
            row.update(output_sizes(out))
            print(json.dumps({k: v for k, v in row.items() if k != "bytes"}), flush=True)
            rows.append(row)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
