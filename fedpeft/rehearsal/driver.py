"""A rehearsal: the config made runnable here (stand-ins, compute cut), and what it measured.

:func:`prepare` turns a config into its rehearsal's: the compute cut (:mod:`fedpeft.rehearsal.config`), a stand-in
for the dataset when the real one cannot be read here (:mod:`fedpeft.rehearsal.standin_data`, cached under
``<cache root>/rehearsal/data/``) and a random-weight stand-in at true width for every model that is not one of
fedpeft's own (:mod:`fedpeft.rehearsal.standin_model`). The run itself is an ordinary run of that config: every
phase, checkpoint, report and adapter as the real run makes them. :func:`summarize` then reads what it measured
(``costs.jsonl``: wall time and peak memory per method and phase) and :mod:`fedpeft.rehearsal.steps` adds one
training step per depth, from which the step at the true depth is extrapolated; both go to ``rehearsal.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import cast

from fedpeft.core.config import ExperimentConfig, ModelConfig, RehearseConfig
from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject, JSONValue
from fedpeft.core.registry import MODELS
from fedpeft.data.tokenizer import cache_root, publish_dir
from fedpeft.planning.shapes import PhaseMeasurement, RehearsalSummary, RehearseSection, StepMeasurement
from fedpeft.rehearsal.config import rehearsal_config

REHEARSAL_FILE = "rehearsal.json"
"""What a rehearsal measured, beside its run's outputs."""

NOT_RESULTS = "a rehearsal: stand-in data and random weights, compute cut; its numbers are not results"
TEXT_SAMPLE = 20_000  # the most texts a stand-in tokenizer learns from


def prepare(cfg: ExperimentConfig) -> tuple[ExperimentConfig, list[str]]:
    """The rehearsal config of ``cfg`` (its ``rehearse`` section, or the defaults) and the notes of what had to
    change beyond the cut; stand-in data and models are written (or found in the cache) on the way."""
    import fedpeft.models.table  # noqa: F401  (registers the models)

    rehearse = cfg.rehearse or RehearseConfig()
    notes: list[str] = []
    cut = rehearsal_config(cfg, rehearse, notes)
    texts, description = _data(cut)
    if description is not None:
        cut = cut.model_copy(update={"data": cut.data.model_copy(update=_data_updates(cut))})
    models = cut.models or {"": cut.model}
    standins: dict[str, str] = {}
    replaced: dict[str, ModelConfig] = {}
    for key, model in models.items():
        if model.name in MODELS:
            replaced[key] = model
            continue
        path = _model(model, rehearse.layers, texts)
        standins[str(path)] = model.name
        replaced[key] = model.model_copy(update={"name": str(path), "revision": None})
    update: dict[str, object] = {"rehearse": rehearse.model_copy(update={"models": standins, "data": description})}
    if cut.models:
        update["models"] = replaced
    else:
        update["model"] = replaced[""]
    return cut.model_copy(update=update), notes


def _model(model: ModelConfig, layers: int | None, texts: list[str]) -> Path:
    from fedpeft.models.paper_configs import model_config
    from fedpeft.rehearsal.standin_model import standin_checkpoint

    config = model_config(model.name)
    if config is None:
        raise UserError(
            f"No configuration of model {model.name} ships with fedpeft or is on this machine; point model.name at "
            "a directory holding its config.json (sizes only, no weights needed) to rehearse it."
        )
    return standin_checkpoint(model.name, config, layers=layers, texts=texts, chat_template=model.chat_template)


# ------------------------------------------------------------------------------------------------ data


