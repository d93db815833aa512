"""One training step of a stand-in model at several depths, each in a fresh process: the step time and peak memory
per layer, and from them the step at the model's true depth.

A step is the one a client takes in the rehearsed config: a batch of the first method's ``batch_size`` examples drawn
at random (seeded) from every client's training examples, so that it is padded as a run's batches are (a batch pads
to its longest example: the first four examples of one client of the SNI stand-in held 584 tokens padded, a random
batch of four holds 813 on average), the config's ``max_length`` and dtype, a LoRA adapter (rank 8) on every target,
forward, backward and the optimizer's update. Each depth runs in its own process (``python -m
fedpeft.rehearsal.steps``), so that its peak resident memory (``ru_maxrss``) is its own. With depths ``d1 < d2``
measured, a layer costs ``(t2 - t1) / (d2 - d1)`` and the rest (embeddings, head, optimizer) ``t1 - d1`` times that;
the true depth's step is extrapolated from them, and measured too when it fits (``check_full_depth``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from fedpeft.core.config import ExperimentConfig, dump_given
from fedpeft.data.types import Example, FederatedData
from fedpeft.models.paper_configs import cut_depth, model_config, true_depth
from fedpeft.planning.shapes import DepthStep, StepMeasurement

MEASURED_STEPS = 2  # timed steps after one warm-up step
STEP_RANK = 8  # the rank of the step's LoRA, on every target of the model


def first_batch(cfg: ExperimentConfig) -> int:
    """The batch of a client's step in ``cfg``: its first method's ``batch_size``."""
    return int(getattr(cfg.methods[0], "batch_size", 8) or 8)


def measure_steps(
    cfg: ExperimentConfig,
    batch_size: int,
    *,
    check_full_depth: bool = False,
    cut_batch: int | None = None,
    lengths: dict[str, int] | None = None,
) -> list[StepMeasurement]:
    """Per stand-in model of the rehearsal config ``cfg``: its step on ``batch_size`` examples (the uncut
    config's) at depth 1 and at the rehearsed depth (and at its true depth with ``check_full_depth``), the
    per-layer cost and the extrapolated step at the true depth; each model's examples at its ``lengths`` entry
    (the uncut config's ``max_length``; by default the rehearsal's). With ``cut_batch`` (the rehearsal's own
    batch) other than ``batch_size``, or a rehearsal cut to shorter examples, also the step the rehearsal's
    clients took, at its batch, length and depth (``"cut"``), from which a plan of the rehearsal config itself is
    timed: a step's time is not proportional to its batch (a batch pads to its longest example, and a step has a
    part that does not shrink with it)."""
    assert cfg.rehearse is not None
    results: list[StepMeasurement] = []
    models = cfg.models or {"": cfg.model}
    with tempfile.TemporaryDirectory(prefix="fedpeft-steps-") as scratch:
        config_file = Path(scratch) / "config.yaml"
        config_file.write_text(dump_given(cfg))
        for key, model in models.items():
            name = cfg.rehearse.models.get(model.name)
            original = model_config(name) if name is not None else None
            if name is None or original is None:
                continue
            full = true_depth(original)
            rehearsed = true_depth(json.loads((Path(model.name) / "config.json").read_text()))
            # Two depths at least (a model rehearsed at one layer is also measured at two), within the true one.
            depths = sorted({1, min(max(2, rehearsed), full)} | ({full} if check_full_depth else set()))
            uncut = (lengths or {}).get(key, model.max_length)
            measured = [
                _measure(config_file, key, Path(model.name), original, depth, batch_size, uncut)
                for depth in depths
                if depth < full or len(depths) < 3
            ]
            failed = None
            if check_full_depth and len(depths) == 3:  # the check may not fit: said, and the rest kept
                try:
                    measured.append(_measure(config_file, key, Path(model.name), original, full, batch_size, uncut))
                except RuntimeError as err:
                    failed = str(err).splitlines()[0]
            images = "image_size" in original and "text_config" not in original
            entry = extrapolate(name, measured, full, batch_size, None if images else uncut)
            if failed is not None:
                entry["full_depth_failed"] = failed
            batch = cut_batch or batch_size
            if batch != batch_size or (uncut != model.max_length and not images):
                cut = _measure(config_file, key, Path(model.name), original, rehearsed, batch, model.max_length)
                entry["cut"] = {"batch_size": batch, "length": None if images else model.max_length, "depths": [cut]}
            results.append(entry)
    return results


def extrapolate(
    name: str, measured: list[DepthStep], full: int, batch_size: int, length: int | None
) -> StepMeasurement:
    """The per-layer step time and memory from the two shallowest depths of ``measured``, and the step at depth
    ``full`` they give (with its error against a measurement at ``full``, if there is one)."""
    entry: StepMeasurement = {
        "model": name,
        "true_layers": full,
        "timed_steps": MEASURED_STEPS,
        "batch_size": batch_size,
        "length": length,
        "depths": measured,
    }
    if len(measured) < 2:
        return entry | {"per_layer_s": None}
    low, high = measured[0], measured[1]
    span = high["layers"] - low["layers"]
    per_layer_s = (high["step_s"] - low["step_s"]) / span
    per_layer_mb = (high["peak_rss_mb"] - low["peak_rss_mb"]) / span
    entry |= {
        "per_layer_s": per_layer_s,
        "per_layer_mb": per_layer_mb,
        # No deeper than the deeper measured step: on a shared machine its time can come out below the shallower's.
        "full_step_s": max(low["step_s"] + per_layer_s * (full - low["layers"]), high["step_s"]),
        "full_peak_mb": max(low["peak_rss_mb"] + per_layer_mb * (full - low["layers"]), high["peak_rss_mb"]),
    }
    at_full = next((m for m in measured[2:] if m["layers"] == full), None)
    if at_full is not None:
        entry["full_step_error"] = entry["full_step_s"] / at_full["step_s"] - 1
        entry["full_peak_error"] = entry["full_peak_mb"] / at_full["peak_rss_mb"] - 1
    return entry


def _measure(
    config_file: Path, key: str, standin: Path, original: dict[str, Any], depth: int, batch_size: int, length: int
) -> DepthStep:
    """One depth's step, in a process of its own: a checkpoint directory whose config has ``depth`` layers and
    whose other files are the stand-in's (layers the weights lack are drawn fresh, as a head is)."""
    with tempfile.TemporaryDirectory(prefix="fedpeft-depth-") as directory:
        for item in standin.iterdir():
            if item.name != "config.json":
                os.symlink(item, Path(directory) / item.name)
        (Path(directory) / "config.json").write_text(json.dumps(cut_depth(original, depth)))
        command = [sys.executable, "-m", "fedpeft.rehearsal.steps", str(config_file), key, directory, str(batch_size),
                   str(length)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode < 0:
        signal = -done.returncode
        why = " (SIGKILL: most often the kernel's out-of-memory killer)" if signal == 9 else ""
        raise RuntimeError(f"the step at depth {depth} was killed by signal {signal}{why}\n{done.stderr[-4000:]}")
    if done.returncode != 0:
        raise RuntimeError(f"the step at depth {depth} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return cast(DepthStep, {"layers": depth, **result})


def _one_depth(config_file: Path, key: str, directory: str, batch_size: int, length: int) -> dict[str, float]:
    """Load the model in ``directory`` as the config's model ``key``, its examples at most ``length`` tokens, and
    time its training steps."""
    import torch

    from fedpeft.core.config import load_config
    from fedpeft.methods.base import lora_spec
    from fedpeft.training import TrainArgs
    from fedpeft.worker import build_data, build_runtime

    # The rehearsal caps every training at rehearse.steps (train.max_steps); the timed call takes all its steps.
    cfg = load_config(str(config_file), ["train.max_steps=null"])
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    model = (cfg.models[key] if key else cfg.model).model_copy(update={"name": directory, "max_length": length})
    data = build_data(cfg)
    before = _rss_mb()
    runtime = build_runtime(cfg, data, model)
    loaded = _rss_mb()
    # The step's own peak: loading the weights can pass it (a shallow model's drawn embeddings), which would hide
    # the layers' memory from the per-layer difference.
    step_peak = _reset_peak()
    warm_up, timed = drawn_batches(data, batch_size)
    # rank STEP_RANK on every LoRA target and a mixture of experts' fused experts, as the methods adapt the model
    # (PEFT forms each expert's update at every forward pass: a cost the step must pay too)
    active = runtime.activate(lora_spec(runtime, STEP_RANK))
    runtime.train(warm_up, TrainArgs(lr=1e-4, batch_size=batch_size, seed=0, steps=1))
    start = time.perf_counter()
    runtime.train(timed, TrainArgs(lr=1e-4, batch_size=batch_size, seed=0, steps=MEASURED_STEPS))
    seconds = (time.perf_counter() - start) / MEASURED_STEPS
    return {
        "step_s": seconds,
        "peak_rss_mb": (_high_water_mb() if step_peak else _peak_mb()) - before,
        "weights_mb": loaded - before,
        **timed_shape(active, list(itertools.islice(runtime.batches(timed, batch_size, 0), MEASURED_STEPS))),
    }


def timed_shape(model: Any, batches: list[dict[str, Any]]) -> dict[str, float]:
    """What the timed steps' batches (as the step drew them) held: the share of their positions whose logits
    ``model``'s step computed (:func:`logit_share`), their positions a row (padded to each batch's longest; none for
    an image classifier, whose batches hold pixels only) and, for a model with pictures, the pictures a row."""
    rows = sum(int((b["input_ids"] if "input_ids" in b else b["pixel_values"]).shape[0]) for b in batches)
    shape = {"logit_share": logit_share(model, [b["labels"] for b in batches])}
    if all("input_ids" in b for b in batches):
        shape["positions"] = sum(int(b["input_ids"].numel()) for b in batches) / max(rows, 1)
    if any("pixel_values" in b for b in batches):
        shape["images"] = sum(int(b["pixel_values"].shape[0]) for b in batches if "pixel_values" in b) / max(rows, 1)
    return shape


def logit_share(model: Any, labels: list[Any]) -> float:
    """The share of the positions of batches with ``labels`` whose logits ``model``'s training step computes
    (fedpeft.training.logits_cut), over all of them; 1 where it computes every position's."""
    from fedpeft.training import logits_cut

    kept = total = 0
    for rows in labels:
        if rows.dim() < 2:  # one label an example: no logits over a vocabulary
            continue
        keep, _ = logits_cut(model, rows)
        total += rows.numel()
        kept += rows.numel() if keep is None else rows.shape[0] * keep if isinstance(keep, int) else keep.numel()
    return kept / total if total else 1.0


def drawn_batches(data: FederatedData, batch_size: int, seed: int = 0) -> tuple[list[Example], list[Example]]:
    """A warm-up batch and :data:`MEASURED_STEPS` timed batches of ``batch_size`` examples each, drawn with
    replacement (seeded) from every client's training examples pooled."""
    pool = [example for client in data.clients for example in client.train]
    if not pool:
        raise ValueError("the rehearsal's federation holds no training examples")
    rng = random.Random(seed)
    drawn = [pool[rng.randrange(len(pool))] for _ in range(batch_size * (1 + MEASURED_STEPS))]
    return drawn[:batch_size], drawn[batch_size:]


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak() -> bool:
    """Reset this process's peak resident memory to its present one (Linux's ``clear_refs``); whether it could."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _high_water_mb() -> float:
    """The peak resident memory since the last :func:`_reset_peak` (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return _peak_mb()


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description="One depth's training step of a rehearsal (internal).")
    parser.add_argument("config")
    parser.add_argument("key")
    parser.add_argument("directory")
    parser.add_argument("batch_size", type=int)
    parser.add_argument("length", type=int)
    args = parser.parse_args()
    from fedpeft.core.logs import quiet_library_output

    quiet_library_output()  # its error output is what a failed measurement shows: the error, not load reports
    print(json.dumps(_one_depth(Path(args.config), args.key, args.directory, args.batch_size, args.length)))


if __name__ == "__main__":
    main()
