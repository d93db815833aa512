"""FLoRA: stacking aggregation of heterogeneous-rank LoRA adapters, folded into the base weights every round.

Z. Wang, Z. Shen, Y. He, G. Sun, H. Wang, L. Lyu, A. Li, "FLoRA: Federated Fine-Tuning Large Language Models with
Heterogeneous Low-Rank Adaptations", NeurIPS 2024, https://arxiv.org/abs/2409.05976.

Every round each sampled client k starts a fresh LoRA of its own rank r_k (A random, B = 0) on the current global
weights and trains it. The server stacks the uploads: A = [p_1 s_1 A_1; ...; p_K s_K A_K] (rows) and
B = [B_1, ..., B_K] (columns), with p_k = n_k / sum_j n_j and s_k = alpha_k / r_k the client's LoRA scaling
(``merge_scaling``: one scaling for every client, as the authors' code merges at lora_alpha / lora_r), so that
B A = sum_k p_k s_k B_k A_k exactly for any ranks (:func:`~fedpeft.methods.families.folding.stack_factors`).
That product is folded into the frozen weights: W <- W + B A. The task head (a full tensor) is averaged by data
size.

The server keeps the cumulative folded update of every LoRA module as one full-size tensor
(``<module>.base_delta``), so any client, one that never took part included, rebuilds the global weights
W0 + sum over rounds of the stacked products; the payload carries it (full-size matrices of the adapted layers,
where the paper sends each round's stacked factors to clients that keep their own folded weights).
Personalization: every client keeps the global model (W0 + the folded update, the global head), optionally
fine-tuned with a fresh LoRA of its rank for ``finetune_epochs`` epochs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import ClassVar

import torch

from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.merging.server_step import metric_mean, weighted_mean
from fedpeft.methods.base import Budget, Method, local_training, lora_spec
from fedpeft.methods.families.folding import (
    A_SUFFIX,
    B_SUFFIX,
    add_deltas,
    folded_weights,
    full_base,
    head_keys,
    is_delta,
    lora_modules,
    lora_scaling,
    module_of_delta,
    stack_factors,
    zero_deltas,
)
from fedpeft.methods.flora_config import FloraConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.training import TrainArgs

_TRAILING_NUMBER = re.compile(r"(\d+)$")


@dataclasses.dataclass
class FloraState(ServerState):
    """The global head and every module's cumulative folded update (``tensors``, ``<module>.base_delta``), and
    the rank of the last round's stacked LoRA (sum of the ranks that took part)."""

    stacked_rank: int = 0


