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

from fedpeft.apps.flower import run_flower_simulation
from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import validate
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
