"""A run's directory under misuse: two runs into it at once (real processes), a killed run's lock, a part whose last
line was cut, a config.yaml that is a directory, a read-only run to adopt, speed settings no clock can count, and
the exit code of a launch stopped with SIGTERM. Each refusal is one sentence and exit code 2, and writes nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from entry_point import cli
from test_bad_input_config import refused, smoke_args
from test_run_dirs import TINY, run_args, snapshot, tiny_run  # noqa: F401  (the module's run, built once)

from fedpeft.rundir import LOCK_FILE, RUN_MARKER

REPO = Path(__file__).resolve().parents[1]


def _start(out: Path, *extra: str) -> subprocess.Popen[str]:
    """``fedpeft run`` of the tiny federation into ``out`` in a process of its own."""
    args = [sys.executable, "-m", "fedpeft.cli", *run_args(out, *extra)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(args, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_the_lock(process: subprocess.Popen[str], out: Path) -> None:
    """Wait until ``process`` holds ``out``'s lock (its pid in the lock file), or fail with its output."""
    lock = out / LOCK_FILE
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the run ended before locking {out}: {process.stdout.read() if process.stdout else ''}")
        try:
            if json.loads(lock.read_text())["pid"] == process.pid:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"the run never locked {out}")


def test_a_second_run_into_a_running_runs_directory_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    first = _start(out)
    try:
        _wait_for_the_lock(first, out)
        os.kill(first.pid, signal.SIGSTOP)  # held where it is, lock and all, for as long as the second one tries
        before = snapshot(tmp_path)
        for extra in ([], ["--resume"]):
            code, _, err = cli(monkeypatch, capsys, *run_args(out, *extra))
            assert code == 2, err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
            assert f"process {first.pid}, started " in err and "still going" in err, err
            assert snapshot(tmp_path) == before
    finally:
        os.kill(first.pid, signal.SIGCONT)
    output, _ = first.communicate(timeout=600)
    assert first.returncode == 0, output
    assert (out / "summary.md").is_file()


