"""What both BayesTune-LoRA methods share (``bayestune_lora`` and ``fedp2eft``): the settings (stage 1's budget
included), one set of rank scales per client pruned to every budget, and the scales kept for the reports (their
plots, :func:`fedpeft.analysis.scale_plots.rank_scale_plots`, are both methods' declared ``report_plots``)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from fedpeft.adapters.bayestune import ClientScales, PrunedAdapters, check_budget, finetune_pruned
from fedpeft.analysis.scales import ScaleRecord, save_client_scales, scales_path
from fedpeft.core.types import ServerState
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.settings.methods import BayesTuneSettings

BayesTuneConfigT = TypeVar("BayesTuneConfigT", bound=BayesTuneSettings)
BayesTuneStateT = TypeVar("BayesTuneStateT", bound=ServerState)
KeptT = TypeVar("KeptT")


class BayesTuneMethod(Method[BayesTuneConfigT, BayesTuneStateT, ClientScales | KeptT]):
    """What both BayesTune-LoRA methods share: one set of scales per client, pruned to each budget.

    Its client state is what the method keeps between rounds (``KeptT``; ``None`` without a federated phase), or,
    from :meth:`prepare_personalization` on, the client's scales."""

    uses_budget = True

    def __init__(self, cfg: BayesTuneConfigT) -> None:
        super().__init__(cfg)
        self.pruned_adapters = PrunedAdapters()

    def check_budgets(self, budgets: list[int]) -> None:
        """Refuse, before any training, a budget the scales cannot serve."""
        for budget in budgets:
            check_budget(budget, self.cfg.r_max)

    def client_scales(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: BayesTuneStateT,
        client_state: ClientScales | KeptT | None,
        seed: int,
    ) -> ClientScales:
        """The client's scales, from the server ``state`` and what the client kept."""
        raise NotImplementedError

    def prepare_personalization(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: BayesTuneStateT,
        client_state: ClientScales | KeptT | None,
        seed: int,
    ) -> ClientScales:
        """The client's scales, computed once and handed to :meth:`personalize` for every budget."""
        return self.client_scales(runtime, client, state, client_state, seed)

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: BayesTuneStateT,
        client_state: ClientScales | KeptT | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        rank = check_budget(budget, self.cfg.r_max)
        if not isinstance(client_state, ClientScales):
            client_state = self.client_scales(runtime, client, state, client_state, seed)
        return finetune_pruned(
            runtime, client.train, client_state.scales, rank, self.cfg, seed=seed, pruned=self.pruned_adapters
        )

    def save_client_artifacts(
        self, prepared: ClientScales | KeptT | None, client: ClientData, run_dir: Path, label: str, seed: int
    ) -> None:
        """Keep the client's scales for the rank-structure and language-distance plots."""
        assert isinstance(prepared, ClientScales)  # what prepare_personalization gave
        scales = prepared.scales.detach().float().cpu().numpy()
        record = ScaleRecord(
            label, seed, client.client_id, client.group, client.pool, prepared.modules, self.cfg.r_max, scales
        )
        save_client_scales(scales_path(run_dir, label, seed, client.client_id), record)
