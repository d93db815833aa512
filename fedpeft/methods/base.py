"""The method contract: pure client and server functions on named tensors.

A method is a class registered in ``fedpeft.core.registry.METHODS`` with a pydantic ``Config``. Engines call:

- ``init_server(runtime, seed) -> ServerState``
- ``payload(state, client_id) -> Payload``                 (may differ per client)
- ``client_update(runtime, client, payload, client_state, seed) -> (ClientUpdate, client_state)``
- ``aggregate(state, updates) -> (ServerState, Metrics)``   (``updates`` is an iterator: aggregate as it streams)
- ``personalize(runtime, client, state, client_state, budget, seed) -> ClientModel``

Methods never choose how clients are executed (sequentially, in Flower, in parallel); the engine does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from fedpeft.base_models import ClientBase
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime


class MethodConfig(BaseModel):
    """Fields every method accepts."""

    model_config = ConfigDict(extra="forbid")

    name: str
    label: str | None = None


class FederatedConfig(MethodConfig):
    """The usual knobs of a federated phase: rounds, client sampling, local training."""

    rounds: int = 10
    fraction: float = 0.1
    min_clients: int = 1
    local_steps: int | None = 10
    local_epochs: float | None = None
    batch_size: int = 16
    lr: float = 1e-4
    weight_decay: float = 0.0


class LoraConfigMixin(BaseModel):
    """LoRA shape knobs (rank, scaling, dropout; ``targets``: module-name suffixes, all linear layers if unset)."""

    rank: int = 8
    alpha: float | None = None
    dropout: float = 0.0
    targets: list[str] | None = None


class Method:
    """Base class of registered methods; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    federated: ClassVar[bool] = True
    uses_budget: ClassVar[bool] = False
    # Tensor-name fragments that never leave the client (checked by the method matrix tests).
    private_keys: ClassVar[tuple[str, ...]] = ()
    # One federated phase per budget (the server state depends on the budget, e.g. FedL2P's learning-rate MLP).
    federated_per_budget: ClassVar[bool] = False
    # Usable as the federated base stage (``base.kind: federated``): implements ``export_base``; with
    # ``per_client_base`` also ``client_base`` (every client gets a base model of its own).
    base_stage: ClassVar[bool] = False
    per_client_base: ClassVar[bool] = False

    def __init__(self, cfg: MethodConfig) -> None:
        self.cfg = cfg

    @property
    def label(self) -> str:
        return self.cfg.label or self.cfg.name

    def init_server(self, runtime: ModelRuntime, seed: int) -> ServerState:
        return ServerState()

    def init_server_for_budget(self, runtime: ModelRuntime, seed: int, budget: int) -> ServerState:
        """The initial server state of the federated phase for ``budget`` (methods with ``federated_per_budget``)."""
        return self.init_server(runtime, seed)

    def should_stop(self, state: ServerState) -> bool:
        """Whether the federated phase ends before its last round (early stopping); checked before every round."""
        return False

    def payload(self, state: ServerState, client_id: str) -> Payload:
        return Payload(tensors=state.tensors)

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: Any, seed: int
    ) -> tuple[ClientUpdate, Any]:
        raise NotImplementedError(f"{self.name} has no federated phase")

    def aggregate(self, state: ServerState, updates: Iterable[ClientUpdate]) -> tuple[ServerState, Metrics]:
        tensors, metrics = weighted_mean(updates)
        if not tensors:
            return state, metrics
        return ServerState(tensors=tensors, round=state.round + 1, extra=state.extra), metrics

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: Any,
        budget: int | None,
        seed: int,
    ) -> ClientModel:
        raise NotImplementedError

    def evaluate(self, runtime: ModelRuntime, client: ClientData, model: ClientModel, seed: int) -> Metrics:
        """Metrics of the personalized ``model`` on the client's test split (methods that infer differently, such
        as FedDPA's instance-wise adapter mixing, override this)."""
        runtime.install(model, seed=seed)
        return runtime.evaluate(client.test)

    def export_base(self, runtime: ModelRuntime, state: ServerState) -> StateDict:
        """Every base tensor of the shared base model this method's final ``state`` gives (``base_stage``)."""
        raise NotImplementedError(f"{self.name} cannot produce a base model")

    def client_base(self, runtime: ModelRuntime, client: ClientData, client_state: Any, seed: int) -> ClientBase | None:
        """One client's own changes to the shared base model (``per_client_base``), computed on the runtime with
        the shared base installed; ``None`` keeps the shared base."""
        return None


