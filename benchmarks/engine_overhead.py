"""Engine overhead: wall time of the federated and personalization loops over the clients' own work.

Runs 20 seen clients x 5 FedIT rounds (every client every round) followed by the evaluation of every client, on
the local engine and on the Flower simulation engine, and writes for each the ratio

    wall time of the engine's loops / summed time of the clients' training and evaluation work

measured in the same process. For the Flower simulation engine the client work runs in Ray workers, which report
their own work time in their replies; its ratio is given for the federated rounds (the local engine's too, for
comparison). A ratio of 1.0 means the engine adds nothing. Also reported: the whole run's wall time including
data generation, model loading and writing the outputs.

Usage: python benchmarks/engine_overhead.py [--engines local flower] [--out benchmarks/results/engine_overhead.json]
       [--quick]   (4 clients, 2 rounds of 2 steps: checks that it runs)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fedpeft.core.config import load_config
from fedpeft.worker import Worker

OVERRIDES = [
    "name=engine-overhead",
    "seeds=[0]",
    "data.groups=[lat1, cyr1]",
    "data.clients_per_group=10",
    "data.train_per_group=1000",
    "data.test_per_group=500",
    "data.unseen_pool=false",
    "base.kind=pretrained",
    "budgets=[8]",
    "methods=[{name: fedit, rounds: 5, fraction: 1.0, local_steps: 10, lr: 0.001}]",
    "output.save_adapters=false",
    "output.plots=false",
]

QUICK = [
    "data.clients_per_group=2",
    "data.train_per_group=40",
    "data.test_per_group=20",
    "methods=[{name: fedit, rounds: 2, fraction: 1.0, local_steps: 2, lr: 0.001}]",
]

WORK_OPS = ("train", "evaluate_base", "personalize")


class WorkClock:
    """Sums the time spent inside the worker's client operations (the clients' own work), and keeps when the
    base model's evaluation began and ended (its loop over the clients, timed from the first client to the last)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.base_span: list[float] = []

    def install(self) -> None:
        for op in WORK_OPS:
            original = getattr(Worker, op)
            if getattr(original, "timed", False):
                continue

            def timed(self_, *args, __original=original, __op=op, **kwargs):  # noqa: ANN001, ANN202
                started = time.perf_counter()
                try:
                    return __original(self_, *args, **kwargs)
                finally:
                    ended = time.perf_counter()
                    clock.seconds += ended - started
                    if __op == "evaluate_base":
                        clock.base_span = [clock.base_span[0] if clock.base_span else started, ended]

            timed.timed = True  # type: ignore[attr-defined]
            setattr(Worker, op, timed)


clock = WorkClock()


def loops_seconds(out: Path) -> float:
    """Wall seconds of the engine loops as the run's costs record them (federated + evaluation phases)."""
    total = 0.0
    for line in (out / "costs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["metric"] == "wall_s" and row["phase"] in ("federated", "personalization"):
            total += row["value"]
    return total


def run_local(out: Path, overrides: list[str]) -> dict:
    from fedpeft.runner import Experiment

    cfg = load_config("smoke", [*overrides, "engine.workers=1"])  # the clients' work in this process, where it is timed
    started = time.perf_counter()
    experiment = Experiment(cfg, out)
    clock.seconds, clock.base_span = 0.0, []
    experiment.run()
    whole = time.perf_counter() - started
    # The base-row evaluation (one seed: one loop over every client) is part of the loops too.
    loops = loops_seconds(out) + clock.base_span[1] - clock.base_span[0]
    wall, work = federated_ratio(out)
    return {
        "engine": "local",
        "loops_s": loops,
        "client_work_s": clock.seconds,
        "ratio": loops / clock.seconds,
        "federated_wall_s": wall,
        "federated_client_work_s": work,
        "federated_ratio": wall / work,
        "whole_run_s": whole,
    }


def federated_ratio(out: Path) -> tuple[float, float]:
    """(wall seconds of the federated rounds, summed client-reported work seconds of those rounds)."""
    values = {}
    for line in (out / "costs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["phase"] == "federated":
            values[row["metric"]] = row["value"]
    client_rounds = values["bytes_up_total"] / values["bytes_up_per_client_round"]
    return values["wall_s"], values["wall_s_per_client_round"] * client_rounds


def run_flower(out: Path, overrides: list[str]) -> dict:
    from fedpeft.apps.flower import run_flower_simulation

    cfg = load_config("smoke", [*overrides, "engine.name=flower"])
    started = time.perf_counter()
    run_flower_simulation(cfg, out, resume=False)
    whole = time.perf_counter() - started
    wall, work = federated_ratio(out)
    return {
        "engine": "flower-simulation",
        "federated_wall_s": wall,
        "federated_client_work_s": work,
        "federated_ratio": wall / work,
        "whole_run_s": whole,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=["local", "flower"], default=["local", "flower"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_overhead.json"))
    parser.add_argument("--quick", action="store_true", help="4 clients, 2 rounds of 2 steps: checks that it runs")
    args = parser.parse_args(argv)
    overrides = [*OVERRIDES, *QUICK] if args.quick else OVERRIDES
    clock.install()
    results = []
    for engine in args.engines:
        with tempfile.TemporaryDirectory() as tmp:
            run = run_local if engine == "local" else run_flower
            result = run(Path(tmp) / "run", overrides)
        print(json.dumps(result))
        results.append(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
