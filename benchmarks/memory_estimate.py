"""Computed GPU memory of the paper-scale presets: weights per dtype, LoRA adapter, AdamW state, activations.

No GPU is needed: every number is computed from the architecture (hidden size, layers, heads, MLP width,
vocabulary) of each preset's model, read from ``config.json`` in the local Hugging Face cache when the model is
there, else from the configuration fedpeft ships (fedpeft/models/paper_configs.py). The formulas live in
fedpeft/planning/architecture.py (``fedpeft plan`` uses them too); docs/benchmarks.md, "Memory at paper scale",
explains them.

    python benchmarks/memory_estimate.py            # markdown tables
    python benchmarks/memory_estimate.py --json     # the numbers
    python benchmarks/memory_estimate.py --quick    # the first preset alone: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fedpeft.core.config import ExperimentConfig, ModelConfig, load_config
from fedpeft.core.errors import UserError
from fedpeft.planning.architecture import (
    GIB,
    activation_bytes,
    lora_parameters,
    parameters,
    weight_bytes,
)
from fedpeft.planning.plan import model_architecture

PRESETS = [
    "fedp2eft-xnli",
    "fedp2eft-masakhanews",
    "fedp2eft-fedaya",
    "potara-cifar100",
    "potara-commonsense",
    "potara-flan",
    "fedmosaic-fedscope",
    "fedmosaic-drake",
    "fedmosaic-hflb",
    "guidance-sni",
    "flame-dolly",
    "flame-dolly-dense",
    "flame-alpagasus",
    "flame-alpagasus-dense",
]


def models_of(cfg: ExperimentConfig) -> dict[str, ModelConfig]:
    return dict(cfg.models) if cfg.models else {"": cfg.model}


def largest(cfg: ExperimentConfig, field: str) -> int | None:
    """The largest ``field`` of the preset's methods, tiers (FLAME's rank tiers) included."""
    values = [getattr(m, field, None) for m in cfg.methods]
    values += [getattr(t, field, None) for m in cfg.methods for t in getattr(m, "tiers", None) or []]
    numbers = [int(v) for v in values if isinstance(v, int)]
    return max(numbers) if numbers else None


def estimate(preset: str) -> list[dict[str, Any]]:
    """One row per model of ``preset``."""
    cfg = load_config(preset)
    rank = largest(cfg, "rank") or max(cfg.budgets)
    batch = largest(cfg, "batch_size") or 1
    rows = []
    for label, model in models_of(cfg).items():
        arch = model_architecture(model)  # a local or cached config.json, else the one fedpeft ships
        lora = lora_parameters(arch, rank)
        length = arch.tokens or model.max_length
        rows.append(
            {
                "preset": preset,
                "model": model.name,
                "architecture": label,
                "source": arch.source,
                "dtype": model.dtype,
                "parameters": parameters(arch),
                "weights": weight_bytes(arch),
                "rank": rank,
                "lora_parameters": lora,
                "adapter_bytes": lora * 4 * 2,  # float32 weights + float32 gradients
                "adamw_bytes": lora * 4 * 2,  # two float32 moments
                "micro_batch": [batch, length],
                "activations": {
                    "float32": activation_bytes(arch, batch, length, 4, False),
                    "bfloat16": activation_bytes(arch, batch, length, 2, False),
                    "bfloat16_checkpointed": activation_bytes(arch, batch, length, 2, True),
                },
                "architecture_sizes": asdict(arch),
            }
        )
    return rows


def gib(value: float) -> str:
    return f"{value / GIB:.2f}" if value >= GIB / 100 else f"{value / GIB:.3f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| preset | model | params (B) | fp32 | bf16 | 8-bit | 4-bit | LoRA r | LoRA params (M) | adapter + grads "
        "(MiB) | AdamW (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        w = r["weights"]
        out.append(
            f"| {r['preset']} | {r['model']} | {r['parameters']['total'] / 1e9:.2f} | {gib(w['float32'])} | "
            f"{gib(w['bfloat16'])} | {gib(w['8bit'])} | {gib(w['4bit'])} | {r['rank']} | "
            f"{r['lora_parameters'] / 1e6:.1f} | {r['adapter_bytes'] / 2**20:.0f} | {r['adamw_bytes'] / 2**20:.0f} |"
        )
    out += [
        "",
        "| preset | model | micro-batch (b x s) | fp32 | bf16 | bf16, checkpointed | of which logits (bf16) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        act = r["activations"]
        b, s = r["micro_batch"]
        out.append(
            f"| {r['preset']} | {r['model']} | {b} x {s} | {gib(act['float32']['total'])} | "
            f"{gib(act['bfloat16']['total'])} | {gib(act['bfloat16_checkpointed']['total'])} | "
            f"{gib(act['bfloat16']['logits'])} |"
        )
    return "\n".join(out)


def against_measured(path: str) -> list[dict[str, Any]]:
    """The estimate beside each measured peak of a benchmarks/step_overhead.py results file (JSON lines): the
    model's weights in its dtype (or quantization), the LoRA with gradients and AdamW moments, and the activations
    of one batch; the ratio is measured / estimated."""
    rows = []
    for line in Path(path).read_text().splitlines():
        run = json.loads(line)
        measured = run.get("fedpeft_peak_cuda_mb")
        if measured is None:
            continue
        try:
            arch = model_architecture(ModelConfig(name=run["model"]))
        except UserError:  # not a configuration the formulas model
            continue
        storage = {"4bit": "4bit", "8bit": "8bit"}.get(run.get("quantization") or "", run["dtype"])
        weights = weight_bytes(arch)["bfloat16" if storage == "float16" else storage]
        lora = lora_parameters(arch, run["rank"]) * 4 * 4  # weights, gradients, two moments: float32
        p = 4 if run["dtype"] == "float32" else 2
        acts = activation_bytes(arch, run["batch"], run["length"], p, False)["total"]
        estimated = (weights + lora + acts) / 2**20
        rows.append({**{k: run[k] for k in ("model", "dtype", "quantization", "batch", "length", "rank")},
                     "measured_mb": measured, "estimated_mb": round(estimated, 1),
                     "ratio": round(measured / estimated, 3)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--measured", help="compare with the peaks of a benchmarks/step_overhead.py results file")
    parser.add_argument("--quick", action="store_true", help="the first preset alone: checks that it runs")
    parser.add_argument("presets", nargs="*", default=PRESETS)
    args = parser.parse_args(argv)
    if args.measured:
        compared = against_measured(args.measured)
        print(json.dumps(compared, indent=2))
        return compared
    presets = PRESETS[:1] if args.quick else args.presets
    rows = [row for preset in presets for row in estimate(preset)]
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))
    if not args.json:
        print("\nGiB (2^30 bytes) unless marked; weights include the runtime's one copy only (see the text).")
    assert all(math.isfinite(r["weights"]["4bit"]) for r in rows)
    return rows


if __name__ == "__main__":
    main()
