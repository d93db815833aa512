"""A model's sizes from its ``config.json``, and the memory and FLOP formulas on them (docs/plan.md).

Every number here is computed from the architecture (hidden size, layers, heads, MLP width, vocabulary, experts),
never measured; docs/benchmarks.md ("Memory at paper scale") checks the parameter counts against the models'
published sizes and the memory against measured peaks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

GIB = 2**30


@dataclass(frozen=True)
class Architecture:
    """The sizes the formulas need. ``kind``: ``decoder`` (Llama-style: RMSNorm, SwiGLU MLP, rotary), ``moe``
    (OLMoE: ``experts`` SwiGLU experts of width ``intermediate``, ``top_k`` per token) or ``encoder`` (BERT / ViT:
    LayerNorm, GELU MLP, biases). ``tokens``: fixed sequence length (ViT: patches + 1), else 0. ``extra_params``:
    frozen parameters outside the modelled stack (a LLaVA model's vision tower and projector), which run
    ``extra_tokens`` tokens forward per image, ``images`` images an example (their mean over the data, where the plan
    counted them; else one); ``padded_images``: the images whose positions a row of a batch is padded to (the
    expected most among a batch's examples; one where not counted)."""

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
    extra_tokens: int = 0
    model_type: str = ""
    source: str = "config.json"
    vision: dict[str, int] = field(default_factory=dict)
    images: float = 1.0
    padded_images: float = 1.0


class UnsupportedArchitectureError(ValueError):
    """A ``config.json`` of a kind the formulas do not model (no ``hidden_size``, or an unknown nesting)."""


def _encoder_params(hidden: int, layers: int, intermediate: int) -> int:
    """One LayerNorm-GELU encoder stack with biases: attention (4 h x h + 4 h), MLP, two LayerNorms per layer."""
    attention = 4 * hidden * hidden + 4 * hidden
    mlp = 2 * hidden * intermediate + intermediate + hidden
    return layers * (attention + mlp + 4 * hidden)


def clip_vision_parameters(vision: dict[str, Any]) -> tuple[int, int]:
    """(parameters, tokens) of a CLIP vision tower (``clip_vision_model``): patch convolution without bias, class
    and position embeddings, pre- and post-LayerNorm around the encoder stack (CLIP ViT-L/14-336: 303,507,456)."""
    h, patch, size = int(vision["hidden_size"]), int(vision["patch_size"]), int(vision["image_size"])
    tokens = (size // patch) ** 2 + 1
    channels = int(vision.get("num_channels", 3))
    embeddings = patch * patch * channels * h + h + tokens * h
    stack = _encoder_params(h, int(vision["num_hidden_layers"]), int(vision["intermediate_size"]))
    return embeddings + 2 * h + stack + 2 * h, tokens


def from_config(values: dict[str, Any], source: str = "config.json") -> Architecture:
    """The architecture a ``config.json`` describes.

    Raises:
        UnsupportedArchitectureError: the configuration is not one these formulas model.
    """
    model_type = str(values.get("model_type", ""))
    if model_type == "llava":
        text, vision = values.get("text_config"), values.get("vision_config")
        if not isinstance(text, dict) or not isinstance(vision, dict):
            raise UnsupportedArchitectureError("a llava config.json needs text_config and vision_config")
        lm = from_config({**text, "tie_word_embeddings": values.get("tie_word_embeddings", True)}, source)
        tower, tokens = clip_vision_parameters(vision)
        v = int(vision["hidden_size"])
        projector = v * lm.hidden + lm.hidden + lm.hidden * lm.hidden + lm.hidden
        return Architecture(**{**lm.__dict__, "extra_params": tower + projector, "extra_tokens": tokens,
                               "model_type": "llava", "vision": {"parameters": tower, "tokens": tokens}})  # fmt: skip
    if "hidden_size" not in values or "num_hidden_layers" not in values:
        raise UnsupportedArchitectureError(f"config.json of model_type {model_type or '?'} has no hidden_size")
    heads = int(values["num_attention_heads"])
    hidden = int(values["hidden_size"])
    experts = int(values.get("num_experts", 0) or 0)
    encoder = model_type in ("bert", "vit", "roberta", "xlm-roberta", "distilbert")
    tokens = 0
    if model_type == "vit":
        tokens = (int(values.get("image_size", 224)) // int(values.get("patch_size", 16))) ** 2 + 1
    return Architecture(
        kind="encoder" if encoder else ("moe" if experts else "decoder"),
        hidden=hidden,
        layers=int(values["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(values.get("num_key_value_heads") or heads),
        head_dim=int(values.get("head_dim") or hidden // heads),
        intermediate=int(values["intermediate_size"]),
        vocab=0 if model_type == "vit" else int(values.get("vocab_size", 0)),
        tied=bool(values.get("tie_word_embeddings", encoder)),
        experts=experts,
        top_k=int(values.get("num_experts_per_tok", 0) or 0),
        tokens=tokens,
        positions=int(values.get("max_position_embeddings", 0)) if model_type != "vit" and encoder else 0,
        model_type=model_type,
        source=source,
    )


def parameters(a: Architecture) -> dict[str, int]:
    """Parameter counts: ``linear`` (the weights bitsandbytes quantizes: every ``nn.Linear`` of the blocks,
    ``lm_head`` excluded), ``experts`` (fused expert tensors, not ``nn.Linear``), ``other`` (embeddings, ``lm_head``,
    norms, biases, router, vision tower), ``total``."""
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


# Each module role of a block, as the suffixes of its module names in the Llama-style and the BERT / ViT families
# (OLMoE's fused experts as PEFT's ``target_parameters``); a target selects a role under PEFT's suffix rule, so
# ``q_proj`` and ``query`` both select the queries, ``output.dense`` BERT's attention output and block output.
ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "q": ("self_attn.q_proj", "attention.self.query"),
    "k": ("self_attn.k_proj", "attention.self.key"),
    "v": ("self_attn.v_proj", "attention.self.value"),
    "o": ("self_attn.o_proj", "attention.output.dense"),
    "gate": ("mlp.gate_proj",),
    "up": ("mlp.up_proj", "intermediate.dense"),
    "gate_up": ("mlp.experts.gate_up_proj",),
    "down": ("mlp.down_proj", "layer.output.dense", "mlp.experts.down_proj"),
}


def lora_shapes(a: Architecture) -> dict[str, tuple[int, int, int]]:
    """Each LoRA-able module role of one block: (in features, out features, copies per layer); OLMoE's MLP roles
    are its fused expert tensors (one rank-r block per expert, PEFT's ``target_parameters``)."""
    q, kv, h, i = a.heads * a.head_dim, a.kv_heads * a.head_dim, a.hidden, a.intermediate
    shapes = {"q": (h, q, 1), "k": (h, kv, 1), "v": (h, kv, 1), "o": (q, h, 1)}
    if a.kind == "moe":
        return shapes | {"gate_up": (h, 2 * i, a.experts), "down": (i, h, a.experts)}
    if a.kind == "encoder":
        return shapes | {"up": (h, i, 1), "down": (i, h, 1)}
    return shapes | {"gate": (h, i, 1), "up": (h, i, 1), "down": (i, h, 1)}


def targeted_roles(a: Architecture, targets: Iterable[str] | None) -> list[str]:
    """The roles ``targets`` select (``None``: every linear layer of the blocks, the fedpeft rule)."""
    shapes = lora_shapes(a)
    if targets is None:
        return list(shapes)
    chosen = list(targets)
    return [
        role for role in shapes if any(name == t or name.endswith("." + t) for name in ROLE_NAMES[role] for t in chosen)
    ]


def lora_parameters(a: Architecture, rank: int, targets: Iterable[str] | None = None) -> int:
    """LoRA parameters at ``rank``: r x (in + out) per targeted module per layer (every linear layer of the
    blocks by default; for OLMoE the attention projections and the fused experts)."""
    shapes = lora_shapes(a)
    per_layer = sum(rank * (fan_in + fan_out) * copies for fan_in, fan_out, copies in
                    (shapes[role] for role in targeted_roles(a, targets)))  # fmt: skip
    return a.layers * per_layer


def weight_bytes(a: Architecture) -> dict[str, float]:
    """Base weights per storage: float32, bfloat16 (= float16), 8-bit (LLM.int8: 1 byte per linear weight) and
    4-bit (NF4 with double quantization: 0.5 byte + 1 byte per 64 weights + 4 bytes per 16384 weights). The
    quantized columns keep every other parameter in float32, as ``prepare_model_for_kbit_training`` leaves them."""
    p = parameters(a)
    rest = (p["experts"] + p["other"]) * 4
    return {
        "float32": p["total"] * 4,
        "bfloat16": p["total"] * 2,
        "float16": p["total"] * 2,
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
    takes (none when p is 4) and the float32 log-probabilities the cross-entropy keeps, at the text's positions
    only (training computes no logits at an image's tokens, whose labels are never read:
    :func:`fedpeft.training.labelled_tail`).
    """
    tokens = batch * (a.tokens or length)
    per_layer = layer_activation_bytes(a, p)
    layers = (a.layers * a.hidden * p + per_layer) if checkpointing else a.layers * per_layer
    logits = 0.0
    if a.kind != "encoder":
        logits = batch * max(length - a.extra_tokens, 2) * a.vocab * (p + (4 if p != 4 else 0) + 4)
    return {"layers": tokens * layers, "logits": logits, "total": tokens * layers + logits}


def active_parameters(a: Architecture) -> int:
    """The parameters one token's forward pass multiplies by: the blocks' linear layers (of an MoE, the router and
    the ``top_k`` routed experts only) and, for a causal LM, ``lm_head``; embedding lookups, norms and biases
    are no matrix products, and the vision tower is counted per example (:func:`extra_forward_flops`)."""
    p = parameters(a)
    routed = a.layers * a.top_k * 3 * a.hidden * a.intermediate if a.kind == "moe" else 0
    router = a.layers * a.hidden * a.experts
    head = a.vocab * a.hidden if a.kind != "encoder" else 0
    return p["linear"] + routed + router + head


def forward_flops_per_token(a: Architecture) -> float:
    """2 x the active parameters: one multiply and one add per weight (attention's own s x s products left out)."""
    return 2.0 * active_parameters(a)


def extra_forward_flops(a: Architecture) -> float:
    """FLOPs of one example through the frozen parts outside the modelled stack (a LLaVA model's vision tower and
    projector, once per image): 2 x their parameters x their tokens x the example's images."""
    return 2.0 * a.extra_params * a.extra_tokens * a.images


def kv_cache_bytes(a: Architecture, batch: int, length: int, p: int) -> float:
    """The key/value cache of generating ``batch`` sequences to ``length`` tokens: 2 x kv x layers x p per token."""
    return 2.0 * a.kv_heads * a.head_dim * a.layers * p * batch * length
