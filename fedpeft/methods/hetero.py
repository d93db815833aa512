"""What FedMosaic and its baselines share: compute matching, hooked adapters per architecture, batch replay.

- Compute matching (FedMosaic paper, Sec. A.6 and Table 15): every method trains ``round(local_steps /
  compute_scale)`` steps per round, ``compute_scale`` being its compute per step relative to SFT's, so that all
  methods spend SFT's compute per round. The defaults are the paper's measured ratios (Table 15);
  ``benchmarks/fedmosaic_costs.py`` measures ours.
- Adapters of these methods are :class:`~fedpeft.adapters.hooked.HookedAdapter` s whose ordinary-LoRA tensors
  are named after the architecture (``<architecture>:<module>.lora_A``), so averaging by name never mixes
  architectures, while PQ-LoRA tensors (``pq<k>.<type>.P``) are shared by all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch
from pydantic import Field

from fedpeft.adapters.hooked import GATED, HookedAdapter
from fedpeft.adapters.pq_lora import NUM_BLOCKS, layer_of, plan_sites
from fedpeft.data.types import Example
from fedpeft.methods.base import FederatedConfig, LoraConfigMixin
from fedpeft.models.runtime import ClientModel
from fedpeft.types import StateDict, derive_seed

# Compute per local step relative to SFT, FedMosaic paper Table 15.
PAPER_COMPUTE_SCALE = {
    "sft": 1.0,
    "fedit": 1.0,
    "ditto": 2.0,
    "fedsim": 1.487,
    "takfl": 1.294,
    "perada": 2.294,
    "feddat": 2.564,
    "feddpa": 2.051,
    "fedmkt": 1.574,
    "fedmosaic": 1.098,
}


class HeteroConfig(FederatedConfig, LoraConfigMixin):
    """Knobs shared by FedMosaic and its baselines (paper defaults for text-only runs)."""

    rounds: int = 20
    fraction: float = 1.0
    local_steps: int | None = 100
    batch_size: int = 4
    lr: float = 3e-4
    rank: int = 16
    compute_scale: float = Field(default=1.0, gt=0)


def matched_steps(cfg: Any) -> int:
    """Local steps of one round after compute matching: ``max(1, round(local_steps / compute_scale))``."""
    return max(1, round(int(cfg.local_steps or 1) / float(cfg.compute_scale)))


def example_batches(count: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """The example indices of each step of ``ModelRuntime.train`` (the same shuffles as ``runtime.batches``)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(count, generator=generator).tolist()
        for start in range(0, count, batch_size):
            yield order[start : start + batch_size]


def hooked_adapter(
    runtime: Any,
    seed: int,
    *,
    rank: int,
    alpha: float | None = None,
    blocks: int = NUM_BLOCKS,
    pq: bool = True,
    branches: tuple[str, ...] = ("local", "global"),
    mix: str = GATED,
) -> HookedAdapter:
    """A fresh adapter for the runtime's architecture; every client of an architecture gets the same one."""
    sites = plan_sites(
        runtime.target_modules, runtime.loaded.lora_targets, runtime.architecture, num_blocks=blocks, pq=pq
    )
    adapter = HookedAdapter(sites, rank=rank, alpha=alpha, branches=branches, mix=mix)
    adapter.initialize(torch.Generator().manual_seed(derive_seed(seed, "adapter", runtime.architecture)))
    return adapter.add_head(runtime)


def gradient_module(runtime: Any, suffix: str) -> str:
    """The module whose weight gradient RELA reads: the last layer's module ending in ``suffix`` (default the
    MLP ``down_proj``), or the last adapted module of the last layer when no module has that name."""
    names = [name for name, _ in runtime.target_modules]
    last = max(layer_of(name) or 0 for name in names)
    in_last = [name for name in names if layer_of(name) == last]
    matching = [name for name in in_last if name == suffix or name.endswith("." + suffix)]
    return (matching or in_last)[-1]


def frozen_gradient(runtime: Any, module: str, examples: list[Example]) -> torch.Tensor:
    """The gradient of the task loss of the runtime's frozen base model w.r.t. ``module``'s weight, flattened.

    The caller makes sure no adapter is active on ``runtime`` (``runtime.install(ClientModel())`` or its own
    extension disabled).
    """
    weight = dict(runtime.target_modules)[module].weight
    model = runtime.activate(None)
    was_training, had_grad = model.training, weight.requires_grad
    batch = {k: v.to(runtime.device) for k, v in runtime.encode(examples).items()}
    model.eval()
    try:
        with runtime._adapter_context(), torch.enable_grad():
            weight.requires_grad_(True)
            (grad,) = torch.autograd.grad(model(**batch).loss, weight)
    finally:
        weight.requires_grad_(had_grad)
        model.train(was_training)
    return grad.detach().reshape(-1).to(torch.float32)


def install_adapter(runtime: Any, adapter: HookedAdapter) -> None:
    """Put ``adapter`` on the runtime's base model (PEFT adapters off)."""
    runtime.install(ClientModel(extension=adapter))


def with_prefix(tensors: StateDict, prefix: str) -> StateDict:
    return {f"{prefix}{k}": v for k, v in tensors.items()}


_SHARED_KEY = re.compile(r"^pq\d+\.")


def is_shared_key(name: str) -> bool:
    """Whether a tensor name is a PQ-LoRA one (``pq<k>.<type>.P|Q``), shared across architectures."""
    return bool(_SHARED_KEY.match(name))


def architecture_keys(tensors: StateDict, architecture: str) -> StateDict:
    """The tensors a client of ``architecture`` uses: PQ-LoRA ones and its architecture's ordinary LoRA."""
    return {k: v for k, v in tensors.items() if is_shared_key(k) or k.startswith(f"{architecture}:")}
