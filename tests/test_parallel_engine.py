"""The local engine on worker processes (``engine.workers``): the records of one worker, a dead worker process as a
failed client, Ctrl-C, and the config's refusals."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from fedpeft.core.config import load_config, validate
from fedpeft.core.errors import UserError
from fedpeft.core.logs import LEVELS_VARIABLE, levels_for_children
from fedpeft.engine import resources
from fedpeft.engine.local import LocalEngine
from fedpeft.engine.pool import gpu_shares, memory_shortfall
from fedpeft.engine.resources import WORKERS_VARIABLE, EngineSettings, resolve_engine
from fedpeft.runner import Experiment
from tests.entry_point import cli
from tests.test_flower import tiny_raw
from tests.test_pipeline import kill_at_round
from tests.test_run_dirs import TINY

# Several method families: FedIT and FedProx (global adapter), Ditto and FedSA-LoRA (state kept per client between
# rounds), LoRA (local only); every round evaluated (evaluate_round on the workers too).
FAMILIES = [
    "methods=[{name: fedit, rounds: 2, fraction: 0.5, local_steps: 2, lr: 0.005},"
    " {name: fedprox, rounds: 2, fraction: 1.0, local_steps: 2, lr: 0.005, mu: 0.01},"
    " {name: ditto, rounds: 2, fraction: 1.0, local_steps: 2, lr: 0.005},"
    " {name: fedsa_lora, rounds: 2, fraction: 1.0, local_steps: 2, lr: 0.005},"
    " {name: lora, lr: 0.005, epochs: 1}]",
    "eval.every=1",
]


def comparable(out: Path) -> list[dict]:
    """The run's records, the ``train`` split's timings left out (they are wall-clock seconds)."""
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return [r for r in records if not (r["split"] == "train" and r["metric"] == "seconds")]


def cost_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]


def sets(overrides: list[str]) -> list[str]:
    """``overrides`` as ``--set`` options of the command line."""
    return [arg for override in overrides for arg in ("--set", override)]


def run_with(tmp_path: Path, name: str, overrides: list[str], workers: int) -> Path:
    out = tmp_path / name
    Experiment(load_config("smoke", [*overrides, f"engine.workers={workers}"]), out).run()
    return out


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("value", [0, -1, "many", 1.5])
def test_workers_below_one_are_refused_with_one_sentence(value):
    with pytest.raises(UserError, match=r"engine\.workers.*1 or more, or `auto`"):
        validate({"engine": {"workers": value}})


@pytest.fixture
def eight_cores(monkeypatch):
    """`auto` as on a machine of 8 cores, without the suite's FEDPEFT_WORKERS."""
    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    monkeypatch.setattr(resources, "cpu_cores", lambda: 8)


def settings_of(engine: dict, **kwargs: object) -> tuple[int, int | None, str]:
    resolved = resolve_engine(validate({"engine": engine}).engine, **{"threads": None, "clients": 100, **kwargs})
    return resolved.processes, resolved.threads, resolved.state


def test_auto_is_the_default_one_process_per_core_or_per_threads_cores(eight_cores):
    assert validate({}).engine.workers == "auto"
    assert settings_of({}) == (8, 1, "disk")
    assert settings_of({}, threads=2) == (4, 2, "disk")  # each process runs the config's threads
    assert settings_of({}, threads=8) == (0, 8, "memory")  # one process: every client runs in this one
    assert settings_of({"batch_clients": 4}) == (0, None, "memory")  # batches train in this process


def test_auto_takes_no_more_processes_than_clients_and_shares_the_cores_among_them(eight_cores):
    assert settings_of({}, clients=3) == (3, 2, "disk")
    assert settings_of({}, threads=1, clients=3) == (3, 1, "disk")
    assert settings_of({}, clients=1) == (0, None, "memory")
    line = resolve_engine(validate({}).engine, threads=None, clients=3).line()
    assert line == (
        "Running on 3 worker processes (2 torch threads each, client states on disk, as many as the run's clients; "
        "--set engine.workers=1 for one process)"
    )


