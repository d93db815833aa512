"""What a LoRA on a mixture of experts' fused expert tensors costs each forward pass, whatever its batch.

PEFT adapts a fused expert tensor (OLMoE's ``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj``, through
``target_parameters``) by forming every expert's update B A and the adapted weight W + s B A at each forward
pass, before any token is routed: a cost per pass that a training step spreads over its batch but that an
evaluation batch of short prompts, and above all each decoding step of a generation, pays whole. The plan counts
it as :data:`fedpeft.planning.cpu_time.EXPERT_LORA_S` seconds per adapted expert weight and pass on all the cores
(docs/plan.md, "Time on this CPU"); this benchmark measures that figure.

For ``--batch`` sequences of one position (a decoding step without its cache) and of ``--tokens`` positions (a
prompt's pass), the forward pass of OLMoE-1B-7B's configuration at its true width, cut to ``--layers`` layers, with
random weights in bfloat16, is timed (median of ``--repeats`` passes after a warm-up, no gradients) bare and with
a LoRA of ``--rank`` (8) on the attention projections and the fused experts, as fedpeft's methods adapt it
(:func:`fedpeft.methods.base.lora_spec`). The difference divided by the expert weights is the seconds per adapted
expert weight the plan uses; numpy's copy bandwidth, measured in the same process, says whether memory traffic
could explain it (bytes per weight at that bandwidth: a few would; tens mean compute bounds it). Each pass is timed
a third time as fedpeft's predictions run it (:func:`fedpeft.models.weights.parameter_adapters_formed`): the
adapted weights formed once, at the warm-up pass, and read by every timed one.

``--quick``: OLMoE's proportions at hidden 256 (64 experts of width 128), two layers, one timed pass: checks that
it runs.

Usage: python benchmarks/expert_lora_passes.py [--layers 2] [--batch 4] [--tokens 64] [--repeats 5] [--rank 8]
    [--threads N] [--out benchmarks/results/expert_lora_passes.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import OlmoeConfig, OlmoeForCausalLM

from fedpeft.models.paper_configs import model_config
from fedpeft.models.targets import FAMILY_LORA_PARAMETERS, FAMILY_LORA_TARGETS
from fedpeft.models.weights import parameter_adapters_formed
from fedpeft.planning.cpu_time import EXPERT_LORA_S

OLMOE = "allenai/OLMoE-1B-7B-0924"
QUICK = {"hidden_size": 256, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
         "vocab_size": 1000}  # fmt: skip


def olmoe(layers: int, quick: bool) -> OlmoeForCausalLM:
    values = {**model_config(OLMOE), "num_hidden_layers": layers, **(QUICK if quick else {})}
    values.pop("architectures", None)
    torch.manual_seed(0)
    model = OlmoeForCausalLM(OlmoeConfig(**values)).to(torch.bfloat16)
    return model.eval()


def expert_weights(model: torch.nn.Module) -> int:
    """The fused expert tensors' weights, all layers."""
    names = tuple(FAMILY_LORA_PARAMETERS["olmoe"])
    return sum(p.numel() for name, p in model.named_parameters() if name.endswith(names))


@torch.no_grad()
def pass_seconds(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> float:
    model(input_ids=ids, use_cache=False)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(input_ids=ids, use_cache=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(megabytes: int = 64, repeats: int = 5) -> float:
    """numpy's copy of ``megabytes`` MiB: bytes read and written per second (the plan's bandwidth figure)."""
    source = np.ones(megabytes * 2**20 // 8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/expert_lora_passes.json"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.repeats, args.tokens = 2, 1, 8
    if args.threads:
        torch.set_num_threads(args.threads)

    model = olmoe(args.layers, args.quick)
    experts = expert_weights(model)
    shapes = {"decode": (args.batch, 1), "prompt": (args.batch, args.tokens)}
    ids = {name: torch.randint(0, model.config.vocab_size, shape) for name, shape in shapes.items()}
    bare = {name: pass_seconds(model, batch, args.repeats) for name, batch in ids.items()}
    lora = LoraConfig(
        r=args.rank,
        lora_alpha=2 * args.rank,
        target_modules=FAMILY_LORA_TARGETS["olmoe"],
        target_parameters=FAMILY_LORA_PARAMETERS["olmoe"],
    )
    adapted = get_peft_model(model, lora).eval()
    with_lora = {name: pass_seconds(adapted, batch, args.repeats) for name, batch in ids.items()}
    formed = {}
    for name, batch in ids.items():  # as a prediction runs: the weights formed at its first pass (the warm-up)
        with parameter_adapters_formed(adapted):
            formed[name] = pass_seconds(adapted, batch, args.repeats)
    bandwidth = copy_bandwidth()
    rows = {}
    for name in shapes:
        extra = max(with_lora[name] - bare[name], 0.0)
        per_weight = extra / experts
        rows[name] = {
            "batch": list(shapes[name]),
            "bare_s": bare[name],
            "lora_s": with_lora[name],
            "formed_s": formed[name],
            "extra_s": extra,
            "seconds_per_expert_weight": per_weight,
            "bytes_per_expert_weight": per_weight * bandwidth,
        }
    result = {
        "model": OLMOE + (" (quick: hidden 256)" if args.quick else ""),
        "layers": args.layers,
        "expert_weights": experts,
        "rank": args.rank,
        "threads": torch.get_num_threads(),
        "copy_bandwidth": bandwidth,
        "plan_seconds_per_expert_weight": EXPERT_LORA_S,
        "processor": platform.processor() or platform.machine(),
        "passes": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['model']}, {args.layers} layers, {experts / 1e6:.0f} M expert weights, "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s, {result['threads']} threads")  # fmt: skip
    for name, row in rows.items():
        print(f"  {name} {row['batch']}: bare {row['bare_s']:.3f} s, with LoRA {row['lora_s']:.3f} s, "
              f"{row['seconds_per_expert_weight'] * 1e9:.2f} ns = {row['bytes_per_expert_weight']:.1f} bytes "
              f"per expert weight; formed once, as a prediction: {row['formed_s']:.3f} s")  # fmt: skip
    print(f"the plan: {EXPERT_LORA_S * 1e9:.2f} ns per expert weight on all the cores -> {args.out}")
    return result


if __name__ == "__main__":
    main()
