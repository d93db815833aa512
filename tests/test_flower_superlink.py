"""A launch survives what its SuperLink survives (docs/flower.md, "A SuperLink that restarts, a busy database"):
a SQLite write lock held longer than Flower's 5 s busy timeout, and a SuperLink restarted mid-run with its database.

The fast tests check the pieces in this process or in small processes: the longer busy timeout that
``python -m fedpeft.apps.superlink`` gives Flower's state, the launcher's log that leaves out the lines a second
``flwr log`` repeats, and the ServerApp's watch of its SuperExec. One slow test runs them together on loopback: real
SuperLink and SuperNodes, the database locked from this process for 12 s, then the SuperLink restarted.
"""

from __future__ import annotations

import io
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from flower_helpers import (
    ATOL,
    FEDPEFT,
    assert_nothing_left,
    launch_command,
    one_torch_thread,
    read_records,
    tiny_raw,
)

from fedpeft.apps import launch
from fedpeft.apps.loopback import LoopbackDeployment
from fedpeft.apps.superlink import set_busy_timeout
from fedpeft.core.processes import process_alive

__all__ = ["one_torch_thread"]  # the fixture applies here


# ---------------------------------------------------------------------------------------------- a busy database
def test_the_superlink_module_gives_flowers_sqlite_state_a_longer_busy_timeout(tmp_path, monkeypatch):
    """Flower 1.42 waits 5 s for a SQLite lock (a constant, no option); the module that starts the SuperLink sets the
    wait of every connection Flower's state opens afterwards."""
    from flwr.supercore import sql_mixin

    assert dict(sql_mixin.SQLITE_PRAGMAS)["busy_timeout"] == "5000"  # Flower's own: if it changes, look again
    monkeypatch.setattr(sql_mixin, "SQLITE_PRAGMAS", sql_mixin.SQLITE_PRAGMAS)  # restored after the test
    assert set_busy_timeout(42.5)

    class State(sql_mixin.SqlMixin):
        pass

    state = State(str(tmp_path / "state.db"))
    state.initialize()
    assert state.query("PRAGMA busy_timeout") == [{"timeout": 42500}]
    assert state.query("PRAGMA journal_mode") == [{"journal_mode": "wal"}]  # the other pragmas stay Flower's


