"""FedMosaic: relevance-guided aggregation (RELA) of PQ-LoRA adapters across heterogeneous clients.

M. Seo, T. Kim, H. Lee, J. Choi, T. Tuytelaars, "Not All Clients Are Equal: Collaborative Model Personalization
on Heterogeneous Multi-Modal Clients", 2025 (arXiv:2506.11024).

Before federation the PQ-LoRA frames of every architecture are aligned to the smallest one on public data
(:mod:`fedpeft.adapters.alignment`). Each client then trains a local adapter (P, Q at PQ sites, LoRA A, B
elsewhere) and one gate per layer, beside a frozen customized global adapter G_i; both branches are mixed as
``(1 - sigmoid(beta)) local + sigmoid(beta) global``. Every ``grad_every`` steps it takes the gradient of the
task loss w.r.t. one weight matrix of the smallest frozen model W_s; the round's mean is smoothed by an EMA,
noised and cut to a shared 40 % of coordinates, and uploaded with the local adapter. The server weighs client j
for client i by ``softmax_j(cos(g_i, g_j) / tau)`` and sends each client its own G_i: PQ parts averaged over
all clients, ordinary LoRA within the client's architecture group. Registered as ``fedmosaic``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from fedpeft.adapters.alignment import AlignmentSettings, align_federation
from fedpeft.adapters.hooked import HookedAdapter, frame_tensors
from fedpeft.adapters.weights import layer_weight
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.federation import federation_of
from fedpeft.merging import rela
from fedpeft.merging.server_step import weighted_mean
from fedpeft.methods.base import Budget, Method
from fedpeft.methods.families.branched import (
    architecture_keys,
    example_batches,
    frozen_gradient,
    gradient_module,
    hooked_adapter,
    install_adapter,
    matched_steps,
)
from fedpeft.methods.fedmosaic_config import FedMosaicConfig
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.training import TrainArgs


class Upload(TypedDict):
    """A client's latest upload, as the server keeps it: its local adapter, weight, relevance vector, metrics."""

    tensors: StateDict
    weight: float
    relevance: torch.Tensor | None
    metrics: Metrics


class Relevance(TypedDict):
    """The last round's RELA weights: row i weighs every client for ``clients[i]``."""

    clients: list[str]
    weights: torch.Tensor


@dataclass
class FedMosaicState(ServerState):
    """The population mean of the global adapters (``tensors``), the pivot and RELA's gradient module (name,
    size, mask seed), every architecture's aligned PQ frames (architecture -> site -> A/B) with the alignment
    report, each client's architecture, latest upload and customized global adapter G_i, the clients that have
    received their frames, and the last RELA weights."""

    pivot: str = ""
    grad_module: str = ""
    grad_size: int = 0
    mask_seed: int = 0
    frames: dict[str, dict[str, dict[str, torch.Tensor]]] = field(default_factory=dict)
    alignment: dict[str, float] = field(default_factory=dict)
    assignment: dict[str, str] = field(default_factory=dict)
    uploads: dict[str, Upload] = field(default_factory=dict)
    globals: dict[str, StateDict] = field(default_factory=dict)
    delivered: list[str] = field(default_factory=list)
    relevance: Relevance | None = None


class FedMosaicClientState(TypedDict):
    """What a client keeps between rounds: its PQ frames (sent once), local adapter, gates and head, and the EMA of
    its relevance gradients."""

    frames: StateDict
    local: StateDict
    gates: StateDict
    head: StateDict
    decayed: torch.Tensor


