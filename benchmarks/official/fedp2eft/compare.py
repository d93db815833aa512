"""The same federation through the authors' FedP2EFT pipeline and fedpeft's: a resumable driver and its report.

``run`` runs, for the seeds and budgets asked, each step below under ``measure.py`` (wall time, peak RSS of the
process tree), skipping a step whose outputs exist, so that the work can be stopped and taken up again:

1. ``fedpeft-<method>-s<k>``: ``fedpeft run fedp2eft-xnli-cpu`` with one method (``lora``, ``bayestune_lora``,
   ``fedp2eft``), one seed k and the protocol's settings, into ``fedpeft/<method>/seed<k>/`` (done: its
   ``results.jsonl``). Each trains the preset's deterministic centralized base stage; ``report`` lists the hashes
   of every run's ``base_model/`` and of the export's model (one hash: one base model).
2. ``export``: ``export_federation.py --base-model`` of the first fedpeft run, so their pipeline starts from the
   same weights (done: ``federation/clients.json``).
3. ``authors-base-<pool>``: their evaluation of the base model alone (``xnli_lora.yaml`` with 0 epochs: B = 0, so
   the merged model is the base model in their bfloat16).
4. Per seed position p (their seed 42 + 10 p, run_xnli.sh's 42/52/62, paired with fedpeft's p-th seed), their
   ``main.py`` as ``run_xnli.sh`` calls it, with this machine's arguments (``smoke.py``):
   ``authors-fedp2eft-s<seed>-federated`` (the PSG's federated training, ``weights_round_<R>.pkl``) and
   ``authors-fedp2eft-s<seed>-r<b>-<pool>`` (``test_only`` from it); ``authors-lora-s<seed>-r<b>-<pool>``;
   ``authors-btlora-s<seed>-r<b>-<pool>``, the largest budget first (it learns each client's scales, which the
   smaller budgets load, as run_xnli.sh does). Done: the run's ``results.pkl`` holds every client's accuracy
   (``patches/04``); the federated step: its weights file.

Their federated step does not evaluate at its end (``test_every_n`` = rounds + 1; run_xnli.sh evaluates at r = 16 on
the seen pool, which the ``r16-seen`` step does again, with the same seed). Every step's measurement, load average
before and after, and (fedpeft) base model hash go to ``steps.json`` beside the outputs; logs to ``logs/``.

``report`` reads a run folder and writes ``comparison.json`` (the paired accuracies, structures, scales and costs)
and ``comparison.md`` (the tables), and an estimate of the full run from the measured per-step times.

Usage (fedpeft's environment; their work folder from setup.sh):
  nice -n 19 python benchmarks/official/fedp2eft/compare.py run --run runs/official-fedp2eft/aligned --protocol aligned
  nice -n 19 python benchmarks/official/fedp2eft/compare.py run --run /tmp/cmp --quick --seeds 0 --budgets 2 16
  python benchmarks/official/fedp2eft/compare.py report --run /tmp/cmp
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import math
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import comparison  # noqa: E402

WORK = HERE / ".work"
PRESET = "fedp2eft-xnli-cpu"
METHODS = ("lora", "bayestune_lora", "fedp2eft")
POOLS = ("seen", "unseen")
THEIR_NAME = {"lora": "lora", "bayestune_lora": "btlora", "fedp2eft": "fedp2eft"}
THEIR_CONFIG = {"lora": "xnli_lora.yaml", "bayestune_lora": "xnli_btlora.yaml", "fedp2eft": "xnli_fedp2eft.yaml"}
R_INIT = 32
"""r_init of BayesTune-LoRA and FedP2EFT on both sides (run_xnli.sh's BT_MAX_RANK; fedpeft's default)."""

QUICK = (
    "data.groups=[lat1,lat2,cyr1]",
    "data.clients_per_group=2",
    "data.train_per_group=120",
    "data.test_per_group=60",
)
"""The smoke-size federation (export_federation.py's ``--quick``, kept equal to it: a test checks)."""

PROTOCOLS = {
    # fedp2eft-xnli-cpu's task learning rate and batch, given to their command line as well
    "aligned": {"lr": 0.005, "batch_size": 16},
    # their configs' (batch 32; lr 1e-4: app.on_evaluate.lr of xnli_lora/btlora, task_lr of run_xnli.sh)
    "authors": {"lr": 0.0001, "batch_size": 32},
}
"""What the two protocols set on both sides; every other hyperparameter is equal in both pipelines' defaults and
is given explicitly below (README.md, "The comparison": the mapping, key by key)."""

# the full run that `report` estimates: the fedp2eft-xnli-cpu preset (docs/results/fedp2eft-xnli-cpu.md)
FULL = {"seeds": 3, "budgets": 4, "seen": 84, "unseen": 90, "per_round": 9, "train_per_client": 100}
ROUNDS = {"aligned": 60, "authors": 150}
"""Federated rounds of each protocol: the preset's 60; their configs' and run_xnli.sh's 150. Both sample a tenth of
the seen pool a round (their 30 of 300 seen clients; fedpeft's fraction 0.1)."""

OFFLINE_ENV = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
CPU_ARGUMENTS = (
    "wandb_args.mode=disabled",
    "models.net.args.device_map=cpu",
    "cpus=1",
    "cpu_threads=1",
)
"""This machine's arguments of their ``main.py`` (smoke.py's, less the Ray actors' count, which ``--workers`` sets:
``simulation.ray_init_args.num_cpus``, one actor of 1 CPU and 1 thread per client at a time)."""


def number(value: float) -> str:
    """A number as their command line parses it to a float or an int (``0.0001``, not ``1e-04``)."""
    return f"{value:.10f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


# ---------------------------------------------------------------------------------------------------------------
# the plan


def plan_of(args: argparse.Namespace) -> dict:
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else ROUNDS[args.protocol])
    fraction = args.fraction if args.fraction is not None else (0.5 if args.quick else 0.1)
    return {
        "protocol": args.protocol,
        "quick": args.quick,
        "rounds": rounds,
        "fraction": fraction,
        "seeds": list(args.seeds),
        "budgets": sorted(set(args.budgets)),
        "methods": [m for m in METHODS if m in args.methods],
        "federation": list(QUICK) if args.quick else [],
        "workers": args.workers,
    }


