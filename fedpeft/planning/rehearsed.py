"""A plan timed on this CPU by a rehearsal's measurements (``rehearsal.json``, docs/rehearsal.md).

A rehearsal measured one LoRA training step of each model on this machine at two depths (one layer and the rehearsed
depth; with ``rehearse.check_full_depth`` also the true one), at the batch of the config's first method, and at the
rehearsal's cut batch when it is another (``"cut"``: a plan of the rehearsal config itself uses it, since a step's
time is not proportional to its batch). The plan takes, per model, the step at the depth the config runs (its stand-
in's cut depth for a rehearsal's own config, the true depth for a preset): measured there when a measured depth is
it, else scaled from the measured depths by the step's FLOPs (their pooled rate; a linear fit of two single-step
timings on a shared machine gave per-layer costs from 0.02 to 1.35 s for the same model). Less the step's fixed
part, over its batch, that is the seconds of one training example; every phase's time then counts its training,
forward passes, generation, client units and full fine-tuning's memory work from it as
:mod:`fedpeft.planning.cpu_time` says. The peak resident memory per worker process is the measured step's at the
true depth.

The rehearsal's own phases (``costs.jsonl``'s wall seconds) are set beside the plan's where they match: the base
stage, each method's federated phase and its personalization with its evaluation (a run times them together).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import cast

from fedpeft.core.costs import ROUND_EVALUATION
from fedpeft.planning.architecture import Architecture, lora_parameters
from fedpeft.planning.cpu_time import (
    STEP_FIXED_EXAMPLES,
    ModelRate,
    at_depth,
    lora_train_flops_per_example,
    step_fixed_s,
    step_flops,
    timed,
    tokens_of,
)
from fedpeft.planning.shapes import (
    AgainstRow,
    MeasuredRehearsal,
    ModelRow,
    PlanData,
    RehearsalSummary,
    RehearsedCpu,
    RehearsedModel,
    RehearsedStep,
    StepMeasurement,
)

STEP_RANK = 8
"""The rank of the LoRA a rehearsal's step trains, on every linear layer of the blocks (fedpeft/rehearsal/steps.py)."""

MEASURED_STEPS = 2
"""The steps a rehearsal times per depth after its warm-up step (fedpeft/rehearsal/steps.py), dividing their time by
this; a rehearsal whose ``train.max_steps`` (``rehearse.steps``) is lower took fewer in that time."""


def read_rehearsal(path: Path) -> MeasuredRehearsal | None:
    """The measurements of the rehearsal at ``path`` (its run directory or its ``rehearsal.json``); ``None`` when
    there is none or it holds no step measured at two depths."""
    file = path / "rehearsal.json" if path.is_dir() else path
    if not file.is_file():
        return None
    try:
        summary: RehearsalSummary = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    steps = [s for s in summary.get("steps", []) if s.get("full_step_s")]
    return {**summary, "steps": steps, "source": str(file)} if steps else None


def timed_steps(step: StepMeasurement, rehearsal: RehearsalSummary) -> int:
    """The steps the measurement's timed call took: its own count if it says, else :data:`MEASURED_STEPS` cut by
    the rehearsal's ``train.max_steps`` (``rehearse.steps``)."""
    if step.get("timed_steps"):
        return int(step["timed_steps"])
    cap = (rehearsal.get("rehearse") or {}).get("steps")
    return min(MEASURED_STEPS, int(cap)) if cap else MEASURED_STEPS


def step_of(model: ModelRow, rehearsal: MeasuredRehearsal) -> StepMeasurement | None:
    """The rehearsal's step measurement of the plan's ``model``: by name (a rehearsal config's stand-in directory
    stands for the model it was made from), else the only one."""
    standins = (rehearsal.get("rehearse") or {}).get("models") or {}
    name = standins.get(model["name"], model["name"])
    steps = rehearsal["steps"]
    found = [s for s in steps if s["model"] == name]
    if found:
        return found[0]
    return steps[0] if len(steps) == 1 else None


def timed_step(model: ModelRow, step: StepMeasurement, rehearsal: RehearsalSummary) -> StepMeasurement:
    """The measurement that times ``model``: for the rehearsal config itself (its model a stand-in) the step at
    its cut batch and length where one was taken, else ``step`` as measured."""
    standins = (rehearsal.get("rehearse") or {}).get("models") or {}
    if model["name"] in standins and step.get("cut"):
        return cast(StepMeasurement, {**step, **step["cut"]})
    return step


