"""DEPT(SPEC): per-client token and position embeddings, every other weight federated.

A. Iacob, L. Sani, M. Kurmanji, W. F. Shen, X. Qiu, D. Cai, Y. Gao, N. D. Lane, "DEPT: Decoupled Embeddings for
Pre-training Language Models", ICLR 2025, https://arxiv.org/abs/2410.05021 (SPEC: specialized embeddings per
data source). As FedP2EFT (2025) adapts it to cross-device FL: every client keeps its own token and position
embeddings, initialized from the pretrained ones (not re-initialized), fine-tunes all weights locally and uploads
every weight except its embeddings; the server averages them (FedAvg). lr 5e-5.

Registered as ``dept_spec`` (alias ``dept``). Each client's model is the global body with its own embeddings; an
unseen client never trained embeddings and keeps the pretrained ones. As a base stage it gives every client a base
model of its own.
"""

from __future__ import annotations

from fedpeft.base_models import ClientBase, embedding_keys
from fedpeft.core.types import ClientUpdate, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, local_training
from fedpeft.methods.dept_spec_config import DeptSpecConfig
from fedpeft.models.runtime import ClientModel, ModelRuntime


def starting_embeddings(runtime: ModelRuntime) -> StateDict:
    """The embeddings of the base model the phase started from (the pretrained ones of every new client)."""
    runtime.install(ClientModel())
    return {k: runtime.base_params[k].detach().clone() for k in embedding_keys(runtime)}


class DeptSpec(Method[DeptSpecConfig, ServerState, StateDict]):
    """FedAvg of every weight but the token and position embeddings, which stay with their client."""

    name = "dept_spec"
    Config = DeptSpecConfig
    private_keys = ("word_embeddings", "position_embeddings", "embed_tokens", "embed_positions", "wte", "wpe")
    base_stage = True
    per_client_base = True
    trains_base_weights = True

    def init_server(self, runtime: ModelRuntime, seed: int) -> ServerState:
        runtime.install(ClientModel())
        private = set(embedding_keys(runtime))
        return ServerState(tensors={k: v for k, v in runtime.base_state().items() if k not in private})

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: StateDict | None, seed: int
    ) -> tuple[ClientUpdate, StateDict]:
        embeddings = client_state if client_state is not None else starting_embeddings(runtime)
        runtime.install(ClientModel(base={**payload.tensors, **embeddings}))
        metrics = runtime.train(client.train, local_training(self.cfg, seed), "all")
        weights = runtime.base_state()
        own = {k: weights.pop(k) for k in embeddings}
        return ClientUpdate(client.client_id, weights, float(len(client.train)), metrics), own

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: StateDict | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        embeddings = client_state if client_state is not None else starting_embeddings(runtime)
        return ClientModel(base={**state.tensors, **embeddings})

    def export_base(self, runtime: ModelRuntime, state: ServerState) -> StateDict:
        return {**state.tensors, **starting_embeddings(runtime)}

    def client_base(
        self, runtime: ModelRuntime, client: ClientData, state: ServerState, client_state: StateDict | None, seed: int
    ) -> ClientBase | None:
        return None if client_state is None else ClientBase(tensors=dict(client_state))