FIXED = ("protocol", "quick", "rounds", "fraction", "federation")
"""What a run folder's steps depend on beyond their names: a rerun must ask for the same."""


def fedpeft_entry(method: str, plan: dict) -> dict:
    """fedpeft's method entry for the protocol (README.md, the mapping)."""
    protocol = PROTOCOLS[plan["protocol"]]
    common = {"name": method, "lr": protocol["lr"], "batch_size": protocol["batch_size"]}
    if method == "lora":
        return {**common, "epochs": 2, "alpha_multiplier": 2.0, "dropout": 0.0}
    bayestune = {
        "r_init": R_INIT,
        "alpha_multiplier": 2.0,
        "dropout": 0.0,
        "lambda_lr": 0.01,
        "alpha_s": 100.0,
        "alpha_p": 0.01,
        "stage1_epochs": 2,
        "finetune_epochs": 2,
    }
    if method == "bayestune_lora":
        return {**common, **bayestune}
    return {
        **common,
        **bayestune,
        "rounds": plan["rounds"],
        "fraction": plan["fraction"],
        "min_clients": 1,
        "psg_lr": 0.0001,
        "psg_steps": 10,
        "psg_loss": "sum",
        "psg_gain": 1e-06,
        "psg_bias": 0.0001,
    }


def flow(value: object) -> str:
    """A value in YAML's flow style, for ``--set``."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {flow(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(flow(item) for item in value) + "]"
    return number(value) if isinstance(value, float) else str(value)


def fedpeft_command(method: str, seed: int, plan: dict, out: Path, resume: bool) -> list[str]:
    sets = [
        f"seeds=[{seed}]",
        f"budgets={flow(plan['budgets'])}",
        f"methods=[{flow(fedpeft_entry(method, plan))}]",
        *plan["federation"],
        f"engine.workers={plan.get('workers', 1)}",
    ]
    command = [str(Path(sys.executable).parent / "fedpeft"), "run", PRESET, "--out", str(out)]
    for setting in sets:
        command += ["--set", setting]
    return command + (["--resume"] if resume else [])


def per_round(plan: dict, seen: int) -> int:
    """Clients per round as fedpeft samples them: max(min_clients = 1, ceil(fraction x seen))."""
    return max(1, math.ceil(plan["fraction"] * seen - 1e-9))


def their_command(
    work: Path, federation: Path, authors: Path, method: str, seed: int, plan: dict, extra: list[str], name: str
) -> list[str]:
    """Their ``main.py`` with the method's XNLI config, this federation and machine, the protocol, ``extra``."""
    repo = work / "repo"
    protocol = PROTOCOLS[plan["protocol"]]
    lr, batch = number(protocol["lr"]), number(protocol["batch_size"])
    if method == "fedp2eft":
        # run_xnli.sh's FedP2EFT block (BTS_LR, SPARSITY_WEIGHT, SIG_WEIGHT, BT_MAX_RANK); task_lr the protocol's
        method_args = [
            "app.client.args.bts_lr=0.01",
            f"app.client.args.task_lr={lr}",
            "app.client.args.loss_weights.sparsity=0.01",
            "app.client.args.loss_weights.significance=100",
            f"models.net.args.adapter_args.r={R_INIT}",
            f"models.net.args.adapter_args.lora_alpha={2 * R_INIT}",
        ]
    else:  # lora, btlora: SeqClsApp fine-tunes at app.on_evaluate.lr
        method_args = [f"app.on_evaluate.lr={lr}"]
    method_args.append(f"app.client.args.batch_size={batch}")
    return [
        str(work / "venv" / "bin" / "python"),
        str(repo / "main.py"),
        str(repo / "configs" / "xnli" / THEIR_CONFIG[method]),
        str(repo / "configs" / "xnli" / "server.yaml"),
        *(federation / "overrides.txt").read_text().split(),
        *CPU_ARGUMENTS,
        f"simulation.ray_init_args.num_cpus={plan.get('workers', 1)}",
        f"model_directory={authors / 'models'}",
        *method_args,
        f"seed={seed}",
        f"models.net.args.seed={seed}",
        *extra,
        f"name={name}",
    ]


# ---------------------------------------------------------------------------------------------------------------
# their outputs


def results_of(authors: Path, name: str) -> dict:
    """The metrics their run ``name`` saved (``wandb/<name>/<run id>/results.pkl``): a test-only run's
    ``server_metrics``; empty if there are none."""
    found = sorted((authors / "wandb" / name).glob("*/results.pkl"), key=lambda p: p.stat().st_mtime)
    if not found:
        return {}
    with open(found[-1], "rb") as handle:
        saved = pickle.load(handle)
    metrics = saved.get("server_metrics") if isinstance(saved, dict) else None
    return {key: float(value) for key, value in (metrics or {}).items() if isinstance(value, (int, float))}


def client_accuracies(metrics: dict) -> dict[int, float]:
    return {
        int(key[len("client") : -len("_accuracy")]): value
        for key, value in metrics.items()
        if key.startswith("client") and key.endswith("_accuracy")
    }


def pool_ids(federation: Path, pool: str) -> list[int]:
    rows = json.loads((federation / "clients.json").read_text())
    return [row["cid"] for row in rows if row["pool"] == pool]


FLWR_LINE = re.compile(r"^(?:DEBUG|INFO) flwr (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) \| [^|]+\| (.*)$")


