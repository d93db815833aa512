"""FedSA-LoRA: only the A matrices are shared; every client keeps its own B.

P. Guo, S. Zeng, Y. Wang, H. Fan, F. Wang, L. Qu, "Selective Aggregation for Low-Rank Adaptation in Federated
Learning", ICLR 2025, https://arxiv.org/abs/2410.01463. Clients train A and B on their data; they upload A only,
which the server averages (weighted by data size), while B (and the task head of classification models) stays
in the client-state store and is trained on from round to round. A client's model is the global A with its own
B. A client without local state (unseen) starts from B = 0 and may train it for ``finetune_steps`` steps.
"""

from __future__ import annotations

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, local_training
from fedpeft.methods.families.lora_keys import install_partial, is_lora_a, only, target_spec
from fedpeft.methods.fedsa_lora_config import FedSALoraConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime


class FedSALora(Method[FedSALoraConfig, ServerState, StateDict]):
    """Federated A (averaged), personal B (kept in the client-state store)."""

    name = "fedsa_lora"
    Config = FedSALoraConfig
    private_keys = (".lora_B.", "classifier", "score", "pooler")

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        return target_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)

    def init_server(self, runtime: ModelRuntime, seed: int) -> ServerState:
        runtime.install(ClientModel(lora=self.spec(runtime)), seed=derive_seed(seed, self.name, "init"))
        return ServerState(tensors=only(runtime.adapter_state(), is_lora_a))

    def _train(
        self, runtime: ModelRuntime, client: ClientData, adapter: StateDict, seed: int, steps: int | None
    ) -> Metrics:
        install_partial(runtime, self.spec(runtime), adapter, seed)
        return runtime.train(client.train, local_training(self.cfg, seed, steps=steps))

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: StateDict | None, seed: int
    ) -> tuple[ClientUpdate, StateDict]:
        # B = 0 and the base head on a client's first round (reset_adapter), its own B and head afterwards.
        metrics = self._train(runtime, client, {**payload.tensors, **(client_state or {})}, seed, None)
        state = runtime.adapter_state()
        update = ClientUpdate(client.client_id, only(state, is_lora_a), float(len(client.train)), metrics)
        return update, only(state, lambda k: not is_lora_a(k))

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: StateDict | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        spec = self.spec(runtime)
        adapter = {**state.tensors, **(client_state or {})}
        if client_state is None and self.cfg.finetune_steps > 0:
            self._train(runtime, client, adapter, seed, self.cfg.finetune_steps)
            adapter = runtime.adapter_state()
        return ClientModel(lora=spec, adapter=install_partial(runtime, spec, adapter, seed))
