"""Peak memory of the local engine with 60 and with 600 clients.

Each size runs in its own process (so peak RSS figures are independent): the XNLI-style benchmark with 15
languages (one of them only in the unseen pool: 58 and 580 clients), 2 pools and 2 or 20 clients per language
and pool (about 100 training samples per client either way), the tiny BERT, a disk client-state store, 3 FedIT
rounds at 10 % participation, then personalization and evaluation of every client. The 600-client run should
exceed the 60-client run by no more than its extra data explains.

``--quick``: 1 and 2 clients per language and pool of two languages, one round: checks that it runs.

Usage: python benchmarks/client_memory.py [--out benchmarks/results/client_memory.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, pickle
from pathlib import Path
from fedpeft.core.config import load_config
from fedpeft.core.costs import peak_rss_mb
from fedpeft.runner import Experiment
from fedpeft.worker import build_data
clients, out = int(sys.argv[1]), Path(sys.argv[2])
overrides = [
    "name=client-memory", "seeds=[0]", "data.groups=null", f"data.clients_per_group={clients}",
    f"data.train_per_group={100 * clients}", f"data.test_per_group={25 * clients}",
    "base.kind=pretrained", "budgets=[4]", "engine.state=disk",
    "methods=[{name: fedit, rounds: 3, fraction: 0.1, local_steps: 5, lr: 0.001}]",
    "output.save_adapters=false", "output.plots=false", "engine.workers=1", *json.loads(sys.argv[3]),
]
cfg = load_config("smoke", overrides)
Experiment(cfg, out).run()
peak = peak_rss_mb()
data = build_data(cfg)  # the run's federation, from the data cache
data_mb = len(pickle.dumps(data.clients)) / 2**20
print(json.dumps({"clients": len(data.clients), "peak_rss_mb": peak, "client_data_pickle_mb": data_mb}))
"""


QUICK = ["data.groups=[lat1, cyr1]", "methods=[{name: fedit, rounds: 1, fraction: 0.5, local_steps: 1, lr: 0.001}]"]


def measure(clients_per_group: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [sys.executable, "-c", CHILD, str(clients_per_group), str(Path(tmp) / "run"), json.dumps(extra)],
            check=True,
            capture_output=True,
            text=True,
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/client_memory.json"))
    parser.add_argument("--quick", action="store_true", help="1 and 2 clients of two languages: checks that it runs")
    args = parser.parse_args(argv)
    extra = QUICK if args.quick else []
    small, large = (measure(1, extra), measure(2, extra)) if args.quick else (measure(2, extra), measure(20, extra))
    result = {
        "runs": [small, large],
        "rss_increase_pct": 100 * (large["peak_rss_mb"] / small["peak_rss_mb"] - 1),
        "extra_client_data_mb": large["client_data_pickle_mb"] - small["client_data_pickle_mb"],
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
