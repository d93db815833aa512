"""Per-tier compute costs of the tiered methods: what a client of each tier spends on one forward pass.

For every tier (in ``eval_tiers``, when set) :func:`tier_costs` records the experts per token, the LoRA rank,
the active parameters (base model at the tier's top-k plus the active LoRA), the analytic forward FLOPs of
``compute_tokens`` tokens (2 x active parameters x tokens, LoRA unmerged) and the measured forward wall time
of one sequence of that length with the adapter merged (timed as the base model at the tier's top-k).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Mapping
from typing import Protocol, TypedDict

import torch

from fedpeft.core.jsontypes import JSONObject
from fedpeft.models.moe import Routing, forward_flops, lora_active_parameters
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.settings.methods import TierConfig, TieredConfig


class ModuleExperts(TypedDict):
    """What the costs read of one LoRA module of a tiered method's layout: its number of experts."""

    experts: int


class TieredModels(Protocol):
    """What :func:`tier_costs` reads of a tiered method (a :class:`~fedpeft.methods.families.tiered.TieredMethod`):
    its settings and label, and per tier the LoRA rank, the LoRA, its modules, the experts per token and the
    routing."""

    @property
    def cfg(self) -> TieredConfig: ...

    @property
    def label(self) -> str: ...

    def rank_for(self, tier: TierConfig) -> int: ...

    def spec(self, runtime: ModelRuntime, rank: int) -> LoraSpec: ...

    def layout(self, runtime: ModelRuntime) -> Mapping[str, ModuleExperts]: ...

    def eval_top_k(self, runtime: ModelRuntime, tier: TierConfig) -> int | None: ...

    def routing(self, runtime: ModelRuntime, top_k: int | None, scale: float = 1.0) -> Routing | None: ...


def tier_costs(method: TieredModels, runtime: ModelRuntime, seed: int) -> list[JSONObject]:
    """``costs.jsonl`` records (phase ``compute``, budget = tier) of every evaluated tier of ``method``."""
    cfg = method.cfg
    rows: list[JSONObject] = []
    config = runtime.base_model.config
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    tokens = min(cfg.compute_tokens, int(positions)) if positions else cfg.compute_tokens  # what the model can read
    vocab = int(config.vocab_size)
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed), device="cpu")
    ids = ids.to(runtime.device)
    for tier in cfg.tiers:
        if cfg.eval_tiers is not None and tier.name not in cfg.eval_tiers:
            continue
        rank = method.rank_for(tier)
        runtime.activate(method.spec(runtime, rank))
        lora_state = runtime.adapter_state()
        top_k = method.eval_top_k(runtime, tier) if runtime.moe is not None else None
        experts = {k: m["experts"] for k, m in method.layout(runtime).items() if m["experts"] > 1}
        k = top_k if top_k is not None else (runtime.moe.default_top_k if runtime.moe is not None else 1)
        base = sum(p.numel() for p in runtime.base_params.values())
        base -= runtime.moe.inactive_parameters(k) if runtime.moe is not None else 0
        lora = lora_active_parameters(lora_state, experts, k)
        model = runtime.install(ClientModel(routing=method.routing(runtime, top_k)))
        # Timed without the adapter: a deployed LoRA is merged into the weights and costs nothing extra.
        adapterless = runtime.peft.disable_adapter() if runtime.peft is not None else contextlib.nullcontext()
        with adapterless, runtime.autocast():
            milliseconds = forward_ms(model, ids, cfg.compute_repeats)
        values = {
            **({"top_k": float(k)} if runtime.moe is not None else {}),
            "lora_rank": float(rank),
            "active_params": float(base + lora),
            "forward_flops": float(forward_flops(base + lora, tokens)),
            "forward_ms": milliseconds,
        }
        rows += [
            {"method": method.label, "seed": seed, "phase": "compute", "budget": tier.name, "metric": m, "value": v}
            for m, v in values.items()
        ]
    runtime.install(ClientModel())
    return rows


@torch.no_grad()
def forward_ms(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> float:
    """Median wall milliseconds of one forward pass (after one warm-up pass)."""
    model.eval()
    model(input_ids=ids)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        model(input_ids=ids)
        if ids.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000.0)
    return float(statistics.median(times))
