"""``fedpeft launch``: run an experiment on a Flower deployment and end with the run's status.

``flwr run --stream`` shows the run's log and exits with 0 whatever became of the run (Flower 1.42). This
wraps it: it submits the app with the experiment's run config, streams the log, then asks the SuperLink for the
run's status (``flwr ls --run-id``) and exits 0 only when the run completed; otherwise it prints one sentence (the
ServerApp's own ``error:`` line when it gave one) and exits 2 for a user error, 1 for any other failure (a run
that stopped because too few clients answered, say).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from fedpeft.core.errors import UserError

_STARTED = re.compile(r"started run (\d+)")
_ERROR = re.compile(r"^(?:\S*\s*)?error: (.+)$")


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
    """Run ``flwr run <app> <federation> --stream --run-config <config_text>``, echoing its output; returns the
    exit code described in the module docstring."""
    if not (Path(app) / "pyproject.toml").is_file() or "[tool.flwr.app" not in (app / "pyproject.toml").read_text():
        raise UserError(f"{app} is not the fedpeft checkout (no [tool.flwr.app] in its pyproject.toml); pass --app.")
    flwr = str(Path(sys.executable).parent / "flwr")
    command = [flwr, "run", str(app), federation, "--stream", "--run-config", config_text]
    run_id, error = None, None
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if run_id is None and (found := _STARTED.search(line)):
                run_id = found.group(1)
            if error is None and (found := _ERROR.match(line.strip())):
                error = found.group(1)
    if run_id is None:
        print(f"error: `flwr run` could not start the run on {federation!r} (exit code {process.returncode}).")
        return 1
    status = run_status(federation, run_id)
    if status == "finished:completed":
        return 0
    if error is not None:  # the ServerApp's own sentence: a user error (2), or a run that had to stop (1)
        print(f"error: {error}")
        return 1 if error.startswith("the run stopped") else 2
    print(f"error: run {run_id} ended as {status or 'unknown'}; see its log above or `flwr log {run_id} {federation}`.")
    return 1


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
