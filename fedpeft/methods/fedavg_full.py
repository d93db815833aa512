"""FedAvg with full fine-tuning ("Standard FL" in the personalization papers).

H. B. McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, https://arxiv.org/abs/1602.05629. Every client fine-tunes all weights of the model from the global
ones; the server averages them weighted by data size. Every client keeps the global model. Used as a compared
method and as the federated base-model stage that personalization methods start from.
"""

from __future__ import annotations

from fedpeft.core.types import ClientUpdate, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, local_training
from fedpeft.methods.fedavg_full_config import FedAvgFullConfig
from fedpeft.models.runtime import ClientModel, ModelRuntime


class FedAvgFull(Method[FedAvgFullConfig, ServerState, None]):
    """FedAvg of all model weights."""

    name = "fedavg_full"
    Config = FedAvgFullConfig
    base_stage = True
    trains_base_weights = True

    def init_server(self, runtime: ModelRuntime, seed: int) -> ServerState:
        runtime.load_base(None)
        return ServerState(tensors=runtime.base_state())

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        runtime.install(ClientModel(base=payload.tensors))
        metrics = runtime.train(client.train, local_training(self.cfg, seed), "all")
        return ClientUpdate(client.client_id, runtime.base_state(), float(len(client.train)), metrics), client_state

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        return ClientModel(base=state.tensors)

    def export_base(self, runtime: ModelRuntime, state: ServerState) -> StateDict:
        return dict(state.tensors)
