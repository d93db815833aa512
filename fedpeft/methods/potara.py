"""Potara: federated-local LoRA merging with closed-form mixing weights.

Y. Zou, M. K. C. Shisher, C. G. Brinton, V. Tripathi, "Communication-Efficient Personalized Adaptation via
Federated-Local Model Merging", 2026, https://arxiv.org/abs/2602.18658.

Phase 1 runs FedIT for ``rounds`` (T_F) rounds, the only communication. Phase 2 trains, on every client, a
purely local LoRA from the same initialization (A from the same seed, B = 0) for ``local_rounds`` (T_L) rounds of
``local_steps`` (E) steps. Phase 3 merges the two on the client: from per-sample gradients of 30 training
samples at both models it estimates diagonal Fisher variances and their gradient correlation, and picks the
convex weight ``alpha`` of the FedIT model that minimizes the variance trace of the merged task vector
(:func:`mixing_weight`); A, B and the task head are merged with it. Variants: one alpha per factor (A / B) or
per module, and a grid search over alpha on a held-out part of the client's training split for comparison.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch

from fedpeft.adapters.gradients import per_sample_gradients
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, StateDict
from fedpeft.data.types import ClientData, Example
from fedpeft.methods.base import Budget, local_schedule, local_training
from fedpeft.methods.families.lora_keys import is_lora, is_lora_a, module_of, target_spec
from fedpeft.methods.fedit import FedITBase, FedITState
from fedpeft.methods.potara_config import PotaraConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.settings.methods import FederatedLocalConfig


def variance_terms(
    grads_fed: torch.Tensor, grads_local: torch.Tensor, eps: float = 1e-8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per coordinate: sigma2_F, sigma2_L (inverse diagonal Fisher) and the clipped cross-covariance s_FL.

    Args:
        grads_fed, grads_local: ``(n_samples, n_coordinates)`` per-sample gradients at the two models.
        eps: Fisher damping.
    """
    g_f, g_l = grads_fed.double(), grads_local.double()
    s2_f = 1.0 / ((g_f**2).mean(0) + eps)
    s2_l = 1.0 / ((g_l**2).mean(0) + eps)
    d_f, d_l = g_f - g_f.mean(0), g_l - g_l.mean(0)
    scale = ((d_f**2).mean(0) * (d_l**2).mean(0)).sqrt()
    rho = torch.where(scale > 0, (d_f * d_l).mean(0) / scale.clamp_min(1e-300), torch.zeros_like(scale))
    s_fl = (rho * (s2_f * s2_l).sqrt()).clamp_min(0.0)
    return s2_f, s2_l, torch.minimum(s_fl, torch.minimum(s2_f, s2_l))


def alpha_from_traces(trace_fed: float, trace_local: float, trace_cross: float) -> float:
    """argmin over a of a^2 tr S_F + (1 - a)^2 tr S_L + 2 a (1 - a) tr S_FL (0.5 when f is flat)."""
    denominator = trace_fed + trace_local - 2.0 * trace_cross
    if denominator <= 0:
        return 0.5
    return min(1.0, max(0.0, (trace_local - trace_cross) / denominator))


def mixing_weight(grads_fed: torch.Tensor, grads_local: torch.Tensor, eps: float = 1e-8) -> float:
    """Potara's closed-form weight alpha of the FedIT model (1 - alpha goes to the local model).

    alpha = sum_j (s2_L - s_FL) / sum_j (s2_F + s2_L - 2 s_FL) over all coordinates j (see
    :func:`variance_terms`); it lies in [0, 1].
    """
    s2_f, s2_l, s_fl = variance_terms(grads_fed, grads_local, eps)
    return alpha_from_traces(float(s2_f.sum()), float(s2_l.sum()), float(s_fl.sum()))


def merge_states(fed: StateDict, local: StateDict, alphas: dict[str, float]) -> StateDict:
    """``alpha * fed + (1 - alpha) * local`` per tensor, ``alphas[key]`` (or ``alphas["*"]``) its weight."""
    return {k: alphas.get(k, alphas["*"]) * v + (1 - alphas.get(k, alphas["*"])) * local[k] for k, v in fed.items()}


@dataclass
class PotaraState(FedITState):
    """The FedIT phase's global adapter, and the seed of the LoRA initialization the local phase starts from."""

    init_seed: int = 0


FederatedLocalConfigT = TypeVar("FederatedLocalConfigT", bound=FederatedLocalConfig)


