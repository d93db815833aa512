"""Per-module learning rates predicted from client statistics: the pieces of FedL2P's rate network.

A small MLP maps a client's feature statistics to one multiplier per LoRA module (each lora_A, lora_B and head
module, :func:`module_groups`); the rate of a module is ``clamp(multiplier, 0, max) * post_multiplier``, the
clamp passing gradients straight through (:func:`module_rates`). The rates reach the fine-tuned weights through
the last inner step: w = w' + eta * u, u being that step's change per unit rate (:func:`unit_steps`,
:func:`through_last_step`), so that the loss of the fine-tuned weights is differentiable in the rates.
Pure functions of tensors, plus :func:`module_groups`, which reads the active adapter of a runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext

import torch
from torch.autograd.function import FunctionCtx

from fedpeft.core.types import StateDict
from fedpeft.models.runtime import ModelRuntime

POST = "post_multiplier"
"""Name of the per-module post-multipliers among the rate network's tensors (the others are ``mlp.*``)."""


class ClampSTE(torch.autograd.Function):
    """Clamp in the forward pass, identity in the backward pass (FedL2P's straight-through estimator)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


def rate_network(inputs: int, outputs: int, hidden: int) -> torch.nn.Sequential:
    """FedL2P's learning-rate MLP: two hidden layers of ``hidden`` units with ReLU."""
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, outputs),
    )


def initial_rate_tensors(inputs: int, outputs: int, hidden: int, post: float, seed: int) -> StateDict:
    """A fresh rate network whose multipliers start near 1 (Xavier-normal weights of gain 0.1, biases 1), drawn
    from ``seed``, as ``mlp.*`` tensors, with every post-multiplier at ``post``."""
    net = rate_network(inputs, outputs, hidden)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                torch.nn.init.xavier_normal_(layer.weight, gain=0.1)
                torch.nn.init.constant_(layer.bias, 1.0)
    tensors = {f"mlp.{k}": v.detach().clone() for k, v in net.state_dict().items()}
    tensors[POST] = torch.full((outputs,), post)
    return tensors


def module_rates(tensors: StateDict, stats: torch.Tensor, *, hidden: int, max_multiplier: float) -> torch.Tensor:
    """Per-module learning rates: clamp(MLP(stats), 0, max_multiplier) * post-multiplier, differentiable in
    ``tensors``."""
    mlp = {k.removeprefix("mlp."): v for k, v in tensors.items() if k.startswith("mlp.")}
    net = rate_network(stats.numel(), tensors[POST].numel(), hidden)
    multipliers = torch.func.functional_call(net, mlp, (stats,))
    return ClampSTE.apply(multipliers, 0.0, max_multiplier) * tensors[POST]


def module_groups(runtime: ModelRuntime) -> list[list[str]]:
    """The active adapter's trainable parameters grouped by module (each lora_A, lora_B, head module)."""
    groups: dict[str, list[str]] = {}
    for name in runtime.adapter_parameters():
        groups.setdefault(name.rsplit(".", 1)[0], []).append(name)
    return list(groups.values())


def unit_steps(
    params: Mapping[str, torch.Tensor], before: StateDict, groups: list[list[str]], rates: list[float]
) -> StateDict:
    """The last step of every parameter per unit rate, u = (w' - w_before) / eta (zero where eta is 0)."""
    last: StateDict = {}
    for group, value in zip(groups, rates, strict=True):
        for name in group:
            step = params[name].detach() - before[name]
            last[name] = step / value if value > 0 else torch.zeros_like(step)
    return last


def through_last_step(
    params: Mapping[str, torch.Tensor], last: StateDict, groups: list[list[str]], rates: torch.Tensor
) -> StateDict:
    """The fine-tuned weights w' + (eta - stop_gradient(eta)) * u: equal to w', with the rates' gradient."""
    moved = rates - rates.detach()
    return {name: params[name].detach() + moved[i] * last[name] for i, group in enumerate(groups) for name in group}


def differentiable_attention() -> AbstractContextManager:
    """A context in which scaled-dot-product attention supports double backward (its math kernel)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - torch < 2.3
        return nullcontext()
    return sdpa_kernel(SDPBackend.MATH)
