"""Typed access to the weight of a layer LoRA wraps (``torch.nn.Module`` types its attributes as tensor or module)."""

from __future__ import annotations

import torch


def layer_weight(module: torch.nn.Module) -> torch.Tensor:
    """The ``weight`` tensor of a linear-like layer (``Linear``, ``Conv1D``, a LoRA factor)."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{type(module).__name__}.weight is a {type(weight).__name__}, not a tensor")
    return weight
