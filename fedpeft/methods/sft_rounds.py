"""SFT in rounds: every client trains its own LoRA on its stream, round by round, and shares nothing.

The "SFT" baseline of FedMosaic (M. Seo et al., "Not All Clients Are Equal: Collaborative Model
Personalization on Heterogeneous Multi-Modal Clients", 2025): clients fine-tune independently. Unlike ``local``
(which trains once on all of a client's data), ``sft_rounds`` runs inside the federated loop, so a stream
dataset feeds it the client's episodic memory round by round and ``eval.every`` evaluates it like the federated
methods. Its compute per round is the reference of compute matching (``compute_scale`` 1).
"""

from __future__ import annotations

from collections.abc import Iterable

from fedpeft.core.types import ClientUpdate, Metrics, Payload, StateDict
from fedpeft.data.types import ClientData
from fedpeft.merging.server_step import metric_mean
from fedpeft.methods.families.branched import BranchedLoraMethod, BranchedState
from fedpeft.methods.sft_rounds_config import SftRoundsConfig
from fedpeft.models.runtime import ModelRuntime


class SftRounds(BranchedLoraMethod[SftRoundsConfig]):
    """Each client alone, one LoRA, trained on its memory every round; nothing is uploaded."""

    name = "sft_rounds"
    Config = SftRoundsConfig
    branches = ("local",)
    shared = None
    communicates = False

    def aggregate(self, state: BranchedState, updates: Iterable[ClientUpdate]) -> tuple[BranchedState, Metrics]:
        return state, metric_mean(updates)  # the uploads carry no tensors: only the clients' metrics

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[ClientUpdate, dict[str, StateDict]]:
        adapter = self.client_adapter(runtime, {}, client_state)
        metrics = self.train_branches(runtime, adapter, client.train, ("local",), ("local",), seed)
        return self.shared_update(client, adapter, metrics), self.client_state(adapter)
