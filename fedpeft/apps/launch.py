"""``fedpeft launch``: run an experiment on a Flower deployment and end with the run's status.

``flwr run --stream`` shows the run's log and exits with 0 whatever became of the run (Flower 1.42). This
wraps it: it submits the app with the experiment's run config and streams the run's log to stderr (the ServerApp's
progress lines, one per stage and round, as a redirected local run prints them), then asks the SuperLink for the
run's status (``flwr ls --run-id``) and exits 0 only when the run completed; otherwise it prints one sentence (the
ServerApp's own ``error:`` line when it gave one, without Flower's exit-code block around it) and exits 2 for a
user error, 1 for any other failure (a run that stopped because too few clients answered, say). Ctrl-C (or
SIGTERM) stops the run on the SuperLink (``flwr stop``) before the command ends: ``flwr run`` alone would leave it
running.

A SuperLink that restarts (or stops answering) ends ``flwr run --stream`` while the run may go on: a SuperLink
restarted with its ``--database`` still knows the run, and its ServerApp carries on once it answers again
(:mod:`fedpeft.engine.flower.link_watch`). So a stream that ends before its run is followed: the command waits up to
:data:`SUPERLINK_WAIT_SECONDS` for the SuperLink, streams the run's log again (``flwr log``, without the lines shown
already) and ends with the run's status as above. A run the SuperLink no longer knows, or that the restart ended, or
a SuperLink that does not come back, ends the command with exit code 1 and one sentence that says so and gives the
command that continues the run (``--resume``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from fedpeft.core.errors import UserError

_STARTED = re.compile(r"started run (\d+)")
_ERROR = re.compile(r"^(?:\S*\s*)?error: (.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

SUPERLINK_WAIT_SECONDS = 150.0
"""Seconds ``fedpeft launch`` waits for a SuperLink that stopped answering during a run before it gives up; longer
than the ServerApp waits for it (:data:`SERVERAPP_WAIT_SECONDS`), so that a launch that gives up leaves no run
that could still go on."""
SERVERAPP_WAIT_SECONDS = 120.0
"""Seconds a deployment's ServerApp waits for its SuperLink to answer again after the SuperLink's SuperExec ended
(:mod:`fedpeft.engine.flower.link_watch`); beyond that it ends."""
MISSING = "missing"
""":func:`run_status` of a run the SuperLink answers it does not know (a SuperLink restarted without its database)."""


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
        stream.flush_panel()
        print(f"error: `flwr run` could not start the run on {federation!r} (exit code {process.returncode}).")
        return 1
    stream.drop_panel()  # Flower's box about the lost connection: what became of the run is said below
    try:
        status = follow(federation, stream)
    except BaseException:  # Ctrl-C or SIGTERM while waiting for the SuperLink or following the run
        stop_run(federation, stream.run_id)
        raise
    if status == "finished:completed":
        return 0
    if status is None:
        print(
            f"error: the SuperLink of {federation!r} stopped answering during run {stream.run_id} and was not back "
            f"within {SUPERLINK_WAIT_SECONDS:.0f} s; once it is, continue the run with `{resume_command()}`.",
            file=sys.stderr,
        )
        return 1
    if status == MISSING or (stream.lost_superlink and stream.error is None):
        ended = "no longer knows the run" if status == MISSING else f"ended the run as {status}"
        print(
            f"error: the SuperLink of {federation!r} restarted during run {stream.run_id} and {ended}; continue it "
            f"with `{resume_command()}`.",
            file=sys.stderr,
        )
        return 1
    if stream.error is not None:  # the ServerApp's own sentence: a run that stopped or lacks results (1), else 2
        print(f"error: {stream.error}", file=sys.stderr)
        return 1 if stream.error.startswith("the run ") else 2
    print(
        f"error: run {stream.run_id} ended as {status or 'unknown'}; see its log above or "
        f"`flwr log {stream.run_id} {federation} --show`.",
        file=sys.stderr,
    )
    return 1


def follow(federation: str, stream: RunLog) -> str | None:
    """The final status of the run ``stream`` announced, once its stream has ended: at once when the run is over;
    otherwise (the SuperLink restarted or stopped answering, which ends ``flwr run --stream``) after waiting up to
    :data:`SUPERLINK_WAIT_SECONDS` for the SuperLink and streaming the rest of the run's log with ``flwr log``.
    None when the SuperLink did not come back, :data:`MISSING` when it no longer knows the run."""
    assert stream.run_id is not None
    flwr = str(Path(sys.executable).parent / "flwr")
    deadline = time.monotonic() + SUPERLINK_WAIT_SECONDS
    while True:
        status = run_status(federation, stream.run_id)
        if status is not None and (status == MISSING or status.startswith("finished:")):
            return status
        if status is None:
            if not stream.lost_superlink:
                stream.lost_superlink = True
                print(
                    f"the SuperLink of {federation!r} does not answer (restarted?); waiting up to "
                    f"{SUPERLINK_WAIT_SECONDS:.0f} s for it to go on with run {stream.run_id}",
                    file=sys.stderr,
                    flush=True,
                )
            if time.monotonic() > deadline:
                return None
            time.sleep(2.0)
            continue
        # The run is pending or running and the SuperLink answers: follow its log again, without the lines shown.
        if stream.lost_superlink:
            print(f"the SuperLink answers again; run {stream.run_id} goes on", file=sys.stderr, flush=True)
        stream.replay()
        command = [flwr, "log", stream.run_id, federation, "--stream"]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
            assert process.stdout is not None
            for line in process.stdout:
                stream.take(line)
        stream.drop_panel()
        deadline = time.monotonic() + SUPERLINK_WAIT_SECONDS
        time.sleep(1.0)


class RunLog:
    """Takes in ``flwr run --stream``'s output line by line: echoes the run's log to stderr, notes the run id, and
    keeps back Flower's exit-code block of a failed run (``Exit Code: 201``, its help text and link), from which
    it takes the ServerApp's one sentence (:attr:`error`), printed once at the end instead. Flower's boxed
    messages (a lost connection) are kept back too, for the caller to show (:meth:`flush_panel`) or drop. After
    :meth:`replay`, the lines already shown are not shown again (``flwr log`` streams a run's log from its start)."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.error: str | None = None
        self.lost_superlink = False  # the SuperLink stopped answering during the run
        self._in_exit_block = False
        self._in_panel = False
        self._panel: list[str] = []
        self._shown: Counter[str] = Counter()
        self._skip: Counter[str] = Counter()

    def replay(self) -> None:
        """The lines that follow repeat the log from its start: leave out those shown already."""
        self._skip = Counter(self._shown)
        self._in_exit_block = False

    def flush_panel(self) -> None:
        """Show the boxed message kept back."""
        sys.stderr.writelines(self._panel)
        sys.stderr.flush()
        self._panel = []

    def drop_panel(self) -> None:
        """Forget the boxed message kept back."""
        self._panel, self._in_panel = [], False

    def take(self, line: str) -> None:
        """Handle one line of output."""
        if self._skip[line] > 0:
            self._skip[line] -= 1
            return
        self._shown[line] += 1
        if self.run_id is None and (found := _STARTED.search(line)):
            self.run_id = found.group(1)
        if self._in_panel or line.lstrip().startswith("╭"):
            self._panel.append(line)
            self._in_panel = not line.lstrip().startswith("╰")
            return
        self.flush_panel()  # the stream goes on after the box: it was no farewell
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


def resume_command() -> str:
    """This command with ``--resume``: the one that continues its run."""
    return shlex.join(["fedpeft", *sys.argv[1:], *([] if "--resume" in sys.argv else ["--resume"])])


def stop_run(federation: str, run_id: str) -> None:
    """Stop run ``run_id`` on the SuperLink (``flwr stop``) and say how to continue it."""
    flwr = str(Path(sys.executable).parent / "flwr")
    stopped = subprocess.run([flwr, "stop", run_id, federation], capture_output=True, text=True, timeout=60)
    how = "stopped" if stopped.returncode == 0 else "could not be stopped (see `flwr ls`)"
    print(f"run {run_id} {how} on {federation!r}; continue it with `{resume_command()}`.", file=sys.stderr, flush=True)


def run_status(federation: str, run_id: str) -> str | None:
    """The SuperLink's status of a run (``finished:completed``, ``finished:failed``, ``running``, ...);
    :data:`MISSING` when the SuperLink answers without the run, None when it does not answer."""
    flwr = str(Path(sys.executable).parent / "flwr")
    try:
        listed = subprocess.run(
            [flwr, "ls", federation, "--run-id", run_id, "--format", "json"], capture_output=True, text=True, timeout=60
        )
        answer = json.loads(listed.stdout)
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return None
    runs = answer.get("runs") if isinstance(answer, dict) else None
    if runs:
        return str(runs[0]["status"])
    message = str(answer.get("error-message", "")) if isinstance(answer, dict) else ""
    return MISSING if "not found" in message.lower() else None
