"""Compute tiers shared by FLAME and the resource-adaptive LoRA baselines (trivial LoRA, HetLoRA, FlexLoRA).

Every client belongs to one tier: its compute budget. A tier fixes the experts per token ``top_k`` a client
of a mixture-of-experts model runs with, the LoRA ``rank`` the rank-compressing baselines give it, and
optionally its own participation rate. The defaults are FLAME's four budgets beta_1 .. beta_4 (paper 004):
top-k 8 / 4 / 2 / 1 and ranks 20 / 12 / 8 / 6.

Which tier a client is in: ``client_tiers`` (client id -> tier name) when it names the client, else round-robin
by the number at the end of the client id: index i -> tier ``i mod len(tiers)`` (``client-00`` -> tier1,
``client-01`` -> tier2, ...). So 4 clients get one tier each and 40 clients ten per tier.

Evaluation runs each client at its tier's compute: its tier's top-k (and rank, for the baselines). Records
carry the tier name as their ``budget``. :meth:`TieredMethod.compute_costs` adds, per tier, the analytic
forward FLOPs and the measured forward time of a client's model (:mod:`fedpeft.methods.families.tier_costs`). The
rank-compressing baselines build on :class:`~fedpeft.methods.families.rank_tiered.RankTieredMethod`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict, TypeVar

from peft import LoraConfig

from fedpeft.adapters.expert_lora import LoraModule, lora_layout
from fedpeft.adapters.weights import layer_weight
from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.sampling import sample_clients
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import Metrics, ServerState
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, TrainHooks, local_training
from fedpeft.methods.families.tier_costs import tier_costs
from fedpeft.models.moe import Routing
from fedpeft.models.runtime import LoraSpec, ModelRuntime
from fedpeft.models.targets import FAMILY_ROUTER_PARAMETERS
from fedpeft.settings.methods import TierConfig, TieredConfig

if TYPE_CHECKING:
    from typing_extensions import Unpack

_TRAILING_NUMBER = re.compile(r"(\d+)$")


class LayoutModule(TypedDict):
    """One LoRA module of :meth:`TieredMethod.layout`, as the server state keeps it (a
    :class:`~fedpeft.adapters.expert_lora.LoraModule`'s fields)."""

    key: str
    experts: int
    block: str | None


@dataclass
class TieredState(ServerState):
    """The global adapter (``tensors``) and its LoRA modules (:meth:`TieredMethod.layout`: key -> experts, MoE
    block)."""

    lora_layout: dict[str, LayoutModule] = field(default_factory=dict)


TieredConfigT = TypeVar("TieredConfigT", bound=TieredConfig)
TieredClientT = TypeVar("TieredClientT")


class TieredMethod(Method[TieredConfigT, TieredState, TieredClientT]):
    """Shared machinery of tiered methods: tier lookup, sampling, LoRA shapes, routing, evaluation, costs.

    Generic over the config and over what a client keeps between rounds (``None``: nothing)."""

    mergeable = False  # a client's model is its tier's (rank, experts per token), not one mergeable LoRA

    # ------------------------------------------------------------------ tiers
    def tier_of(self, client_id: str) -> TierConfig:
        """The tier of ``client_id``: ``client_tiers`` or round-robin on the id's trailing number."""
        tiers = {t.name: t for t in self.cfg.tiers}
        if client_id in self.cfg.client_tiers:
            return tiers[self.cfg.client_tiers[client_id]]
        match = _TRAILING_NUMBER.search(client_id)
        if match is None:
            raise UserError(
                f"Client {client_id!r} has no number at the end of its id to assign it a tier; list it in "
                f"`client_tiers` of method {self.label}."
            )
        return self.cfg.tiers[int(match.group(1)) % len(self.cfg.tiers)]

    def sample(self, client_ids: list[str], round_: int, seed: int) -> list[str]:
        """The clients of one round: ``fraction`` of all clients, or per tier its own ``participation`` rate
        (``ceil(rate * clients of the tier)``, at least one) when any tier sets one."""
        if all(t.participation is None for t in self.cfg.tiers):
            return sample_clients(client_ids, self.cfg.fraction, self.cfg.min_clients, seed, round_)
        chosen: list[str] = []
        for tier in self.cfg.tiers:
            members = sorted(c for c in client_ids if self.tier_of(c).name == tier.name)
            if not members:
                continue
            rate = tier.participation if tier.participation is not None else self.cfg.fraction
            count = min(len(members), max(1, math.ceil(rate * len(members) - 1e-9)))
            chosen += random.Random(derive_seed(seed, "sample", round_, tier.name)).sample(members, count)
        return sorted(chosen)

    def budgets_of(self, client: ClientData, budgets: Sequence[int]) -> list[Budget]:
        """The budgets a client is evaluated at: its tier's name, or none if the tier is not in ``eval_tiers``."""
        tier = self.tier_of(client.client_id).name
        return [tier] if self.cfg.eval_tiers is None or tier in self.cfg.eval_tiers else []

    # ------------------------------------------------------------------ shapes
    def max_rank(self) -> int:
        """Rank of the server's global adapter."""
        return max(t.rank for t in self.cfg.tiers)

    def rank_for(self, tier: TierConfig) -> int:
        """LoRA rank a client of ``tier`` trains (the tier's rank unless a method fixes one)."""
        return tier.rank

    def alpha_for(self, rank: int) -> float:
        """LoRA alpha at ``rank``: alpha * rank / max rank, so that every rank has the scaling of the global
        adapter and the first r components of it mean the same update on every client."""
        return self.cfg.alpha * rank / self.max_rank()

    def spec(self, runtime: ModelRuntime, rank: int) -> LoraSpec:
        """The LoRA of ``rank``: attention (and MLP) modules, plus fused experts and optionally the router."""
        parameters = list(getattr(runtime.loaded, "lora_parameters", ()))
        if self.cfg.lora_router:
            router = FAMILY_ROUTER_PARAMETERS.get(runtime.loaded.family)
            if not router:
                raise UserError(f"lora_router needs a mixture-of-experts model; {runtime.loaded.name} has no router.")
            parameters += router
        if parameters and runtime.peft is not None:
            # PEFT requires every adapter with target_parameters on one model to target the same parameters.
            configs = [c for c in runtime.peft.peft_config.values() if isinstance(c, LoraConfig)]
            others = {tuple(sorted(c.target_parameters or ())) for c in configs} - {()}
            if others and others != {tuple(sorted(parameters))}:
                raise UserError(
                    f"Method {self.label} puts LoRA on {sorted(parameters)} but another adapter on this model targets "
                    f"{sorted(next(iter(others)))}; give every method the same lora_router setting."
                )
        return LoraSpec(
            rank=rank,
            alpha=float(self.alpha_for(rank)),
            targets=tuple(runtime.loaded.lora_targets),
            target_parameters=tuple(parameters),
        )

    def layout(self, runtime: ModelRuntime) -> dict[str, LayoutModule]:
        """The active adapter's LoRA modules (see :func:`lora_layout`), as plain dicts for the server state."""
        assert runtime.peft is not None and runtime.active is not None
        blocks = [name for name, _, _ in runtime.moe.blocks] if runtime.moe is not None else []
        modules = lora_layout(runtime.peft, runtime.active.key, blocks)
        return {k: LayoutModule(key=m.key, experts=m.experts, block=m.block) for k, m in modules.items()}

    @staticmethod
    def modules(layout: dict[str, LayoutModule]) -> dict[str, LoraModule]:
        return {k: LoraModule(**v) for k, v in layout.items()}

    # ------------------------------------------------------------------ routing
    def train_top_k(self, runtime: ModelRuntime, tier: TierConfig) -> int | None:
        """Experts per token in local training (``None``: the model's own)."""
        return tier.top_k

    def routing(self, runtime: ModelRuntime, top_k: int | None, scale: float = 1.0) -> Routing | None:
        if runtime.moe is None:
            return None
        return Routing(top_k=top_k, scale=scale)

    def train_local(self, runtime: ModelRuntime, client: ClientData, seed: int, **hooks: Unpack[TrainHooks]) -> Metrics:
        """The one training loop with this method's local-training settings."""
        return runtime.train(client.train, local_training(self.cfg, seed, **hooks))

    def check_model(self, runtime: ModelRuntime) -> None:
        """Refuse tiers the model cannot run (top-k beyond its experts, ranks beyond its layers)."""
        # The layers LoRA wraps, as captured before any adapter was injected.
        modules = runtime.target_modules
        limit = min(min(layer_weight(m).shape) for _, m in modules) if modules else None
        for tier in self.cfg.tiers:
            if limit is not None and self.rank_for(tier) > limit:
                raise UserError(
                    f"Tier {tier.name} needs LoRA rank {self.rank_for(tier)} but this model allows at most {limit}; "
                    "lower the tier's rank."
                )
            if runtime.moe is not None and tier.top_k is not None and tier.top_k > runtime.moe.num_experts:
                raise UserError(
                    f"Tier {tier.name} asks for top_k={tier.top_k} but the model has {runtime.moe.num_experts} "
                    "experts; lower the tier's top_k."
                )

    # ------------------------------------------------------------------ costs
    def eval_top_k(self, runtime: ModelRuntime, tier: TierConfig) -> int | None:
        """Experts per token at evaluation: the tier's compute."""
        return tier.top_k

    def compute_costs(self, runtime: ModelRuntime, seed: int) -> list[JSONObject]:
        """Per tier: top-k, rank, active parameters, analytic forward FLOPs and measured forward milliseconds of
        one ``compute_tokens``-token sequence, as ``costs.jsonl`` records (phase ``compute``, budget = tier)."""
        return tier_costs(self, runtime, seed)