def weighted_mean(updates: Iterable[ClientUpdate]) -> tuple[StateDict, Metrics]:
    """Streaming weighted mean of the clients' tensors; also averages their numeric metrics.

    Runs in float64 and returns the tensors in their original dtype, so the result does not depend on how many
    clients were folded in before a given one beyond float64 rounding.
    """
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    metric_sums: dict[str, float] = {}
    total = 0.0
    count = 0
    for update in updates:
        w = float(update.weight)
        total += w
        count += 1
        for key, tensor in update.tensors.items():
            dtypes.setdefault(key, tensor.dtype)
            contribution = tensor.detach().to(torch.float64) * w
            sums[key] = sums[key] + contribution if key in sums else contribution
        for key, value in update.metrics.items():
            metric_sums[key] = metric_sums.get(key, 0.0) + float(value)
    if count == 0 or total <= 0:
        return {}, {"clients": float(count)}
    mean = {k: (v / total).to(dtypes[k]) for k, v in sums.items()}
    metrics = {f"train_{k}": v / count for k, v in metric_sums.items()}
    metrics["clients"] = float(count)
    return mean, metrics


def lora_spec(
    runtime: ModelRuntime,
    rank: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    targets: list[str] | None = None,
) -> LoraSpec:
    """A LoRA of ``rank`` on ``targets`` (default: all linear layers of the runtime's model and the fused expert
    tensors of a mixture-of-experts model; alpha: 2 * rank)."""
    if targets:
        from fedpeft.methods.lora_parts import target_spec

        return target_spec(runtime, rank, alpha, dropout, targets)
    return LoraSpec(
        rank=rank,
        alpha=float(alpha if alpha is not None else 2 * rank),
        targets=tuple(runtime.loaded.lora_targets),
        dropout=dropout,
        target_parameters=tuple(getattr(runtime.loaded, "lora_parameters", ())),
    )


def local_schedule(cfg: FederatedConfig, steps: int | None = None) -> dict[str, Any]:
    """How long a client trains in one round, as ``ModelRuntime.train``'s ``epochs`` and ``steps``: exactly
    ``steps`` steps when given, else ``local_epochs`` epochs when set, else ``local_steps`` steps."""
    if steps is not None:
        return {"epochs": None, "steps": steps}
    return {"epochs": cfg.local_epochs, "steps": cfg.local_steps if cfg.local_epochs is None else None}


def local_training(cfg: FederatedConfig, *, steps: int | None = None, lr: float | None = None) -> dict[str, Any]:
    """The keyword arguments of ``ModelRuntime.train`` for one round of local training under ``cfg``: its
    learning rate (or ``lr``), batch size, weight decay and :func:`local_schedule`."""
    return {
        "lr": cfg.lr if lr is None else lr,
        "batch_size": cfg.batch_size,
        "weight_decay": cfg.weight_decay,
        **local_schedule(cfg, steps),
    }


def fine_tune(
    runtime: ModelRuntime, model: ClientModel, examples: list[Any], *, seed: int, **settings: Any
) -> ClientModel:
    """Install ``model`` (fresh LoRA weights from ``seed`` where it gives none), train its adapter on
    ``examples`` (``settings``: the keyword arguments of ``ModelRuntime.train``) and return the trained model."""
    runtime.install(model, seed=seed)
    runtime.train(examples, seed=seed, **settings)
    return ClientModel(lora=model.lora, adapter=runtime.adapter_state())
