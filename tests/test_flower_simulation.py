"""The Flower simulation engine (Ray): the local engine's numbers, a user error, and Ctrl-C with --resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from flower_helpers import ATOL, one_torch_thread, read_costs, read_records, tiny_raw

from fedpeft.apps.flower import run_flower_simulation, simulation_backend
from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import EngineConfig, dump_config, same_run, validate
from fedpeft.methods.base import method_class
from fedpeft.runner import Experiment

__all__ = ["one_torch_thread"]  # the fixture applies here


# ---------------------------------------------------------------------------------------------- equivalence
@pytest.mark.slow
def test_simulation_engine_matches_local_engine(tmp_path):
    """The same records and global adapter as the local engine, with the two methods running at once
    (``engine.concurrent_methods``: their messages interleave on the nodes, their server steps take turns)."""
    cfg = validate(tiny_raw())
    Experiment(cfg, tmp_path / "local").run()
    run_flower_simulation(validate(tiny_raw(engine={"concurrent_methods": 2})), tmp_path / "flower")

    local, flower = read_records(tmp_path / "local"), read_records(tmp_path / "flower")
    assert {k[0] for k in local} == {"base", "fedit", "lora"}
    assert local.keys() == flower.keys()
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key

    # The global adapter after the last round: the floats themselves, not only the accuracies they lead to.
    def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
        return load_checkpoint(run_dir / "checkpoints" / "fedit" / "seed0.safetensors")["state"].tensors

    local_state, flower_state = final_state(tmp_path / "local"), final_state(tmp_path / "flower")
    assert list(local_state) == list(flower_state)
    for key, tensor in local_state.items():
        torch.testing.assert_close(flower_state[key], tensor, atol=ATOL, rtol=0, msg=key)

    local_costs, flower_costs = read_costs(tmp_path / "local"), read_costs(tmp_path / "flower")
    for metric in ("bytes_up_total", "bytes_down_total"):
        assert flower_costs["fedit", "federated", metric] == local_costs["fedit", "federated", metric] > 0
    assert yaml.safe_load((tmp_path / "flower" / "config.yaml").read_text())["engine"]["name"] == "flower"


@pytest.mark.slow
def test_user_error_inside_the_simulation_reaches_the_cli(tmp_path, monkeypatch, capsys):
    from fedpeft import cli

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_raw(budgets=[100_000], base={"kind": "pretrained"})))
    argv = ["fedpeft", "run", str(config), "--engine", "flower", "--out", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    assert "rank" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_stops_a_simulation_at_once_and_the_run_resumes(tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group) ends `fedpeft run --engine flower` within seconds with exit
    code 130, leaves no Ray or ClientApp process behind and a checkpoint from which --resume finishes the run:
    synchronous FedIT with the numbers of an uninterrupted one, and FedBuff (running at the same time,
    ``engine.concurrent_methods``) from its last server step, its clients then in flight sent again."""
    fedit = tiny_raw()["methods"][0] | {"rounds": 12}
    buffered = fedit | {"label": "buffered", "schedule": {"kind": "fedbuff", "concurrency": 3, "buffer_size": 2}}
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[fedit, buffered], engine={"concurrent_methods": 2})
    raw["data"] = {**raw["data"], "unseen_pool": False}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "flower"
    fedpeft = str(Path(sys.executable).parent / "fedpeft")
    command = [fedpeft, "run", str(config), "--engine", "flower", "--out", str(out)]
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    checkpoints = [out / "checkpoints" / label / "seed0.safetensors" for label in ("fedit", "buffered")]
    deadline = time.monotonic() + 300
    while not all(c.exists() for c in checkpoints) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.poll() is None, "the run ended before it could be interrupted"
    os.killpg(run.pid, signal.SIGINT)
    interrupted = time.monotonic()
    _, err = run.communicate(timeout=120)
    assert time.monotonic() - interrupted < 60  # seconds on an idle machine; generous for a loaded one
    assert run.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].endswith("--resume`."), err[-3000:]
    # Nothing of the run's session stays: a short-lived helper that a library starts at exit (Flower's telemetry
    # runs `file` through platform.platform()) may still be ending; Ray and the ClientApps must be gone.
    deadline = time.monotonic() + 10
    while True:
        left = subprocess.run(["ps", "-o", "pid=,comm=", "-s", str(run.pid)], capture_output=True, text=True).stdout
        if not left.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left.strip(), left
    method_class("fedit")  # a checkpoint names its state's class, known once the method is imported, as in a run
    state = load_checkpoint(checkpoints[0])
    assert 1 <= state["state"].round < 12 and not state["meter"]["failures"]  # no round of the ended backend
    saved = load_checkpoint(checkpoints[1])
    assert 1 <= saved["state"].round < 12 and not saved["meter"]["failures"]
    # After a server step, the clients still training (none when the step took the last reply in) are listed, to
    # be sent again on --resume.
    assert len(saved.get("in_flight", [])) <= 2

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    Experiment(validate(raw | {"methods": [fedit]}), tmp_path / "local").run()
    local, flower = read_records(tmp_path / "local"), read_records(out)
    synchronous = {k: v for k, v in flower.items() if k[0] != "buffered" and k[8] != "virtual_time"}
    assert local.keys() == synchronous.keys()
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key
    steps = [k[6] for k in flower if k[0] == "buffered" and k[7] == "train" and k[8] == "clients"]
    assert sorted(steps) == list(range(1, 13)), steps  # every server step once, before and after the resume
    assert all(v == 2.0 for k, v in flower.items() if k[0] == "buffered" and k[7] == "train" and k[8] == "clients")


