"""Deployment against the local engine: the same experiment through a SuperLink and SuperNodes on loopback.

For each config (a preset name or YAML path; a semicolon-separated list of overrides may follow after ``@``):
runs ``fedpeft run`` (local engine) and ``flwr run .`` against a SuperLink and ``--nodes`` SuperNodes on this
machine (``fedpeft.apps.loopback``), both as fresh processes, and writes the wall times, their ratio, the
messages per run, the model loads per node, and the seconds of the nodes' messages split into Flower's start of
a ClientApp process, the node worker's start and model load (once per run), fedpeft's relay and codec, and the
clients' own work (from the run's ``costs.jsonl``, method ``engine``).

``--quick``: smoke cut to 2 clients of one language and one round of FedIT on 2 nodes: checks that it runs.

Usage: python benchmarks/deployment.py [CONFIG[@OVERRIDES] ...] [--nodes 2] [--out benchmarks/results/deployment.json]
       [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedpeft.apps.loopback import LoopbackDeployment
from fedpeft.core.config import dump_given, load_config

REPO = Path(__file__).resolve().parents[1]
PARTS = ("flower_start_seconds", "worker_startup_seconds", "fedpeft_overhead_seconds", "client_work_seconds")
QUICK = [
    "base.kind=pretrained",
    "data.groups=[lat1]",
    "data.unseen_pool=false",
    "data.train_per_group=24",
    "data.test_per_group=8",
    "budgets=[2]",
    "methods=[{name: fedit, rounds: 1, fraction: 1.0, local_steps: 1, lr: 0.005}]",
    "output.plots=false",
]


def local_run(config: str, overrides: list[str], out: Path) -> float:
    command = [str(Path(sys.executable).parent / "fedpeft"), "run", config, "--out", str(out)]
    command += [arg for o in overrides for arg in ("--set", o)]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - started


def deployment_run(config: str, overrides: list[str], out: Path, nodes: int, workdir: Path) -> float:
    node_configs = [f"partition-id={i} num-partitions={nodes} worker-dir='{workdir / 'w'}'" for i in range(nodes)]
    with LoopbackDeployment(workdir, node_configs, {"OMP_NUM_THREADS": "1"}) as deployment:
        run_config = f"config='{config}' out='{out}' overrides='{';'.join(overrides)}'"
        started = time.perf_counter()
        finished = deployment.run(REPO, run_config, timeout=3600)
        seconds = time.perf_counter() - started
    if finished.returncode != 0 or not (out / "summary.md").exists():
        raise SystemExit(f"the deployment run failed:\n{(finished.stdout + finished.stderr)[-3000:]}")
    return seconds


def node_counters(out: Path) -> dict[str, dict[str, float]]:
    nodes: dict[str, dict[str, float]] = {}
    for line in (out / "costs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["method"] == "engine":
            nodes.setdefault(str(row["node"]), {})[row["metric"]] = row["value"]
    return nodes


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", default=["smoke"])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "deployment.json")
    parser.add_argument("--quick", action="store_true", help="smoke cut to 2 clients and one round, on 2 nodes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fpq") as quick:
        if args.quick:
            config = Path(quick) / "quick.yaml"
            config.write_text(dump_given(load_config("smoke", QUICK)))
            args.configs, args.nodes = [str(config)], 2
        return compare(args.configs, args.nodes, args.out)


def compare(configs: list[str], nodes_per_run: int, out: Path) -> list[dict]:
    """Each config on the local engine and on a loopback deployment of ``nodes_per_run`` nodes; the rows."""
    rows = []
    for spec in configs:
        config, _, extra = spec.partition("@")
        overrides = [o.strip() for o in extra.split(";") if o.strip()]
        with tempfile.TemporaryDirectory(prefix="fpd") as tmp:
            work = Path(tmp)
            local = local_run(config, overrides, work / "local")
            deployed = deployment_run(config, overrides, work / "deployed", nodes_per_run, work)
            nodes = node_counters(work / "deployed")
        messages = sum(n["messages"] for n in nodes.values())
        row = {"config": spec, "nodes": nodes_per_run, "local_s": local, "deployment_s": deployed}
        row.update(ratio=deployed / local, messages=messages, model_loads=[n["model_loads"] for n in nodes.values()])
        row.update({part: sum(n[part] for n in nodes.values()) / messages for part in PARTS})
        row["message_seconds"] = sum(n["message_seconds"] for n in nodes.values()) / messages
        rows.append(row)
        print(json.dumps(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(
        "| config | local s | deployment s | ratio | messages | model loads per node | per message: Flower start "
        "s | worker start + model load s | fedpeft overhead s | client work s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        parts = " | ".join(f"{r[p]:.2f}" for p in PARTS)
        loads = ", ".join(str(int(n)) for n in r["model_loads"])
        print(f"| {r['config']} | {r['local_s']:.1f} | {r['deployment_s']:.1f} | {r['ratio']:.2f} | "
              f"{r['messages']:.0f} | {loads} | {parts} |")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
