"""The software and machine a run starts on, kept in its ``environment.json`` (docs/outputs.md): the versions, the
commit, the device and the CPU whose float kernels the records were computed with."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def cpu_description() -> dict[str, Any]:
    """The CPU a run's float kernels ran on: its model name (from /proc/cpuinfo on Linux, else the platform's),
    its logical cores and the vector kernels PyTorch chose for it (``AVX512``, ``AVX2``, ...). Records made on two
    CPUs with different kernels need not be identical (docs/outputs.md)."""
    model = platform.processor() or None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip() or model
                break
    kernels = None
    with contextlib.suppress(AttributeError, RuntimeError):
        kernels = torch.backends.cpu.get_cpu_capability()
    return {"model": model, "cores": os.cpu_count(), "kernels": kernels}


def environment(device: str) -> dict[str, Any]:
    """The software and machine a run starts on: Python and library versions, fedpeft's git commit when it runs
    from a checkout, the device, the CPU (:func:`cpu_description`), the command line and the start time (UTC)."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for package in ("fedpeft", "torch", "transformers", "peft", "flwr", "datasets", "bitsandbytes"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
        commit = (done.stdout.strip() or None) if done.returncode == 0 else None
        if commit is not None:  # a checkout with uncommitted changes does not run that commit's code
            status = ["git", "status", "--porcelain", "--untracked-files=no"]
            dirty = subprocess.run(status, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10)
            commit += "+changes" if dirty.stdout.strip() else ""
    accelerator = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "python": platform.python_version(),
        "versions": versions,
        "git_commit": commit,
        "device": device,
        "accelerator": accelerator,
        "cpu": cpu_description(),
        "platform": platform.platform(),
        "command": sys.argv,
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
