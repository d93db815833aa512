"""FedDPA-T: a global and a local LoRA per client, mixed per test instance.

Y. Yang, G. Long, T. Shen, J. Jiang, M. Blumenstein, "Dual-Personalizing Adapter for Federated Foundation
Models", NeurIPS 2024, https://arxiv.org/abs/2403.19211. Every client holds a global LoRA (federated: trained
alone, uploaded, averaged together with the task head) and a local LoRA (never leaves the client). In each round
a sampled client first trains its local LoRA with the received global LoRA frozen, the two mixed with weights
(1 - a, a), a = ``local_weight``; then it trains the global LoRA alone and uploads it (FedDPA-T, the variant that
trains both adapters in every round). At inference the mixing weight of an instance x is
alpha(x) = ``max_weight`` * mean_s cos(e(x), e(s)) over ``reference_instances`` random training instances s of
the client (e = mean-pooled last hidden state of the model with the local LoRA), clamped to [0, max_weight]:
the output is W0 x + (1 - alpha) dW_global x + alpha dW_local x.

Registered as ``feddpa`` (alias ``feddpa_t``). As a base stage (FedP2EFT, 2025) each client's base model is
W0 + (1 - a) dW_global + a dW_local with the global head; an unseen client trains its local LoRA on that shared
part first. Defaults follow FedP2EFT: LoRA on q and v, r = 8, alpha = 8, dropout 0.05, lr 5e-5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from peft import get_peft_model_state_dict

from fedpeft import evaluation
from fedpeft.adapters.instance_mixing import (
    drawn_weights,
    mixed_adapters,
    reference_draw,
    representations,
)
from fedpeft.base_models import ClientBase, merged_base, resolve_targets
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData, Example
from fedpeft.methods.base import Budget, Method, local_schedule
from fedpeft.methods.feddpa_config import FedDPAConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.training import TrainArgs


@dataclass
class DualAdapterModel(ClientModel):
    """A client's global LoRA (``lora``/``adapter``, with the head) plus its local LoRA, mixed per instance."""

    local_lora: LoraSpec | None = None
    local_adapter: StateDict = field(default_factory=dict)


