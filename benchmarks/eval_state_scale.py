"""The evaluation between rounds (``eval.every``) and the disk client-state store at many clients.

``--eval N ...``: for each N, ``fedpeft run smoke`` on synthetic XNLI with N clients of one language (4 train and
2 test rows each), FedIT for 2 rounds of 10 clients (all N below 10) on the pretrained tiny BERT, once with
``eval.every=1`` and once without; the difference of the two runs' CPU seconds is what the evaluations between
rounds cost, and a run that writes the ``round_evaluation`` rows of ``costs.jsonl`` also gives their wall seconds.

``--store N ...``: for each N, a disk store (:class:`fedpeft.core.stores.DiskStore`) in a fresh directory: two
passes of ``put`` over N clients (tiny states, rounds 0 and 1), then one pass of ``get``; the seconds of each.

Both measure whatever ``fedpeft`` this Python imports: run once more with ``PYTHONPATH`` set to another checkout
(from a directory outside this one) to measure it before a change.

Usage: python benchmarks/eval_state_scale.py [--eval 100 300 1000] [--store 1000 10000] [--out results.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_overrides(clients: int, every: bool) -> list[str]:
    overrides = [
        "name=eval-scale",
        "data.groups=[lat1]",
        f"data.clients_per_group={clients}",
        f"data.train_per_group={4 * clients}",
        f"data.test_per_group={2 * clients}",
        "data.unseen_pool=false",
        "data.partition=iid",
        "base.kind=pretrained",
        "budgets=[4]",
        f"methods=[{{name: fedit, rounds: 2, fraction: {min(1.0, 10 / clients)}, local_steps: 1, lr: 0.005}}]",
        "output.save_adapters=false",
        "output.plots=false",
    ]
    return overrides + (["eval.every=1"] if every else [])


def timed_run(out: Path, overrides: list[str]) -> dict[str, float]:
    """Wall and CPU seconds of one ``fedpeft run`` (its processes), and its evaluation rows if it writes them."""
    args = [sys.executable, "-m", "fedpeft.cli", "run", "smoke", "--out", str(out)]
    for override in overrides:
        args += ["--set", override]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = {"wall_s": wall, "cpu_s": cpu}
    for line in (out / "costs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") == "round_evaluation":
            found[f"evaluation_{row['metric']}"] = row["value"]
    return found


def eval_scale(clients: int, scratch: Path) -> dict[str, float]:
    plain = timed_run(scratch / f"plain-{clients}", run_overrides(clients, every=False))
    evaluated = timed_run(scratch / f"every-{clients}", run_overrides(clients, every=True))
    row = {"clients": clients, "cpu_s_without": plain["cpu_s"], "cpu_s_with": evaluated["cpu_s"]}
    row["evaluation_cpu_s"] = evaluated["cpu_s"] - plain["cpu_s"]
    row.update({k: v for k, v in evaluated.items() if k.startswith("evaluation_")})
    return row


def store_scale(clients: int, scratch: Path) -> dict[str, float]:
    import torch

    from fedpeft.core.stores import DiskStore

    root = scratch / f"store-{clients}"
    store = DiskStore(root)
    ids = [f"client-{i:06d}" for i in range(clients)]
    row: dict[str, float] = {"clients": clients}
    for round_ in (0, 1):
        started = time.perf_counter()
        for client_id in ids:
            store.put(client_id, {"w": torch.full((16,), float(round_))}, round_)
        row[f"put_round{round_}_s"] = time.perf_counter() - started
    started = time.perf_counter()
    for client_id in ids:
        store.get(client_id)
    row["get_s"] = time.perf_counter() - started
    shutil.rmtree(root)
    return row


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval", type=int, nargs="*", default=[])
    parser.add_argument("--store", type=int, nargs="*", default=[])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (4 clients each): checks that it runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.eval, args.store = [4], [4]
    import fedpeft

    results: dict[str, object] = {"fedpeft": str(Path(fedpeft.__file__).parent), "eval": [], "store": []}
    with tempfile.TemporaryDirectory() as scratch:
        for clients in args.store:
            results["store"].append(store_scale(clients, Path(scratch)))  # type: ignore[attr-defined]
            print(json.dumps(results["store"][-1]), flush=True)  # type: ignore[index]
        for clients in args.eval:
            results["eval"].append(eval_scale(clients, Path(scratch)))  # type: ignore[attr-defined]
            print(json.dumps(results["eval"][-1]), flush=True)  # type: ignore[index]
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