def seconds_per_example(model: ModelRow, step: StepMeasurement, rehearsal: RehearsalSummary) -> tuple[float, str]:
    """Seconds of one training example of ``model`` at the depth the config runs (its architecture's layers), less
    the step's fixed part, and how it was found."""
    a = Architecture(**model["architecture"])
    step = timed_step(model, step, rehearsal)
    depth, batch = a.layers, int(step["batch_size"])
    scale = MEASURED_STEPS / timed_steps(step, rehearsal)
    measured = {int(d["layers"]): float(d["step_s"]) * scale for d in step.get("depths", [])}
    if not measured:  # an older rehearsal.json: its extrapolated step at the true depth
        measured = {int(step["true_layers"]): float(step["full_step_s"]) * scale}

    def compute(layers: int, seconds: float) -> float:
        return max(seconds - step_fixed_s(at_depth(a, layers)), 0.1 * seconds)

    examples = batch + STEP_FIXED_EXAMPLES  # a step of ``batch`` costs this many examples (its fixed part aside)
    shape, timed_a, timed_tokens = image_text_shape(model, step)
    if depth in measured:
        return compute(depth, measured[depth]) / examples * shape, f"measured at {depth} layer(s)"
    flops = {d: lora_train_flops_per_example(at_depth(timed_a, d), timed_tokens) for d in measured}
    rate = sum(flops.values()) * examples / sum(compute(d, t) for d, t in measured.items())
    depths = " and ".join(str(d) for d in sorted(measured))
    seconds = lora_train_flops_per_example(timed_a, timed_tokens) / rate * shape
    return seconds, f"scaled by FLOPs from {depths} layer(s)"


def image_text_shape(model: ModelRow, step: StepMeasurement) -> tuple[float, Architecture, float]:
    """How an image-text example of the plan compares with the measured step's: the ratio of their training FLOPs
    (the plan's positions and images an example against the timed batches' ``positions`` and ``images`` a row), the
    architecture and tokens the step timed. A text model's, or a step measured before those were recorded: 1, as
    planned (the step's examples are the plan's examples)."""
    a, tokens = Architecture(**model["architecture"]), tokens_of(model)
    depths = [d for d in step.get("depths", []) if "positions" in d and "images" in d]
    if not a.extra_tokens or not depths:
        return 1.0, a, tokens
    positions = sum(float(d["positions"]) for d in depths) / len(depths)
    images = sum(float(d["images"]) for d in depths) / len(depths)
    timed_a = replace(a, images=images, padded_images=images)
    return step_flops(a, tokens) / step_flops(timed_a, positions), timed_a, positions


def measured_logit_share(model: ModelRow, step: StepMeasurement, rehearsal: RehearsalSummary) -> float | None:
    """The share of its positions with logits that the step :func:`seconds_per_example` times for ``model``
    computed (the mean over its depths; ``None`` where an older rehearsal did not measure it)."""
    depths = timed_step(model, step, rehearsal).get("depths", [])
    shares = [float(d["logit_share"]) for d in depths if "logit_share" in d]
    return sum(shares) / len(shares) if shares else None


def rehearsed_cpu(data: PlanData, rehearsal: MeasuredRehearsal) -> RehearsedCpu:
    """This CPU's time per phase and in all, and the memory per worker process, for the planned run ``data``
    (:func:`~fedpeft.planning.render.plan_json`) from ``rehearsal``'s measured steps; with the rehearsal's own
    phases beside the plan's where they match."""
    rates: list[ModelRate] = []
    models: list[RehearsedModel] = []
    steps: list[RehearsedStep] = []
    for model in data["models"]:
        step = step_of(model, rehearsal)
        share = None
        if step is None:  # a model the rehearsal did not measure: the mean of the measured ones
            per = [seconds_per_example(model, s, rehearsal)[0] for s in rehearsal["steps"]]
            seconds, how = sum(per) / len(per), "the mean of the measured models"
        else:
            share = measured_logit_share(model, step, rehearsal)
            seconds, how = seconds_per_example(model, step, rehearsal)
            true: ModelRow = {**model, "architecture": {**model["architecture"], "layers": int(step["true_layers"])}}
            a = Architecture(**true["architecture"])
            batch = int(step["batch_size"])
            steps.append({"model": step["model"], "batch_size": batch, "layers": a.layers,
                          "step_s": step_fixed_s(a) + seconds_per_example(true, step, rehearsal)[0]
                          * (batch + STEP_FIXED_EXAMPLES),
                          "peak_rss_bytes": step["full_peak_mb"] * 2**20})  # fmt: skip
        layers = int(model["architecture"]["layers"])
        timed_adapter = float(lora_parameters(Architecture(**model["architecture"]), STEP_RANK))
        rates.append(ModelRate(model["label"] or model["name"], seconds, "rehearsal", layers, share, timed_adapter))
        models.append({"model": model["name"], "layers": layers, "seconds_per_example": seconds, "how": how,
                       "measured": step["model"] if step else None})  # fmt: skip
    cpu = timed(data, rates)
    peak = max(s["full_peak_mb"] for s in rehearsal["steps"]) * 2**20
    return {
        "source": rehearsal["source"],
        "models": models,
        "steps": steps,
        "phases": cpu["seconds"],
        "parts": cpu["parts"],
        "start_s": cpu["start_s"],
        "report_s": cpu["report_s"],
        "total_s": cpu["total_s"],
        "cpu_hours": cpu["total_s"] / 3600,
        "peak_rss_bytes": peak,
        "against": against_measured(data, cpu["seconds"], rehearsal) if is_rehearsal_of(data, rehearsal) else [],
        "processes": data["cpu"]["processes"],
    }


