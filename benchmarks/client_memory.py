"""Peak memory of the local engine with 60 and with 600 clients.

Each size runs in its own process (so peak RSS figures are independent): the XNLI-style benchmark with 15
languages (one of them only in the unseen pool: 58 and 580 clients), 2 pools and 2 or 20 clients per language
and pool (about 100 training samples per client either way), the tiny BERT, a disk client-state store, 3 FedIT
rounds at 10 % participation, then personalization and evaluation of every client. The 600-client run should
exceed the 60-client run by no more than its extra data explains.

Usage: python benchmarks/client_memory.py [--out benchmarks/results/client_memory.json]
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
clients, out = int(sys.argv[1]), Path(sys.argv[2])
overrides = [
    "name=client-memory", "seeds=[0]", "data.groups=null", f"data.clients_per_group={clients}",
    f"data.train_per_group={100 * clients}", f"data.test_per_group={25 * clients}",
    "base.kind=pretrained", "budgets=[4]", "engine.state=disk",
    "methods=[{name: fedit, rounds: 3, fraction: 0.1, local_steps: 5, lr: 0.001}]",
    "output.save_adapters=false", "output.plots=false",
]
experiment = Experiment(load_config("smoke", overrides), out)
experiment.run()
data = experiment.data
data_mb = len(pickle.dumps(data.clients)) / 2**20
print(json.dumps({"clients": len(data.clients), "peak_rss_mb": peak_rss_mb(), "client_data_pickle_mb": data_mb}))
"""


def measure(clients_per_group: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [sys.executable, "-c", CHILD, str(clients_per_group), str(Path(tmp) / "run")],
            check=True,
            capture_output=True,
            text=True,
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/client_memory.json"))
    args = parser.parse_args()
    small, large = measure(2), measure(20)
    result = {
        "runs": [small, large],
        "rss_increase_pct": 100 * (large["peak_rss_mb"] / small["peak_rss_mb"] - 1),
        "extra_client_data_mb": large["client_data_pickle_mb"] - small["client_data_pickle_mb"],
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