def test_a_killed_run_leaves_no_lock_behind(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    killed = _start(out)
    _wait_for_the_lock(killed, out)
    killed.kill()
    killed.wait(timeout=60)
    assert (out / LOCK_FILE).is_file()  # the file stays; its lock died with the process
    # Whatever the kill left (a lock file alone, a start without results, finished units), --resume takes it.
    code, _, err = cli(monkeypatch, capsys, *run_args(out, "--resume"))
    assert code == 0, err
    assert (out / "summary.md").is_file() and (out / RUN_MARKER).is_file()


def test_a_part_whose_last_line_was_cut_is_a_unit_run_again(tiny_run, tmp_path, monkeypatch, capsys):  # noqa: F811
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    part = run / "parts" / "lora-seed0.jsonl"
    whole = part.read_text()
    part.write_text(whole[: whole.rindex("\n", 0, len(whole) - 1) + 20])  # the last line cut after 20 characters
    code, _, err = cli(monkeypatch, capsys, *run_args(run, "--resume"))
    assert code == 0, err
    assert (run / "results.jsonl").read_text() == (tiny_run / "results.jsonl").read_text()
    assert part.read_text().endswith("\n")
    records = [json.loads(line) for line in part.read_text().splitlines()]
    assert [r for r in records if "_cost" not in r] == [
        json.loads(line) for line in whole.splitlines() if "_cost" not in line
    ]


def test_a_broken_line_inside_a_part_is_named(tiny_run, tmp_path, monkeypatch, capsys):  # noqa: F811
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    part = run / "parts" / "lora-seed0.jsonl"
    lines = part.read_text().splitlines(keepends=True)
    part.write_text("".join([lines[0], "{not json\n", *lines[2:]]))
    before = snapshot(tmp_path)
    code, _, err = cli(monkeypatch, capsys, *run_args(run, "--resume"))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{part} line 2 " in err and "remove that file" in err, err
    assert snapshot(tmp_path) == before


def test_resume_where_config_yaml_is_a_directory_is_one_sentence(tiny_run, tmp_path, monkeypatch, capsys):  # noqa: F811
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    (run / "config.yaml").unlink()
    (run / "config.yaml").mkdir()
    before = snapshot(tmp_path)
    code, _, err = cli(monkeypatch, capsys, *run_args(run, "--resume"))
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "config.yaml is not a file" in err
    assert snapshot(tmp_path) == before and (run / "config.yaml").is_dir()


def test_adopting_a_read_only_run_is_one_sentence(tiny_run, tmp_path, monkeypatch, capsys):  # noqa: F811
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    (run / RUN_MARKER).unlink()  # a run of a version before the marker
    if os.geteuid() == 0:  # root writes anywhere: the file system's refusal, as a read-only mount gives it
        from fedpeft import rundir

        def read_only(*_args, **_kwargs) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(rundir, "write_marker", read_only)
    else:
        run.chmod(0o555)
    try:
        code, _, err = cli(monkeypatch, capsys, "adopt", str(run))
    finally:
        run.chmod(0o755)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "Permission denied" in err and "make the directory writable" in err
    assert not (run / RUN_MARKER).exists()


@pytest.mark.parametrize(
    ("speed", "message"),
    [
        ("{distribution: lognormal, sigma: 1000}", "reach e^10000"),
        ("{distribution: lognormal, sigma: .inf}", "sigma=inf"),
        ("{groups: {lat1: .inf}}", "above 0 and finite (groups.lat1=inf)"),
        ("{round_robin: [1, .inf]}", "round_robin[1]=inf"),
        ("{round_robin: [1.0e-200, 1.0e+200]}", "reach e^461"),
    ],
)
def test_speeds_no_clock_can_count_are_refused_before_anything_runs(speed, message, tmp_path, monkeypatch, capsys):
    args = smoke_args(tmp_path / "run", f"clients.speed={speed}", "methods=[{name: fedit, schedule: {kind: fedasync}}]")
    assert message in refused(monkeypatch, capsys, tmp_path, args)


def test_the_corrected_rerun_of_a_refused_start_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    method = "methods=[{name: fedit, rounds: 1, fraction: 0.5, schedule: {kind: fedasync}}]"
    refused(
        monkeypatch, capsys, tmp_path, smoke_args(out, "clients.speed={distribution: lognormal, sigma: 1000}", method)
    )
    code, _, err = cli(
        monkeypatch, capsys, *smoke_args(out, "clients.speed={distribution: lognormal, sigma: 1}", method)
    )
    assert code == 0, err


def test_sigterm_ends_a_launch_with_143_after_stopping_the_run(tmp_path):
    """`fedpeft launch` stopped with SIGTERM stops the run on the SuperLink, says how to continue it and exits 143
    (Ctrl-C: 130), as docs/flower.md says; `flwr` is stood in for by a stream that announces the run."""
    program = f"""
import os, signal, subprocess, sys
import fedpeft.apps.launch as launch
stopped = []

class FlwrRun:
    def __init__(self, command, **kwargs):
        self.returncode = None
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    @property
    def stdout(self):
        yield "🎊 Successfully started run 4242\\n"
        os.kill(os.getpid(), signal.SIGTERM)
        yield "never read\\n"

def flwr(command, **kwargs):
    stopped.append(command[1:3])
    return subprocess.CompletedProcess(command, 0, "", "")

launch.subprocess.Popen = FlwrRun
launch.subprocess.run = flwr
sys.argv = ["fedpeft", "launch", "smoke", "--federation", "remote", "--app", {str(REPO)!r}]
from fedpeft.cli import main
try:
    main()
finally:
    print("stopped:", stopped, file=sys.stderr)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr
    assert "stopped: [['stop', '4242']]" in done.stderr
    assert "run 4242 stopped on 'remote'; continue it with `fedpeft launch smoke" in done.stderr
    assert "--resume`" in done.stderr and "Traceback" not in done.stderr
    flower_doc = (REPO / "docs" / "flower.md").read_text()
    assert "exits with code 130 after Ctrl-C and 143\n   after SIGTERM" in flower_doc