def is_rehearsal_of(data: PlanData, rehearsal: RehearsalSummary) -> bool:
    """Whether the planned config is the rehearsal's own: a rehearsal's config of the same name whose models are
    the rehearsal's stand-ins (or, where it stood in for none, its own)."""
    standins = (rehearsal.get("rehearse") or {}).get("models") or {}
    if not data.get("rehearsal") or data["name"] != rehearsal.get("config"):
        return False
    return all(m["name"] in standins for m in data["models"]) if standins else True


def _measured_key(method: str, phase: str) -> tuple[str, str] | None:
    """The rehearsal phase (``costs.jsonl``'s method and phase) that times the plan's ``method`` / ``phase``."""
    if phase == "base stage":
        return ("base", "base")
    if phase == "federated":
        return (method, "federated")
    if phase in ("personalization", "evaluation") and method != "base model":
        return (method, "personalization")
    return None


def against_measured(data: PlanData, seconds: list[float | None], rehearsal: RehearsalSummary) -> list[AgainstRow]:
    """The plan's seconds of each phase the rehearsal timed (its first seed), beside the measured wall seconds; a
    method's personalization and evaluation together, as the run times them, with its evaluations between rounds
    (``round_evaluation``, outside the federated phase's time in a run's costs). Only where the plan is of the
    rehearsal's own config (the same name and cut) do the two mean the same run."""
    first = min((q.get("seed", 0) for q in rehearsal.get("phases", [])), default=0)
    measured: dict[tuple[str, str], float | None] = {}
    for p in rehearsal.get("phases", []):
        if p.get("seed", 0) == first and p["phase"] != ROUND_EVALUATION:
            measured[(p["method"], p["phase"])] = p.get("wall_s")
    for p in rehearsal.get("phases", []):  # the evaluations between rounds: the plan's evaluation counts them
        own = (p["method"], "personalization")
        if p.get("seed", 0) == first and p["phase"] == ROUND_EVALUATION and measured.get(own) is not None:
            measured[own] = (measured[own] or 0.0) + (p.get("wall_s") or 0.0)
    rows: dict[tuple[str, str], AgainstRow] = {}
    for phase, value in zip(data["phases"], seconds, strict=True):
        key = _measured_key(phase["method"], phase["phase"])
        if key is None or key not in measured:
            continue
        row = rows.setdefault(key, {"method": key[0], "phase": key[1], "planned_s": 0.0, "measured_s": measured[key]})
        row["planned_s"] = None if value is None or row["planned_s"] is None else row["planned_s"] + value
    return list(rows.values())


def _seconds(value: float) -> str:
    """Seconds as a reader takes them in: ``0.4 s``, ``42 s``, ``3.5 min``, ``2.1 h``."""
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:,.1f} h"


def rehearsed_lines(rehearsed: RehearsedCpu) -> list[str]:
    """The plan's lines about this CPU from the rehearsal."""
    lines = []
    for s in rehearsed["steps"]:
        lines.append(
            f"This CPU, rehearsed ({rehearsed['source']}): one training step of {s['model']} at its {s['layers']} "
            f"layers, batch {s['batch_size']}: about {_seconds(s['step_s'])}, {s['peak_rss_bytes'] / 2**30:.1f} GiB "
            "resident."
        )
    for m in rehearsed["models"]:
        lines.append(
            f"This CPU from the rehearsal: {m['model']} at {m['layers']} layer(s) trains an example in "
            f"{m['seconds_per_example']:.3g} s ({m['how']}; a step's fixed part aside)."
        )
    lines.append(
        f"This CPU from the rehearsal: {_seconds(rehearsed['total_s'])} for the whole run (the phases, "
        f"{_seconds(rehearsed['start_s'])} to start and {_seconds(rehearsed['report_s'])} for the report; training, "
        "forward passes, generation, client units and full fine-tuning's memory work as docs/plan.md counts them)."
    )
    if rehearsed["against"] and rehearsed.get("processes", 1) > 1:
        lines.append(
            f"  (on {rehearsed['processes']} worker processes a run's methods take turns on them side by side: each "
            "phase's measured time includes its waits for the others', so compare the whole run's clock)"
        )
    for row in rehearsed["against"]:
        if row["planned_s"] is None or not row["measured_s"]:
            continue
        error = row["planned_s"] / row["measured_s"] - 1
        lines.append(
            f"  {row['method']} {row['phase']}: planned {_seconds(row['planned_s'])}, the rehearsal measured "
            f"{_seconds(row['measured_s'])} ({error:+.0%})."
        )
    return lines