class FedMosaic(Method[FedMosaicConfig, FedMosaicState, FedMosaicClientState]):
    """RELA + PQ-LoRA with a gated local/global dual adapter on every client."""

    name = "fedmosaic"
    Config = FedMosaicConfig
    mergeable = False  # PQ-LoRA branches with a gate, attached as an extension
    architecture_aware = True
    private_keys = ("gate/", "head/")

    # ------------------------------------------------------------------ adapters
    def adapter(self, runtime: ModelRuntime, seed: int) -> HookedAdapter:
        cfg = self.cfg
        return hooked_adapter(runtime, seed, rank=cfg.rank, alpha=cfg.alpha, blocks=cfg.blocks, pq=cfg.pq)

    # ------------------------------------------------------------------ server
    def init_server(self, runtime: ModelRuntime, seed: int) -> FedMosaicState:
        cfg = self.cfg
        federation = federation_of(runtime)
        pivot = cfg.pivot or federation.smallest()
        adapters = {name: self.adapter(federation.runtime(name), seed) for name in federation.names}
        frames = {name: adapter.frames() for name, adapter in adapters.items()}
        report: dict[str, float] = {}
        public = federation.public[: cfg.align_samples]
        if cfg.align and cfg.pq and public:
            settings = AlignmentSettings(
                lam=cfg.align_lambda,
                lr=cfg.align_lr,
                epochs=cfg.align_epochs,
                batch_size=cfg.align_batch_size,
                cca_reg=cfg.cca_reg,
                capture_bytes=None if cfg.align_capture_mb is None else cfg.align_capture_mb * 2**20,
            )
            generator = torch.Generator().manual_seed(derive_seed(seed, self.name, "align"))
            sites = {name: adapter.sites for name, adapter in adapters.items()}
            frames, report = align_federation(federation, sites, frames, pivot, public, settings, generator)
        population: dict[str, torch.Tensor] = {}
        for adapter in adapters.values():
            population.update(adapter.branch("global"))
        pivot_runtime = federation.runtime(pivot)
        module = gradient_module(pivot_runtime, cfg.grad_module)
        return FedMosaicState(
            tensors=population,
            pivot=pivot,
            grad_module=module,
            grad_size=int(layer_weight(dict(pivot_runtime.target_modules)[module]).numel()),
            mask_seed=derive_seed(seed, self.name, "rela-mask"),
            frames=frames,
            alignment=report,
            assignment=dict(federation.assignment),
        )

    def _architecture(self, state: FedMosaicState, client_id: str) -> str:
        return state.assignment.get(client_id, next(iter(state.frames)))

    def global_for(self, state: FedMosaicState, client_id: str, architecture: str) -> dict[str, torch.Tensor]:
        """G_i: the client's customized global adapter (the population mean before it has uploaded)."""
        custom = state.globals.get(client_id)
        return architecture_keys(custom if custom is not None else state.tensors, architecture)

    def payload(self, state: FedMosaicState, client_id: str) -> Payload:
        architecture = self._architecture(state, client_id)
        tensors = self.global_for(state, client_id, architecture)
        if client_id not in state.delivered:
            tensors = {**tensors, **frame_tensors(state.frames[architecture])}
        config = {
            "pivot": state.pivot,
            "grad_module": state.grad_module,
            "grad_size": state.grad_size,
            "mask_seed": state.mask_seed,
        }
        return Payload(tensors=tensors, config=config)

    def update_spec(self, payload: Payload) -> dict[str, torch.Size] | None:
        """A client uploads its local adapter: the global adapter's keys and shapes (the PQ frames stay)."""
        return {k: v.shape for k, v in payload.tensors.items() if not k.startswith("frame/")}

    def aggregate(self, state: FedMosaicState, updates: Iterable[ClientUpdate]) -> tuple[FedMosaicState, Metrics]:
        uploads = dict(state.uploads)
        received = []
        for update in updates:
            uploads[update.client_id] = {
                "tensors": update.tensors,
                "weight": update.weight,
                "relevance": update.extras.get("relevance"),
                "metrics": update.metrics,
            }
            received.append(update.client_id)
        if not received:
            return state, {"clients": 0.0}
        ids = sorted(uploads)
        population = weighted_mean(ClientUpdate(c, uploads[c]["tensors"], uploads[c]["weight"]) for c in ids)
        vectors = [v for v in (uploads[c]["relevance"] for c in ids) if v is not None]
        if self.cfg.rela and len(vectors) == len(ids):
            weights = rela.relevance_weights(torch.stack(vectors), self.cfg.tau)
        else:
            weights = torch.full((len(ids), len(ids)), 1.0 / len(ids), dtype=torch.float64)
        adapters = [uploads[c]["tensors"] for c in ids]
        customized = {c: rela.customized_global(weights[i], adapters) for i, c in enumerate(ids)}
        metrics: Metrics = {"clients": float(len(received)), "self_weight": float(torch.diagonal(weights).mean())}
        losses = [uploads[c]["metrics"]["loss"] for c in received if "loss" in uploads[c]["metrics"]]
        if losses:
            metrics["train_loss"] = sum(losses) / len(losses)
        new_state = dataclasses.replace(
            state,
            tensors=population,
            uploads=uploads,
            globals=customized,
            relevance=Relevance(clients=ids, weights=weights.float()),
            delivered=sorted(set(state.delivered) | set(received)),
        )
        return new_state, metrics

    # ------------------------------------------------------------------ client
    def _client_adapter(
        self,
        runtime: ModelRuntime,
        frames: dict[str, torch.Tensor],
        global_: dict[str, torch.Tensor],
        own: FedMosaicClientState | None,
    ) -> HookedAdapter:
        adapter = self.adapter(runtime, 0)
        adapter.load(frames)
        adapter.load_branch("global", global_)
        if own is None:  # the first round: the local adapter starts as the received global one
            adapter.load_branch("local", global_)
        else:
            adapter.load_branch("local", own["local"])
            adapter.load(own["gates"])
            adapter.load(own["head"])
        return adapter

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: FedMosaicClientState | None,
        seed: int,
    ) -> tuple[ClientUpdate, FedMosaicClientState]:
        cfg = self.cfg
        frames = {k: v for k, v in payload.tensors.items() if k.startswith("frame/")}
        if not frames and client_state is not None:  # sent once; without PQ-LoRA (pq: false) there are none
            frames = client_state["frames"]
        global_ = {k: v for k, v in payload.tensors.items() if not k.startswith("frame/")}
        adapter = self._client_adapter(runtime, frames, global_, client_state)
        install_adapter(runtime, adapter)
        params = adapter.trainable(["local/", "gate/", "head/"])
        pq_params = [p for k, p in params.items() if k.startswith("local/pq")]
        other = {k: p for k, p in params.items() if not k.startswith("local/pq")}
        steps = matched_steps(cfg)
        gradients: list[torch.Tensor] = []
        config = payload.config
        mask = rela.shared_mask(int(config["grad_size"]), cfg.keep, int(config["mask_seed"]))
        pivot = federation_of(runtime).runtime(config["pivot"])
        schedule = example_batches(len(client.train), cfg.batch_size, seed)

        def relevance_gradient(step: int) -> None:
            chunk = next(schedule)
            if step % cfg.grad_every:
                return
            examples = [client.train[i] for i in chunk]
            if pivot is runtime:
                adapter.enabled = False
            else:
                pivot.install(ClientModel())
            try:
                gradients.append(frozen_gradient(pivot, config["grad_module"], examples)[mask])
            finally:
                adapter.enabled = True

        args = TrainArgs(
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            seed=seed,
            steps=steps,
            weight_decay=cfg.weight_decay,
            after_backward=relevance_gradient,
            optimizer_groups=[{"params": pq_params, "lr": cfg.pq_lr or cfg.lr}] if pq_params else None,
        )
        metrics = runtime.train(client.train, args, other)
        runtime.detach_extension()
        previous = client_state["decayed"] if client_state else None
        decayed = rela.ema(previous, torch.stack(gradients).mean(0), cfg.ema)
        noise = torch.Generator().manual_seed(derive_seed(seed, "rela-noise"))
        sanitized = rela.sanitize(decayed, cfg.noise, noise)
        local = adapter.branch("local")
        extras = {"relevance": sanitized, "architecture": runtime.architecture}
        update = ClientUpdate(client.client_id, local, float(len(client.train)), metrics, extras)
        new_state: FedMosaicClientState = {
            "frames": frames,
            "local": local,
            "gates": adapter.group("gate/"),
            "head": adapter.group("head/"),
            "decayed": decayed,
        }
        return update, new_state

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedMosaicState,
        client_state: FedMosaicClientState | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        architecture = runtime.architecture
        if state.frames:
            frames = frame_tensors(state.frames[architecture])
            global_ = self.global_for(state, client.client_id, architecture)
        else:  # no federated phase ran: the fresh adapter
            fresh = self.adapter(runtime, seed)
            frames, global_ = fresh.group("frame/"), fresh.branch("global")
        adapter = self._client_adapter(runtime, frames, global_, client_state)
        return ClientModel(extension=adapter)
