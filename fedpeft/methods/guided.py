"""Server-side merging and client-side guidance for personalized LoRA (registered as ``guided``).

"From Aggregation to Guidance: Strategies for Personalized Federated Fine-Tuning of Foundation Models",
M. Piórczyński, W. Łapacz, X. Li, C. Liu, A. Turner, A. Dubrawski (Carnegie Mellon University), preprint, 2025.

Each round the server merges the clients' LoRAs into a global one with a merge operator in a space
(:mod:`fedpeft.merging`: mean / ties / iso_c / ... in ``ab`` or ``knots`` space, global coefficient alpha),
optionally folding it into every client's backbone and restarting the LoRAs from scratch (ReLoRA). Each client
uses the global LoRA as its starting point (``hard_init``) or as a regularizer of its own LoRA, in parameter space
(``l2``) or function space (``kd``, the global model as teacher), with a fixed beta or one scaled by the client's
similarity to the global LoRA. Every client keeps its own last LoRA as its personalized model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import torch

from fedpeft import guidance
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.merging import lora_pairs, merge_lora_states
from fedpeft.merging.server_step import MetricMean, metric_mean, weighted_mean
from fedpeft.methods.base import Budget, ForwardOutputs, Method, local_training
from fedpeft.methods.families.folding import base_weight_key, in_out_weights
from fedpeft.methods.guided_config import GuidedConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.models.targets import to_weight_layout
from fedpeft.training import Batch, LossHook

FOLD_PREFIX = "fold."  # payload keys of the global updates folded into the backbone (ReLoRA)


@dataclass
class GuidedState(ServerState):
    """The global LoRA (``tensors``), the run's seed (merge drops, ReLoRA restarts) and, with ReLoRA, the global
    LoRA of every round so far, folded into the backbone."""

    seed: int = 0
    folds: list[StateDict] = field(default_factory=list)


class GuidedClientState(TypedDict):
    """What a client keeps between rounds: its last LoRA, and (ReLoRA) the number of folds its backbone had."""

    adapter: StateDict
    folds: int


class Guided(Method[GuidedConfig, GuidedState, GuidedClientState]):
    """Merge operator and space on the server, hard-init / l2 / kd guidance on the clients."""

    name = "guided"
    Config = GuidedConfig

    def spec(self, runtime: ModelRuntime, slot: str = "") -> LoraSpec:
        rank = self.cfg.rank
        targets = tuple(self.cfg.targets or runtime.loaded.lora_targets)
        alpha = float(self.cfg.alpha if self.cfg.alpha is not None else 2 * rank)
        return LoraSpec(rank=rank, alpha=alpha, targets=targets, dropout=self.cfg.dropout, slot=slot)

    @property
    def scaling(self) -> float:
        return float(self.cfg.alpha if self.cfg.alpha is not None else 2 * self.cfg.rank) / self.cfg.rank

    # ------------------------------------------------------------------ server
    def init_server(self, runtime: ModelRuntime, seed: int) -> GuidedState:
        runtime.activate(self.spec(runtime))
        runtime.reset_adapter(derive_seed(seed, self.name, "init"))
        return GuidedState(tensors=runtime.adapter_state(), seed=seed)

    def payload(self, state: GuidedState, client_id: str) -> Payload:
        config: JSONObject = {"round": state.round}
        if not self.cfg.relora:
            return Payload(tensors=state.tensors, config=config)
        # The backbone is W0 plus every global update so far; the LoRA restarts from a seed shared by the round.
        lora_keys = {k for pair in lora_pairs(state.tensors).values() for k in pair}
        tensors = {k: v for k, v in state.tensors.items() if k not in lora_keys}
        for index, fold in enumerate(state.folds):
            tensors.update({f"{FOLD_PREFIX}{index}.{k}": v for k, v in fold.items()})
        config["init_seed"] = derive_seed(state.seed, self.name, "relora", state.round)
        # The fresh LoRA is not sent; its shapes are, for the server's check of the upload (``update_spec``).
        config["lora_shapes"] = {k: list(state.tensors[k].shape) for k in sorted(lora_keys)}
        return Payload(tensors=tensors, config=config)

    def update_spec(self, payload: Payload) -> dict[str, torch.Size]:
        """The head and the LoRA a client trained (with ReLoRA a fresh one, not the folds it received)."""
        tensors = {k: v.shape for k, v in payload.tensors.items() if not k.startswith(FOLD_PREFIX)}
        shapes = payload.config.get("lora_shapes", {})
        return {**tensors, **{k: torch.Size(shape) for k, shape in shapes.items()}}

    def aggregate(self, state: GuidedState, updates: Iterable[ClientUpdate]) -> tuple[GuidedState, Metrics]:
        merge = self.cfg.merge
        if merge.operator == "mean" and merge.space == "ab" and merge.weighting == "data":
            running = MetricMean()
            tensors = weighted_mean(running.observe(updates))  # streams: no upload is held
            metrics = running.result()
            for b_key in (pair[1] for pair in lora_pairs(tensors).values()):
                tensors[b_key] = tensors[b_key] * merge.alpha
        else:
            received = list(updates)
            metrics = metric_mean(received)
            seed = derive_seed(state.seed, self.name, "merge", state.round)
            tensors = merge_lora_states(
                [u.tensors for u in received], [u.weight for u in received], merge, scaling=self.scaling, seed=seed
            )
        if not tensors:
            return state, metrics
        folds = state.folds
        if self.cfg.relora:
            lora_keys = {k for pair in lora_pairs(tensors).values() for k in pair}
            folds = [*state.folds, {k: tensors[k] for k in lora_keys}]
        return dataclasses.replace(state, tensors=tensors, folds=folds), metrics

    # ------------------------------------------------------------------ client
    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: GuidedClientState | None,
        seed: int,
    ) -> tuple[ClientUpdate, GuidedClientState]:
        cfg = self.cfg
        spec = self.spec(runtime)
        folds = _folds(payload.tensors)
        global_ = {k: v for k, v in payload.tensors.items() if not k.startswith(FOLD_PREFIX)}
        previous = client_state["adapter"] if client_state else None
        if cfg.relora:
            base = self.folded_base(runtime, folds)
            runtime.install(ClientModel(lora=spec, adapter=global_, base=base), seed=payload.config["init_seed"])
            current = global_
        else:
            local_start = cfg.guidance != "hard_init" and cfg.start == "local"
            start = previous if local_start and previous is not None else global_
            runtime.install(ClientModel(lora=spec, adapter=start), seed=seed)
            current = previous if previous is not None else start
        metrics: Metrics = {}
        extra_loss = None
        if cfg.guidance != "hard_init" and payload.config.get("round", 0) > 0:
            similarity = self.similarity(current, global_)
            beta = guidance.weighted_beta(cfg.beta, similarity)
            metrics.update(beta=beta, similarity=similarity)
            if beta > 0:
                extra_loss = self._guidance_loss(runtime, spec, global_, beta, seed)
        metrics.update(runtime.train(client.train, local_training(cfg, seed, extra_loss=extra_loss)))
        adapter = runtime.adapter_state()
        update = ClientUpdate(client.client_id, adapter, float(len(client.train)), metrics)
        return update, {"adapter": adapter, "folds": len(folds)}

    def similarity(self, local: StateDict, global_: StateDict) -> float:
        """s_k between the client's current LoRA and the global one (1 when similarity is ``none``)."""
        kind = self.cfg.similarity
        if kind == "none":
            return 1.0
        if kind == "sar":
            return guidance.subspace_alignment_ratio(local, global_, energy=self.cfg.sar_energy)
        on: Literal["factors", "products"] = "products" if kind == "cosine_products" else "factors"
        return guidance.cosine_similarity(local, global_, on=on, scaling=self.scaling)

    def _guidance_loss(
        self, runtime: ModelRuntime, spec: LoraSpec, global_: StateDict, beta: float, seed: int
    ) -> LossHook:
        """The hook adding beta (L_REG - L_SFT), so that the loop's total is (1 - beta) L_SFT + beta L_REG."""
        if self.cfg.guidance == "l2":
            params = runtime.adapter_parameters()
            suffixes = (f".modules_to_save.{spec.key}", f".{spec.key}")
            named = {n: _strip(n, suffixes) for n in params}
            anchors = {n: global_[key] for n, key in named.items() if key in global_}

            def regularizer(model: torch.nn.Module, batch: Batch, outputs: ForwardOutputs) -> torch.Tensor:
                return guidance.l2_distance(params, anchors)
        else:
            teacher = dataclasses.replace(spec, slot="global")
            runtime.activate(teacher)
            runtime.reset_adapter(seed)
            runtime.load_adapter(global_)
            runtime.activate(spec)
            classification = runtime.task == "classification"

            def regularizer(model: torch.nn.Module, batch: Batch, outputs: ForwardOutputs) -> torch.Tensor:
                inputs = {k: v for k, v in batch.items() if k != "labels"}
                with torch.no_grad(), runtime.using_adapter(teacher) as teacher_model:
                    teacher_logits = teacher_model(**inputs).logits
                return guidance.kd_loss(
                    outputs.logits,
                    teacher_logits,
                    None if classification else batch["labels"],
                    temperature=self.cfg.temperature,
                    direction=self.cfg.kd_direction,
                )

        def hook(model: torch.nn.Module, batch: Batch, outputs: ForwardOutputs) -> torch.Tensor:
            return beta * (regularizer(model, batch, outputs) - outputs.loss)

        return hook

    def folded_base(self, runtime: ModelRuntime, folds: list[StateDict]) -> StateDict:
        """W0 + sum of the folded global updates s B_G A_G, for the targeted base weights (ReLoRA)."""
        runtime.load_base(None)
        in_out = in_out_weights(runtime)
        weights: StateDict = {}
        for fold in folds:
            for module, (a_key, b_key) in lora_pairs(fold).items():
                name = base_weight_key(module)
                if name not in weights:
                    weights[name] = runtime.base_params[name].detach().clone()
                delta = self.scaling * (fold[b_key].to(torch.float64) @ fold[a_key].to(torch.float64))
                weights[name] += to_weight_layout(delta, name in in_out).to(weights[name].dtype)
        return weights

    # ------------------------------------------------------------------ personalization
    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: GuidedState,
        client_state: GuidedClientState | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        """The client's own last LoRA; a client that never trained gets the global model.

        With ReLoRA the backbone the client trained on, W0 + sum of the folded global updates, is itself W0 plus
        a LoRA: the folds and the client's LoRA are stacked into one LoRA of rank r * (folds + 1), so the model
        is a plain PEFT adapter on the base model (as saved under ``adapters/``).
        """
        spec = self.spec(runtime)
        if not self.cfg.relora:
            return ClientModel(lora=spec, adapter=client_state["adapter"] if client_state else state.tensors)
        folds = list(state.folds)
        if client_state is not None:
            parts, head = [*folds[: client_state["folds"]], client_state["adapter"]], client_state["adapter"]
        else:
            parts, head = folds, state.tensors
        if not parts:
            return ClientModel()
        pairs = lora_pairs(parts[0])
        lora_keys = {k for pair in pairs.values() for k in pair}
        adapter = {k: v for k, v in head.items() if k not in lora_keys}
        for a_key, b_key in pairs.values():
            adapter[a_key] = torch.cat([p[a_key] for p in parts], dim=0)
            adapter[b_key] = torch.cat([p[b_key] for p in parts], dim=1)
        rank = spec.rank * len(parts)
        return ClientModel(lora=dataclasses.replace(spec, rank=rank, alpha=self.scaling * rank), adapter=adapter)


def _strip(name: str, suffixes: tuple[str, ...]) -> str:
    for suffix in suffixes:
        name = name.replace(suffix, "")
    return name


def _folds(tensors: StateDict) -> list[StateDict]:
    """The per-round global updates carried by a ReLoRA payload, in round order."""
    folds: dict[int, StateDict] = {}
    for key, tensor in tensors.items():
        if key.startswith(FOLD_PREFIX):
            index, name = key[len(FOLD_PREFIX) :].split(".", 1)
            folds.setdefault(int(index), {})[name] = tensor
    return [folds[i] for i in sorted(folds)]