def flower_phases(log: Path) -> dict:
    """Seconds their run spent in federated rounds (``fit_round`` sampled -> received) and in evaluation
    (``configure_evaluate`` -> ``aggregate_evaluate``), from the Flower log lines' timestamps, with the counts."""
    fit = evaluate = 0.0
    rounds = evaluated = 0
    started: dict[str, datetime.datetime] = {}
    if not log.exists():
        return {}
    for line in log.read_text(errors="replace").splitlines():
        match = FLWR_LINE.match(line)
        if not match:
            continue
        when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
        text = match.group(2)
        if re.match(r"fit_round \d+: strategy sampled", text):
            started["fit"] = when
        elif re.match(r"fit_round \d+ received", text) and "fit" in started:
            fit += (when - started.pop("fit")).total_seconds()
            rounds += 1
        elif text.startswith("configure_evaluate: strategy sampled"):
            started["evaluate"] = when
            evaluated += int(re.search(r"sampled (\d+)", text).group(1))
        elif text.startswith("aggregate_evaluate: received") and "evaluate" in started:
            evaluate += (when - started.pop("evaluate")).total_seconds()
    return {"fit_s": round(fit, 1), "rounds": rounds, "evaluate_s": round(evaluate, 1), "evaluated": evaluated}


# ---------------------------------------------------------------------------------------------------------------
# steps


class Steps:
    """``steps.json``: each step's record, written after every step."""

    def __init__(self, run: Path):
        self.path = run / "steps.json"
        self.records: dict = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self) -> None:
        temporary = self.path.with_name(".steps.json.tmp")
        temporary.write_text(json.dumps(self.records, indent=1) + "\n")
        temporary.replace(self.path)


def sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


UNKEPT = tuple(f"fedpeft/*/seed*/{part}/*" for part in ("adapters", "checkpoints", "plots", "parts"))
"""What ``--keep`` leaves out of a step's archive: a finished fedpeft run's saved adapters (58 MiB for LoRA's 174
clients x 4 budgets), checkpoints, plots and per-unit record parts (merged into its results), which neither a later
step nor the report reads."""


def snapshot(run: Path) -> dict[str, tuple[int, float]]:
    """Every file under ``run`` (relative path: size, modification time) but ``steps.json`` and :data:`UNKEPT`."""
    files = {}
    for path in run.rglob("*"):
        if path.is_file() and not path.is_symlink():
            relative = path.relative_to(run)
            if any(relative.match(pattern) or any(p.match(pattern) for p in relative.parents) for pattern in UNKEPT):
                continue
            stat = path.stat()
            files[str(relative)] = (stat.st_size, stat.st_mtime)
    files.pop("steps.json", None)
    return files


def keep_step(keep: Path, run: Path, step: str, before: dict[str, tuple[int, float]], record: dict) -> Path:
    """Archive what step ``step`` wrote or changed under ``run`` (against ``before``) and its record, as
    ``keep/<step>.tar.gz``: a machine that lacks the run folder restores it with :func:`restore_steps`."""
    keep.mkdir(parents=True, exist_ok=True)
    changed = sorted(name for name, stat in snapshot(run).items() if before.get(name) != stat)
    target = keep / f"{step}.tar.gz"
    temporary = target.with_name(f".{target.name}.tmp")
    with tarfile.open(temporary, "w:gz") as archive:
        for name in changed:
            archive.add(run / name, arcname=f"files/{name}")
        data = (json.dumps(record, indent=1) + "\n").encode()
        info = tarfile.TarInfo("record.json")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    temporary.replace(target)
    return target


def restore_steps(keep: Path, run: Path, steps: Steps) -> list[str]:
    """Extract every ``keep/<step>.tar.gz`` whose step ``steps`` has no record of into ``run``, in the order the
    steps finished (a later step's files replace an earlier one's), and take its record; the steps restored."""
    archives = []
    for path in sorted(keep.glob("*.tar.gz")):
        step = path.name.removesuffix(".tar.gz")
        if step in steps.records:
            continue
        with tarfile.open(path, "r:gz") as archive:
            member = archive.extractfile("record.json")
            record = json.loads(member.read()) if member is not None else {}
        archives.append((record.get("finished", ""), step, path, record))
    restored = []
    for _, step, path, record in sorted(archives):
        with tarfile.open(path, "r:gz") as archive:
            files = [m for m in archive.getmembers() if m.name.startswith("files/")]
            for member in files:
                member.name = member.name.removeprefix("files/")
            archive.extractall(run, members=files, filter="data")
        steps.records[step] = {**record, "restored_from": str(path)}
        restored.append(step)
    if restored:
        steps.save()
    return restored


