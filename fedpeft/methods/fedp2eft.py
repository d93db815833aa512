"""``fedp2eft``: federated learning to personalize PEFT -- one PSG gives every client its LoRA rank structure.

"Federated Learning to Personalize PEFT for Multilingual LLMs" -- R. Lee, M. Kim, F. Rezk, R. Li, S. Venieris,
T. Hospedales, AAAI 2026, https://arxiv.org/abs/2502.04387.

Federated phase (seen pool): each sampled client computes its data statistics with the frozen base model, lets the
PSG (phi) predict its rank scales, trains a fresh BayesTune-LoRA initialized with them for ``stage1_epochs``
epochs (stage 1; at most ``stage1_steps`` steps), regresses the PSG toward the scales it reached with ``psg_steps``
Adam steps on an L1 loss summed over all scales (stage 2), and uploads phi only; the LoRA is discarded. The server
averages phi weighted by data size. Personalization (any client, seen or unseen, any budget r <= r_max, one trained
PSG): statistics -> PSG -> top-(r * L) pruning -> fine-tuning with frozen scales -> a plain PEFT LoRA. The
building blocks are in :mod:`fedpeft.adapters.bayestune` and :mod:`fedpeft.adapters.psg`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import torch

from fedpeft.adapters.bayestune import ClientScales, initial_spec, train_scales
from fedpeft.adapters.psg import StrategyGenerator, make_generator, regress_toward, save_generator
from fedpeft.adapters.statistics import feature_statistics
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.families.bayestune import BayesTuneMethod
from fedpeft.methods.fedp2eft_config import FedP2EFTConfig
from fedpeft.models.runtime import ModelRuntime

PSG_DIR = "psg"


def psg_path(run_dir: Path, label: str, seed: int, architecture: str | None = None) -> Path:
    """Where the trained PSG of a method label and seed lives (weights; metadata beside it as ``.json``): one per
    architecture of a heterogeneous federation (``psg/<label>/<architecture>/``)."""
    directory = Path(run_dir) / PSG_DIR / label
    return (directory / architecture if architecture is not None else directory) / f"seed{seed}.safetensors"


@dataclass
class FedP2EFTState(ServerState):
    """The PSG's weights (``tensors``) and the names of the modules whose rank scales it predicts, in order."""

    modules: list[str] = field(default_factory=list)


class ClientStatistics(TypedDict):
    """What a FedP2EFT client keeps between rounds: its data statistics under the frozen base model."""

    statistics: torch.Tensor


class FedP2EFT(BayesTuneMethod[FedP2EFTConfig, FedP2EFTState, ClientStatistics]):
    """Federated PSG training on the seen pool; per-client rank structures for every budget from one PSG."""

    name = "fedp2eft"
    Config = FedP2EFTConfig
    private_keys = ("lora_",)

    def _generator(self, runtime: ModelRuntime, seed: int, state: StateDict | None = None) -> StrategyGenerator:
        return make_generator(
            len(runtime.target_modules),
            self.cfg.r_init,
            seed=derive_seed(seed, self.name, "psg"),
            gain=self.cfg.psg_gain,
            bias=self.cfg.psg_bias,
            state=state,
        )

    def _statistics(
        self, runtime: ModelRuntime, client: ClientData, client_state: ClientScales | ClientStatistics | None
    ) -> torch.Tensor:
        # The base model is frozen for the whole run, so a client's statistics are computed once and kept.
        if isinstance(client_state, dict) and "statistics" in client_state:
            return client_state["statistics"]
        return feature_statistics(runtime, client.train, batch_size=self.cfg.stats_batch_size)

    def init_server(self, runtime: ModelRuntime, seed: int) -> FedP2EFTState:
        initial_spec(runtime, self.cfg.r_init, self.cfg.alpha_multiplier, self.cfg.dropout)  # validates r_init
        generator = self._generator(runtime, seed)
        tensors = {k: v.detach().clone() for k, v in generator.state_dict().items()}
        return FedP2EFTState(tensors=tensors, modules=[name for name, _ in runtime.target_modules])

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: ClientScales | ClientStatistics | None,
        seed: int,
    ) -> tuple[ClientUpdate, ClientStatistics]:
        statistics = self._statistics(runtime, client, client_state)
        generator = self._generator(runtime, 0, payload.tensors)
        initial = generator.scales(statistics).detach()
        scales, metrics = train_scales(runtime, client.train, initial, self.cfg, seed=seed)
        before, after = regress_toward(
            generator, statistics, scales, steps=self.cfg.psg_steps, lr=self.cfg.psg_lr, reduction=self.cfg.psg_loss
        )
        tensors = {k: v.detach().clone() for k, v in generator.state_dict().items()}
        metrics = {**metrics, "psg_l1_before": before, "psg_l1_after": after}
        update = ClientUpdate(client.client_id, tensors, float(len(client.train)), metrics)
        return update, {"statistics": statistics}

    def client_scales(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedP2EFTState,
        client_state: ClientScales | ClientStatistics | None,
        seed: int,
    ) -> ClientScales:
        statistics = self._statistics(runtime, client, client_state)
        generator = self._generator(runtime, seed, state.tensors or None)
        scales = generator(statistics).detach()
        return ClientScales(scales, [name for name, _ in runtime.target_modules], {})

    def save_server_artifacts(
        self, state: FedP2EFTState, run_dir: Path, seed: int, architecture: str | None = None
    ) -> None:
        """Write the trained PSG and what ``fedpeft personalize`` needs to use it."""
        path = psg_path(run_dir, self.label, seed, architecture)
        meta = {
            "method": self.name,
            "label": self.label,
            "seed": seed,
            "rounds": state.round,
            "modules": list(state.modules),
            "config": self.cfg.model_dump(mode="json"),
        }
        save_generator(path, state.tensors, meta)
