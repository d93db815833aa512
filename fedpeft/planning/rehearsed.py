"""A plan corrected by a rehearsal's measurements on this machine (``rehearsal.json``, docs/rehearsal.md).

The plan's own CPU hours are FLOPs over this CPU's matmul rate; a rehearsal measured what a training step of each
model costs here at its true depth (extrapolated from one and two layers, or measured with
``rehearse.check_full_depth``), at the batch of the config's first method. With it, the run's hours on this CPU are
its training examples times the measured seconds per example, and its evaluation examples times a third of that (a
forward pass of the three a step makes); the peak resident memory per worker process is the measured step's at the
true depth. A config whose methods train at other batch sizes is counted per example (the step scales with its
batch), full fine-tuning at the LoRA step's cost (a lower bound), and generated tokens are not counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORWARD_SHARE = 1 / 3  # a forward pass's share of a training step (forward, backward of twice its cost)


def read_rehearsal(path: Path) -> dict[str, Any] | None:
    """The measurements of the rehearsal at ``path`` (its run directory or its ``rehearsal.json``); ``None`` when
    there is none or it holds no step measured at two depths."""
    file = path / "rehearsal.json" if path.is_dir() else path
    if not file.is_file():
        return None
    try:
        summary = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    steps = [s for s in summary.get("steps", []) if s.get("full_step_s")]
    return {**summary, "steps": steps, "source": str(file)} if steps else None


def rehearsed_cpu(data: dict[str, Any], rehearsal: dict[str, Any]) -> dict[str, Any]:
    """This CPU's hours and memory for the planned run ``data`` (:func:`~fedpeft.planning.render.plan_json`) from
    ``rehearsal``'s measured steps (their mean over the models, for a federation of several architectures)."""
    steps = rehearsal["steps"]
    per_example = sum(s["full_step_s"] / s["batch_size"] for s in steps) / len(steps)
    train = sum((p["examples"] or 0.0) * p["times"] for p in data["phases"] if p["phase"] != "evaluation")
    evaluation = sum((p["examples"] or 0.0) * p["times"] for p in data["phases"] if p["phase"] == "evaluation")
    seconds = (train + FORWARD_SHARE * evaluation) * per_example
    return {
        "source": rehearsal["source"],
        "models": [
            {
                "model": s["model"],
                "step_s": s["full_step_s"],
                "batch_size": s["batch_size"],
                "peak_rss_bytes": s["full_peak_mb"] * 2**20,
                "layers": s["true_layers"],
            }
            for s in steps
        ],  # fmt: skip
        "seconds_per_example": per_example,
        "cpu_hours": seconds / 3600,
        "peak_rss_bytes": max(s["full_peak_mb"] for s in steps) * 2**20,
    }


def rehearsed_lines(rehearsed: dict[str, Any]) -> list[str]:
    """The plan's lines about this CPU from the rehearsal."""
    lines = []
    for m in rehearsed["models"]:
        lines.append(
            f"This CPU, rehearsed ({rehearsed['source']}): one training step of {m['model']} at its {m['layers']} "
            f"layers, batch {m['batch_size']}: {m['step_s']:.2f} s, {m['peak_rss_bytes'] / 2**30:.1f} GiB resident."
        )
    lines.append(
        f"This CPU from the rehearsal: {rehearsed['cpu_hours']:,.1f} h for the whole run (training examples x the "
        "measured seconds per example, evaluation at a third; generated tokens not counted)."
    )
    return lines
