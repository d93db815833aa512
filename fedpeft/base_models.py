"""Base models that personalization starts from: shared ones and one per client.

A federated base stage (``base.kind: federated``) runs a method on the seen pool and turns its final state into
the shared base model (``Method.export_base``): FedAvg's weights, or a global LoRA merged into the weights.
Personalized federated methods (FedDPA-T, DEPT(SPEC)) give every client a base model of its own; such a client's
base is the shared base plus a :class:`ClientBase`: tensors that replace shared ones (DEPT's embeddings) and a
LoRA merged in with a scale (FedDPA's local adapter). Client bases are small (no copy of the whole model per
client); the worker applies them on top of the shared base before any of the client's work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fedpeft.core.config import BaseStageConfig
from fedpeft.core.errors import UserError
from fedpeft.core.types import Metrics, StateDict
from fedpeft.data.types import Example
from fedpeft.models.moe import router_balancing
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.training import EpochHook, TrainArgs

# The query and value projections of attention, per family (the "q, v" LoRA placement of FedIT and FedDPA).
QUERY_VALUE_TARGETS: dict[str, tuple[str, ...]] = {
    "bert": ("query", "value"),
    **{f: ("q_proj", "v_proj") for f in ("llama", "gemma", "gemma2", "gemma3", "mistral", "qwen2", "qwen3")},
}


@dataclass
class ClientBase:
    """One client's own changes to the shared base model.

    Attributes:
        tensors: base tensors replaced by the client's own (by canonical parameter name).
        lora: a LoRA merged into the weights with ``scale`` (after ``tensors`` are in place), if any.
        adapter: that LoRA's tensors.
        scale: the factor of the merged LoRA update.
    """

    tensors: StateDict = field(default_factory=dict)
    lora: LoraSpec | None = None
    adapter: StateDict = field(default_factory=dict)
    scale: float = 1.0


def train_centralized_base(
    runtime: ModelRuntime,
    examples: list[Example],
    base: BaseStageConfig,
    *,
    after_epoch: EpochHook | None = None,
    run_seed: int = 0,
) -> Metrics:
    """A centralized base stage: train every base weight of ``runtime`` on ``examples`` (the base corpus).

    A mixture-of-experts model can train with its router load-balancing loss added, as in MoE pretraining
    (``base.router_aux_loss``; off by default). The trained weights stay in the runtime (read them with
    ``runtime.base_state()``). ``after_epoch`` is told each epoch's mean loss (progress display). The stage's
    seed is ``base.seed``, plus ``run_seed`` when ``base.per_seed`` trains one per run seed.
    """
    runtime.install(ClientModel())
    with router_balancing(runtime.base_model, base.router_aux_loss):
        seed = base.seed + (run_seed if base.per_seed else 0)
        args = TrainArgs(lr=base.lr, batch_size=base.batch_size, seed=seed, epochs=base.epochs, after_epoch=after_epoch)
        return runtime.train(examples, args, "all")


def resolve_targets(runtime: ModelRuntime, targets: str | Sequence[str] | None) -> tuple[str, ...]:
    """LoRA target suffixes: ``None`` or ``"all"`` = every linear layer, ``"qv"`` = attention query and value,
    or an explicit list of module-name suffixes."""
    if targets is None or targets == "all":
        return tuple(runtime.loaded.lora_targets)
    if targets == "qv":
        family = runtime.loaded.family
        if family not in QUERY_VALUE_TARGETS:
            raise UserError(
                f"No query/value layer names are known for the {family!r} family; set `targets` to a list of "
                "module-name suffixes."
            )
        return QUERY_VALUE_TARGETS[family]
    if isinstance(targets, str):
        raise UserError(f"Unknown `targets` {targets!r}; use all, qv or a list of module-name suffixes.")
    return tuple(targets)


def merged_weights(runtime: ModelRuntime, lora: LoraSpec, adapter: StateDict, scale: float = 1.0) -> StateDict:
    """The tensors of the runtime's current base that change when ``adapter`` is merged in with ``scale``:
    W + scale * (alpha / r) B A for every adapted layer, and the adapter's task head."""
    runtime.install(ClientModel(lora=lora, adapter=adapter))
    merged = runtime.merged_weights(scale)
    runtime.activate(None)
    return merged


def merged_base(runtime: ModelRuntime, lora: LoraSpec, adapter: StateDict, scale: float = 1.0) -> StateDict:
    """Every base tensor, with ``adapter`` merged into the weights of the layers it adapts."""
    merged = merged_weights(runtime, lora, adapter, scale)
    return {**runtime.base_state(), **merged}


def client_base_tensors(runtime: ModelRuntime, client_base: ClientBase) -> StateDict:
    """The base tensors a :class:`ClientBase` replaces, computed on the runtime's current (shared) base."""
    overrides = {k: v.detach().clone() for k, v in client_base.tensors.items()}
    if client_base.lora is None:
        return overrides
    runtime.install(ClientModel(lora=client_base.lora, adapter=client_base.adapter))
    runtime.load_base(overrides)  # the merge applies on top of the client's own tensors
    overrides.update(runtime.merged_weights(client_base.scale))
    runtime.install(ClientModel())  # back to the shared base, no adapter
    return overrides


def embedding_keys(runtime: ModelRuntime) -> list[str]:
    """Canonical names of the token and position embedding weights of the runtime's model."""
    model = runtime.base_model
    owners = {id(p): name for name, p in runtime.base_params.items()}
    keys = []
    token = model.get_input_embeddings()
    if token is not None and id(token.weight) in owners:
        keys.append(owners[id(token.weight)])
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and "position" in name.rsplit(".", 1)[-1]:
            if id(module.weight) in owners and owners[id(module.weight)] not in keys:
                keys.append(owners[id(module.weight)])
    return keys
