"""Which layers of a model carry LoRA, which form the task head, and how large a rank they allow.

Targets are module-name suffixes in PEFT's matching rule (a module matches a target ``t`` when its name is
``t`` or ends with ``.t``), so they can be passed as ``LoraConfig(target_modules=...)`` unchanged.

The rule for every family: LoRA goes on every linear layer of the transformer blocks -- attention
projections and MLP -- and on nothing else. Mixture-of-experts families keep their experts in fused 3-D
parameters rather than linear layers; those get LoRA through PEFT's ``target_parameters``
(:data:`FAMILY_LORA_PARAMETERS`: one rank-r block per expert), the attention projections through
``target_modules``; the router stays frozen. The task head (classifier, score, BERT's pooler, which only the
classification head reads) is trained in full and saved with the adapter; embeddings and ``lm_head`` stay
frozen.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

# Linear layers of one block, per family. BERT names three different layers ``dense``: the attention output,
# the block output and the pooler; ``output.dense`` picks the first two but not ``pooler.dense``.
FAMILY_LORA_TARGETS: dict[str, list[str]] = {
    "bert": ["query", "key", "value", "output.dense", "intermediate.dense"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gemma": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gemma2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gemma3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "olmo": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "olmoe": ["q_proj", "k_proj", "v_proj", "o_proj"],
}

# Fused expert parameters of mixture-of-experts families (PEFT ``target_parameters`` suffixes).
FAMILY_LORA_PARAMETERS: dict[str, list[str]] = {
    "olmoe": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}

# The router weight of mixture-of-experts families, for methods that optionally put LoRA on it.
FAMILY_ROUTER_PARAMETERS: dict[str, list[str]] = {
    "olmoe": ["mlp.gate.weight"],
}

# Modules that make up a sequence-classification head, in the names transformers gives them.
HEAD_MODULE_NAMES = ("pre_classifier", "pooler", "classifier", "score")

# Never LoRA targets, whatever the family.
_ALWAYS_EXCLUDED = ("lm_head",)

LORA_LAYER_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, Conv1D)


def normalize_family(model_type: str) -> str:
    """The family name of a transformers ``model_type`` (``gemma3_text`` -> ``gemma3``)."""
    return model_type.removesuffix("_text").replace("-", "_")


def matches(name: str, targets: Iterable[str]) -> bool:
    """Whether module ``name`` matches one of ``targets`` under PEFT's suffix rule."""
    return any(name == t or name.endswith("." + t) for t in targets)


def _is_under(name: str, prefixes: Iterable[str]) -> bool:
    parts = name.split(".")
    return any(p in parts for p in prefixes)


def head_modules_of(model: nn.Module) -> list[str]:
    """The classification-head modules present in ``model`` (e.g. ``["pooler", "classifier"]`` for BERT)."""
    leaf_names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}
    return [h for h in HEAD_MODULE_NAMES if h in leaf_names]


def discover_lora_targets(model: nn.Module, exclude: Iterable[str] = ()) -> list[str]:
    """Shortest name suffixes matching every linear layer of ``model`` outside ``exclude``, and none inside.

    Used for families without an entry in :data:`FAMILY_LORA_TARGETS`; for those with one it gives the same
    answer (a test checks it).

    Args:
        model: the model to inspect.
        exclude: module names (path components) whose linear layers are not LoRA targets, such as the task
            head; ``lm_head`` is always excluded.
    """
    excluded_roots = (*_ALWAYS_EXCLUDED, *exclude)
    linear = [name for name, module in model.named_modules() if isinstance(module, LORA_LAYER_TYPES)]
    kept = [n for n in linear if not _is_under(n, excluded_roots)]
    dropped = [n for n in linear if _is_under(n, excluded_roots)]
    targets: list[str] = []
    for name in kept:
        parts = name.split(".")
        for k in range(1, len(parts) + 1):
            suffix = ".".join(parts[-k:])
            if not any(matches(d, [suffix]) for d in dropped):
                break
        if suffix not in targets:
            targets.append(suffix)
    return targets


def lora_modules(model: nn.Module, targets: Iterable[str]) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs LoRA would wrap for ``targets``."""
    targets = list(targets)
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, LORA_LAYER_TYPES) and matches(name, targets)
    ]


def count_lora_modules(model: nn.Module, targets: Iterable[str]) -> int:
    """L, the number of layers LoRA wraps in ``model`` for ``targets``."""
    return len(lora_modules(model, targets))


def stores_in_out(module: nn.Module) -> bool:
    """Whether ``module`` stores its weight as (in, out), as GPT-2's ``Conv1D`` does, rather than as ``Linear``'s
    (out, in): the layout of a LoRA product B @ A (A of shape (r, in), B of shape (out, r)).

    PEFT wraps such a layer with ``fan_in_fan_out=True`` and merges ``transpose(B @ A)``; every place that folds an
    (out, in) update into the weight, or reads the weight as (out, in), goes through :func:`to_weight_layout` /
    :func:`to_lora_layout` with this answer.
    """
    return isinstance(module, Conv1D)


def in_out_weight_names(modules: Iterable[tuple[str, nn.Module]]) -> frozenset[str]:
    """The weight names (``<module>.weight``) of the ``(name, module)`` pairs whose weight is stored (in, out)."""
    return frozenset(f"{name}.weight" for name, module in modules if stores_in_out(module))


def to_weight_layout(delta: torch.Tensor, in_out: bool) -> torch.Tensor:
    """An (out, in) update (``B @ A``) in the layout of a weight: transposed where the weight is stored (in, out)
    (``in_out``, from :func:`stores_in_out`), as it is otherwise."""
    return delta.transpose(0, 1) if in_out else delta


def to_lora_layout(weight: torch.Tensor, in_out: bool) -> torch.Tensor:
    """A weight (or an update in its layout) as (out, in), the layout of ``B @ A``: the inverse of
    :func:`to_weight_layout`."""
    return weight.transpose(0, 1) if in_out else weight


def in_out_features(module: nn.Module) -> tuple[int, int]:
    """``(in_features, out_features)`` of a layer LoRA wraps (``Linear`` or ``Conv1D``)."""
    if isinstance(module, Conv1D):
        in_features, out_features = module.weight.shape
        return int(in_features), int(out_features)
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    raise TypeError(f"LoRA wraps linear layers, not {type(module).__name__}")


def max_rank(model: nn.Module, targets: Iterable[str]) -> int:
    """The largest LoRA rank every targeted layer allows: min over them of min(in_features, out_features).

    Raises:
        ValueError: if ``targets`` match no layer of ``model``.
    """
    found = lora_modules(model, targets)
    if not found:
        raise ValueError("the LoRA targets match no linear layer of the model")
    return min(min(in_out_features(module)) for _, module in found)