def measured(run: Path, step: str, command: list[str], cwd: Path, env: dict | None = None) -> dict:
    """Run ``command`` under measure.py from ``cwd``, output to ``logs/<step>.log``; the measurement."""
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out = logs / f"{step}.json"
    out.unlink(missing_ok=True)
    wrapper = [sys.executable, str(HERE / "measure.py"), "--out", str(out), "--", *command]
    load_before = os.getloadavg()
    with open(logs / f"{step}.log", "w") as log:
        subprocess.run(wrapper, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    result = json.loads(out.read_text()) if out.exists() else {"returncode": None}
    result.pop("command", None)
    result["load_before"] = [round(x, 2) for x in load_before]
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    return result


class Driver:
    def __init__(self, args: argparse.Namespace):
        self.run = args.run.resolve()
        self.work = args.work.resolve()
        self.plan = plan_of(args)
        self.run.mkdir(parents=True, exist_ok=True)
        saved = self.run / "plan.json"
        if saved.exists():
            before = json.loads(saved.read_text())
            changed = [key for key in FIXED if before.get(key) != self.plan[key]]
            if changed:
                sys.exit(f"{self.run} holds steps of another plan ({', '.join(changed)} differ); use another --run")
        saved.write_text(json.dumps(self.plan, indent=1) + "\n")
        self.steps = Steps(self.run)
        self.keep = args.keep.resolve() if getattr(args, "keep", None) else None
        if self.keep is not None and self.keep.is_dir():
            for step in restore_steps(self.keep, self.run, self.steps):
                print(f"[kept] {step}: restored from {self.keep}", flush=True)
        self.federation = self.run / "federation"
        self.authors = self.run / "authors"
        self.authors.mkdir(exist_ok=True)

    def step(self, name: str, done, command_fn, cwd: Path, env: dict | None = None, extra: dict | None = None) -> None:
        """Run step ``name`` unless ``done()``; stop the driver when it ends without its outputs."""
        if done():
            print(f"[skip] {name}: its outputs exist", flush=True)
            if name not in self.steps.records:
                self.steps.records[name] = {"note": "outputs found, not measured here"}
                self.steps.save()
            return
        command = command_fn()
        print(f"[run ] {name}", flush=True)
        before = snapshot(self.run) if self.keep is not None else {}
        result = measured(self.run, name, command, cwd, env)
        result["workers"] = self.plan["workers"]
        result.update(extra() if callable(extra) else (extra or {}))
        self.steps.records[name] = result
        self.steps.save()
        if not done():
            log = self.run / "logs" / f"{name}.log"
            sys.exit(f"step {name} ended (exit code {result.get('returncode')}) without its outputs: see {log}")
        print(f"       {result.get('wall_s')} s, peak tree {result.get('peak_tree_rss_mib')} MiB", flush=True)
        if self.keep is not None:
            kept = keep_step(self.keep, self.run, name, before, result)
            print(f"       kept: {kept} ({kept.stat().st_size / 2**20:.1f} MiB)", flush=True)

    # fedpeft ---------------------------------------------------------------------------------------------------

    def fedpeft_dir(self, method: str, seed: int) -> Path:
        return self.run / "fedpeft" / method / f"seed{seed}"

    def fedpeft_steps(self) -> None:
        for seed in self.plan["seeds"]:
            for method in self.plan["methods"]:
                out = self.fedpeft_dir(method, seed)

                def command(out=out, method=method, seed=seed):
                    resume = (out / ".fedpeft-run").exists()
                    out.parent.mkdir(parents=True, exist_ok=True)
                    return fedpeft_command(method, seed, self.plan, out, resume)

                self.step(
                    f"fedpeft-{method}-s{seed}",
                    lambda out=out: (out / "results.jsonl").exists(),
                    command,
                    self.run,
                    extra=lambda out=out: {"base_model_sha256": sha256(out / "base_model" / "model.safetensors")},
                )

    def base_model(self) -> Path:
        for seed in self.plan["seeds"]:
            for method in ("fedp2eft", *self.plan["methods"]):
                candidate = self.fedpeft_dir(method, seed) / "base_model"
                if (candidate / "model.safetensors").exists():
                    return candidate
        sys.exit("no fedpeft run of this plan has written its base_model/ yet")

    def export_step(self) -> None:
        def command():
            line = [sys.executable, str(HERE / "export_federation.py"), "--out", str(self.federation), "--force"]
            line += ["--base-model", str(self.base_model())]
            for setting in self.plan["federation"]:
                line += ["--set", setting]
            return line

        self.step(
            "export",
            lambda: (self.federation / "clients.json").exists() and (self.federation / "overrides.txt").exists(),
            command,
            self.run,
            extra=lambda: {
                "base_model": str(self.base_model()),
                "base_model_sha256": sha256(self.federation / "model" / "model.safetensors"),
            },
        )

    # theirs ----------------------------------------------------------------------------------------------------

    def their_step(self, step: str, method: str, seed: int, extra: list[str], done) -> None:
        def command():
            for stale in (self.authors / "wandb" / step, self.authors / "models" / step):
                shutil.rmtree(stale, ignore_errors=True)  # a failed earlier try: start clean
            return their_command(self.work, self.federation, self.authors, method, seed, self.plan, extra, step)

        self.step(
            step,
            done,
            command,
            self.authors,
            OFFLINE_ENV,
            extra=lambda: flower_phases(self.run / "logs" / f"{step}.log"),
        )

    def evaluated(self, step: str, pool: str):
        def done() -> bool:
            found = client_accuracies(results_of(self.authors, step))
            return bool(found) and set(found) == set(pool_ids(self.federation, pool))

        return done

    def their_steps(self) -> None:
        budgets = self.plan["budgets"]
        seen = len(pool_ids(self.federation, "seen"))
        rounds = self.plan["rounds"]
        schedule = [
            f"app.run.num_rounds={rounds}",
            f"app.run.test_every_n={rounds + 1}",  # no evaluation at the end: the r<b>-seen steps evaluate
            f"app.run.save_every_n={rounds}",
            f"server.strategy.args.min_fit_clients={per_round(self.plan, seen)}",
        ]
        for pool in POOLS:
            step = f"authors-base-{pool}"
            extra = ["app.client.args.num_train_epochs=0", "models.net.args.adapter_args.r=2"]
            extra += ["models.net.args.adapter_args.lora_alpha=4", f"data.args.pool={pool}"]
            self.their_step(step, "lora", comparison.their_seed(0), extra, self.evaluated(step, pool))
        for position, _ in enumerate(self.plan["seeds"]):
            seed = comparison.their_seed(position)
            if "fedp2eft" in self.plan["methods"]:
                federated = f"authors-fedp2eft-s{seed}-federated"
                psg = self.authors / "models" / federated / f"weights_round_{rounds}.pkl"
                self.their_step(
                    federated, "fedp2eft", seed, [*schedule, f"app.client.args.eval_rank={max(budgets)}"], psg.exists
                )
                for budget in budgets:
                    for pool in POOLS:
                        step = f"authors-fedp2eft-s{seed}-r{budget}-{pool}"
                        extra = [*schedule, f"app.client.args.eval_rank={budget}", f"app.args.load_fedl2p_params={psg}"]
                        extra += ["app.args.test_only=True", f"data.args.pool={pool}"]
                        self.their_step(step, "fedp2eft", seed, extra, self.evaluated(step, pool))
            if "lora" in self.plan["methods"]:
                for budget in budgets:
                    for pool in POOLS:
                        step = f"authors-lora-s{seed}-r{budget}-{pool}"
                        extra = [f"models.net.args.adapter_args.r={budget}"]
                        extra += [f"models.net.args.adapter_args.lora_alpha={2 * budget}", f"data.args.pool={pool}"]
                        self.their_step(step, "lora", seed, extra, self.evaluated(step, pool))
            if "bayestune_lora" in self.plan["methods"]:
                for pool in POOLS:
                    first = f"authors-btlora-s{seed}-r{max(budgets)}-{pool}"
                    for budget in sorted(budgets, reverse=True):
                        step = f"authors-btlora-s{seed}-r{budget}-{pool}"
                        extra = [f"models.net.args.adapter_args.r={R_INIT}"]
                        extra += [f"models.net.args.adapter_args.lora_alpha={2 * R_INIT}"]
                        extra += [f"app.client.args.bt_args.eval_rank={budget}", f"data.args.pool={pool}"]
                        if step != first:  # run_xnli.sh: the smaller budgets load the first run's scales
                            extra.append(f"app.client.args.bt_args.load_bts_path={self.authors / 'models' / first}")
                        self.their_step(step, "bayestune_lora", seed, extra, self.evaluated(step, pool))

    def run_all(self, sides: list[str]) -> None:
        started = time.perf_counter()
        if "fedpeft" in sides:
            self.fedpeft_steps()
        if "authors" in sides:
            self.export_step()
            self.their_steps()
        print(f"done in {time.perf_counter() - started:.0f} s; {self.run / 'steps.json'}", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# the report


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def their_structure(authors: Path, step: str, cid: int) -> dict | None:
    """What patches/06 saved for one client of one of their runs: modules, scales, kept positions."""
    path = authors / "models" / step / "rank_structure" / f"{cid}.pkl"
    if not path.exists():
        return None
    with open(path, "rb") as handle:
        return pickle.load(handle)


def machine() -> dict:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        None,
    )
    return {"cpu": model, "cores": os.cpu_count(), "load_now": [round(x, 2) for x in os.getloadavg()]}


def git_commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
        return head.stdout.strip() or None
    except OSError:
        return None


def report(run: Path) -> dict:
    from fedpeft.analysis.scales import read_scales

    run = run.resolve()
    plan = json.loads((run / "plan.json").read_text())
    steps = Steps(run).records
    federation, authors = run / "federation", run / "authors"
    clients = json.loads((federation / "clients.json").read_text())
    cid_of = {row["client_id"]: row["cid"] for row in clients}
    seeds, budgets = plan["seeds"], plan["budgets"]

    records: dict[str, list[dict]] = {}
    scales: dict[tuple[str, int, str], dict] = {}
    fedpeft_costs: dict[str, list[dict]] = {}
    for method in plan["methods"]:
        records[method] = []
        for seed in seeds:
            out = run / "fedpeft" / method / f"seed{seed}"
            records[method] += [r for r in read_jsonl(out / "results.jsonl") if "split" in r]
            fedpeft_costs.setdefault(method, []).extend(read_jsonl(out / "costs.jsonl"))
            if out.exists():
                for record in read_scales(out):
                    scales[(method, seed, record.client)] = comparison.scales_by_module(record.scales, record.modules)

    accuracy_rows, cells = [], []
    for method in plan["methods"]:
        for pool in POOLS:
            for budget in budgets:
                ours = comparison.fedpeft_values(records[method], method, pool, budget, seeds)
                metrics = {p: results_of(authors, their_step_name(method, p, budget, pool)) for p in range(len(seeds))}
                theirs = comparison.authors_values(metrics, clients)
                cell = comparison.compare_accuracies(ours, theirs)
                cells.append({"method": method, "pool": pool, "budget": budget, **cell})
                for (client, position), value in sorted(ours.items()):
                    accuracy_rows.append(
                        {
                            "method": method,
                            "pool": pool,
                            "budget": budget,
                            "client": client,
                            "position": position,
                            "fedpeft": value,
                            "authors": theirs.get((client, position)),
                        }
                    )
    base_rows = []
    for pool in POOLS:
        ours = {}
        for method in plan["methods"]:
            ours.update(
                {
                    (r["client"], 0): float(r["value"])
                    for r in records[method]
                    if r["method"] == "base"
                    and r["metric"] == "accuracy"
                    and r["split"] == "test"
                    and r["pool"] == pool
                }
            )
        theirs = comparison.authors_values({0: results_of(authors, f"authors-base-{pool}")}, clients)
        base_rows.append(
            {"method": "base", "pool": pool, "budget": None, **comparison.compare_accuracies(ours, theirs)}
        )

    structure_rows, scale_rows = structure_comparison(plan, clients, scales, authors)
    modules_order = []
    if structure_rows:
        first = structure_rows[0]
        modules_order = list(scales[(first["method"], seeds[first["position"]], first["client"])])

    result = {
        "plan": plan,
        "machine": machine(),
        "report_commit": git_commit(),  # the checkout that wrote this report
        # the commits of the checkout each fedpeft run ran from (+changes: with uncommitted changes)
        "fedpeft_run_commits": sorted(
            {json.loads(p.read_text()).get("git_commit") or "?" for p in (run / "fedpeft").glob("*/seed*/env.json")}
        ),
        "fedpeft_env": next(
            (json.loads(p.read_text()) for p in sorted((run / "fedpeft").glob("*/seed*/env.json"))), None
        ),
        "their_commit": "35ef17d",
        "patches": sorted(p.name for p in (HERE / "patches").glob("*.patch")),
        "clients": {pool: sum(r["pool"] == pool for r in clients) for pool in POOLS},
        "steps": steps,
        # every fedpeft run's base_model/ and the exported model/: one hash when both sides start from one model
        "base_model_hashes": sorted(
            {rec["base_model_sha256"] for rec in steps.values() if rec.get("base_model_sha256")}
        ),
        "fedpeft_phases": phase_costs(fedpeft_costs),
        "costs": method_costs(plan, steps, fedpeft_costs),
        "accuracy": cells,
        "base": base_rows,
        "structure": structure_cells(structure_rows),
        "structure_modules": modules_order,
        "scales": scale_summary(scale_rows),
        "estimate": {
            protocol: estimate(plan, steps, fedpeft_costs, clients, rounds) for protocol, rounds in ROUNDS.items()
        },
        "per_client": {"accuracy": accuracy_rows, "structure": structure_rows, "scales": scale_rows},
        "cid_of": cid_of,
    }
    (run / "comparison.json").write_text(json.dumps(result, indent=1) + "\n")
    (run / "comparison.md").write_text(markdown(result))
    return result


def their_step_name(method: str, position: int, budget: int, pool: str) -> str:
    return f"authors-{THEIR_NAME[method]}-s{comparison.their_seed(position)}-r{budget}-{pool}"


def structure_comparison(plan: dict, clients: list[dict], scales: dict, authors: Path) -> tuple[list, list]:
    """Per client, seed position and budget of FedP2EFT and BayesTune-LoRA: fedpeft's structure, their scales'
    under fedpeft's rule on the shared modules, their own kept ranks, ties; and per client and seed the scales
    (from the first budget's run: the scales do not depend on the budget)."""
    rows, scale_rows = [], []
    for method in [m for m in plan["methods"] if m != "lora"]:
        for pool in POOLS:
            for budget in plan["budgets"]:
                for position, seed in enumerate(plan["seeds"]):
                    step = their_step_name(method, position, budget, pool)
                    for row in [r for r in clients if r["pool"] == pool]:
                        ours = scales.get((method, seed, row["client_id"]))
                        saved = their_structure(authors, step, row["cid"])
                        if ours is None or saved is None:
                            continue
                        shared = list(ours)
                        theirs = comparison.scales_by_module(saved["scales"], saved["modules"])
                        names = [comparison.shared_name(m) for m in saved["modules"]]
                        actual = comparison.module_counts(saved["kept"], names, R_INIT)
                        our_counts = comparison.kept_counts(ours, budget)
                        their_counts = comparison.restricted_counts(theirs, shared, budget)
                        key = {"method": method, "pool": pool, "client": row["client_id"], "position": position}
                        rows.append(
                            {
                                **key,
                                "budget": budget,
                                "fedpeft": [our_counts[m] for m in shared],
                                "authors_shared": [their_counts[m] for m in shared],
                                "authors_kept": [actual[m] for m in names],
                                **comparison.compare_structures(our_counts, their_counts),
                                "authors_outside_share": comparison.outside_share(actual, shared),
                                "fedpeft_tie": comparison.tie_at_cut(ours, budget),
                                "authors_tie": comparison.tie_at_cut(theirs, budget),
                            }
                        )
                        if budget == plan["budgets"][0]:
                            scale_rows.append({**key, **comparison.compare_scales(ours, theirs, shared)})
    return rows, scale_rows


def structure_cells(rows: list[dict]) -> list[dict]:
    """:func:`structure_comparison`'s rows summed per method, pool and budget."""
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault((row["method"], row["pool"], row["budget"]), []).append(row)
    return [
        {
            "method": method,
            "pool": pool,
            "budget": budget,
            "clients": len(found),
            "same": sum(r["same"] for r in found),
            "overlap": statistics.fmean(r["overlap"] for r in found),
            "distinct_fedpeft": len({tuple(r["fedpeft"]) for r in found}),
            "distinct_authors": len({tuple(r["authors_shared"]) for r in found}),
            "fedpeft_ties": sum(r["fedpeft_tie"] for r in found),
            "authors_ties": sum(r["authors_tie"] for r in found),
            "authors_outside_share": statistics.fmean(r["authors_outside_share"] for r in found),
        }
        for (method, pool, budget), found in cells.items()
    ]


def method_costs(plan: dict, steps: dict, costs: dict[str, list[dict]]) -> list[dict]:
    """The same work on both sides, per method and seed position: fedpeft's run (its wall time, its base stage,
    its federated and personalization phases, its peak RSS) against the sum of their steps of that method and seed
    (wall time, Flower's rounds and evaluation, the largest peaks). Their base-model evaluation and the export are
    left out (fedpeft's runs evaluate the base model inside their base stage)."""
    rows = []
    for position, seed in enumerate(plan["seeds"]):
        theirs_seed = comparison.their_seed(position)
        for method in plan["methods"]:
            ours = steps.get(f"fedpeft-{method}-s{seed}", {})
            phases: dict[str, float] = {}
            for row in costs.get(method, []):
                if row.get("seed") == seed and row.get("metric") == "wall_s":
                    phases[row["phase"]] = phases.get(row["phase"], 0.0) + float(row["value"])
            theirs = [
                rec
                for name, rec in steps.items()
                if name.startswith(f"authors-{THEIR_NAME[method]}-s{theirs_seed}-") and "wall_s" in rec
            ]
            rows.append(
                {
                    "method": method,
                    "position": position,
                    "fedpeft_wall_s": ours.get("wall_s"),
                    "fedpeft_base_stage_s": round(phases.get("base", 0.0), 1),
                    "fedpeft_method_s": round(phases.get("federated", 0.0) + phases.get("personalization", 0.0), 1),
                    "fedpeft_peak_mib": ours.get("peak_tree_rss_mib"),
                    "authors_invocations": len(theirs),
                    "authors_wall_s": round(sum(rec["wall_s"] for rec in theirs), 1),
                    "authors_method_s": round(sum(rec.get("fit_s", 0) + rec.get("evaluate_s", 0) for rec in theirs), 1),
                    "authors_peak_tree_mib": max((rec["peak_tree_rss_mib"] for rec in theirs), default=None),
                    "authors_peak_actor_mib": max((rec["peak_actor_rss_mib"] for rec in theirs), default=None),
                }
            )
    return rows


def phase_costs(costs: dict[str, list[dict]]) -> dict:
    """Per method: fedpeft's own phase times (mean over its seeds' runs), from costs.jsonl."""
    out = {}
    for method, rows in costs.items():
        phases: dict[str, list[float]] = {}
        for row in rows:
            if row.get("metric") in ("wall_s", "wall_s_per_client", "wall_s_per_client_round", "peak_rss_mb"):
                phases.setdefault(f"{row['phase']}.{row['metric']}", []).append(float(row["value"]))
        out[method] = {key: round(statistics.fmean(values), 3) for key, values in sorted(phases.items())}
    return out


def scale_summary(rows: list[dict]) -> list[dict]:
    cells = {}
    for row in rows:
        cells.setdefault((row["method"], row["pool"]), []).append(row)
    return [
        {
            "method": method,
            "pool": pool,
            "clients": len(found),
            "fedpeft_mean": statistics.fmean(r["fedpeft_mean"] for r in found),
            "authors_mean": statistics.fmean(r["authors_mean"] for r in found),
            "module_correlation": comparison.mean_or_none(r["module_correlation"] for r in found),
        }
        for (method, pool), found in cells.items()
    ]


def estimate(plan: dict, steps: dict, costs: dict[str, list[dict]], clients: list[dict], rounds: int) -> dict:
    """Hours of the full run (:data:`FULL`, ``rounds`` rounds) from this run's measured per-step times.

    Theirs: each ``main.py`` invocation's start-up (its wall time less Flower's rounds and evaluation, median over
    the steps), the time per client-round of the federated step and per personalized client of each kind of step
    (Flower's timestamps). fedpeft's: each run's base stage and start-up (its wall time less its phases), per
    client-round and per personalized client (costs.jsonl; the personalization phase covers this run's budgets,
    scaled to the full run's). The per-client times are scaled by the clients' training sets (the preset's 100
    examples against this run's mean) for the upper figure and not for the lower: part of a client's time does not
    grow with its data (their client_fn rebuilds the model for every call).
    """
    train = statistics.fmean(row["train"] for row in clients)
    factor = FULL["train_per_client"] / train
    seeds, budgets, n = FULL["seeds"], FULL["budgets"], FULL["seen"] + FULL["unseen"]
    client_rounds = rounds * FULL["per_round"]
    out: dict = {"train_per_client_here": round(train, 1), "size_factor": round(factor, 2)}
    out["full"] = {**FULL, "rounds": rounds}

    theirs = {name: rec for name, rec in steps.items() if name.startswith("authors-") and "wall_s" in rec}
    if theirs:
        startup = statistics.median(
            rec["wall_s"] - rec.get("fit_s", 0) - rec.get("evaluate_s", 0) for rec in theirs.values()
        )
        seen_here = sum(row["pool"] == "seen" for row in clients)
        per_client: dict[str, list[float]] = {}
        per_round_s = []
        for name, rec in theirs.items():
            if name.endswith("-federated") and rec.get("rounds"):
                per_round_s.append(rec["fit_s"] / (rec["rounds"] * per_round(plan, seen_here)))
            elif rec.get("evaluated"):
                kind = name.split("-")[1]
                if kind == "btlora" and f"-r{max(plan['budgets'])}-" in name:
                    kind = "btlora-first"  # learns the clients' scales, then fine-tunes
                per_client.setdefault(kind, []).append(rec["evaluate_s"] / rec["evaluated"])
        t = {kind: statistics.fmean(values) for kind, values in per_client.items()}
        t_round = statistics.fmean(per_round_s) if per_round_s else 0.0
        invocations = 2 + seeds * (1 + 3 * 2 * budgets)
        scaled = n * t.get("base", 0) + seeds * (
            client_rounds * t_round
            + budgets * n * (t.get("fedp2eft", 0) + t.get("lora", 0))
            + n * t.get("btlora-first", 0)
            + (budgets - 1) * n * t.get("btlora", 0)
        )
        out["authors"] = {
            "invocations": invocations,
            "startup_s": round(startup, 1),
            "per_client_round_s": round(t_round, 2),
            "per_client_s": {kind: round(value, 2) for kind, value in sorted(t.items())},
            "hours": [round((invocations * startup + scaled * f) / 3600, 2) for f in (1.0, factor)],
        }

    by_method = phase_costs(costs)
    walls: dict[str, list[float]] = {}  # each method's runs, one a seed: their phases are means over the seeds too
    for name, rec in steps.items():
        if name.startswith("fedpeft-") and "wall_s" in rec:
            walls.setdefault(name.split("-")[1], []).append(rec["wall_s"])
    if by_method and walls:
        fixed = scaled = 0.0
        detail = {}
        for method, values in by_method.items():
            phases = sum(value for key, value in values.items() if key.endswith(".wall_s"))
            startup = statistics.fmean(walls.get(method, [phases])) - phases
            # the personalization phase's wall time over the clients (its wall_s_per_client leaves out some of it)
            per_client = values.get("personalization.wall_s", 0) / len(clients) * budgets / len(plan["budgets"])
            per_cr = values.get("federated.wall_s_per_client_round", 0)
            fixed += seeds * (startup + values.get("base.wall_s", 0))
            scaled += seeds * (n * per_client + client_rounds * per_cr)
            detail[method] = {
                "startup_s": round(startup, 1),
                "base_stage_s": round(values.get("base.wall_s", 0), 1),
                "per_client_round_s": round(per_cr, 3),
                "per_client_s": round(per_client, 3),
            }
        out["fedpeft"] = {
            "runs": seeds * len(by_method),
            "methods": detail,
            "hours": [round((fixed + scaled * f) / 3600, 2) for f in (1.0, factor)],
        }
    return out


def table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def markdown(result: dict) -> str:
    """The report's tables: accuracies, rank structures, scales, steps."""

    def pct(value: float | None) -> str:
        return "—" if value is None else f"{value * 100:.2f}"

    lines = [
        "Accuracy x 100 on each client's test split. fedpeft - authors: per client, the mean over the seeds both",
        "have; 95 % t interval over the clients; * where it excludes 0.",
        "",
    ]
    rows = [
        [c["method"], c["pool"], c["budget"] or "—", c["clients"], pct(c["fedpeft"]), pct(c["authors"])]
        + [comparison.format_difference(c)]
        for c in [*result["base"], *result["accuracy"]]
    ]
    lines += table(["method", "pool", "r", "clients", "fedpeft", "authors", "fedpeft - authors"], rows)
    if result["structure"]:
        lines += [
            "",
            "Rank structures (ranks kept per module) per client and seed: fedpeft's, against fedpeft's rule applied",
            "to their scales on the 12 modules both adapt; the share of their own kept ranks outside those 12",
            "(pooler, classifier); ties: client-seeds whose cut falls between equal scales (their own selection).",
            "",
        ]
        header = ["method", "pool", "r", "client-seeds", "same", "overlap", "distinct: fedpeft", "distinct: authors"]
        header += ["theirs outside the 12", "ties: fedpeft", "ties: authors"]
        rows = [
            [c["method"], c["pool"], c["budget"], c["clients"], c["same"], f"{c['overlap']:.2f}"]
            + [c["distinct_fedpeft"], c["distinct_authors"], f"{c['authors_outside_share'] * 100:.1f} %"]
            + [c["fedpeft_ties"], c["authors_ties"]]
            for c in result["structure"]
        ]
        lines += table(header, rows)
    if result["scales"]:
        lines += [
            "",
            "Scales (clamped): mean over clients; correlation of the 12 per-module means, mean over clients.",
            "",
        ]
        rows = [
            [c["method"], c["pool"], c["clients"], f"{c['fedpeft_mean']:.4g}", f"{c['authors_mean']:.4g}"]
            + ["—" if c["module_correlation"] is None else f"{c['module_correlation']:+.2f}"]
            for c in result["scales"]
        ]
        lines += table(["method", "pool", "clients", "fedpeft mean", "authors mean", "module correlation"], rows)
    lines += [
        "",
        "The same work per method and seed: fedpeft's run (wall time; its base stage; its federated and",
        "personalization phases; peak RSS) against the sum of their steps (wall time; Flower's rounds and",
        "evaluation; the largest peak of the process tree and of the client actor).",
        "",
    ]
    header = ["method", "seed", "fedpeft wall s", "base stage s", "method s", "peak MiB", "their runs"]
    header += ["their wall s", "their method s", "their peak tree MiB", "their actor MiB"]
    rows = [
        [c["method"], c["position"], c["fedpeft_wall_s"], c["fedpeft_base_stage_s"], c["fedpeft_method_s"]]
        + [c["fedpeft_peak_mib"], c["authors_invocations"], c["authors_wall_s"], c["authors_method_s"]]
        + [c["authors_peak_tree_mib"], c["authors_peak_actor_mib"]]
        for c in result["costs"]
    ]
    lines += table(header, rows)
    lines.append("")
    header = ["step", "wall s", "peak tree MiB", "peak process MiB", "Ray actor MiB", "their fit s", "their eval s"]
    rows = [
        [name, rec.get("wall_s", "—"), rec.get("peak_tree_rss_mib", "—"), rec.get("peak_process_rss_mib", "—")]
        + [rec.get("peak_actor_rss_mib") or "—", rec.get("fit_s", "—"), rec.get("evaluate_s", "—")]
        + [(rec.get("load_before") or ["—"])[0]]
        for name, rec in result["steps"].items()
    ]
    lines += table([*header, "load before"], rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run (or continue) the steps")
    run.add_argument("--run", type=Path, required=True, help="the folder of this comparison's outputs")
    run.add_argument("--work", type=Path, default=WORK, help="setup.sh's work folder (repo/, venv/)")
    run.add_argument("--protocol", choices=sorted(PROTOCOLS), default="aligned")
    run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="fedpeft's seeds; theirs 42 + 10 x index")
    run.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 16])
    run.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    run.add_argument("--sides", nargs="+", choices=["fedpeft", "authors"], default=["fedpeft", "authors"])
    run.add_argument("--quick", action="store_true", help="the smoke-size federation (4 seen, 6 unseen clients)")
    run.add_argument(
        "--keep",
        type=Path,
        help="a folder that receives each finished step's outputs as <step>.tar.gz, restored from there into a run "
        "folder that lacks them: the comparison taken up on another machine or checkout",
    )
    run.add_argument("--rounds", type=int, help="federated rounds (default: aligned 60, authors 150; --quick 3)")
    run.add_argument("--fraction", type=float, help="share of the seen pool per round (default 0.1; --quick 0.5)")
    run.add_argument(
        "--workers",
        type=int,
        default=1,
        help="clients at once: fedpeft's engine.workers, their Ray actors (1 CPU each)",
    )
    rep = commands.add_parser("report", help="compare what a run folder holds")
    rep.add_argument("--run", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        Driver(args).run_all(args.sides)
    else:
        result = report(args.run)
        print(markdown(result))
        print(json.dumps(result["estimate"], indent=1))


if __name__ == "__main__":
    main()
