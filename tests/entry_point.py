"""The ``fedpeft`` console entry point called in the test's own process (a process of its own per call would
import torch and transformers again each time)."""

from __future__ import annotations

import sys

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
