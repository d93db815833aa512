"""``fedpeft launch``: run an experiment on a Flower deployment and end with the run's status.

``flwr run --stream`` shows the run's log and exits with 0 whatever became of the run (Flower 1.42). This
wraps it: it submits the app with the experiment's run config and streams the run's log to stderr (the ServerApp's
progress lines, one per stage and round, as a redirected local run prints them), then asks the SuperLink for the
run's status (``flwr ls --run-id``) and exits 0 only when the run completed; otherwise it prints one sentence (the
ServerApp's own ``error:`` line when it gave one, without Flower's exit-code block around it) and exits 2 for a
user error, 1 for any other failure (a run that stopped because too few clients answered, say). Ctrl-C (or
SIGTERM) stops the run on the SuperLink (``flwr stop``) before the command ends: ``flwr run`` alone would leave it
running.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from fedpeft.core.errors import UserError

_STARTED = re.compile(r"started run (\d+)")
_ERROR = re.compile(r"^(?:\S*\s*)?error: (.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_config(
    config: str, out: Path | None, overrides: list[str], *, resume: bool, node_timeout: float, reply_timeout: float
) -> str:
    """The ``--run-config`` string of the fedpeft ServerApp (paths made absolute: the SuperLink reads them)."""
    source = str(Path(config).resolve()) if Path(config).suffix in (".yaml", ".yml") else config
    for text in (source, *overrides, str(out or "")):
        if "'" in text:
            raise UserError(f"{text!r} contains a single quote, which a Flower run config cannot carry.")
    parts = [f"config='{source}'", f"overrides='{';'.join(overrides)}'"]
    if out is not None:
        parts.append(f"out='{Path(out).resolve()}'")
    parts += [f"resume={str(resume).lower()}", f"node-timeout={node_timeout:g}", f"reply-timeout={reply_timeout:g}"]
    return " ".join(parts)


def launch(app: Path, federation: str, config_text: str) -> int:
    """Run ``flwr run <app> <federation> --stream --run-config <config_text>``, streaming the run's log to stderr;
    returns the exit code described in the module docstring."""
    if not (Path(app) / "pyproject.toml").is_file() or "[tool.flwr.app" not in (app / "pyproject.toml").read_text():
        raise UserError(f"{app} is not the fedpeft checkout (no [tool.flwr.app] in its pyproject.toml); pass --app.")
    flwr = str(Path(sys.executable).parent / "flwr")
    command = [flwr, "run", str(app), federation, "--stream", "--run-config", config_text]
    stream = RunLog()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                stream.take(line)
        except BaseException:  # Ctrl-C or SIGTERM: flwr run stops streaming, but the run would go on
            if stream.run_id is not None:
                stop_run(federation, stream.run_id)
            raise
    if stream.run_id is None:
        print(f"error: `flwr run` could not start the run on {federation!r} (exit code {process.returncode}).")
        return 1
    status = run_status(federation, stream.run_id)
    if status == "finished:completed":
        return 0
    if stream.error is not None:  # the ServerApp's own sentence: a run that stopped or lacks results (1), else 2
        print(f"error: {stream.error}", file=sys.stderr)
        return 1 if stream.error.startswith("the run ") else 2
    print(
        f"error: run {stream.run_id} ended as {status or 'unknown'}; see its log above or "
        f"`flwr log {stream.run_id} {federation} --show`.",
        file=sys.stderr,
    )
    return 1


class RunLog:
    """Takes in ``flwr run --stream``'s output line by line: echoes the run's log to stderr, notes the run id, and
    keeps back Flower's exit-code block of a failed run (``Exit Code: 201``, its help text and link), from which
    it takes the ServerApp's one sentence (:attr:`error`), printed once at the end instead."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.error: str | None = None
        self._in_exit_block = False

    def take(self, line: str) -> None:
        """Handle one line of output."""
        if self.run_id is None and (found := _STARTED.search(line)):
            self.run_id = found.group(1)
        if "Exit Code:" in line:
            self._in_exit_block = True
        if self.error is None and (found := _ERROR.match(_ANSI.sub("", line).strip())):
            self.error = found.group(1)
            return
        if self._in_exit_block:
            self._in_exit_block = "For more information, visit:" not in line
            return
        sys.stderr.write(line)
        sys.stderr.flush()


def stop_run(federation: str, run_id: str) -> None:
    """Stop run ``run_id`` on the SuperLink (``flwr stop``) and say how to continue it."""
    flwr = str(Path(sys.executable).parent / "flwr")
    stopped = subprocess.run([flwr, "stop", run_id, federation], capture_output=True, text=True, timeout=60)
    again = shlex.join(["fedpeft", *sys.argv[1:], *([] if "--resume" in sys.argv else ["--resume"])])
    how = "stopped" if stopped.returncode == 0 else "could not be stopped (see `flwr ls`)"
    print(f"run {run_id} {how} on {federation!r}; continue it with `{again}`.", file=sys.stderr, flush=True)


def run_status(federation: str, run_id: str) -> str | None:
    """The SuperLink's status of a run (``finished:completed``, ``finished:failed``, ...), None if unknown."""
    flwr = str(Path(sys.executable).parent / "flwr")
    listed = subprocess.run(
        [flwr, "ls", federation, "--run-id", run_id, "--format", "json"], capture_output=True, text=True
    )
    try:
        runs = json.loads(listed.stdout)["runs"]
    except (json.JSONDecodeError, KeyError):
        return None
    return str(runs[0]["status"]) if runs else None
