"""Rehearse the paper presets on this machine (`fedpeft run PRESET --rehearse`) and tabulate what each measured.

    python benchmarks/rehearse_presets.py --out runs/rehearsals             # every paper preset, one at a time
    python benchmarks/rehearse_presets.py --presets potara-cifar100 guidance-sni --set rehearse.layers=1
    python benchmarks/rehearse_presets.py --quick --out /tmp/r              # the smoke preset: this script's plumbing
    python benchmarks/rehearse_presets.py --minutes 15 --presets fedmosaic-drake   # Ctrl-C a preset after 15 min

Each preset runs in its own `fedpeft run` process (its wall time and the peak resident memory of it and its
workers, from the kernel's accounting of finished children); its `rehearsal.json` adds the phases' times, the
per-depth step and the extrapolated step at the true depth. Writes `rehearsals.json` and prints a markdown table
(docs/results/paper-scale.md, "Rehearsed here").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PAPER_PRESETS = [
    "fedp2eft-xnli",
    "fedp2eft-masakhanews",
    "fedp2eft-fedaya",
    "potara-flan",
    "potara-commonsense",
    "potara-cifar100",
    "flame-dolly",
    "flame-dolly-dense",
    "flame-alpagasus",
    "flame-alpagasus-dense",
    "guidance-sni",
    "fedmosaic-drake",
    "fedmosaic-hflb",
    "fedmosaic-fedscope",
]
QUICK = (
    "smoke",
    [
        "seeds=[0]",
        "engine.workers=1",
        "data.groups=[lat1]",
        "methods=[{name: fedit, rounds: 1, fraction: 1.0, local_steps: 1, lr: 0.005}]",
        "output.plots=false",
    ],
)
"""The quick mode's rehearsal: the smoke preset (fedpeft's own tiny models and synthetic data: nothing to stand in
for) cut to one language and one FedIT round, to check this script's plumbing; tests/test_rehearsal_presets.py
rehearses one paper preset per family."""


def rehearse(preset: str, out: Path, overrides: list[str], minutes: float | None = None) -> dict[str, Any]:
    """One preset's rehearsal in a process of its own: its exit code, wall time, peak memory and measurements.
    After ``minutes`` it is interrupted as Ctrl-C would (exit code 130; what it wrote stays, and its row says how
    far it got)."""
    command = [sys.executable, "-m", "fedpeft.cli", "run", preset, "--rehearse", "--out", str(out)]
    for assignment in overrides:
        command += ["--set", assignment]
    log = out.parent / f"{out.name}.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    with log.open("w") as stream:
        run = subprocess.Popen(
            command,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A sweep started in the background (`... &`) has SIGINT ignored, which its children inherit
            preexec_fn=_interruptible,
        )
        # Timers, not a wait with a timeout (which polls, taking a share of a core from the rehearsal it times):
        # after `minutes` the run and its workers get SIGINT, as from a terminal's Ctrl-C; two minutes on, SIGKILL.
        seconds = None if minutes is None else minutes * 60
        timers = (
            [] if seconds is None else [_timer(seconds, run, signal.SIGINT), _timer(seconds + 120, run, signal.SIGKILL)]
        )
        code = run.wait()
        for timer in timers:
            timer.cancel()
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    row: dict[str, Any] = {
        "preset": preset,
        "exit": code,
        "wall_s": round(wall, 1),
        # The largest child so far: exact for the first preset, a lower bound for the others.
        "children_peak_rss_mb": round(max(peak, before) / 1024),
        "log": str(log),
    }
    summary_file = out / "rehearsal.json"
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        row |= {
            "phases_s": summary["wall_s"],
            "peak_rss_mb": round(summary["peak_rss_mb"]),
            "workers_peak_rss_mb": summary.get("workers_peak_rss_mb"),
            "steps": summary["steps"],
            "notes": summary["notes"],
            "data": summary["rehearse"].get("data"),
        }
    else:
        row["error"] = _last_line(log)
    if minutes is not None and wall >= minutes * 60:
        row["stopped_after_min"] = minutes
        row["last_progress"] = _last_progress(log)
    return row


def _timer(seconds: float, run: subprocess.Popen[bytes], signum: int) -> threading.Timer:
    """Send ``signum`` to ``run``'s process group after ``seconds`` (unless it ended)."""

    def send() -> None:
        if run.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signum)

    timer = threading.Timer(seconds, send)
    timer.daemon = True
    timer.start()
    return timer


def _interruptible() -> None:
    """In the preset's process, before it starts: SIGINT as a terminal's Ctrl-C (Python's KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _last_progress(log: Path) -> str:
    """The last progress line a stopped rehearsal printed (where it was when it was stopped)."""
    lines = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if ", seed " in line and not line.startswith(("interrupted", "terminated"))
    ]
    return (lines or [""])[-1].strip()[:300]


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:300]


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the rehearsals."""
    lines = [
        "| preset | exit | wall | peak RSS main / worker | step at true depth (extrapolated) | per layer |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        steps = row.get("steps") or []
        full = "; ".join(
            f"{s['model'].split('/')[-1]} {s['full_step_s']:.2f} s, {s['full_peak_mb'] / 1024:.1f} GiB"
            for s in steps
            if s.get("full_step_s") is not None
        )
        layer = "; ".join(
            f"{s['per_layer_s']:.3f} s, {s['per_layer_mb']:.0f} MB" for s in steps if s.get("per_layer_s") is not None
        )
        peak = f"{row['peak_rss_mb'] / 1024:.1f} GiB" if "peak_rss_mb" in row else "-"
        if row.get("workers_peak_rss_mb") is not None:
            peak += f" / {row['workers_peak_rss_mb'] / 1024:.1f} GiB"
        status = "0" if row["exit"] == 0 else f"{row['exit']}: {row.get('error', '')}"
        if "stopped_after_min" in row:
            status = f"stopped after {row['stopped_after_min']:g} min, in: {row['last_progress']}"
        lines.append(
            f"| {row['preset']} | {status} | {row['wall_s'] / 60:.1f} min | {peak} | {full or '-'} | {layer or '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="*", default=PAPER_PRESETS)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="--set for every preset")
    parser.add_argument("--out", type=Path, default=Path("runs/rehearsals"))
    parser.add_argument("--quick", action="store_true", help="the smoke preset only (seconds): this script's plumbing")
    parser.add_argument("--minutes", type=float, help="interrupt a preset after this many minutes (as Ctrl-C would)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = [QUICK] if args.quick else [(preset, []) for preset in args.presets]
    rows = []
    for preset, extra in plan:
        rows.append(rehearse(preset, args.out / preset, [*extra, *args.overrides], args.minutes))
        print(json.dumps({k: rows[-1][k] for k in ("preset", "exit", "wall_s")}), flush=True)
    (args.out / "rehearsals.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
