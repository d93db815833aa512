"""Computed GPU memory of the paper-scale presets: weights per dtype, LoRA adapter, AdamW state, activations.

No GPU is needed: every number is computed from the architecture (hidden size, layers, heads, MLP width,
vocabulary) of each preset's model, read from ``config.json`` in the local Hugging Face cache when the model is
there, else from :data:`ARCHITECTURES` (the values of each model's ``config.json`` on the hub). The formulas are
in docs/benchmarks.md, "Memory at paper scale", and in the functions below.

    python benchmarks/memory_estimate.py            # markdown tables
    python benchmarks/memory_estimate.py --json     # the numbers
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fedpeft.core.config import ExperimentConfig, ModelConfig, load_config

GIB = 2**30


@dataclass(frozen=True)
class Architecture:
    """The sizes the estimate needs. ``kind``: ``decoder`` (Llama-style: RMSNorm, SwiGLU MLP, rotary),
    ``moe`` (OLMoE: ``experts`` SwiGLU experts of width ``intermediate``, ``top_k`` per token) or ``encoder``
    (BERT / ViT: LayerNorm, GELU MLP, biases). ``tokens``: fixed sequence length (ViT: patches + 1), else 0.
    ``extra_params``: parameters outside the modelled stack (a LLaVA model's vision tower and projector)."""

    kind: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int = 0
    top_k: int = 0
    tokens: int = 0
    positions: int = 0
    extra_params: int = 0
    source: str = "table"


# config.json of each model on the Hugging Face hub (vocab, hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, head_dim, intermediate_size, tie_word_embeddings, num_experts, num_experts_per_tok).
LLAMA_3_2_1B = Architecture("decoder", 2048, 16, 32, 8, 64, 8192, 128256, True)
LLAMA_3_2_3B = Architecture("decoder", 3072, 28, 24, 8, 128, 8192, 128256, True)
# LLaVA-Llama3.2 (FedMosaic): the paper does not name its vision tower; LLaVA-1.5's CLIP ViT-L/14-336 (304 M
# parameters) and a two-layer MLP projector (1024 -> hidden -> hidden) are assumed, counted as frozen weights.
CLIP_L_336 = 303_507_456


def _llava(lm: Architecture) -> Architecture:
    return replace(lm, extra_params=CLIP_L_336 + 1024 * lm.hidden + lm.hidden * lm.hidden + 2 * lm.hidden)


ARCHITECTURES: dict[str, Architecture] = {
    "meta-llama/Llama-3.2-1B": LLAMA_3_2_1B,
    "meta-llama/Llama-3.2-3B": LLAMA_3_2_3B,
    "meta-llama/Llama-3.2-3B-Instruct": LLAMA_3_2_3B,
    "meta-llama/Llama-3.1-8B": Architecture("decoder", 4096, 32, 32, 8, 128, 14336, 128256, False),
    "Qwen/Qwen3-4B-Instruct-2507": Architecture("decoder", 2560, 36, 32, 8, 128, 9728, 151936, True),
    "allenai/OLMo-1B-hf": Architecture("decoder", 2048, 16, 16, 16, 128, 8192, 50304, True),
    "allenai/OLMoE-1B-7B-0924": Architecture("moe", 2048, 16, 16, 16, 128, 1024, 50304, False, experts=64, top_k=8),
    "google-bert/bert-base-multilingual-cased": Architecture(
        "encoder", 768, 12, 12, 12, 64, 3072, 119547, True, positions=512
    ),
    "google/vit-base-patch16-224-in21k": Architecture("encoder", 768, 12, 12, 12, 64, 3072, 0, True, tokens=197),
    "checkpoints/llava-llama3.2-1b": _llava(LLAMA_3_2_1B),
    "checkpoints/llava-llama3.2-3b": _llava(LLAMA_3_2_3B),
}

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


def from_cache(name: str) -> Architecture | None:
    """The architecture from ``config.json`` of ``name`` in the local Hugging Face cache (``None``: not there)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    path = try_to_load_from_cache(name, "config.json")
    if not isinstance(path, str):
        return None
    return from_config(path, source="hub cache")


def from_config(path: str, source: str = "config.json") -> Architecture | None:
    """The architecture a ``config.json`` describes (``None``: not one this estimate models)."""
    with open(path) as f:
        c: dict[str, Any] = json.load(f)
    if "hidden_size" not in c or c.get("model_type") in {"llava", "vit"}:
        return None
    heads = int(c["num_attention_heads"])
    experts = int(c.get("num_experts", 0) or 0)
    encoder = c.get("model_type") == "bert"
    return Architecture(
        kind="encoder" if encoder else ("moe" if experts else "decoder"),
        hidden=int(c["hidden_size"]),
        layers=int(c["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
        intermediate=int(c["intermediate_size"]),
        vocab=int(c["vocab_size"]),
        tied=bool(c.get("tie_word_embeddings", encoder)),
        experts=experts,
        top_k=int(c.get("num_experts_per_tok", 0) or 0),
        positions=int(c.get("max_position_embeddings", 0)) if encoder else 0,
        source=source,
    )


def parameters(a: Architecture) -> dict[str, int]:
    """Parameter counts: ``linear`` (the weights bitsandbytes quantizes: every ``nn.Linear`` of the blocks and
    ``lm_head`` excluded), ``experts`` (fused expert tensors, not ``nn.Linear``), ``other`` (embeddings,
    ``lm_head``, norms, biases, router, vision tower), ``total``."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    attention = a.hidden * q + 2 * a.hidden * kv + q * a.hidden
    embeddings = a.vocab * a.hidden + a.positions * a.hidden
    if a.kind == "encoder":
        linear = a.layers * (attention + 2 * a.hidden * a.intermediate)
        other = embeddings + a.layers * (4 * a.hidden + a.intermediate + 4 * a.hidden) + a.hidden * (a.hidden + 1)
        if a.tokens:  # ViT: a 16 x 16 x 3 patch projection and position embeddings instead of a vocabulary
            other += 16 * 16 * 3 * a.hidden + a.tokens * a.hidden
        experts = 0
    elif a.kind == "moe":
        linear = a.layers * attention
        experts = a.layers * a.experts * 3 * a.hidden * a.intermediate
        other = embeddings + a.layers * (a.hidden * a.experts + 2 * a.hidden + q + kv) + a.hidden
    else:
        linear = a.layers * (attention + 3 * a.hidden * a.intermediate)
        experts = 0
        other = embeddings + a.layers * 2 * a.hidden + a.hidden
    if a.kind != "encoder" and not a.tied:
        other += a.vocab * a.hidden  # lm_head
    other += a.extra_params
    return {"linear": linear, "experts": experts, "other": other, "total": linear + experts + other}


def lora_parameters(a: Architecture, rank: int) -> int:
    """LoRA on every linear layer of the blocks (the fedpeft rule), r x (in + out) each; for OLMoE the attention
    projections and the fused experts (one rank-r block per expert, ``target_parameters``)."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    attention = rank * ((a.hidden + q) + 2 * (a.hidden + kv) + (q + a.hidden))
    if a.kind == "moe":
        mlp = a.experts * rank * ((a.hidden + 2 * a.intermediate) + (a.intermediate + a.hidden))
    elif a.kind == "encoder":
        mlp = rank * 2 * (a.hidden + a.intermediate)
    else:
        mlp = rank * 3 * (a.hidden + a.intermediate)
    return a.layers * (attention + mlp)


def weight_bytes(a: Architecture) -> dict[str, float]:
    """Base weights per storage: float32, bfloat16 (= float16), 8-bit (LLM.int8: 1 byte per linear weight) and
    4-bit (NF4 with double quantization: 0.5 byte + 1 byte per 64 weights + 4 bytes per 16384 weights). The
    quantized columns keep every other parameter in float32, as ``prepare_model_for_kbit_training`` leaves them."""
    p = parameters(a)
    rest = (p["experts"] + p["other"]) * 4
    return {
        "float32": p["total"] * 4,
        "bfloat16": p["total"] * 2,
        "8bit": p["linear"] * 1 + rest,
        "4bit": p["linear"] * (0.5 + 1 / 64 + 4 / 16384) + rest,
    }


def layer_activation_bytes(a: Architecture, p: int) -> float:
    """Bytes autograd keeps per token per layer for LoRA training, activations of ``p`` bytes per element.

    Decoder: the two RMSNorm inputs upcast to float32 (2 x 4h), the normed input shared by the q/k/v LoRA
    branches (h), q, k, v and the attention output kept by a fused attention kernel (2q + 2kv), the o_proj input
    (q), and in the SwiGLU MLP its normed input (h) and four intermediate tensors (gate, SiLU(gate), up, their
    product: 4 I). MoE: the same attention plus q/k norms in float32, the router's float32 logits and
    probabilities (2 x 4E) and per routed expert its input, output and four intermediates. Encoder: LayerNorm
    inputs, q/k/v/output, and the GELU MLP's input and two intermediates.
    """
    h, i = a.hidden, a.intermediate
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    attention = p * (h + 3 * q + 2 * kv)
    if a.kind == "encoder":
        return attention + p * (2 * h + h + 2 * i)
    if a.kind == "moe":
        return 8 * h + 4 * (q + kv) + attention + 8 * a.experts + p * a.top_k * (2 * h + 4 * i)
    return 8 * h + attention + p * (h + 4 * i)


def activation_bytes(a: Architecture, batch: int, length: int, p: int, checkpointing: bool) -> dict[str, float]:
    """Saved activations of one micro-batch of ``batch`` sequences of ``length`` tokens.

    Without checkpointing every layer keeps :func:`layer_activation_bytes`; with it (one checkpoint per layer)
    each layer keeps only its input (h x p per token) and one layer's activations exist at a time during the
    backward pass. A causal LM adds its logits: p bytes per vocabulary entry per token, the float32 copy the loss
    takes (none when p is 4) and the float32 log-probabilities the cross-entropy keeps.
    """
    tokens = batch * (a.tokens or length)
    per_layer = layer_activation_bytes(a, p)
    layers = (a.layers * a.hidden * p + per_layer) if checkpointing else a.layers * per_layer
    logits = 0.0
    if a.kind != "encoder":
        logits = tokens * a.vocab * (p + (4 if p != 4 else 0) + 4)
    return {"layers": tokens * layers, "logits": logits, "total": tokens * layers + logits}


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
        arch = from_cache(model.name) or ARCHITECTURES[model.name]
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
        arch = from_config(str(Path(run["model"]) / "config.json"))
        if measured is None or arch is None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    parser.add_argument("--measured", help="compare with the peaks of a benchmarks/step_overhead.py results file")
    parser.add_argument("presets", nargs="*", default=PRESETS)
    args = parser.parse_args()
    if args.measured:
        print(json.dumps(against_measured(args.measured), indent=2))
        return
    rows = [row for preset in args.presets for row in estimate(preset)]
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))
    if not args.json:
        print("\nGiB (2^30 bytes) unless marked; weights include the runtime's one copy only (see the text).")
    assert all(math.isfinite(r["weights"]["4bit"]) for r in rows)


if __name__ == "__main__":
    main()