def _data_key(cfg: ExperimentConfig) -> str:
    return hashlib.sha256(json.dumps(cfg.data.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def _data_dir(cfg: ExperimentConfig) -> Path:
    return cache_root() / "rehearsal" / "data" / f"{cfg.data.name}-{_data_key(cfg)}"


def _data_updates(cfg: ExperimentConfig) -> JSONObject:
    record = json.loads((_data_dir(cfg) / "standin.json").read_text())
    return dict(record["updates"])


def _data(cfg: ExperimentConfig) -> tuple[list[str], str | None]:
    """Texts to train stand-in tokenizers on, and the stand-in data's description (``None``: the real data is
    read, and the texts are its own)."""
    from fedpeft.rehearsal.standin_data import STANDIN_DATASETS, real_data_available, write_standin

    if real_data_available(cfg) or cfg.data.name not in STANDIN_DATASETS:
        if cfg.data.name.startswith("synthetic-") or real_data_available(cfg):
            return _own_texts(cfg), None
        raise UserError(
            f"Dataset {cfg.data.name} is not on this machine and has no stand-in; give data.path to rehearse it."
        )
    target = _data_dir(cfg)
    record_file = target / "standin.json"
    if not record_file.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        try:
            standin = write_standin(cfg, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        updates = {key: _moved(value, staging, target) for key, value in standin.data_updates.items()}
        description = _moved_text(standin.description, staging, target)
        record = {"updates": updates, "description": description, "texts": standin.texts[:TEXT_SAMPLE]}
        (staging / "standin.json").write_text(json.dumps(record))
        publish_dir(staging, target)
    record = json.loads(record_file.read_text())
    return list(record["texts"]), str(record["description"])


def _moved(value: JSONValue, staging: Path, target: Path) -> JSONValue:
    """A data setting that names the staging directory, naming its final place instead."""
    if isinstance(value, str) and value.startswith(str(staging)):
        return str(target) + value[len(str(staging)) :]
    return value


def _moved_text(text: str, staging: Path, target: Path) -> str:
    return text.replace(str(staging), str(target))


def _own_texts(cfg: ExperimentConfig) -> list[str]:
    from fedpeft.worker import build_data

    texts = build_data(cfg).corpus() if cfg.data.sites is None else []
    step = max(1, len(texts) // TEXT_SAMPLE)
    return texts[::step][:TEXT_SAMPLE]


# ------------------------------------------------------------------------------------------------ measurements


def summarize(
    run_dir: Path, cfg: ExperimentConfig, notes: list[str], steps: list[StepMeasurement], total_s: float
) -> RehearsalSummary:
    """What the rehearsal in ``run_dir`` measured, written to its ``rehearsal.json``: per method and phase the
    wall time and peak memory (from ``costs.jsonl``), the per-depth step measurements, the notes, and
    ``total_s``, the whole rehearsal's wall time (stand-ins, the run, the step measurements), added to the earlier
    sittings' of a resumed rehearsal (those that ended with a summary)."""
    assert cfg.rehearse is not None
    phases: list[PhaseMeasurement] = []
    costs = run_dir / "costs.jsonl"
    rows = [json.loads(line) for line in costs.read_text().splitlines() if line.strip()] if costs.is_file() else []
    table: dict[tuple[str, int, str], dict[str, float]] = {}
    for row in rows:
        if row.get("metric") in ("wall_s", "peak_rss_mb", "workers_peak_rss_mb", "server_init_s"):
            key = (str(row["method"]), int(row["seed"]), str(row["phase"]))
            table.setdefault(key, {})[row["metric"]] = float(row["value"])
    for (method, seed, phase), values in table.items():
        phases.append(cast(PhaseMeasurement, {"method": method, "seed": seed, "phase": phase, **values}))
    workers = [p["workers_peak_rss_mb"] for p in phases if "workers_peak_rss_mb" in p]
    sittings = 1
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # a resumed rehearsal: its earlier sittings
        earlier = json.loads((run_dir / REHEARSAL_FILE).read_text())
        total_s += float(earlier["total_s"])
        sittings += int(earlier.get("sittings", 1))
    summary: RehearsalSummary = {
        "what": NOT_RESULTS,
        "config": cfg.name,
        "rehearse": cast(RehearseSection, cfg.rehearse.model_dump(mode="json")),
        "notes": notes,
        "phases": phases,
        "total_s": round(total_s, 1),
        "sittings": sittings,
        "wall_s": round(sum(p.get("wall_s", 0.0) + p.get("server_init_s", 0.0) for p in phases), 3),
        "peak_rss_mb": max((p.get("peak_rss_mb", 0.0) for p in phases), default=0.0),
        "workers_peak_rss_mb": max(workers, default=None),
        "steps": steps,
    }
    (run_dir / REHEARSAL_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def summary_lines(summary: RehearsalSummary) -> list[str]:
    """The rehearsal's end block: what it was, what it measured, what the true depth would take."""
    rehearse = summary["rehearse"]
    lines = [f"Rehearsal of {summary['config']}: {NOT_RESULTS}."]
    for path, name in rehearse.get("models", {}).items():
        del path
        depth = f"{rehearse['layers']} layers" if rehearse.get("layers") else "its true depth"
        lines.append(f"  model: {name} at true width, random weights, cut to {depth}")
    lines.append(f"  data: {rehearse.get('data') or 'the real dataset'}")
    lines.append(
        f"  cut: {rehearse['rounds']} rounds, {rehearse['steps']} step(s) per training, {rehearse['eval_batches']} "
        f"batch(es) per evaluation, {rehearse['seeds']} seed(s)"
    )
    sittings = summary.get("sittings", 1)
    over = f" over {sittings} sittings" if sittings > 1 else ""
    workers = summary.get("workers_peak_rss_mb")
    where = "in the main process" if workers is None else f"in the main process, {workers:.0f} MB in a worker process"
    lines.append(
        f"  measured: {summary['total_s']:.0f} s in all{over}, {summary['wall_s']:.1f} s of them in the run's phases; "
        f"peak {summary['peak_rss_mb']:.0f} MB {where}"
    )
    for step in summary.get("steps", []):
        lines.append("  " + step_line(step))
    lines.extend(f"  note: {note}" for note in summary.get("notes", []))
    return lines


def step_line(step: StepMeasurement) -> str:
    """One model's per-depth step measurement as a sentence."""
    measured = ", ".join(
        f"{d['layers']} layers {d['step_s']:.2f} s / {d['peak_rss_mb']:.0f} MB" for d in step["depths"]
    )
    shape = f"{step['length']} tokens" if step.get("length") else "images"
    line = f"{step['model']}: one training step (batch {step['batch_size']} x {shape}): {measured}"
    if step.get("per_layer_s") is not None:
        line += (
            f"; per layer {step['per_layer_s']:.3f} s / {step['per_layer_mb']:.0f} MB, at its {step['true_layers']} "
            f"layers about {step['full_step_s']:.2f} s / {step['full_peak_mb']:.0f} MB"
        )
    if "full_step_error" in step:
        line += f" (against the measured: {step['full_step_error']:+.0%} / {step['full_peak_error']:+.0%})"
    if "full_depth_failed" in step:
        line += f"; at its true depth: {step['full_depth_failed']}"
    return line