class Flora(Method[FloraConfig, FloraState, None]):
    """Stacked A (rows) and B (columns) of the clients' fresh LoRAs, their product folded into the weights."""

    name = "flora"
    Config: ClassVar[type[FloraConfig]] = FloraConfig
    base_stage = True  # the shared base is the global model: W0 + the folded update, the global head

    def rank_of(self, client_id: str) -> int:
        """A client's LoRA rank: ``client_ranks``, else ``ranks[i mod len(ranks)]`` with i the number at the end of
        its id, else ``rank``."""
        if client_id in self.cfg.client_ranks:
            return int(self.cfg.client_ranks[client_id])
        match = _TRAILING_NUMBER.search(client_id)
        if self.cfg.ranks and match is not None:
            return int(self.cfg.ranks[int(match.group(1)) % len(self.cfg.ranks)])
        return int(self.cfg.rank)

    def scaling(self, rank: int) -> float:
        """The LoRA scaling a client of ``rank`` trains with (alpha / rank; alpha 2 * rank when unset)."""
        return lora_scaling(self.cfg.alpha, rank)

    def merge_scale(self, rank: int) -> float:
        """The scaling the server folds the product of a client of ``rank`` with: ``merge_scaling``, else the
        client's own."""
        return self.cfg.merge_scaling if self.cfg.merge_scaling is not None else self.scaling(rank)

    def spec(self, runtime: ModelRuntime, rank: int) -> LoraSpec:
        return lora_spec(runtime, rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)

    def init_server(self, runtime: ModelRuntime, seed: int) -> FloraState:
        runtime.install(ClientModel(lora=self.spec(runtime, self.cfg.rank)), seed=seed)
        adapter = runtime.adapter_state()
        head = {k: adapter[k] for k in head_keys(adapter)}
        return FloraState(tensors={**head, **zero_deltas(runtime, lora_modules(adapter))})

    def payload(self, state: FloraState, client_id: str) -> Payload:
        return Payload(tensors=state.tensors, config={"rank": self.rank_of(client_id)})

    def update_spec(self, payload: Payload) -> dict[str, torch.Size]:
        """A fresh LoRA of the client's rank on every folded module, and the head."""
        rank = int(payload.config["rank"])
        spec: dict[str, torch.Size] = {}
        for key, tensor in payload.tensors.items():
            if is_delta(key):
                module = module_of_delta(key)
                out_features, in_features = tensor.shape
                spec[module + A_SUFFIX] = torch.Size((rank, in_features))
                spec[module + B_SUFFIX] = torch.Size((out_features, rank))
            else:
                spec[key] = tensor.shape
        return spec

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        rank = int(payload.config.get("rank", self.rank_of(client.client_id)))
        base = folded_weights(runtime, payload.tensors)
        head = {k: payload.tensors[k] for k in head_keys(payload.tensors)}
        runtime.install(ClientModel(base=base, lora=self.spec(runtime, rank), adapter=head), seed=seed)
        metrics = runtime.train(client.train, local_training(self.cfg, seed))
        return ClientUpdate(client.client_id, runtime.adapter_state(), float(len(client.train)), metrics), None

    def aggregate(self, state: FloraState, updates: Iterable[ClientUpdate]) -> tuple[FloraState, Metrics]:
        received = list(updates)
        modules = [module_of_delta(k) for k in state.tensors if is_delta(k)]
        heads = set(head_keys(state.tensors))
        head = weighted_mean(
            ClientUpdate(u.client_id, {k: v for k, v in u.tensors.items() if k in heads}, u.weight) for u in received
        )
        metrics = metric_mean(received)
        total = sum(float(u.weight) for u in received)
        if not received or total <= 0:
            return state, metrics
        ranks = [int(u.tensors[modules[0] + A_SUFFIX].shape[0]) for u in received] if modules else []
        coefficients = [float(u.weight) / total * self.merge_scale(r) for u, r in zip(received, ranks, strict=False)]
        deltas = {}
        for module in modules:
            factors = [(u.tensors[module + A_SUFFIX], u.tensors[module + B_SUFFIX]) for u in received]
            a, b = stack_factors(factors, coefficients)
            deltas[module] = b @ a
        tensors = {**add_deltas(state.tensors, deltas), **head}
        stacked = sum(ranks)
        metrics["stacked_rank"] = float(stacked)
        return dataclasses.replace(state, tensors=tensors, stacked_rank=stacked), metrics

    def global_weights(self, runtime: ModelRuntime, state: FloraState) -> StateDict:
        """The base tensors the global model changes: W0 + folded update on every adapted layer, and the head."""
        return folded_weights(runtime, state.tensors, head=True)

    def export_base(self, runtime: ModelRuntime, state: FloraState) -> StateDict:
        return full_base(runtime, self.global_weights(runtime, state))

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FloraState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        base = self.global_weights(runtime, state)
        if self.cfg.finetune_epochs <= 0:
            return ClientModel(base=base)
        spec = self.spec(runtime, self.rank_of(client.client_id))
        head = {k: state.tensors[k] for k in head_keys(state.tensors)}
        runtime.install(ClientModel(base=base, lora=spec, adapter=head), seed=seed)
        lr = self.cfg.finetune_lr or self.cfg.lr
        runtime.train(
            client.train, TrainArgs(lr=lr, batch_size=self.cfg.batch_size, seed=seed, epochs=self.cfg.finetune_epochs)
        )
        return ClientModel(base=base, lora=spec, adapter=runtime.adapter_state())
