"""Why FlexLoRA breaks the tiny OLMoE with 40 clients at lr 0.005 (docs/results/flame.md, 40-client section).

Two probes on a FLAME preset's data and centralized base stage (seed 0; default
``docs/results/flame/flex-lr.yaml``, the setting of ``flame-cpu-40`` in which the collapse was found: eight
categories, 6 base epochs):

1. ``scale``: loads a finished run's server checkpoint of one method (``--run DIR --method LABEL``) and scores
   ROUGE-L x 100 of its global adapter at the largest rank and top-8, with the global update B A scaled by each
   of ``--scales`` (B multiplied, A kept), mean over every fourth client. A sharp drop between two scales means
   the update crossed a threshold rather than pointing the wrong way.
2. ``a-norm``: reruns FlexLoRA (3 rounds, ``--lr``) with the redistributed factors rescaled after every
   aggregation so that the rows of A have ``--a-row-norm`` (the initial LoRA A's is about 0.59) and B the inverse
   factor: the global update B A is unchanged, only the clients' starting factors and so their Adam steps
   differ. Writes a normal run to ``--out`` and prints the per-tier ROUGE-L.

Usage:
  python benchmarks/flexlora_update_scale.py scale --run runs/flame-cpu-40 --method flexlora
  python benchmarks/flexlora_update_scale.py a-norm --out runs/flexlora-a-norm [--a-row-norm 0.59]
      [--base-checkpoint runs/flex-lr/checkpoints/base-centralized.safetensors]
  python benchmarks/flexlora_update_scale.py --quick   # both probes on a tiny cut of the preset: checks they run
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from moe_topk_sensitivity import base_runtime  # this directory's benchmark: the preset's trained base model

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import load_config
from fedpeft.methods import flexlora
from fedpeft.models.runtime import ClientModel
from fedpeft.runner import Experiment
from fedpeft.worker import build_method

LABEL = "flexlora-a-norm"
QUICK = [
    "data.options={num_clients: 2, samples: 40, categories: [add, plural], base_categories: [add]}",
    "data.base_samples=64",
    "base.epochs=1",
    "model.max_length=64",
    "eval.max_new_tokens=4",
]


def scale_probe(preset: str, run: Path, method: str, seed: int, scales: list[float]) -> dict[str, float]:
    """ROUGE-L x 100 of ``method``'s saved global adapter with B A scaled by each of ``scales``."""
    source = str(run / "config.yaml") if (run / "config.yaml").exists() else preset
    cfg = load_config(source)
    entry = next(m for m in cfg.methods if (m.label or m.name) == method)
    data, runtime = base_runtime(source, [], run / "checkpoints" / "base-centralized.safetensors")
    tiered = build_method(entry, cfg)
    state = load_checkpoint(run / "checkpoints" / method / f"seed{seed}.safetensors")["state"]
    spec = tiered.spec(runtime, tiered.max_rank())
    clients = data.clients[::4]
    out = {}
    for scale in scales:
        adapter = {k: v * scale if ".lora_B." in k else v for k, v in state.tensors.items()}
        runtime.install(ClientModel(lora=spec, adapter=adapter))
        out[str(scale)] = statistics.fmean(100 * runtime.evaluate(c.test)["rougeL"] for c in clients)
        print(f"B A x {scale}: ROUGE-L {out[str(scale)]:.2f}", flush=True)
    return out


def a_norm_probe(
    preset: str,
    out: Path,
    lr: float,
    row_norm: float,
    base: Path | None,
    overrides: list[str] | None = None,
    rounds: int = 3,
) -> dict[str, float]:
    """FlexLoRA for ``rounds`` rounds with A's rows rescaled to ``row_norm`` after every redistribution (``base``: a
    centralized base-stage checkpoint to reuse instead of training one; ``overrides``: of the preset)."""
    redistribute = flexlora.svd_factors

    def rescaled(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = redistribute(*args, **kwargs)
        return a * row_norm, b / row_norm

    flexlora.svd_factors = rescaled
    try:
        entry = f"methods=[{{name: flexlora, label: {LABEL}, rounds: {rounds}, lr: {lr}}}]"
        cfg = load_config(preset, ["seeds=[0]", *(overrides or []), entry])
        if base is not None:
            (out / "checkpoints").mkdir(parents=True, exist_ok=True)
            shutil.copy(base, out / "checkpoints" / "base-centralized.safetensors")
        Experiment(cfg, out).run()
    finally:
        flexlora.svd_factors = redistribute
    scores: dict[str, list[float]] = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("method") == LABEL and row.get("metric") == "rougeL":
            scores.setdefault(row["budget"], []).append(100 * row["value"])
    result = {tier: statistics.fmean(values) for tier, values in sorted(scores.items())}
    print(" ".join(f"{tier} {value:.2f}" for tier, value in result.items()))
    return result


def quick(preset: str) -> dict[str, dict[str, float]]:
    """Both probes on a tiny cut of ``preset``: a-norm for one round, then scale on the run it wrote."""
    with tempfile.TemporaryDirectory(prefix="flexlora-scale-") as tmp:
        run = Path(tmp) / "run"
        tiers = a_norm_probe(preset, run, 0.005, 0.59, None, QUICK, rounds=1)
        scaled = scale_probe(preset, run, LABEL, 0, [0.0, 1.0])
    return {"a_norm": tiers, "scale": scaled}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]] | dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", nargs="?", choices=["scale", "a-norm"])
    parser.add_argument("--preset", default="docs/results/flame/flex-lr.yaml")
    parser.add_argument("--run", type=Path, help="scale: a finished run's directory")
    parser.add_argument("--method", default="flexlora", help="scale: the method's label in that run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scales", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--out", type=Path, help="a-norm: the run directory to write")
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--a-row-norm", type=float, default=0.59)
    parser.add_argument("--base-checkpoint", type=Path, help="a-norm: reuse this base-stage checkpoint")
    parser.add_argument("--quick", action="store_true", help="both probes on a tiny cut of the preset")
    args = parser.parse_args(argv)
    if args.quick:
        return quick(args.preset)
    if args.probe == "scale":
        if args.run is None:
            parser.error("scale needs --run")
        return scale_probe(args.preset, args.run, args.method, args.seed, args.scales)
    if args.probe == "a-norm":
        if args.out is None:
            parser.error("a-norm needs --out")
        return a_norm_probe(args.preset, args.out, args.lr, args.a_row_norm, args.base_checkpoint)
    parser.error("name a probe (scale or a-norm) or give --quick")


if __name__ == "__main__":
    main()
