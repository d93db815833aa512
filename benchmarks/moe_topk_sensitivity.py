"""How much the tiny OLMoE's quality depends on its router's top-k, and why (docs/models.md, tiny-olmoe).

Trains the centralized base stage of a FLAME preset (default ``flame-cpu-4``: synthetic-instructions with the
arithmetic categories, 4,000 base examples, 12 epochs), or loads it from ``--checkpoint``, then

1. scores ROUGE-L x 100 of the base model on each client's test split with every router at top-k = 8, 4, 2, 1
   and with the MoE output switched off (``no MoE``: the blocks' output scaled by 0), mean over the clients,
   and per category (the clients' test examples pooled) at each top-k;
2. prints routing diagnostics on 64 test sequences (real tokens only): per layer the mean norm of the attention
   output and of the MoE output, the router entropy (and its maximum, log E), the
   router probability mass of the top 1 / 2 / 4 / 8 experts, and at each lower top-k how much of the MoE
   output's norm remains and its cosine to the top-8 output; the mean off-diagonal cosine between the experts'
   weights.

``--quick``: the preset cut to 2 clients of 2 categories and a base stage of one epoch on 64 examples: checks
that it runs.

Usage: python benchmarks/moe_topk_sensitivity.py [--preset flame-cpu-4] [--set base.router_aux_loss=0.01]
       [--checkpoint base.safetensors] [--out benchmarks/results/moe_topk.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedpeft.base_models import train_centralized_base
from fedpeft.core.checkpoints import load_checkpoint, save_checkpoint
from fedpeft.core.config import load_config
from fedpeft.evaluation import rouge
from fedpeft.models.runtime import ClientModel
from fedpeft.worker import build_data, build_runtime

TOP_KS = (8, 4, 2, 1)
QUICK = [
    "data.options={num_clients: 2, samples: 40, categories: [add, plural], base_categories: [add]}",
    "data.base_samples=64",
    "base.epochs=1",
    "model.max_length=64",
    "eval.max_new_tokens=4",
]


def base_runtime(preset: str, overrides: list[str], checkpoint: Path | None) -> tuple[Any, Any]:
    """The preset's data and a runtime holding its trained base model (trained here unless ``checkpoint``)."""
    cfg = load_config(preset, overrides)
    data = build_data(cfg)
    runtime = build_runtime(cfg, data)
    if checkpoint is not None and checkpoint.exists():
        runtime.set_initial_base(load_checkpoint(checkpoint)["tensors"])
    else:
        train_centralized_base(runtime, data.base_train, cfg.base)
        tensors = runtime.base_state()
        if checkpoint is not None:
            save_checkpoint({"tensors": tensors}, checkpoint)
        runtime.set_initial_base(tensors)
    runtime.install(ClientModel())
    return data, runtime


