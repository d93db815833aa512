"""FLAME's compute claim: forward wall time at the lowest tier (top-1) vs the highest (top-8), same model and batch.

For each model below, the same random batch (``--batch`` x ``--tokens`` token ids) goes through the forward pass
with every router at top-8, 4, 2 and 1 (median of ``--repeats`` timed passes after a warm-up pass, one torch
thread unless ``--threads``), next to the analytic FLOPs ratio 2 x active parameters x tokens
(:func:`fedpeft.models.moe.active_parameters`: all parameters less the unused experts, embeddings included).
Both of transformers' expert implementations are timed: ``grouped_mm`` (its default where available) and
``eager`` (a loop over the hit experts).

- ``tiny-olmoe``: the zoo's tiny OLMoE (hidden 64, 2 layers, 16 experts of width 32, vocabulary 1,000): what
  the CPU presets run. Embeddings dominate its parameter count.
- ``olmoe-mid``: an OLMoE-architecture model of 104 M parameters whose proportions follow OLMoE-1B-7B (64
  experts of width hidden / 2, top-8): hidden 512, 4 layers, 8 heads, vocabulary 8,000.
- ``OLMoE-1B-7B``: allenai/OLMoE-1B-7B-0924's configuration on the meta device (no weights): the analytic
  ratio only (the paper reports 46.1 % of the FLOPs at k = 1, profiled with DeepSpeed).

``--quick``: the tiny OLMoE alone, 16 tokens, one timed pass: checks that it runs.

Usage: python benchmarks/flame_tier_flops.py [--repeats 20] [--out benchmarks/results/flame_tier_flops.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import OlmoeConfig, OlmoeForCausalLM

from fedpeft.models.moe import MoeControl, active_parameters, forward_flops

TOP_KS = (8, 4, 2, 1)
MODELS = {
    "tiny-olmoe": {"hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "num_experts": 16, "vocab_size": 1000},
    "olmoe-mid": {"hidden_size": 512, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "num_experts": 64, "vocab_size": 8000},
}  # fmt: skip
OLMOE_1B_7B = {"hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
               "num_key_value_heads": 16, "num_experts": 64, "vocab_size": 50304}  # fmt: skip


def config(fields: dict, implementation: str | None = None) -> OlmoeConfig:
    extra = {"experts_implementation": implementation} if implementation else {}
    return OlmoeConfig(**fields, num_experts_per_tok=8, norm_topk_prob=False, tie_word_embeddings=False,
                       pad_token_id=0, bos_token_id=None, eos_token_id=None, **extra)  # fmt: skip


def analytic(model: torch.nn.Module, tokens: int) -> dict[int, float]:
    return {k: float(forward_flops(active_parameters(model, k), tokens)) for k in TOP_KS}


@torch.no_grad()
def time_forward(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> dict[int, float]:
    control = MoeControl.of(model)
    assert control is not None
    times: dict[int, float] = {}
    for k in TOP_KS:
        control.set_top_k(k)
        model(input_ids=ids)  # warm-up
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            model(input_ids=ids)
            samples.append((time.perf_counter() - started) * 1000)
        times[k] = statistics.median(samples)
    control.set_top_k(None)
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/flame_tier_flops.json"))
    parser.add_argument("--quick", action="store_true", help="the tiny OLMoE, 16 tokens, one pass: checks that it runs")
    args = parser.parse_args(argv)
    models = {"tiny-olmoe": MODELS["tiny-olmoe"]} if args.quick else MODELS
    if args.quick:
        args.tokens, args.repeats = 16, 1
    torch.set_num_threads(args.threads)
    report: dict = {
        "batch": args.batch,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "models": {},
    }
    for name, fields in models.items():
        entry: dict = {}
        for implementation in ("grouped_mm", "eager"):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = OlmoeForCausalLM(config(fields, implementation)).eval()
            generator = torch.Generator().manual_seed(0)
            ids = torch.randint(0, fields["vocab_size"], (args.batch, args.tokens), generator=generator)
            ms = time_forward(model, ids, args.repeats)
            entry.setdefault("parameters", sum(p.numel() for p in model.parameters()))
            entry.setdefault("flops", analytic(model, args.tokens * args.batch))
            entry[f"forward_ms_{implementation}"] = ms
            del model
        flops = entry["flops"]
        entry["flops_ratio_k1_vs_k8"] = flops[1] / flops[8]
        for implementation in ("grouped_mm", "eager"):
            ms = entry[f"forward_ms_{implementation}"]
            entry[f"time_ratio_k1_vs_k8_{implementation}"] = ms[1] / ms[8]
        report["models"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if "ratio" in k}), flush=True)
    with torch.device("meta"):
        big = OlmoeForCausalLM(config(OLMOE_1B_7B))
    flops = analytic(big, args.tokens)
    report["models"]["OLMoE-1B-7B"] = {
        "parameters": sum(p.numel() for p in big.parameters()),
        "active_parameters": {k: active_parameters(big, k) for k in TOP_KS},
        "flops": flops,
        "flops_ratio_k1_vs_k8": flops[1] / flops[8],
        "paper_flops_ratio_k1_vs_k8": 158.0 / 342.8,
    }
    print("OLMoE-1B-7B", report["models"]["OLMoE-1B-7B"]["flops_ratio_k1_vs_k8"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
