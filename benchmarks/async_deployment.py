"""Synchronous against asynchronous rounds on a real Flower deployment: SuperLink and SuperNodes on loopback.

Runs a config whose methods spend the same client updates synchronously and asynchronously (default: the
``async-cpu`` preset: ``sync`` FedIT, ``fedbuff``, ``fedasync``) through ``flwr run`` against a SuperLink and
``--nodes`` SuperNodes on this machine (``fedpeft.apps.loopback``). Devices of different speeds are played by
``faults: slow``: the clients of node j (clients whose id ends in a number i with i mod nodes = j, which is also
how the partitions map to nodes) wait ``(tier_j - 1) x --unit`` seconds before each local update, ``--tiers``
giving tier_j (FLAME's 1, 2, 4, 8 by default). Nothing here is a virtual clock: a node's reply decides the order.
The methods run one after the other (``engine.concurrent_methods=1``), each phase with the nodes to itself.

Writes, per seed and method, the wall seconds of the federated phase (the sum of its server steps' ``seconds``),
the server steps, the mean staleness and the final test metric over the clients, and keeps the run directory
(``--out``) for ``docs/results/async/deployment.py``.

``--quick``: the preset cut to 2 clients (one per node) of 10 examples per category, one synchronous round of
FedIT and 2 server steps of FedAsync with both clients in flight (the second update one step stale), on 2 nodes of
tiers 1 and 2 (unit 0.5 s): checks that it runs.

Usage: python benchmarks/async_deployment.py [CONFIG] [--nodes 4] [--tiers 1 2 4 8] [--unit 1.0] [--out DIR]
       [--set KEY=VALUE ...] [--quick]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fedpeft.apps.loopback import LoopbackDeployment
from fedpeft.core.config import dump_given, load_config

REPO = Path(__file__).resolve().parents[1]
_NUMBER = re.compile(r"(\d+)$")
QUICK = [
    "seeds=[0]",
    "base.kind=pretrained",
    "data.options={num_clients: 2, samples: 20, categories: [add, plural], base_categories: [add]}",
    "eval={max_new_tokens: 4}",
    "methods=[{name: fedit, label: sync, rounds: 1, fraction: 1.0, local_steps: 1, batch_size: 4, rank: 4}, "
    "{name: fedit, label: fedasync, rounds: 2, local_steps: 1, batch_size: 4, rank: 4, "
    "schedule: {kind: fedasync, concurrency: 2}}]",
]


def tier_faults(client_ids: list[str], nodes: int, tiers: list[float], unit: float) -> list[dict]:
    """One ``slow`` fault per tier above 1: the clients of node j wait ``(tiers[j] - 1) * unit`` seconds."""
    by_node: dict[int, list[str]] = {}
    for client_id in sorted(client_ids):
        match = _NUMBER.search(client_id)
        if match is None:
            raise SystemExit(f"client {client_id!r} has no number at the end of its id to give it a tier")
        by_node.setdefault(int(match.group(1)) % nodes, []).append(client_id)
    faults = []
    for node, clients in sorted(by_node.items()):
        wait = (tiers[node % len(tiers)] - 1.0) * unit
        if wait > 0:
            faults.append({"kind": "slow", "clients": clients, "value": round(wait, 6)})
    return faults


def final_mean(evaluations: list[tuple[int, float]]) -> float | None:
    """The mean over clients of the evaluations at the last round evaluated (the phase's final evaluation)."""
    if not evaluations:
        return None
    last = max(round_ for round_, _ in evaluations)
    return statistics.fmean(value for round_, value in evaluations if round_ == last)


def summary(run_dir: Path, metric: str) -> list[dict]:
    """Per seed and method: the federated phase's wall seconds, server steps, mean staleness, final ``metric``."""
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    found: dict[tuple[int, str], dict] = {}
    for r in rows:
        if r["method"] == "base":
            continue
        entry = found.setdefault((r["seed"], r["method"]), {"seconds": 0.0, "steps": 0, "staleness": [], "final": []})
        if r["split"] == "train" and r["metric"] == "seconds":
            entry["seconds"] += r["value"]
            entry["steps"] += 1
        elif r["split"] == "train" and r["metric"] == "staleness":
            entry["staleness"].append(r["value"])
        elif r["split"] == "test" and r["metric"] == metric:
            entry["final"].append((r["round"] or 0, r["value"]))
    return [
        {
            "seed": seed,
            "method": method,
            "phase_seconds": e["seconds"],
            "server_steps": e["steps"],
            "mean_staleness": statistics.fmean(e["staleness"]) if e["staleness"] else 0.0,
            f"final_{metric}": final_mean(e["final"]),
        }
        for (seed, method), e in sorted(found.items())
    ]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default="async-cpu")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--tiers", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--unit", type=float, default=1.0, help="seconds of one tier step")
    parser.add_argument("--metric", default="rougeL")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "async-deployment")
    parser.add_argument("--quick", action="store_true", help="2 clients on 2 nodes: checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.tiers, args.unit, args.overrides = 2, [1.0, 2.0], 0.5, [*QUICK, *args.overrides]

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the deployment's processes end with the script
    # One method at a time, so that each phase has the nodes to itself (a deployment runs them all at once).
    args.overrides = ["engine.concurrent_methods=1", *args.overrides]
    cfg = load_config(args.config, args.overrides)
    from fedpeft.worker import build_data

    client_ids = [c.client_id for c in build_data(cfg).clients]
    faults = [f.model_dump(exclude_defaults=True) for f in cfg.faults]
    faults += tier_faults(client_ids, args.nodes, args.tiers, args.unit)
    cfg = load_config(args.config, [*args.overrides, f"faults={json.dumps(faults)}"])
    with tempfile.TemporaryDirectory(prefix="fpa") as tmp:
        work = Path(tmp)
        config = work / "config.yaml"
        config.write_text(dump_given(cfg))
        node_configs = [
            f"partition-id={i} num-partitions={args.nodes} worker-dir='{work / 'w'}'" for i in range(args.nodes)
        ]
        with LoopbackDeployment(work, node_configs, {"OMP_NUM_THREADS": "1"}) as deployment:
            started = time.perf_counter()
            finished = deployment.run(REPO, f"config='{config}' out='{args.out.resolve()}'", timeout=6 * 3600)
            wall = time.perf_counter() - started
    if finished.returncode != 0 or not (args.out / "summary.md").exists():
        sys.exit(f"the deployment run failed:\n{(finished.stdout + finished.stderr)[-3000:]}")
    rows = summary(args.out, args.metric)
    result = {"config": args.config, "overrides": args.overrides, "nodes": args.nodes, "tiers": args.tiers}
    result.update(unit=args.unit, run_seconds=wall, rows=rows)
    (args.out / "async_deployment.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"| seed | method | phase s | server steps | mean staleness | final {args.metric} x100 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        final = r[f"final_{args.metric}"]
        final_text = "—" if final is None else f"{final * 100:.2f}"
        print(
            f"| {r['seed']} | {r['method']} | {r['phase_seconds']:.1f} | {r['server_steps']} | "
            f"{r['mean_staleness']:.2f} | {final_text} |"
        )
    print(f"\nthe whole run: {wall:.0f} s")
    return result


if __name__ == "__main__":
    main()
