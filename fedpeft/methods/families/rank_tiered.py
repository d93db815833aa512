"""The base of the rank-compressing tiered baselines (trivial LoRA, HetLoRA, FlexLoRA).

The server keeps a global LoRA of the largest tier rank r_max; a client of a tier with rank r receives its first
r components (rows of A, columns of B; per expert for fused expert LoRA), trains them and returns them. What
the server does with the returned adapters is each baseline's own aggregation. Tiers and their assignment to
clients are those of :mod:`fedpeft.methods.families.tiered`; local training runs at the model's own experts per token
unless ``train_top_k: tier``.
"""

from __future__ import annotations

from typing import TypeVar

from fedpeft.adapters.expert_lora import module_key, truncate
from fedpeft.core.records import Budget
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Payload, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.families.tiered import TierConfig, TieredClientT, TieredMethod, TieredState
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.settings.methods import RankTieredConfig

RankTieredConfigT = TypeVar("RankTieredConfigT", bound=RankTieredConfig)


class RankTieredMethod(TieredMethod[RankTieredConfigT, TieredClientT]):
    """A tiered LoRA baseline: the server keeps a global adapter of the largest rank and each client trains
    the first components up to its tier's rank (the rank-compressing methods); subclasses aggregate."""

    Config = RankTieredConfig

    def init_server(self, runtime: ModelRuntime, seed: int) -> TieredState:
        self.check_model(runtime)
        runtime.activate(self.spec(runtime, self.max_rank()))
        runtime.reset_adapter(derive_seed(seed, self.name, "init"))
        return TieredState(tensors=runtime.adapter_state(), lora_layout=self.layout(runtime))

    def train_top_k(self, runtime: ModelRuntime, tier: TierConfig) -> int | None:
        return tier.top_k if self.cfg.train_top_k == "tier" else None

    def adapter_for(self, state: TieredState, rank: int) -> StateDict:
        """The global adapter's first ``rank`` components (every tensor as is at the largest rank)."""
        if rank == self.max_rank():
            return dict(state.tensors)
        layout = self.modules(state.lora_layout)
        out = {k: v for k, v in state.tensors.items() if module_key(k) is None}
        for key, module in layout.items():
            a, b = truncate(state.tensors[f"{key}.lora_A.weight"], state.tensors[f"{key}.lora_B.weight"],
                            module.experts, rank)  # fmt: skip
            out[f"{key}.lora_A.weight"], out[f"{key}.lora_B.weight"] = a, b
        return out

    def payload(self, state: TieredState, client_id: str) -> Payload:
        rank = self.rank_for(self.tier_of(client_id))
        return Payload(tensors=self.adapter_for(state, rank), config={"rank": rank})

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: TieredClientT | None, seed: int
    ) -> tuple[ClientUpdate, TieredClientT | None]:
        tier = self.tier_of(client.client_id)
        rank = int(payload.config.get("rank", self.rank_for(tier)))
        routing = self.routing(runtime, self.train_top_k(runtime, tier))
        runtime.install(ClientModel(lora=self.spec(runtime, rank), adapter=payload.tensors, routing=routing), seed=seed)
        metrics = self.train_local(runtime, client, seed)
        return ClientUpdate(client.client_id, runtime.adapter_state(), float(len(client.train)), metrics), client_state

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: TieredState,
        client_state: TieredClientT | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        tier = self.tier_of(client.client_id)
        rank = self.rank_for(tier)
        routing = self.routing(runtime, self.eval_top_k(runtime, tier))
        return ClientModel(lora=self.spec(runtime, rank), adapter=self.adapter_for(state, rank), routing=routing)
