"""The ``fedpeft`` console entry point called in the test's own process (a process of its own per call would
import torch and transformers again each time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``fedpeft *args`` through :func:`fedpeft.cli.main`; returns (exit code, stdout, stderr)."""
    from fedpeft.cli import main

    monkeypatch.setattr(sys, "argv", ["fedpeft", *args])
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


HEAVY_LIBRARIES = ("torch", "peft", "transformers")


def command_in_a_fresh_process(*args: str) -> list[str]:
    """Run ``fedpeft *args`` in a new interpreter (it must succeed); returns which of :data:`HEAVY_LIBRARIES` it
    imported."""
    program = (
        "import sys\n"
        "from fedpeft.cli import main\n"
        f"sys.argv = ['fedpeft', *{list(args)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as stop:\n"
        "    assert not stop.code, stop.code\n"
        f"print('imported:', ','.join(m for m in {HEAVY_LIBRARIES!r} if m in sys.modules))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("imported:"))
    return [name for name in line.removeprefix("imported:").strip().split(",") if name]


def report_in_a_fresh_process(run_dir: Path, out: Path) -> list[str]:
    """Run ``fedpeft report RUN_DIR --out OUT`` in a new interpreter (it must succeed); returns which of
    :data:`HEAVY_LIBRARIES` it imported."""
    return command_in_a_fresh_process("report", str(run_dir), "--out", str(out))