def test_auto_takes_as_many_processes_as_fit_in_memory_and_a_number_that_does_not_fit_is_refused(eight_cores):
    gib = 2**30
    assert settings_of({}, per_process=gib, available=int(2.5 * gib)) == (2, 4, "disk")
    assert settings_of({}, per_process=gib, available=int(1.5 * gib)) == (0, None, "memory")
    line = resolve_engine(validate({}).engine, threads=1, clients=9, per_process=gib, available=gib).line()
    assert line == (
        "Running in one process (1 torch thread, as many as fit in memory; --set engine.workers=N for N worker "
        "processes)"
    )
    with pytest.raises(UserError, match="use engine.workers 2 or fewer"):
        settings_of({"workers": 4}, per_process=gib, available=int(2.5 * gib))


def test_auto_on_gpus_is_workers_per_gpu_on_each_as_far_as_their_memory_holds(eight_cores):
    gib = 2**30
    free = {0: 10 * gib, 1: 3 * gib}
    gpus = {"gpus": ["0", "1"], "gpu_bytes": gib, "gpu_free": free.__getitem__}
    assert settings_of({"workers_per_gpu": 3}, **gpus) == (6, 1, "disk")
    assert settings_of({"workers_per_gpu": 4}, **gpus) == (6, 1, "disk")  # GPU 1 holds 3
    with pytest.raises(UserError, match="engine.workers_per_gpu 2 needs about 4.0 GiB of memory of GPU 1"):
        settings_of({"workers": 4}, gpus=["0", "1"], gpu_bytes=2 * gib, gpu_free=free.__getitem__)


def test_a_number_of_workers_is_taken_as_given_and_the_variable_sets_what_auto_is(eight_cores, monkeypatch):
    assert settings_of({"workers": 1}) == (0, None, "memory")
    assert settings_of({"workers": 3}) == (3, 2, "disk")
    assert settings_of({"workers": 3}, threads=1) == (3, 1, "disk")
    monkeypatch.setenv(WORKERS_VARIABLE, "3")
    assert settings_of({}) == (3, 2, "disk") and settings_of({"workers": 2}) == (2, 4, "disk")
    monkeypatch.setenv(WORKERS_VARIABLE, "many")
    with pytest.raises(UserError, match="FEDPEFT_WORKERS='many' is not a number of worker processes"):
        settings_of({})


def test_worker_processes_keep_client_state_on_disk_and_the_config_keeps_what_it_says(tmp_path):
    two = Experiment(load_config("smoke", [*TINY, "engine.workers=2"]), tmp_path / "a")
    assert two.cfg.engine.state == "memory" and two.cfg.engine.workers == 2
    assert resolve_engine(two.cfg.engine, threads=1, clients=4).state == "disk"
    assert "client states on disk" in resolve_engine(two.cfg.engine, threads=1, clients=4).line()  # said, not silent
    on_disk = load_config("smoke", [*TINY, "engine.workers=2", "engine.state=disk"]).engine
    assert "client states" not in resolve_engine(on_disk, threads=1, clients=4).line()  # as asked: nothing to say
    assert resolve_engine(load_config("smoke", TINY).engine, threads=1, clients=4).state == "memory"