# ---------------------------------------------------------------------------------------------- a Ray cluster
def test_simulation_backend_joins_a_cluster_with_per_client_resources_or_starts_ray_here():
    here = simulation_backend(EngineConfig(num_supernodes=3), cuda=False)
    assert here["client_resources"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert here["init_args"]["num_cpus"] == min(3, os.cpu_count() or 1) and here["init_args"]["address"] == "local"
    gpu_here = simulation_backend(EngineConfig(num_supernodes=1), cuda=True)
    assert gpu_here["client_resources"]["num_gpus"] == 1.0 and gpu_here["init_args"]["num_gpus"] == 1

    engine = EngineConfig(name="flower", ray_address="auto", client_cpus=2, workers_per_gpu=4)
    cluster = simulation_backend(engine, cuda=True)
    # Ray refuses num_cpus / num_gpus when it joins a cluster: the cluster's nodes say what they have
    assert cluster["init_args"]["address"] == "auto" and not {"num_cpus", "num_gpus"} & cluster["init_args"].keys()
    assert cluster["client_resources"] == {"num_cpus": 2.0, "num_gpus": 0.25}
    explicit = simulation_backend(engine.model_copy(update={"client_gpus": 1.0}), cuda=True)
    assert explicit["client_resources"]["num_gpus"] == 1.0
    assert simulation_backend(engine, cuda=False)["client_resources"]["num_gpus"] == 0.0


def test_a_run_may_resume_on_another_cluster_or_with_other_client_resources():
    here = validate(tiny_raw(engine={"name": "flower"}))
    cluster = here.model_copy(
        update={"engine": here.engine.model_copy(update={"ray_address": "auto", "client_cpus": 2, "client_gpus": 1})}
    )
    assert same_run(dump_config(here), dump_config(cluster))
    other_data = here.model_copy(update={"data": here.data.model_copy(update={"seed": 1})})
    assert not same_run(dump_config(here), dump_config(other_data))


# Two Ray nodes on loopback, in a process of their own (Ray reads this setting when it is imported): without it
# Ray resolves 127.0.0.1 to the machine's network address, as a cluster across machines needs.
CLUSTER = """
import sys
from ray.cluster_utils import Cluster
loopback = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
cluster = Cluster(initialize_head=True, head_node_args={**loopback, "include_dashboard": False})
cluster.add_node(**loopback)
cluster.wait_for_nodes()
print(cluster.address, len(cluster.list_all_nodes()), flush=True)
sys.stdin.read()
cluster.shutdown()
"""
LOOPBACK_RAY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.mark.slow
def test_simulation_on_a_two_node_ray_cluster_gives_the_local_engine_records(tmp_path):
    """`fedpeft run --engine flower --set engine.ray_address=...` joins a running cluster of two Ray nodes (a head
    and a worker node, one CPU each, started on loopback) instead of starting Ray, and its records are the local
    engine's."""
    raw = tiny_raw()
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**os.environ, **LOOPBACK_RAY}
    cluster = subprocess.Popen(
        [sys.executable, "-c", CLUSTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert cluster.stdout is not None and cluster.stdin is not None
        address, nodes = cluster.stdout.readline().split()
        assert address.startswith("127.0.0.1:") and nodes == "2"
        fedpeft = str(Path(sys.executable).parent / "fedpeft")
        command = [fedpeft, "run", str(config), "--engine", "flower", "--out", str(tmp_path / "cluster")]
        command += ["--set", f"engine.ray_address={address}", "--set", "engine.num_supernodes=2"]
        run = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        # A simulation without engine.ray_address starts a Ray of its own beside the running cluster, which Ray
        # would otherwise join and refuse the core count it was given.
        alone = [fedpeft, "run", str(config), "--engine", "flower", "--out", str(tmp_path / "alone")]
        beside = subprocess.run(alone, capture_output=True, text=True, timeout=600, env=env)
        cluster.stdin.close()
        cluster.wait(timeout=60)
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()
    assert run.returncode == 0, run.stderr[-3000:]
    assert beside.returncode == 0, beside.stderr[-3000:]
    Experiment(validate(raw), tmp_path / "local").run()
    local, flower = read_records(tmp_path / "local"), read_records(tmp_path / "cluster")
    assert local.keys() == flower.keys() and {k[0] for k in local} == {"base", "fedit", "lora"}
    for key, value in local.items():
        assert flower[key] == pytest.approx(value, abs=ATOL), key
    assert read_records(tmp_path / "alone").keys() == local.keys()
    resolved = yaml.safe_load((tmp_path / "cluster" / "config.yaml").read_text())["engine"]
    assert resolved["ray_address"] == address


# ---------------------------------------------------------------------------------------------- an unreachable Ray
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_ray_address_where_nothing_listens_is_one_sentence_before_anything_starts(tmp_path, monkeypatch, capsys):
    """Ray itself retries such an address for minutes; the run is refused at once and writes nothing."""
    from fedpeft import cli

    address = f"127.0.0.1:{closed_port()}"
    out = tmp_path / "out"
    argv = ["fedpeft", "run", "smoke", "--engine", "flower", "--set", f"engine.ray_address={address}"]
    argv += ["--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: No Ray cluster answers at engine.ray_address='{address}'")
    assert not out.exists()


@pytest.mark.slow
def test_a_simulation_whose_ray_cannot_start_ends_at_once_with_one_sentence(tmp_path, monkeypatch):
    """Ray's start fails inside Flower's simulation runtime (here: no cluster to join, Ray's own error injected:
    a real ``auto`` would join whatever Ray another test runs on this machine): the run ends with the
    cause in one sentence, and the ServerApp's thread, which would wait for its virtual nodes' answers for
    ``SIMULATION_NODE_TIMEOUT`` (600 s), ends with it."""
    import threading

    from flwr.server.superlink.fleet.vce.backend import raybackend

    from fedpeft.core.errors import UserError

    def no_cluster(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(raybackend.ray, "init", no_cluster)  # what Ray raises where no cluster runs
    before = set(threading.enumerate())
    with pytest.raises(UserError, match="Ray could not join the cluster at engine.ray_address='auto'"):
        run_flower_simulation(validate(tiny_raw(engine={"ray_address": "auto"})), tmp_path / "out")
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=60)
        assert not thread.is_alive(), f"{thread.name} still runs after the simulation failed"