class FedDPA(Method[FedDPAConfig, ServerState, StateDict]):
    """Global LoRA federated, local LoRA kept; instance-wise mixing of the two at inference."""

    name = "feddpa"
    Config = FedDPAConfig
    mergeable = False  # global and local LoRA mixed per test instance (its own client_base serves the base stage)
    base_stage = True
    per_client_base = True

    def specs(self, runtime: ModelRuntime) -> tuple[LoraSpec, LoraSpec]:
        """The global LoRA (with the head) and the local LoRA (without) of every client."""
        cfg = self.cfg
        targets = resolve_targets(runtime, cfg.targets)
        glob = LoraSpec(rank=cfg.rank, alpha=cfg.alpha, targets=targets, dropout=cfg.dropout, slot="global")
        local = LoraSpec(rank=cfg.rank, alpha=cfg.alpha, targets=targets, dropout=cfg.dropout, slot="local", head=False)
        return glob, local

    def init_server(self, runtime: ModelRuntime, seed: int) -> ServerState:
        glob, _ = self.specs(runtime)
        runtime.install(ClientModel(lora=glob), seed=seed)
        return ServerState(tensors=runtime.adapter_state())

    def train_local(
        self, runtime: ModelRuntime, examples: list[Example], weights: dict[LoraSpec, float], seed: int, **length
    ) -> StateDict:
        """Train the local LoRA (the last of ``weights``) with the other adapters frozen, mixed by ``weights``."""
        local = list(weights)[-1]
        with mixed_adapters(runtime, weights):
            assert runtime.peft is not None
            params = {n: p for n, p in runtime.peft.named_parameters() if f".{local.key}." in n}
            runtime.train(
                examples, TrainArgs(lr=self.cfg.lr, batch_size=self.cfg.batch_size, seed=seed, **length), params
            )
            state = get_peft_model_state_dict(runtime.peft, adapter_name=local.key)
        return {k: v.detach().clone() for k, v in state.items()}

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: StateDict | None, seed: int
    ) -> tuple[ClientUpdate, StateDict]:
        glob, local = self.specs(runtime)
        a = self.cfg.local_weight
        runtime.install(ClientModel(lora=local, adapter=client_state or {}), seed=seed)
        runtime.install(ClientModel(lora=glob, adapter=payload.tensors), seed=seed)
        schedule = local_schedule(self.cfg)
        local_state = self.train_local(runtime, client.train, {glob: 1.0 - a, local: a}, seed, **schedule)
        runtime.install(ClientModel(lora=glob, adapter=payload.tensors), seed=seed)
        metrics = runtime.train(
            client.train, TrainArgs(lr=self.cfg.lr, batch_size=self.cfg.batch_size, seed=seed, **schedule)
        )
        update = ClientUpdate(client.client_id, runtime.adapter_state(), float(len(client.train)), metrics)
        return update, local_state

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: StateDict | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        glob, local = self.specs(runtime)
        local_state = client_state
        if local_state is None:  # an unseen client trains its local LoRA beside the final global one
            a = self.cfg.local_weight
            runtime.install(ClientModel(lora=local), seed=seed)
            runtime.install(ClientModel(lora=glob, adapter=state.tensors), seed=seed)
            epochs = self.cfg.unseen_local_epochs
            local_state = self.train_local(runtime, client.train, {glob: 1.0 - a, local: a}, seed, epochs=epochs)
        return DualAdapterModel(lora=glob, adapter=state.tensors, local_lora=local, local_adapter=local_state)

    def evaluate(self, runtime: ModelRuntime, client: ClientData, model: ClientModel, seed: int) -> Metrics:
        if not isinstance(model, DualAdapterModel) or model.local_lora is None:
            return super().evaluate(runtime, client, model, seed)
        runtime.install(ClientModel(lora=model.local_lora, adapter=model.local_adapter), seed=seed)
        test = runtime.evaluation_examples(client.test)
        # Each test example is compared with `reference_instances` drawn training examples: only those drawn
        # are represented, not the whole training set.
        chosen = reference_draw(len(client.train), len(test), sample=self.cfg.reference_instances, seed=seed)
        needed = sorted(set(chosen.flatten().tolist()))
        position = torch.full((len(client.train),), -1, dtype=torch.long)
        position[needed] = torch.arange(len(needed))
        references = representations(runtime, [client.train[i] for i in needed])
        alphas = drawn_weights(
            representations(runtime, test), references, position[chosen], max_weight=self.cfg.max_weight
        )
        runtime.install(ClientModel(lora=model.lora, adapter=model.adapter), seed=seed)
        predictions: list[Any] = []
        assert model.lora is not None
        with mixed_adapters(runtime, {model.lora: 1.0, model.local_lora: 0.0}) as scales:
            for start in range(0, len(test), runtime.eval_batch_size):
                alpha = alphas[start : start + runtime.eval_batch_size]
                scales[model.lora.key], scales[model.local_lora.key] = 1.0 - alpha, alpha
                predictions += runtime.predict(test[start : start + runtime.eval_batch_size])
        return score(runtime, predictions, test)

    # ------------------------------------------------------------------ as a base stage
    def export_base(self, runtime: ModelRuntime, state: ServerState) -> StateDict:
        glob, _ = self.specs(runtime)
        return merged_base(runtime, glob, state.tensors, scale=1.0 - self.cfg.local_weight)

    def client_base(
        self, runtime: ModelRuntime, client: ClientData, state: ServerState, client_state: StateDict | None, seed: int
    ) -> ClientBase:
        _, local = self.specs(runtime)
        local_state = client_state
        if local_state is None:  # unseen: the shared base already holds (1 - a) of the global LoRA
            runtime.install(ClientModel(lora=local), seed=seed)
            epochs = self.cfg.unseen_local_epochs
            local_state = self.train_local(runtime, client.train, {local: self.cfg.local_weight}, seed, epochs=epochs)
        return ClientBase(lora=local, adapter=local_state, scale=self.cfg.local_weight)


def score(runtime: ModelRuntime, predictions: list[Any], examples: list[Example]) -> Metrics:
    """The task metrics of ``predictions`` (as :meth:`ModelRuntime.evaluate` computes them)."""
    if runtime.task == "classification":
        return {"accuracy": evaluation.accuracy(predictions, [int(ex["label"]) for ex in examples])}
    return evaluation.generation_metrics(predictions, [ex["response"] for ex in examples])