class Potara(FedITBase[FederatedLocalConfigT, PotaraState]):
    """FedIT for T_F rounds, a local LoRA from the same init, and their closed-form merge per client."""

    name = "potara"
    Config: ClassVar[type[FederatedLocalConfig]] = PotaraConfig

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        cfg = self.cfg
        return target_spec(runtime, cfg.rank, cfg.alpha, cfg.dropout, cfg.targets)

    def init_server(self, runtime: ModelRuntime, seed: int) -> PotaraState:
        tensors = self.initial_adapter(runtime, seed)
        return PotaraState(tensors=tensors, seed=seed, init_seed=derive_seed(seed, self.name, "init"))

    @property
    def options(self) -> PotaraConfig | None:
        """Potara's own knobs (granularity, grid search); ``None`` for a subclass with the plain federated-local
        config (Fisher merging)."""
        return self.cfg if isinstance(self.cfg, PotaraConfig) else None

    def fit_split(self, client: ClientData) -> tuple[list[Example], list[Example]]:
        """The training examples, and (grid search only) the held-out part used to score grid points."""
        options = self.options
        if options is None or not options.grid_search or options.grid_holdout <= 0 or len(client.train) < 4:
            return client.train, []
        order = list(range(len(client.train)))
        random.Random(derive_seed(0, "holdout", client.client_id)).shuffle(order)
        cut = max(1, round(options.grid_holdout * len(order)))
        return [client.train[i] for i in order[cut:]], [client.train[i] for i in order[:cut]]

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        fit, _ = self.fit_split(client)
        update, client_state = super().client_update(
            runtime, ClientData(client.client_id, client.group, client.pool, fit, []), payload, client_state, seed
        )
        if self.cfg.uniform_weights:
            update.weight = 1.0
        return update, client_state

    def train_local(
        self, runtime: ModelRuntime, spec: LoraSpec, fit: list[Example], init_seed: int, seed: int
    ) -> StateDict:
        """Phase 2: a LoRA from the federated phase's initialization, trained on ``fit`` alone."""
        cfg = self.cfg
        runtime.install(ClientModel(lora=spec), seed=init_seed)
        # A local "round" is exactly a FedIT round's work: local_epochs passes when set, else local_steps steps.
        schedule = local_schedule(cfg)
        batch = cfg.batch_size * runtime.grad_accum_steps
        per_round = runtime.steps_for(len(fit), batch, schedule["epochs"], schedule["steps"])
        if cfg.local_rounds > 0:
            steps = cfg.local_rounds * per_round
            runtime.train(fit, local_training(cfg, seed, steps=steps))
        return runtime.adapter_state()

    def gradients(
        self, runtime: ModelRuntime, model: ClientModel, sample: list[Example]
    ) -> tuple[torch.Tensor, list[tuple[str, torch.Size]]]:
        runtime.activate(model.lora)  # the full adapter state overwrites every tensor: no fresh init needed
        runtime.load_adapter(model.adapter)
        return per_sample_gradients(runtime, sample, select=is_lora)

    def merge(
        self, runtime: ModelRuntime, fed: ClientModel, local: ClientModel, sample: list[Example]
    ) -> tuple[StateDict, Metrics]:
        """Phase 3: the closed-form merge of the two adapters and the weights it used."""
        grads_fed, layout = self.gradients(runtime, fed, sample)
        grads_local, _ = self.gradients(runtime, local, sample)
        s2_f, s2_l, s_fl = variance_terms(grads_fed, grads_local, self.cfg.eps)
        columns: dict[str, slice] = {}
        start = 0
        for key, shape in layout:
            columns[key] = slice(start, start + shape.numel())
            start += shape.numel()

        def alpha_over(keys: list[str]) -> float:
            index = torch.cat([torch.arange(columns[k].start, columns[k].stop) for k in keys])
            return alpha_from_traces(float(s2_f[index].sum()), float(s2_l[index].sum()), float(s_fl[index].sum()))

        alpha = alpha_from_traces(float(s2_f.sum()), float(s2_l.sum()), float(s_fl.sum()))
        alphas: dict[str, float] = {"*": alpha}
        info = {"alpha": alpha}
        keys = list(columns)
        options = self.options
        granularity = options.granularity if options is not None else "global"
        if granularity == "ab":
            parts: tuple[tuple[str, Callable[[str], bool]], ...] = (("A", is_lora_a), ("B", lambda k: not is_lora_a(k)))
            for part, keep in parts:
                info[f"alpha_{part}"] = alpha_over([k for k in keys if keep(k)])
                alphas.update({k: info[f"alpha_{part}"] for k in keys if keep(k)})
        elif granularity == "module":
            for module in dict.fromkeys(module_of(k) for k in keys):
                members = [k for k in keys if module_of(k) == module]
                alphas.update(dict.fromkeys(members, alpha_over(members)))
            info["alpha_module_mean"] = sum(alphas[k] for k in keys) / len(keys)
        return merge_states(fed.adapter, local.adapter, alphas), info

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: PotaraState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        spec = self.spec(runtime)
        init_seed = state.init_seed
        fit, holdout = self.fit_split(client)
        started = time.perf_counter()
        local = ClientModel(lora=spec, adapter=self.train_local(runtime, spec, fit, init_seed, seed))
        trained = time.perf_counter()
        fed = ClientModel(lora=spec, adapter={k: v.clone() for k, v in state.tensors.items()})
        sample = random.Random(seed).sample(fit, min(self.cfg.merge_samples, len(fit)))
        merged, info = self.merge(runtime, fed, local, sample)
        info.update(train_s=trained - started, merge_s=time.perf_counter() - trained)
        variants = {"fedit": fed, "local": local} if self.cfg.parts else {}
        options = self.options
        if options is not None and options.grid_search:
            best, scores = self.grid_scores(runtime, fed, local, holdout or fit, client.test, options.grid)
            info.update(scores, alpha_grid=best)
            variants["grid"] = ClientModel(lora=spec, adapter=merge_states(fed.adapter, local.adapter, {"*": best}))
        return ClientModel(lora=spec, adapter=merged, variants=variants, info=info)

    def grid_scores(
        self,
        runtime: ModelRuntime,
        fed: ClientModel,
        local: ClientModel,
        holdout: list[Example],
        test: list[Example],
        grid: list[float],
    ) -> tuple[float, Metrics]:
        """Every weight of ``grid`` scored on the held-out examples (and, for the plot, on the test split)."""
        metric = "accuracy" if runtime.task == "classification" else "rouge1"
        scores: Metrics = {}
        best, best_score = grid[0], -1.0
        for alpha in grid:
            runtime.install(ClientModel(lora=fed.lora, adapter=merge_states(fed.adapter, local.adapter, {"*": alpha})))
            score = runtime.evaluate(holdout)[metric]
            scores[f"val_{metric}@{alpha:g}"] = score
            scores[f"test_{metric}@{alpha:g}"] = runtime.evaluate(test)[metric]
            if score > best_score:
                best, best_score = alpha, score
        return best, scores