def scores_by_top_k(data: Any, runtime: Any) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Test ROUGE-L x 100 at each top-k and with the MoE output off: the mean over clients, and per category (all
    clients' test examples pooled; top-k rows only). Each client's answers are generated once per setting."""
    tests = [ex for c in data.clients for ex in c.test]
    categories = sorted({ex["group"] for ex in tests})
    scores: dict[str, float] = {}
    by_category: dict[str, dict[str, float]] = {}
    for k in (*TOP_KS, 0):
        runtime.moe.set_top_k(k or None)
        runtime.moe.scale = torch.tensor(0.0 if k == 0 else 1.0)
        per_client = [runtime.predict(c.test) for c in data.clients]
        client_scores = [
            100 * rouge(answers, [ex["response"] for ex in c.test])["rougeL"]
            for c, answers in zip(data.clients, per_client, strict=True)
        ]
        name = f"top-{k}" if k else "no MoE"
        scores[name] = sum(client_scores) / len(client_scores)
        if k:
            answers = [a for client_answers in per_client for a in client_answers]
            by_category[name] = {}
            for category in categories:
                picked = [(a, ex["response"]) for a, ex in zip(answers, tests, strict=True) if ex["group"] == category]
                by_category[name][category] = 100 * rouge([p for p, _ in picked], [r for _, r in picked])["rougeL"]
    runtime.moe.scale = torch.tensor(1.0)
    runtime.moe.set_top_k(None)
    return scores, by_category


def diagnostics(data: Any, runtime: Any) -> list[dict[str, float]]:
    """Per-layer norms, router concentration, the MoE output at lower top-k, and expert weight cosines."""
    model = runtime.base_model
    tests = [ex for c in data.clients for ex in c.test][:64]
    batch = next(runtime.batches(tests, len(tests), 0))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    mask = batch["attention_mask"].reshape(-1).bool()
    width = model.config.hidden_size
    captured: dict[str, torch.Tensor] = {}

    def keep(name: str):  # noqa: ANN202
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            tensor = output[0] if isinstance(output, tuple) else output
            captured[name] = tensor.detach().reshape(-1, tensor.shape[-1])[mask]

        return hook

    layers = model.model.layers
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.self_attn.register_forward_hook(keep(f"attn{i}")))
        hooks.append(layer.mlp.register_forward_hook(keep(f"moe{i}")))
        hooks.append(layer.mlp.gate.register_forward_hook(keep(f"router{i}")))
    rows = [{"layer": float(i)} for i in range(len(layers))]
    try:
        with torch.no_grad():
            reference: dict[str, torch.Tensor] = {}
            for k in TOP_KS:
                runtime.moe.set_top_k(k)
                model(**inputs)
                for i, row in enumerate(rows):
                    moe = captured[f"moe{i}"]
                    if k == TOP_KS[0]:
                        reference[f"moe{i}"] = moe
                        probs = captured[f"router{i}"].softmax(-1)
                        ranked = probs.sort(-1, descending=True).values
                        row.update(
                            attention_norm=float(captured[f"attn{i}"].reshape(-1, width).norm(dim=-1).mean()),
                            moe_norm_top8=float(moe.norm(dim=-1).mean()),
                            router_entropy=float(-(probs * probs.clamp_min(1e-12).log()).sum(-1).mean()),
                            router_entropy_max=math.log(probs.shape[-1]),
                            **{f"router_mass_top{j}": float(ranked[:, :j].sum(-1).mean()) for j in TOP_KS},
                        )
                    else:
                        full = reference[f"moe{i}"]
                        row[f"moe_norm_share_top{k}"] = float(moe.norm(dim=-1).mean() / full.norm(dim=-1).mean())
                        row[f"moe_cosine_top{k}"] = float(F.cosine_similarity(moe, full, dim=-1).mean())
    finally:
        runtime.moe.set_top_k(None)
        for hook in hooks:
            hook.remove()
    for row, layer in zip(rows, layers, strict=True):
        experts = layer.mlp.experts
        flat = torch.cat([experts.gate_up_proj.flatten(1), experts.down_proj.flatten(1)], dim=1).detach()
        cosines = F.normalize(flat, dim=1) @ F.normalize(flat, dim=1).T
        row["expert_weight_cosine"] = float(cosines[~torch.eye(len(cosines), dtype=torch.bool)].mean())
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train or load the base model, print the top-k table and the diagnostics, optionally save them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="flame-cpu-4")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--checkpoint", type=Path, default=None, help="load the base model here, or save it")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="2 clients, a base stage of one epoch on 64 examples")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    overrides = ["seeds=[0]", *(QUICK if args.quick else []), *args.overrides]
    data, runtime = base_runtime(args.preset, overrides, args.checkpoint)
    if runtime.moe is None:
        raise SystemExit(f"the model of {args.preset} is not a mixture of experts")
    scores, by_category = scores_by_top_k(data, runtime)
    print("ROUGE-L x 100, mean over clients: " + ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
    for k, row in by_category.items():
        print(f"{k}: " + ", ".join(f"{c} {v:.1f}" for c, v in row.items()))
    rows = diagnostics(data, runtime)
    for row in rows:
        print(", ".join(f"{k} {v:.3g}" for k, v in row.items()))
    payload = {
        "preset": args.preset,
        "overrides": args.overrides,
        "scores": scores,
        "by_category": by_category,
        "layers": rows,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=1) + "\n")
    return payload


if __name__ == "__main__":
    main()
