"""FFA-LoRA: federated LoRA with A frozen at its random initialization; only B is trained and averaged.

Y. Sun, Z. Li, Y. Li, B. Ding, "Improving LoRA in Privacy-Preserving Federated Learning", ICLR 2024,
https://arxiv.org/abs/2403.12313. Every client draws the same A from the shared initialization seed and never
changes it, so the product B A averages exactly when B does. Clients train and upload B (and the task head of
classification models, averaged like FedIT's); A never travels. Every client keeps the final global model.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Payload, ServerState
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, local_training
from fedpeft.methods.families.lora_keys import install_partial, is_lora_a, only, target_spec
from fedpeft.methods.ffa_lora_config import FFALoraConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime


@dataclass
class FFALoraState(ServerState):
    """The global B and head (``tensors``) and the seed every client draws the frozen A from."""

    init_seed: int = 0


class FFALora(Method[FFALoraConfig, FFALoraState, None]):
    """Federated LoRA with A frozen at the shared random init; B (and the head) averaged."""

    name = "ffa_lora"
    Config = FFALoraConfig
    private_keys = (".lora_A.",)

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        return target_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)

    def init_server(self, runtime: ModelRuntime, seed: int) -> FFALoraState:
        init_seed = derive_seed(seed, self.name, "init")
        runtime.install(ClientModel(lora=self.spec(runtime)), seed=init_seed)
        tensors = only(runtime.adapter_state(), lambda k: not is_lora_a(k))
        return FFALoraState(tensors=tensors, init_seed=init_seed)

    def payload(self, state: FFALoraState, client_id: str) -> Payload:
        return Payload(tensors=state.tensors, config={"init_seed": state.init_seed})

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        # The shared init seed recreates A; the payload overwrites B and the head.
        install_partial(runtime, self.spec(runtime), payload.tensors, payload.config["init_seed"])
        trainable = {n: p for n, p in runtime.adapter_parameters().items() if ".lora_A." not in n}
        metrics = runtime.train(client.train, local_training(self.cfg, seed), trainable)
        tensors = only(runtime.adapter_state(), lambda k: not is_lora_a(k))
        return ClientUpdate(client.client_id, tensors, float(len(client.train)), metrics), client_state

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FFALoraState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        spec = self.spec(runtime)
        return ClientModel(lora=spec, adapter=install_partial(runtime, spec, state.tensors, state.init_seed))
