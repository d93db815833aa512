"""A smoke of the authors' FedP2EFT pipeline on a tiny fedpeft federation, on the CPU.

The steps of their ``run_xnli.sh`` for FedP2EFT, with its hyperparameters (r_init 32, lora_alpha 64, scales' lr
0.01, task lr 1e-4, sparsity 0.01, significance 100, stage 2 ten Adam steps, two local epochs at batch 32), on the
federation ``export_federation.py --quick`` writes (4 seen and 6 unseen clients, the tiny BERT after the preset's
centralized base stage):

1. ``export``: the federation and base model, in fedpeft's environment;
2. ``federated``: the PSG trained ``--rounds`` rounds on the seen pool, ``--clients-per-round`` clients a round,
   then evaluated on the seen pool at r = 16 (``eval_rank`` of their script's training run);
3. ``r<budget>-<pool>``: their ``test_only`` personalization of every client of each pool at each budget, from the
   PSG of the last round.

Every step runs under ``measure.py`` (wall time, peak memory of the process tree). Their code exits 0 even when a
client fails (``os._exit(0)`` in ``LLMServer``), so a step counts as done only when its results file holds
accuracies. Written under ``--run``: ``logs/<step>.log``, ``smoke.json`` (measurements and accuracies); the table
is printed.

Usage (in fedpeft's environment, after setup.sh):
  python benchmarks/official/fedp2eft/smoke.py
  python benchmarks/official/fedp2eft/smoke.py --rounds 3 --budgets 2 16 --run /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"

# run_xnli.sh's FedP2EFT block (BTS_LR, SPARSITY_WEIGHT, SIG_WEIGHT, BT_MAX_RANK) and seed of its first run
THEIR_ARGUMENTS = (
    "app.client.args.bts_lr=0.01",
    "app.client.args.task_lr=0.0001",
    "app.client.args.loss_weights.sparsity=0.01",
    "app.client.args.loss_weights.significance=100",
    "seed=42",
    "models.net.args.seed=42",
    "models.net.args.adapter_args.r=32",
    "models.net.args.adapter_args.lora_alpha=64",
)

# this machine: no CUDA device, no network for wandb, one client actor at a time on a shared 2-core machine
CPU_ARGUMENTS = (
    "wandb_args.mode=disabled",
    "models.net.args.device_map=cpu",
    "simulation.ray_init_args.num_cpus=1",
    "cpus=1",
    "cpu_threads=1",
)

OFFLINE_ENV = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def their_command(work: Path, federation: Path, run: Path, name: str, extra: list[str]) -> list[str]:
    """Their ``main.py`` with the XNLI FedP2EFT configs and the arguments of this federation and machine."""
    repo = work / "repo"
    overrides = (federation / "overrides.txt").read_text().split()
    return [
        str(work / "venv" / "bin" / "python"),
        str(repo / "main.py"),
        str(repo / "configs" / "xnli" / "xnli_fedp2eft.yaml"),
        str(repo / "configs" / "xnli" / "server.yaml"),
        *overrides,
        *CPU_ARGUMENTS,
        f"model_directory={run / 'models'}",
        *THEIR_ARGUMENTS,
        *extra,
        f"name={name}",
    ]


def measured(step: str, command: list[str], run: Path, env: dict[str, str] | None = None) -> dict:
    """Run ``command`` from ``run`` under measure.py, its output to ``logs/<step>.log``; the measurement."""
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out = logs / f"{step}.json"
    wrapper = [sys.executable, str(HERE / "measure.py"), "--out", str(out), "--", *command]
    with open(logs / f"{step}.log", "w") as log:
        subprocess.run(wrapper, cwd=run, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return json.loads(out.read_text())


def results_of(run: Path, name: str) -> dict:
    """The metrics their run ``name`` saved (``wandb/<name>/<run id>/results.pkl``): a test-only run's
    ``server_metrics``, or the last round's of a federated run; empty if there are none."""
    found = sorted((run / "wandb" / name).glob("*/results.pkl"))
    if not found:
        return {}
    with open(found[-1], "rb") as handle:
        saved = pickle.load(handle)
    if "server_metrics" in saved:
        metrics = saved["server_metrics"]
    else:  # federated: one entry per round, metrics where the round evaluated
        evaluated = [entry["server_metrics"] for entry in saved.values() if entry.get("server_metrics")]
        metrics = evaluated[-1] if evaluated else {}
    return {key: float(value) for key, value in (metrics or {}).items()}


