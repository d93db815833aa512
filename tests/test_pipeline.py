"""End to end: the output contract, adapters that load with plain PEFT, kill-and-resume, bad input."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import load_config
from fedpeft.runner import Experiment

FAST = [
    "data.groups=[lat1, lat4, cyr1]",
    "methods=[{name: lora, lr: 0.005, epochs: 2}, {name: fedit, rounds: 2, fraction: 0.5, local_steps: 3, lr: 0.005}]",
]
RECORD_KEYS = {"method", "budget", "pool", "client", "group", "seed", "round", "split", "metric", "value"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def reproducible(path: Path) -> list[dict]:
    """The records of a results file that a rerun reproduces (all but the rounds' wall seconds), sorted."""
    records = [r for r in read_jsonl(path) if not (r["split"] == "train" and r["metric"] == "seconds")]
    key = ("method", "budget", "client", "split", "round", "metric")
    return sorted(records, key=lambda r: tuple(str(r[k]) for k in key))


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "fedpeft.cli", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smoke") / "run"
    Experiment(load_config("smoke"), out).run()
    return out


@pytest.mark.slow
def test_smoke_writes_the_output_contract(smoke_run):
    for name in ("config.yaml", "results.jsonl", "costs.jsonl", "summary.md"):
        assert (smoke_run / name).is_file(), name
    assert list((smoke_run / "plots").glob("*.png"))
    records = read_jsonl(smoke_run / "results.jsonl")
    assert all(set(r) == RECORD_KEYS for r in records)
    methods = {r["method"] for r in records}
    assert methods == {"base", "lora", "fedit", "fedprox", "local", "fedavg_full", "fedp2eft"}
    assert {r["budget"] for r in records if r["method"] == "lora"} == {2, 4}
    assert {r["pool"] for r in records} == {"seen", "unseen"}
    # cyr1 is the language that appears only in the unseen pool.
    assert {r["pool"] for r in records if r["group"] == "cyr1"} == {"unseen"}
    clients = {r["client"] for r in records if r["method"] == "base"}
    for method in methods:
        evaluated = {r["client"] for r in records if r["method"] == method and r["split"] != "train"}
        assert evaluated == clients, method
    # Every federated round leaves its training records: the clients' mean loss, clients, examples, seconds.
    train = [r for r in records if r["split"] == "train"]
    assert {(r["method"], r["round"]) for r in train} == {
        (m, k)
        for m, rounds in (("fedit", 2), ("fedprox", 2), ("fedavg_full", 1), ("fedp2eft", 2))
        for k in range(1, rounds + 1)
    }
    fedit = {(r["round"], r["metric"]): r["value"] for r in train if r["method"] == "fedit"}
    assert fedit[1, "clients"] == 3 and fedit[1, "examples"] > 0 and fedit[1, "seconds"] > 0 and fedit[1, "loss"] > 0
    assert all(r["client"] is None and r["pool"] == "seen" for r in train)
    env = json.loads((smoke_run / "env.json").read_text())
    assert env["versions"]["torch"] == torch.__version__ and env["device"] == "cpu"
    assert env["cpu"]["kernels"] == torch.backends.cpu.get_cpu_capability() and env["cpu"]["cores"] == os.cpu_count()
    costs = read_jsonl(smoke_run / "costs.jsonl")
    fedit = {c["metric"]: c["value"] for c in costs if c["method"] == "fedit" and c["phase"] == "federated"}
    # 6 seen clients (3 seen languages x 2), half of them in each of 2 rounds: 6 client-rounds.
    assert fedit["bytes_up_per_client_round"] > 0
    assert fedit["bytes_up_total"] == 6 * fedit["bytes_up_per_client_round"] == fedit["bytes_down_total"]
    assert 0 < fedit["server_init_s"] < 60  # the server's state before the first round, timed apart from wall_s
    summary = (smoke_run / "summary.md").read_text()
    assert "Seen pool" in summary and "Unseen pool" in summary and "| base |" in summary
    assert (smoke_run / "checkpoints" / "fedit" / "seed0.safetensors").is_file()


@pytest.mark.slow
def test_saved_adapters_load_with_peft_and_reproduce_predictions(smoke_run):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from fedpeft.worker import Worker

    cfg = load_config(str(smoke_run / "config.yaml"))
    worker = Worker(cfg, smoke_run)
    records = read_jsonl(smoke_run / "results.jsonl")
    # FedIT's clients all keep the global adapter, written once (adapters/fedit/global/).
    for method, budget_dir, budget in (("lora", "r4/lat4-unseen-00", 4), ("fedit", "global", None)):
        client_id = "lat4-unseen-00"
        adapter_dir = smoke_run / "adapters" / method / budget_dir
        base = AutoModelForSequenceClassification.from_pretrained(smoke_run / "base_model")
        model = PeftModel.from_pretrained(base, adapter_dir).eval()
        client = worker.clients[client_id]
        batch = worker.runtime.encode(client.test)
        labels = batch.pop("labels")
        with torch.no_grad():
            predictions = model(**batch).logits.argmax(-1)
        accuracy = int((predictions == labels).sum()) / len(labels)  # as the runtime counts it, in float64
        logged = next(
            r["value"]
            for r in records
            if r["method"] == method and r["budget"] == budget and r["client"] == client_id and r["seed"] == 0
        )
        assert accuracy == pytest.approx(logged, abs=1e-9), method


@pytest.mark.slow
def test_report_merges_runs(smoke_run, tmp_path):
    result = cli("report", str(smoke_run), str(smoke_run), "--out", str(tmp_path / "merged"))
    assert result.returncode == 0, result.stderr
    assert "Seen pool" in (tmp_path / "merged" / "summary.md").read_text()


def test_list_commands():
    methods = cli("list", "methods")
    assert methods.returncode == 0
    for name in ("fedavg_full", "fedit", "fedprox", "local", "lora"):
        assert name in methods.stdout
    assert "sft" in methods.stdout and "fedavg" in methods.stdout
    assert "smoke" in cli("list", "presets").stdout and "quickstart" in cli("list", "presets").stdout
    assert "synthetic-xnli" in cli("list", "datasets").stdout
    assert "tiny-bert" in cli("list", "models").stdout


@pytest.mark.slow
def kill_at_round(args: list[str], checkpoint: Path, round_: int) -> int:
    """Start the command ``args`` in a session of its own and SIGKILL it (all its processes) once ``checkpoint``
    holds round ``round_`` or a later one (or after 240 s); returns the checkpoint's round then."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if checkpoint.exists() and load_checkpoint(checkpoint)["round"] >= round_:
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return load_checkpoint(checkpoint)["round"]


def test_kill_and_resume_gives_the_uninterrupted_results(tmp_path):
    overrides = [
        "data.groups=[lat1, lat4]",
        "methods=[{name: fedit, rounds: 40, fraction: 0.5, local_steps: 5, lr: 0.005}, {name: lora, epochs: 1}]",
        "output.plots=false",
        "output.save_adapters=false",
    ]
    reference = tmp_path / "reference"
    Experiment(load_config("smoke", overrides), reference).run()

    interrupted = tmp_path / "interrupted"
    args = [sys.executable, "-m", "fedpeft.cli", "run", "smoke", "--out", str(interrupted)]
    for item in overrides:
        args += ["--set", item]
    checkpoint = interrupted / "checkpoints" / "fedit" / "seed0.safetensors"
    killed_at = kill_at_round(args, checkpoint, 3)
    assert not (interrupted / "results.jsonl").exists(), "the run finished before it could be killed"
    assert 3 <= killed_at < 40

    result = cli(*args[3:], "--resume")
    assert result.returncode == 0, result.stderr
    assert reproducible(interrupted / "results.jsonl") == reproducible(reference / "results.jsonl")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "no-such-preset"], "Unknown preset"),
        (["run", "smoke", "--set", "methods=[{name: nope}]"], "Unknown method 'nope'"),
        (["run", "smoke", "--set", "data.name=nope"], "Unknown dataset 'nope'"),
        (["run", "smoke", "--set", "model.name=no/such-model"], "no/such-model"),
        (["run", "smoke", "--set", "budgets=[1000]"], "exceeds the largest rank"),
        (["run", "smoke", "--set", "data.name=xnli", "--set", "data.path=/no/such/dir"], "/no/such/dir"),
        (["run", "smoke", "--set", "methods=[{name: fedit, rounds: many}]"], "rounds"),
        (["run", "smoke", "--set", "methods.1.bogus=1"], "Invalid setting 'bogus' of method 'fedit'"),
        (["run", "smoke", "--set", "methods.1.rounds=-1"], "`rounds` must be 0 or more"),
        (["run", "smoke", "--set", "methods.1.fraction=0"], "`fraction` must be in (0, 1]"),
        (["run", "smoke", "--set", "methods.1.fraction=1.5"], "`fraction` must be in (0, 1]"),
        (["run", "smoke", "--set", "methods.1.min_clients=0"], "`min_clients` must be at least 1"),
        (["run", "smoke", "--set", "methods.1.min_clients=100"], "needs min_clients=100"),
        (["run", "smoke", "--set", "budgets=[-2]"], "`budgets` must be positive"),
        (["run", "smoke", "--set", "methods=[]"], "`methods` must list at least one method"),
        (["run", "smoke", "--set", "seeds=[]"], "`seeds` must list at least one seed"),
        (["run", "smoke", "--set", "base.kind=federated", "--set", "base.method={name: fedalt}"], "fedalt"),
        (["list", "things"], "Cannot list"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args, message, tmp_path, capsys, monkeypatch):
    """The console entry point (``fedpeft.cli.main``) in this process: a process of its own per case would import
    torch and transformers again each time; the cases that follow run it as a command."""
    from fedpeft.cli import main

    monkeypatch.setattr(
        sys, "argv", ["fedpeft", *args, *(["--out", str(tmp_path / "run")] if args[0] == "run" else [])]
    )
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exited:
            main()
    finally:
        signal.signal(signal.SIGTERM, handler)
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, stderr
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "smoke", "--set", "methods=[{name: nope}]"], "Unknown method 'nope'"),
        (["list", "things"], "Cannot list"),
    ],
)
def test_bad_input_ends_the_command_with_one_sentence_and_exit_2(args, message, tmp_path):
    result = cli(*args, "--out", str(tmp_path / "run")) if args[0] == "run" else cli(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_malformed_yaml_and_existing_run_lose_nothing(tmp_path, smoke_run):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ndata: {name: [\n")
    result = cli("run", str(broken), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr
    before = {p: p.read_bytes() for p in smoke_run.rglob("*.jsonl")}
    result = cli("run", "smoke", "--out", str(smoke_run))
    assert result.returncode == 2 and "holds a finished run" in result.stderr
    assert before == {p: p.read_bytes() for p in smoke_run.rglob("*.jsonl")}


def test_generation_pipeline_with_a_federated_base_stage(tmp_path):
    """Fed-Aya-style instruction following on tiny Llama: federated full-weight base stage, FedIT, LoRA."""
    overrides = [
        "data.name=synthetic-fedaya",
        "data.groups=null",
        "data.options={num_clients: 4, unseen_clients: 1, samples_per_client: 20}",
        "model.name=tiny-llama",
        "model.max_length=48",
        "base.kind=federated",
        "base.method={name: fedavg_full, rounds: 1, fraction: 1.0, local_steps: 2, lr: 0.001}",
        "budgets=[2]",
        "eval.max_new_tokens=8",
        "methods=[{name: lora, lr: 0.005, epochs: 1}, {name: fedit, rounds: 1, fraction: 1.0, local_steps: 2}]",
        "output.plots=false",
    ]
    out = tmp_path / "run"
    Experiment(load_config("smoke", overrides), out).run()
    records = [r for r in read_jsonl(out / "results.jsonl") if r["split"] == "test"]
    assert {r["metric"] for r in records} == {"meteor", "rouge1", "rougeL"}
    assert {r["method"] for r in records} == {"base", "lora", "fedit"}
    train = [r for r in read_jsonl(out / "results.jsonl") if r["split"] == "train"]
    assert {r["method"] for r in train} == {"base-stage", "fedit"}  # the federated base stage's rounds too
    assert all(0.0 <= r["value"] <= 1.0 for r in records)
    assert {r["pool"] for r in records} == {"seen", "unseen"}
    assert (out / "checkpoints" / "base-seed0.safetensors").is_file()
    assert (out / "adapters" / "lora" / "r2").is_dir()
    summary = (out / "summary.md").read_text()
    assert "METEOR" in summary and "ROUGE-L" in summary
    costs = read_jsonl(out / "costs.jsonl")
    assert any(c["phase"] == "base" and c["metric"] == "bytes_up_total" and c["value"] > 0 for c in costs)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_interrupt_ends_with_its_code_and_one_line_and_the_run_resumes(sig, code, word, smoke_run, tmp_path):
    out = tmp_path / "my run"  # the resume line quotes it
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    args = [sys.executable, "-m", "fedpeft.cli", "run", "smoke", "--out", str(out)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not (out / "parts" / "base-seed0.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == code, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(word) and f"--out {shlex.quote(str(out))} --resume" in last and "Traceback" not in stderr
    assert not (out / "results.jsonl").exists()  # stopped before the end
    if sig != signal.SIGINT:
        return  # the printed line resumes alike whatever stopped the run: resumed once, after Ctrl-C

    # The printed line, pasted into a shell as it is (`fedpeft` standing for this interpreter's fedpeft).
    again = last.split("`")[1]
    fedpeft = f'fedpeft() {{ {shlex.quote(sys.executable)} -m fedpeft.cli "$@"; }}'
    result = subprocess.run(["bash", "-c", f"{fedpeft}\n{again}"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert reproducible(out / "results.jsonl") == reproducible(smoke_run / "results.jsonl")
