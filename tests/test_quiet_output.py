"""Without -v, fedpeft's commands print no library line (bitsandbytes' missing kernels, deprecations, warnings)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

LIBRARY_SIGNS = (
    "bitsandbytes",
    "kernels-community",
    "site-packages",
    "UserWarning",
    "FutureWarning",
    "DeprecationWarning",
    "WARNING",
)


def _library_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(sign in line for sign in LIBRARY_SIGNS)]


def _fedpeft(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "fedpeft.cli", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.mark.slow
def test_run_report_and_personalize_print_no_library_line(tmp_path: Path) -> None:
    assert importlib.util.find_spec("bitsandbytes") is not None, "install the quantization extra: the test needs it"
    run = tmp_path / "run"
    quiet = {"run": _fedpeft("run", "smoke", "--out", str(run)).stderr}
    quiet["report"] = _fedpeft("report", str(run), "--out", str(tmp_path / "report")).stderr
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    client, budget = next((r["client"], r["budget"]) for r in records if r["method"] == "fedp2eft" and r["client"])
    personalize = ["personalize", str(run), "--budget", str(budget), "--client", client, "--out", str(tmp_path / "a")]
    quiet["personalize"] = _fedpeft(*personalize).stderr
    assert {command: _library_lines(stderr) for command, stderr in quiet.items()} == {c: [] for c in quiet}
