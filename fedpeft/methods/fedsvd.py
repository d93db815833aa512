"""FedSVD: clients train only B; the server averages B and re-factorizes B A by SVD into a new orthonormal A.

S. Lee, S. Park, D. B. Lee, D. Wagner, H. Seong, T. Bocklet, J. Lee, S. J. Hwang, "FedSVD: Adaptive
Orthogonalization for Private Federated Learning with LoRA", NeurIPS 2025, https://arxiv.org/abs/2505.12805.

Every client receives the global A and B, keeps A frozen and trains B; it uploads B only. The server averages B by
data size (p_k = n_k / sum_j n_j; A was the same for everyone, so B_avg A equals sum_k p_k B_k A exactly), then
re-factorizes the product M = B_avg A at the same rank r by its SVD M = U S V^T: A <- V_r^T (orthonormal rows: the
principal input directions of the aggregate update), B <- U_r S_r. M has rank at most r, so the global model is
unchanged by the re-factorization (computed from a thin QR of A^T and an (out, r) SVD, without forming M;
:func:`~fedpeft.methods.families.folding.refactor`). ``refactor_every`` re-factorizes every that many rounds, once
more than ``svd_warmup_rounds`` rounds have run. As in the authors' code, the task head of a classification model
stays frozen (never trained, uploaded nor aggregated; ``train_head`` trains and averages it) and alpha defaults to
the rank (scaling 1). Every client keeps the global adapter, optionally fine-tuned locally for ``finetune_epochs``
epochs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import ClassVar

import torch

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, fine_tune_if_asked, local_training, lora_spec, method_server_step
from fedpeft.methods.families.folding import A_SUFFIX, B_SUFFIX, lora_modules, refactor
from fedpeft.methods.families.lora_keys import is_lora, is_lora_b
from fedpeft.methods.fedsvd_config import FedSvdConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime


@dataclasses.dataclass
class FedSvdState(ServerState):
    """The global adapter (``tensors``: A, B and the head)."""


class FedSvd(Method[FedSvdConfig, FedSvdState, None]):
    """B trained and averaged with A frozen; the server's SVD of B A gives the next orthonormal A."""

    name = "fedsvd"
    Config: ClassVar[type[FedSvdConfig]] = FedSvdConfig

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        alpha = self.cfg.alpha if self.cfg.alpha is not None else float(self.cfg.rank)  # scaling 1, the authors'
        return lora_spec(runtime, self.cfg.rank, alpha, self.cfg.dropout, self.cfg.targets)

    def trained(self, key: str) -> bool:
        """Whether a client trains and uploads the adapter tensor ``key``: B, and the head with ``train_head``."""
        return is_lora_b(key) or (self.cfg.train_head and not is_lora(key))

    def init_server(self, runtime: ModelRuntime, seed: int) -> FedSvdState:
        runtime.install(ClientModel(lora=self.spec(runtime)), seed=derive_seed(seed, self.name, "init"))
        return FedSvdState(tensors=runtime.adapter_state())

    def update_spec(self, payload: Payload) -> dict[str, torch.Size]:
        """B, and the head with ``train_head`` (A and a frozen head stay with the server)."""
        return {k: v.shape for k, v in payload.tensors.items() if self.trained(k)}

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        runtime.install(ClientModel(lora=self.spec(runtime), adapter=payload.tensors), seed=seed)
        trainable = {n: p for n, p in runtime.adapter_parameters().items() if self.trained(n)}
        metrics = runtime.train(client.train, local_training(self.cfg, seed), trainable)
        upload = {k: v for k, v in runtime.adapter_state().items() if self.trained(k)}
        return ClientUpdate(client.client_id, upload, float(len(client.train)), metrics), None

    def aggregate(self, state: FedSvdState, updates: Iterable[ClientUpdate]) -> tuple[FedSvdState, Metrics]:
        step = method_server_step(self)
        assert step is not None  # the weighted mean of B, then the re-factorization
        result = step(state, updates)
        if not result.tensors:
            return state, result.metrics
        tensors: StateDict = {**state.tensors, **result.tensors}
        done = state.round + 1  # rounds run, this one included (the round loop counts them from 0)
        if done % self.cfg.refactor_every == 0 and done > self.cfg.svd_warmup_rounds:
            for module in lora_modules(tensors):
                a_key, b_key = module + A_SUFFIX, module + B_SUFFIX
                tensors[a_key], tensors[b_key] = refactor(tensors[a_key], tensors[b_key])
        state = dataclasses.replace(state, tensors=tensors, server_optimizer=result.moments)
        return state, result.metrics

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedSvdState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        model = ClientModel(lora=self.spec(runtime), adapter=state.tensors)
        return fine_tune_if_asked(runtime, model, client.train, self.cfg, seed=seed)