def test_the_superlink_module_refuses_a_busy_timeout_that_is_no_number_of_seconds():
    command = [sys.executable, "-m", "fedpeft.apps.superlink", "--help"]
    refused = subprocess.run(
        command, env={**os.environ, "FEDPEFT_SQLITE_BUSY_TIMEOUT": "soon"}, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode != 0
    assert refused.stderr.strip() == "error: FEDPEFT_SQLITE_BUSY_TIMEOUT='soon' is not a number of seconds above 0."
    usage = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0 and "usage: flower-superlink" in usage.stdout and "--database" in usage.stdout


# ---------------------------------------------------------------------------------------------- the launcher's log
def test_a_log_streamed_again_shows_only_its_new_lines_and_a_lost_connections_box_is_kept_back(monkeypatch):
    shown = io.StringIO()
    monkeypatch.setattr(sys, "stderr", shown)
    stream = launch.RunLog()
    first = ["Successfully started run 77\n", "round 1/3\n", "round 2/3\n", "round 2/3\n"]
    box = ["╭─ Error ──╮\n", "│ Connection to the SuperLink is unavailable. │\n", "╰──────────╯\n"]
    for line in first + box:
        stream.take(line)
    assert stream.run_id == "77" and shown.getvalue() == "".join(first)
    stream.drop_panel()
    stream.replay()  # `flwr log` streams the run's log from its start
    for line in [*first[1:], "warning: retrying\n", "round 3/3\n", "Exit Code: 201\n", "error: it broke\n"]:
        stream.take(line)
    assert shown.getvalue() == "".join([*first, "warning: retrying\n", "round 3/3\n"])
    assert stream.error == "it broke"

    # A box the stream goes on after is no farewell: shown, in its place.
    stream = launch.RunLog()
    for line in [*box, "round 1/3\n"]:
        stream.take(line)
    assert shown.getvalue().endswith("".join([*box, "round 1/3\n"]))


# ---------------------------------------------------------------------------------------------- the ServerApp's watch
WATCHED = """
import logging, os, signal, sys, threading, time
from fedpeft.engine.flower.link_watch import SuperLinkWatch

logging.basicConfig(level=logging.INFO, format="%(message)s")
mode = sys.argv[1]

class Grid:  # stands in for the ServerApp's Grid: "away" never answers, as Flower's retries while the SuperLink is
    def get_node_ids(self):  # gone
        if mode == "away":
            threading.Event().wait()
        return []

def flowers_handler(signum, frame):  # what Flower installs: it ends the process
    print("Flower's handler", flush=True)
    os._exit(3)

signal.signal(signal.SIGINT, flowers_handler)
started_by = os.getppid()
with SuperLinkWatch(Grid(), seconds=2.0, poll=0.1):
    print("watching", flush=True)
    while os.getppid() == started_by:  # until the process that started this one (the SuperExec) has ended
        time.sleep(0.05)
    signal.raise_signal(signal.SIGINT)  # as Flower's watch of its parent does, once
    print("the run goes on", flush=True)
    time.sleep(1.0)
    if mode == "back":
        signal.raise_signal(signal.SIGINT)  # a second one (flwr stop): Flower's
    time.sleep(30)
"""

STARTER = """
import subprocess, sys
with open(sys.argv[2], "w") as out:
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[3]], stdout=out, stderr=subprocess.STDOUT)
print(child.pid, flush=True)
sys.stdin.readline()  # ends when told: the SuperExec gone
"""


def watched(tmp_path: Path, mode: str) -> tuple[str, float]:
    """Run :data:`WATCHED` under a process that ends once it watches (a SuperExec that ends); its output and the
    seconds from that end to its own."""
    output = tmp_path / f"{mode}.log"
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, WATCHED, str(output), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert starter.stdout is not None and starter.stdin is not None
    pid = int(starter.stdout.readline())
    deadline = time.monotonic() + 120
    while "watching" not in output.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    starter.stdin.close()
    starter.wait(timeout=30)
    ended = time.monotonic()
    while process_alive(pid) and time.monotonic() < ended + 30:
        time.sleep(0.05)
    assert not process_alive(pid)
    return output.read_text(), time.monotonic() - ended


def test_a_serverapp_whose_superexec_ended_goes_on_while_the_superlink_answers(tmp_path):
    output, _ = watched(tmp_path, "back")
    lines = output.splitlines()
    assert "the SuperLink answers again; the run goes on" in lines
    assert lines.index("the run goes on") < lines.index("Flower's handler")  # the first SIGINT taken, not the second


def test_a_serverapp_whose_superlink_does_not_answer_ends_after_its_wait(tmp_path):
    output, seconds = watched(tmp_path, "away")
    assert "error: the SuperLink did not answer within 2 s; this ServerApp ends" in output
    assert "the run goes on" in output and "Flower's handler" not in output  # ended by the watch, not by Flower
    assert seconds < 20, seconds


# ---------------------------------------------------------------------------------------------- on loopback
def launch_run_id(output: str) -> str:
    """The run id ``fedpeft launch`` announced (Flower's ``Successfully started run N`` line)."""
    found = re.search(r"started run (\d+)", output)
    assert found, output[-3000:]
    return found.group(1)


def hold_write_lock(database: Path, seconds: float) -> float:
    """Hold SQLite's write lock on ``database`` for ``seconds`` (as another writer would), from this process; the
    seconds it took to get it."""
    connection = sqlite3.connect(database, isolation_level=None, timeout=60)
    started = time.monotonic()
    connection.execute("BEGIN EXCLUSIVE")  # in WAL mode: the write lock; readers go on
    waited = time.monotonic() - started
    time.sleep(seconds)
    connection.execute("COMMIT")
    connection.close()
    return waited


@pytest.mark.slow
def test_a_launch_survives_a_locked_database_and_a_superlink_restart(tmp_path):
    """A deployment with the SuperLink's ``--database`` (started as docs/flower.md says then): mid-run, the database
    is write-locked for 12 s (Flower's own wait is 5 s: without the longer one, the SuperExec, both SuperNodes and
    the run end, as measured on loopback), then the SuperLink is restarted. The launch waits for it, streams the
    rest of the run once (every round line once), exits 0 with the records of the local engine, and the run's node
    workers are closed with it. A second run whose SuperLink restarts without its database (it forgets the run)
    ends the launch with one sentence that says so and the command that resumes it; its workers, which nothing can
    close then, end on their lease within a minute."""
    rounds = 5
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0] | {"rounds": rounds}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    worker_dir = Path(tempfile.mkdtemp(prefix="fp"))  # short: a Unix socket's path is limited to ~100 bytes
    node_configs = [
        f"partition-id={i} num-partitions=2 run-dir='{tmp_path / f'node{i}'}' worker-dir='{worker_dir}'"
        for i in range(2)
    ]
    database = tmp_path / "superlink.db"
    checkpoint = out / "checkpoints" / "fedit" / "seed0.safetensors"

    def wait_for_round(done: int, run: subprocess.Popen) -> None:
        from fedpeft.core.checkpoints import load_checkpoint
        from fedpeft.methods.base import method_class

        method_class("fedit")  # a checkpoint names its state's class, known once the method is imported, as in a run
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and run.poll() is None:
            try:
                if load_checkpoint(checkpoint)["state"].round >= done:
                    return
            except Exception:  # absent, or being replaced
                pass
            time.sleep(0.3)
        raise AssertionError(f"round {done} never completed: {(tmp_path / 'launch.log').read_text()[-3000:]}")

    deployment = LoopbackDeployment(tmp_path, node_configs, {"OMP_NUM_THREADS": "1"}, database=database)
    with deployment, open(tmp_path / "launch.log", "w") as log:
        run = subprocess.Popen(
            launch_command(config, out, node_timeout=180),
            cwd=tmp_path,
            env=deployment.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_round(1, run)
            assert hold_write_lock(database, 12.0) < 5.0
            wait_for_round(3, run)
            deployment.restart_superlink()
            assert run.wait(timeout=600) == 0, (tmp_path / "launch.log").read_text()[-4000:]
            ended = time.monotonic()
        finally:
            if run.poll() is None:
                run.kill()
        assert_nothing_left(worker_dir, seconds=60)
        assert time.monotonic() - ended < 60
        superlink_log = deployment.log("superlink").read_text(errors="replace")

        # A SuperLink restarted without its database forgets the run: one sentence, the resume line, no traceback.
        forgotten = launch_command(config, tmp_path / "out2", node_timeout=180)
        second = subprocess.Popen(forgotten, cwd=tmp_path, env=deployment.env, stderr=subprocess.PIPE, text=True)
        checkpoint = tmp_path / "out2" / "checkpoints" / "fedit" / "seed0.safetensors"
        try:
            wait_for_round(1, second)
            stopped = time.monotonic()
            deployment.stop_one("superlink")
            for path in tmp_path.glob("superlink.db*"):
                path.unlink()
            deployment.start_superlink()
            _, err = second.communicate(timeout=300)
        finally:
            if second.poll() is None:
                second.kill()
        assert second.returncode == 1, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            f"error: the SuperLink of 'local-deployment' restarted during run {launch_run_id(err)} and no longer "
            f"knows the run; continue it with `fedpeft {' '.join(forgotten[1:])} --resume`."
        ), err[-3000:]
        assert "Traceback" not in err and "Connection to the SuperLink is unavailable" not in err, err[-3000:]
        # The run's workers end on their lease: 60 s after the last keepalive, sent before the restart and renewed
        # by a ClientApp process that may start a few seconds later on a loaded machine (65.6 s seen at a load of 2),
        # then the worker's exit. Far less than the node timeout of 180 s the run would otherwise wait.
        assert_nothing_left(worker_dir, seconds=90)
        assert time.monotonic() - stopped < 80

    streamed = (tmp_path / "launch.log").read_text()
    assert "database is locked" not in superlink_log
    # The restart is seen by the launcher (its stream ended: "does not answer") or, when Flower's client reconnected
    # the stream by itself (a quick restart), by the ServerApp only; either way the run went on and said so.
    noticed = "does not answer (restarted?)" in streamed or "the SuperLink restarted or stopped" in streamed
    assert noticed and "the SuperLink answers again" in streamed, streamed[-3000:]
    for done in range(1, rounds + 1):  # the log streamed again after the restart, without what was shown
        assert streamed.count(f"seed 0: round {done}/{rounds},") == 1, streamed[-4000:]
    assert not [line for line in streamed.splitlines() if line.startswith("error")], streamed[-3000:]
    assert "Traceback" not in streamed, streamed[-3000:]

    local = tmp_path / "local"
    ran = subprocess.run([FEDPEFT, "run", str(config), "--out", str(local)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    deployed, expected = read_records(out), read_records(local)
    assert deployed.keys() == expected.keys()
    assert all(abs(deployed[key] - expected[key]) <= ATOL for key in expected)