def summary(metrics: dict) -> dict:
    """Mean over clients of the per-client accuracies (x100), the clients' count, and the average over
    languages that their code reports (``avg_accuracy``)."""
    clients = [value for key, value in metrics.items() if key.startswith("client") and key.endswith("_accuracy")]
    return {
        "clients": len(clients),
        "client_mean_accuracy": round(100 * sum(clients) / len(clients), 2) if clients else None,
        "avg_accuracy": round(metrics["avg_accuracy"], 2) if "avg_accuracy" in metrics else None,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=WORK, help="setup.sh's work folder (repo/, venv/)")
    parser.add_argument("--run", type=Path, default=WORK / "smoke", help="folder of this smoke's outputs")
    parser.add_argument("--federation", type=Path, help="an exported federation to use instead of --quick's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients-per-round", type=int, default=2)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 16])
    args = parser.parse_args(argv)
    work, run = args.work.resolve(), args.run.resolve()
    run.mkdir(parents=True, exist_ok=True)
    env = dict(OFFLINE_ENV)
    steps = []
    started = time.perf_counter()

    federation = args.federation.resolve() if args.federation else run / "federation"
    if args.federation is None:
        export = [sys.executable, str(HERE / "export_federation.py"), "--out", str(federation), "--quick", "--force"]
        steps.append({"step": "export", **measured("export", export, run)})

    rounds = args.rounds
    schedule = [
        f"app.run.num_rounds={rounds}",
        f"app.run.test_every_n={rounds}",
        f"app.run.save_every_n={rounds}",
        f"server.strategy.args.min_fit_clients={args.clients_per_round}",
    ]
    name = "fedp2eft_federated"
    command = their_command(work, federation, run, name, [*schedule, "app.client.args.eval_rank=16"])
    steps.append({"step": "federated", "name": name, **measured("federated", command, run, env)})
    psg = run / "models" / name / f"weights_round_{rounds}.pkl"
    for budget in args.budgets:
        for pool in ("seen", "unseen"):
            step = f"r{budget}-{pool}"
            extra = [
                *schedule,
                f"app.client.args.eval_rank={budget}",
                f"app.args.load_fedl2p_params={psg}",
                "app.args.test_only=True",
                f"data.args.pool={pool}",
            ]
            name = f"fedp2eft_{step}"
            steps.append(
                {
                    "step": step,
                    "name": name,
                    **measured(step, their_command(work, federation, run, name, extra), run, env),
                }
            )

    for entry in steps:
        if "name" in entry:
            entry.update(summary(results_of(run, entry.pop("name"))))
        entry.pop("command", None)
    result = {"rounds": rounds, "budgets": args.budgets, "total_wall_s": round(time.perf_counter() - started, 1)}
    result["steps"] = steps
    (run / "smoke.json").write_text(json.dumps(result, indent=1) + "\n")
    print("| step | wall s | peak tree RSS MiB | peak actor RSS MiB | clients | mean accuracy | avg over languages |")
    print("|---|---|---|---|---|---|---|")
    for entry in steps:
        cells = [entry["step"], entry["wall_s"], entry["peak_tree_rss_mib"], entry["peak_actor_rss_mib"]]
        cells += [entry.get("clients", ""), entry.get("client_mean_accuracy", ""), entry.get("avg_accuracy", "")]
        print("| " + " | ".join(str(cell) for cell in cells) + " |")
    print(f"total {result['total_wall_s']} s; {run / 'smoke.json'}")
    done = all(entry.get("clients", 1) for entry in steps)
    if not done:
        print("a step saved no accuracies: see its log under", run / "logs")
    return result


if __name__ == "__main__":
    main()