def test_workers_given_on_the_command_line_are_refused_at_load(tmp_path, monkeypatch, capsys):
    from fedpeft import cli

    argv = ["fedpeft", "run", "smoke", "--out", str(tmp_path / "out"), "--set", "engine.workers=0"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "engine.workers" in err[-1] and not (tmp_path / "out").exists()


def test_memory_shortfall_names_the_count_that_fits():
    gib = 2**30
    assert memory_shortfall(3, gib, 3 * gib, where="memory") is None
    message = memory_shortfall(4, gib, int(2.5 * gib), where="memory")
    assert message == (
        "engine.workers 4 needs about 4.0 GiB of memory (4 worker processes of about 1.00 GiB, each holding the "
        "run's data and model), and 2.5 GiB is free; use engine.workers 2 or fewer."
    )
    tight = memory_shortfall(2, gib, gib // 2, where="memory of GPU 0", setting="engine.workers_per_gpu")
    assert tight is not None and tight.startswith("engine.workers_per_gpu 2 needs about 2.0 GiB of memory of GPU 0")
    assert tight.endswith("free memory or use a smaller model.")


def pool_processes(psutil, count: int, timeout: float = 60.0) -> list:
    """This process's ``count`` worker-pool children, once each has exec'd its command (a child between fork and
    exec still shows the parent's command line); zombies of earlier tests in this process are no pool's."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for child in psutil.Process().children():
            try:
                if "fedpeft.engine.pool" in " ".join(child.cmdline()):
                    found.append(child)
            except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_worker_processes_are_pinned_to_the_gpus_round_robin(tmp_path):
    """Each process sees one GPU (``CUDA_VISIBLE_DEVICES``), taken in turn; a CPU build of torch ignores it."""
    import psutil

    from fedpeft.core.config import dump_given
    from fedpeft.engine.pool import WorkerPool

    assert gpu_shares(5, ["0", "1"]) == [3, 2] and gpu_shares(1, ["0", "1"]) == [1, 0]
    cfg = load_config("smoke", TINY)
    pool = WorkerPool(dump_given(cfg), tmp_path, 3, 1, None, ["2", "7"])
    pool.start()
    try:
        children = pool_processes(psutil, count=3)
        seen = sorted(p.environ().get("CUDA_VISIBLE_DEVICES") for p in children)
        levels = {p.environ().get(LEVELS_VARIABLE) for p in children}
    finally:
        pool.close()
    assert seen == ["2", "2", "7"]
    assert levels == {levels_for_children()}  # the run's library log levels (-v or not) reach the processes


def test_a_worker_process_takes_the_library_log_levels_it_was_given(monkeypatch):
    from fedpeft.core.logs import apply_inherited_levels

    monkeypatch.setattr(logging.getLogger("bitsandbytes"), "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger("peft"), "level", logging.NOTSET)
    monkeypatch.setenv(LEVELS_VARIABLE, f"bitsandbytes={logging.ERROR},peft=x,os={logging.DEBUG}")
    apply_inherited_levels()
    assert logging.getLogger("bitsandbytes").level == logging.ERROR
    assert logging.getLogger("peft").level == logging.NOTSET  # not a level: left as it was


def test_a_quiet_worker_keeps_transformers_quiet_after_importing_it():
    """transformers sets its logger's level from its environment when imported: a quiet run's worker shows no
    warnings, load reports, progress bars or deprecation notices of it."""
    import subprocess
    import sys

    probe = (
        "from fedpeft.core.logs import apply_inherited_levels; apply_inherited_levels(); import logging, warnings; "
        "import transformers; from transformers.utils import logging as tl; "
        "print(logging.getLogger('transformers').level, tl.is_progress_bar_enabled()); "
        "warnings.warn('notice', FutureWarning)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_", "HF_"))}
    quiet = subprocess.run(
        [sys.executable, "-c", probe], env=env | {LEVELS_VARIABLE: f"transformers={logging.ERROR}"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert quiet.stdout.split() == [str(logging.ERROR), "False"] and "notice" not in quiet.stderr
    loud = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert loud.stdout.split()[0] != str(logging.ERROR) and "notice" in loud.stderr  # -v: as the library sets it


def test_a_worker_count_that_does_not_fit_in_memory_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys
):
    """The estimate is this process's resident size per worker process; here the machine has room for one."""
    import psutil

    rss = psutil.Process().memory_info().rss
    real = psutil.virtual_memory
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real()._replace(available=int(1.5 * rss)))
    out = tmp_path / "out"
    code, _, err = cli(monkeypatch, capsys, "run", "smoke", "--out", str(out), "--set", "engine.workers=2", *sets(TINY))
    assert code == 2 and not out.exists()
    assert err.strip().splitlines()[-1].endswith("GiB is free; use engine.workers 1 or fewer.")


def test_a_gpu_device_without_a_gpu_is_refused_in_one_sentence(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    for device in ("cuda", "cuda:1"):
        code, _, err = cli(monkeypatch, capsys, "run", "smoke", "--out", str(out), "--set", f"device={device}")
        assert code == 2 and not out.exists()
        assert f"device {device} needs an NVIDIA GPU" in err.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------- same numbers
@pytest.mark.slow
def test_worker_processes_give_the_records_of_one(tmp_path, caplog):
    """More workers than clients: as many worker processes as there are clients, said once, with the records of
    one process (two workers, the default on two cores, are benchmarks/parallel.py's quick mode in
    tests/test_benchmarks.py)."""
    one = run_with(tmp_path, "one", TINY, 1)
    with caplog.at_level(logging.WARNING, logger="fedpeft"):
        many = run_with(tmp_path, "many", TINY, 64)
    assert comparable(many) == comparable(one)
    said = [r.getMessage() for r in caplog.records if "engine.workers 64" in r.getMessage()]
    assert said == ["engine.workers 64: the federation has 4 clients, so 4 worker processes run"], said
    # costs.jsonl gives the worker processes' peak memory so far with every phase they ran, never falling; a run in
    # one process has none.
    peaks = [(r["phase"], r["value"]) for r in cost_rows(many) if r["metric"] == "workers_peak_rss_mb"]
    assert {phase for phase, _ in peaks} >= {"base", "personalization"}
    values = [value for _, value in peaks]
    assert values == sorted(values) and values[-1] > 100  # a worker process that trained holds torch and a model
    assert not [r for r in cost_rows(one) if r["metric"] == "workers_peak_rss_mb"]


# The default (`engine.workers: auto`) as a user gets it, beside one process, with the records of one process:
# tests/test_benchmarks.py runs benchmarks/parallel.py's quick mode, which checks exactly that.


@pytest.mark.slow
def test_two_workers_give_the_records_of_one_across_method_families(tmp_path, monkeypatch):
    """With ``engine.concurrent_methods`` the units (the base evaluation and each method) run at once on the two
    processes, and the records are those of one worker, which runs them one after the other."""
    from fedpeft.engine.pool import WorkerPool

    in_flight: dict[int, str] = {}
    overlaps: set[frozenset[str]] = set()
    send, finish = WorkerPool._send, WorkerPool._finish

    def recording_send(self, slot, op, client_id, kwargs):  # noqa: ANN001, ANN202
        tag = send(self, slot, op, client_id, kwargs)
        in_flight[tag] = kwargs.get("label", op)
        overlaps.add(frozenset(in_flight.values()))
        return tag

    def recording_finish(self, tag, result):  # noqa: ANN001, ANN202
        in_flight.pop(tag, None)
        finish(self, tag, result)

    overrides = [*TINY[:-1], *FAMILIES]
    one = run_with(tmp_path, "one", overrides, 1)
    monkeypatch.setattr(WorkerPool, "_send", recording_send)
    monkeypatch.setattr(WorkerPool, "_finish", recording_finish)
    two = run_with(tmp_path, "two", [*overrides, "engine.concurrent_methods=5"], 2)
    records = comparable(one)
    assert {r["method"] for r in records} >= {"fedit", "fedprox", "ditto", "fedsa_lora", "lora"}
    assert any(r["split"] == "train" for r in records) and any(r["round"] == 1 for r in records)
    assert comparable(two) == records
    assert list((two / "client_state").rglob("*.safetensors"))  # per-client state lived on disk
    assert any(len(labels) >= 2 for labels in overlaps), overlaps  # two units' clients ran at the same time


@pytest.mark.slow
def test_the_units_of_seeds_that_share_a_base_model_run_at_once_with_the_records_of_one_process(tmp_path, monkeypatch):
    """The smoke preset's centralized base stage is trained once for every seed: then the units of both seeds run
    at once on the worker processes (a client of seed 1 beside one of seed 0), and the records and their order are
    those of one process, which runs the seeds one after the other."""
    from fedpeft.engine.pool import WorkerPool

    in_flight: dict[int, int] = {}
    overlaps: set[frozenset[int]] = set()
    send, finish = WorkerPool._send, WorkerPool._finish

    def recording_send(self, slot, op, client_id, kwargs):  # noqa: ANN001, ANN202
        tag = send(self, slot, op, client_id, kwargs)
        in_flight[tag] = kwargs.get("seed", -1)
        overlaps.add(frozenset(in_flight.values()))
        return tag

    def recording_finish(self, tag, result):  # noqa: ANN001, ANN202
        in_flight.pop(tag, None)
        finish(self, tag, result)

    # FedIT's rounds outlast LoRA's one pass: seed 1's first method starts in LoRA's place while FedIT runs on.
    methods = "methods=[{name: fedit, rounds: 6, fraction: 1.0, local_steps: 4, lr: 0.005}, {name: lora, lr: 0.005}]"
    overrides = [*TINY[:-1], methods, "seeds=[0, 1]"]
    one = run_with(tmp_path, "one", overrides, 1)
    monkeypatch.setattr(WorkerPool, "_send", recording_send)
    monkeypatch.setattr(WorkerPool, "_finish", recording_finish)
    two = run_with(tmp_path, "two", [*overrides, "engine.concurrent_methods=2"], 2)
    assert comparable(two) == comparable(one)  # in the same order
    assert any({0, 1} <= seeds for seeds in overlaps), overlaps


@pytest.mark.slow
@pytest.mark.parametrize(
    "base",
    [
        "base.kind=pretrained",
        "base={kind: federated, method: {name: fedavg_full, rounds: 1, fraction: 1.0, local_steps: 2, lr: 0.001}}",
    ],
)
def test_with_worker_processes_the_server_process_loads_no_model(tmp_path, monkeypatch, base):
    """The server's process builds no model (nor tokenizer) when worker processes run the clients: a method's
    initial state, the base stage's export, the saved base model and the costs come from a worker process, with the
    records and files of one worker."""
    overrides = [
        *TINY[:-1],
        "methods=[{name: fedit, rounds: 2, fraction: 0.5, local_steps: 2, lr: 0.005}, {name: lora, lr: 0.005}]",
        base,
        "output.save_adapters=true",
    ]
    one = run_with(tmp_path, "one", overrides, 1)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the server's process loaded a model")

    monkeypatch.setattr("fedpeft.worker.build.build_runtime", refuse)  # worker processes are interpreters of their own
    two = run_with(tmp_path, "two", overrides, 2)
    assert comparable(two) == comparable(one)
    saved = [p.relative_to(one) for p in sorted((one / "base_model").rglob("*"))]
    assert saved and saved == [p.relative_to(two) for p in sorted((two / "base_model").rglob("*"))]
    weights = Path("base_model") / "model.safetensors"
    assert (two / weights).read_bytes() == (one / weights).read_bytes()


@pytest.mark.slow
def test_runs_that_share_the_pool_get_their_own_results_in_order(tmp_path):
    """Two runs of one pool at once, in threads that take turns (as units do): each gets its own clients' results,
    in its clients' order, whichever thread received them."""
    import threading

    from fedpeft.core.config import dump_given
    from fedpeft.core.turns import Turns
    from fedpeft.engine.pool import WorkerPool

    cfg = load_config("smoke", [*TINY, "base.kind=pretrained"])
    pool = WorkerPool(dump_given(cfg), tmp_path, 2, 1, None)
    turns = Turns()
    results: dict[str, list[tuple[str, int]]] = {}
    clients = sorted(c.client_id for c in Experiment(cfg, tmp_path / "x")._load(flower=False)[0].data.clients)

    def run(name: str, ids: list[str]) -> None:
        with turns.hold():
            got = pool.run("evaluate_base", ids, lambda _client: {"seed": 0}, turns.wait)
            results[name] = [(client_id, len(value) if isinstance(value, list) else -1) for client_id, value, _ in got]

    threads = [threading.Thread(target=run, args=(n, ids)) for n, ids in (("a", clients), ("b", clients[::-1]))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        pool.close()
    assert [c for c, _ in results["a"]] == clients and [c for c, _ in results["b"]] == clients[::-1]
    assert all(count > 0 for _, count in results["a"] + results["b"])


def test_an_interrupted_run_of_the_pool_raises_at_its_next_look():
    from fedpeft.engine.pool import WorkerPool

    pool = WorkerPool("", Path("."), 1, 1, None)
    pool.stopped.set()
    with pytest.raises(KeyboardInterrupt, match="the run was interrupted"):
        next(pool.run("evaluate_base", ["c"], lambda _client: {}, lambda seconds: None))
    pool.close()


# ---------------------------------------------------------------------------------------------- failures
@pytest.mark.slow
def test_a_killed_worker_process_is_a_failed_client_and_the_run_goes_on(tmp_path):
    """SIGKILL the worker process that runs a (slow) client in round 2: the client is a failed client of that
    round, the process is replaced, and the run ends with every other record."""
    victim = "lat1-seen-00"
    overrides = [
        *TINY[:-1],
        "methods=[{name: fedit, rounds: 3, fraction: 1.0, local_steps: 2, lr: 0.005}]",
        f"faults=[{{kind: slow, value: 120, clients: [{victim}], rounds: [2]}}]",
        "engine.workers=2",
    ]
    engines: list[LocalEngine] = []

    def engine_factory(worker):
        engines.append(LocalEngine(worker, EngineSettings(processes=2, threads=1, state="disk")))
        return engines[0]

    killed: list[int] = []

    out = tmp_path / "run"
    after_round_1 = out / "checkpoints" / "fedit" / "seed0.safetensors"

    def kill_the_victim() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            pid = engines[0].running().get(victim) if engines and after_round_1.exists() else None
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_victim, daemon=True)
    killer.start()
    started = time.monotonic()
    Experiment(load_config("smoke", overrides), out).run(engine_factory=engine_factory)
    killer.join(timeout=10)
    assert killed and time.monotonic() - started < 110  # the slow client was not waited for
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    failed = [c for c in costs if c.get("metric") == "failed_client"]
    # its second round (faults and costs.jsonl both count rounds from 1)
    assert len(failed) == 1 and failed[0]["client"] == victim and failed[0]["round"] == 2, failed
    assert "WorkerProcessError" in json.dumps(failed[0]) and str(killed[0]) in json.dumps(failed[0])
    records = comparable(out)
    assert {r["method"] for r in records} >= {"fedit", "base"}
    assert {r["client"] for r in records if r["method"] == "fedit" and r["split"] == "test"} >= {victim}


@pytest.mark.slow
def test_ctrl_c_leaves_no_worker_process(tmp_path):
    """Ctrl-C (SIGINT to the process group) during the rounds ends the run with exit code 130 and leaves no
    process of its session behind."""
    raw = tiny_raw(base={"kind": "pretrained"}, engine={"workers": 2})
    raw["methods"] = [raw["methods"][0] | {"rounds": 40}]
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    fedpeft = str(Path(sys.executable).parent / "fedpeft")
    run = subprocess.Popen(
        [fedpeft, "run", str(config), "--out", str(out)], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    checkpoint = out / "checkpoints" / "fedit" / "seed0.safetensors"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.poll() is None, "the run ended before it could be interrupted"
    session = ["ps", "-o", "pid=,args=", "-s", str(run.pid)]
    before = subprocess.run(session, capture_output=True, text=True).stdout
    assert before.count("fedpeft.engine.pool") == 2, before
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 130, err[-3000:]
    deadline = time.monotonic() + 10
    while True:
        left = subprocess.run(session, capture_output=True, text=True).stdout
        if not left.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left.strip(), left


@pytest.mark.slow
def test_a_run_killed_on_two_workers_resumes_on_one_and_back_with_the_records_of_one(tmp_path):
    """Ditto keeps its per-client state on disk with two worker processes and in memory with one: a run killed
    mid-phase on two workers resumes on one (its client states read from the files), is killed again, and resumes
    on two (the checkpoint's states written as files); the records are those of an uninterrupted run on one
    worker."""
    from fedpeft.core.checkpoints import load_checkpoint

    overrides = [
        *TINY[:-1],
        "methods=[{name: ditto, rounds: 40, fraction: 1.0, local_steps: 2, lr: 0.005}]",
        "output.plots=false",
    ]
    reference = run_with(tmp_path, "reference", overrides, 1)
    interrupted = tmp_path / "interrupted"
    args = [sys.executable, "-m", "fedpeft.cli", "run", "smoke", "--out", str(interrupted)]
    args += sets(overrides)
    checkpoint = interrupted / "checkpoints" / "ditto" / "seed0.safetensors"
    killed_at = kill_at_round([*args, "--set", "engine.workers=2"], checkpoint, 3)
    assert not (interrupted / "results.jsonl").exists(), "the run finished before it could be killed"
    assert 3 <= killed_at < 30
    assert load_checkpoint(checkpoint)["store"] is None  # the client states are files

    again = kill_at_round([*args, "--set", "engine.workers=1", "--resume"], checkpoint, killed_at + 4)
    assert not (interrupted / "results.jsonl").exists(), "the resumed run finished before it could be killed"
    assert killed_at < again < 40
    assert load_checkpoint(checkpoint)["store"]  # the client states are in the checkpoint

    resumed = subprocess.run([*args, "--set", "engine.workers=2", "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert comparable(interrupted) == comparable(reference)
