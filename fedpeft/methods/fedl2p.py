"""FedL2P: federated learning to personalize, here the per-module learning rates of a LoRA fine-tuning.

R. Lee, M. Kim, D. Li, X. Qiu, T. Hospedales, F. Huszar, N. D. Lane, "FedL2P: Federated Learning to
Personalize", NeurIPS 2023, https://arxiv.org/abs/2310.02420; as adapted to LoRA by FedP2EFT (2025, appendix A.4).
A federated MLP maps a client's feature statistics (mean and SD of every LoRA-targeted layer's input) to one
learning-rate multiplier per LoRA module (each lora_A, lora_B and head module), times a learnable per-module
post-multiplier. Meta-learning on each sampled client, for 3 outer steps: fine-tune a fresh rank-r LoRA with those
rates on 80 % of its training data for ``local_steps`` steps (inner loop), then update the MLP and the
post-multipliers with the implicit-function-theorem hypergradient of the loss on the held-out 20 % (Neumann series,
Q = 3, psi = 0.1, clamped to [-1, 1]). The rates reach the fine-tuned weights through the last inner step,
w = w' + eta * u (u = that step's update per unit rate), as in FedL2P. The server averages the MLP (FedAvg) and
stops early when the clients' validation loss has not improved for ``patience`` rounds, keeping the best MLP. One
federated run per budget r. Personalization: statistics -> MLP -> rates -> fine-tune a fresh LoRA for 2 epochs ->
evaluate. The rate network's pieces are in :mod:`fedpeft.adapters.learning_rates`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from fedpeft.adapters import feature_statistics
from fedpeft.adapters.learning_rates import (
    POST,
    differentiable_attention,
    initial_rate_tensors,
    module_groups,
    module_rates,
    through_last_step,
    unit_steps,
)
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData, Example
from fedpeft.hypergradient import ift_hypergradient
from fedpeft.methods.base import Budget, Method, local_schedule, method_server_step
from fedpeft.methods.fedl2p_config import FedL2PConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.training import TrainArgs, labelled_tail


def split_validation(examples: list[Example], fraction: float, key: str) -> tuple[list[Example], list[Example]]:
    """A fixed (train, validation) split of a client's training data, ``fraction`` held out (at least one)."""
    order = list(range(len(examples)))
    random.Random(derive_seed(0, "fedl2p-split", key)).shuffle(order)
    held = min(len(examples) - 1, max(1, round(fraction * len(examples))))
    return [examples[i] for i in order[held:]], [examples[i] for i in order[:held]]


@dataclass
class FedL2PState(ServerState):
    """The rate network (``tensors``) of one budget's federated phase, and its early stopping: the best
    network so far, its clients' validation loss and the rounds since it."""

    budget: int | None = None
    best_loss: float = math.inf
    best_tensors: StateDict = field(default_factory=dict)
    since_best: int = 0


class FedL2P(Method[FedL2PConfig, FedL2PState, None]):
    """A federated MLP from client statistics to per-LoRA-module learning rates, meta-learned with IFT."""

    name = "fedl2p"
    Config = FedL2PConfig
    uses_budget = True
    federated_per_budget = True

    def spec(self, runtime: ModelRuntime, rank: int) -> LoraSpec:
        return LoraSpec(
            rank=rank,
            alpha=float(self.cfg.alpha_multiplier * rank),
            targets=tuple(runtime.loaded.lora_targets),
            dropout=self.cfg.dropout,
        )

    # ------------------------------------------------------------------ the rate network
    def rates(self, tensors: StateDict, stats: torch.Tensor) -> torch.Tensor:
        """Per-module learning rates: clamp(MLP(stats)) * post-multiplier, differentiable in ``tensors``."""
        return module_rates(tensors, stats, hidden=self.cfg.hidden, max_multiplier=self.cfg.max_multiplier)

    def init_server(self, runtime: ModelRuntime, seed: int) -> FedL2PState:
        return self.init_server_for_budget(runtime, seed, self.cfg.default_rank)

    def init_server_for_budget(self, runtime: ModelRuntime, seed: int, budget: int) -> FedL2PState:
        runtime.activate(self.spec(runtime, budget))
        inputs, outputs = 2 * len(runtime.target_modules), len(module_groups(runtime))
        init_seed = derive_seed(seed, self.name, "init", budget)
        tensors = initial_rate_tensors(inputs, outputs, self.cfg.hidden, self.cfg.lr, init_seed)
        return FedL2PState(tensors=tensors, budget=budget)

    def state_budget(self, state: FedL2PState) -> int:
        """The rank budget of ``state``'s federated phase."""
        return self.cfg.default_rank if state.budget is None else state.budget

    def payload(self, state: FedL2PState, client_id: str) -> Payload:
        return Payload(tensors=state.tensors, config={"budget": self.state_budget(state)})

    # ------------------------------------------------------------------ inner loop
    def fine_tune(
        self, runtime: ModelRuntime, spec: LoraSpec, examples: list[Example], rates: torch.Tensor, seed: int, **length
    ) -> tuple[dict[str, torch.nn.Parameter], dict[str, torch.Tensor]]:
        """Fine-tune a fresh LoRA with per-module ``rates``; returns its parameters and the last step per unit rate."""
        runtime.install(ClientModel(lora=spec), seed=seed)
        params = runtime.adapter_parameters()
        groups = module_groups(runtime)
        values = [float(r) for r in rates]
        optimizer_groups = [{"params": [params[n] for n in g], "lr": v} for g, v in zip(groups, values, strict=True)]
        total = runtime.steps_for(len(examples), self.cfg.batch_size, length.get("epochs"), length.get("steps"))
        before: dict[str, torch.Tensor] = {}

        def remember(step: int) -> None:
            if step == total - 1:
                before.update({n: p.detach().clone() for n, p in params.items()})

        args = TrainArgs(
            lr=0.0,
            batch_size=self.cfg.batch_size,
            seed=seed,
            steps=total,
            optimizer_groups=optimizer_groups,
            after_backward=remember,
        )
        runtime.train(examples, args, {})
        return params, unit_steps(params, before, groups, values)

    def meta_step(
        self,
        runtime: ModelRuntime,
        tensors: dict[str, torch.nn.Parameter],
        stats: torch.Tensor,
        spec: LoraSpec,
        train: list[Example],
        val: list[Example],
        seed: int,
    ) -> float:
        """One outer step: inner fine-tuning, then the hypergradient into ``tensors[...].grad``; returns L_V."""
        rates = self.rates(dict(tensors), stats)
        params, last = self.fine_tune(runtime, spec, train, rates.detach(), seed, **local_schedule(self.cfg))
        weights = through_last_step(params, last, module_groups(runtime), rates)
        leaves = {n: w.detach().clone().requires_grad_(True) for n, w in weights.items()}
        rng = random.Random(seed)
        model = runtime.peft
        assert model is not None
        model.eval()
        with differentiable_attention(), runtime.autocast():
            outer = torch.func.functional_call(model, leaves, (), self._batch(runtime, val, rng))
            val_grads = torch.autograd.grad(outer.loss, list(leaves.values()))
            inner = torch.func.functional_call(model, weights, (), self._batch(runtime, train, rng))
            train_grads = torch.autograd.grad(inner.loss, list(weights.values()), create_graph=True)
            hparams = list(tensors.values())
            hyper = ift_hypergradient(
                val_grads,
                train_grads,
                list(weights.values()),
                hparams,
                steps=self.cfg.neumann_steps,
                psi=self.cfg.psi,
                clamp=self.cfg.clamp,
            )
        for p, g in zip(hparams, hyper, strict=True):
            p.grad = g.detach()
        return float(outer.loss.detach())

    def _batch(self, runtime: ModelRuntime, examples: list[Example], rng: random.Random) -> dict[str, torch.Tensor]:
        chosen = rng.sample(examples, min(self.cfg.outer_batch_size, len(examples)))
        batch = {k: v.to(runtime.device) for k, v in runtime.encode(chosen).items()}
        assert runtime.peft is not None
        return labelled_tail(runtime.peft, batch)

    # ------------------------------------------------------------------ federated phase
    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        spec = self.spec(runtime, int(payload.config.get("budget", self.cfg.default_rank)))
        train, val = split_validation(client.train, self.cfg.val_fraction, client.client_id)
        stats = feature_statistics(runtime, train)
        tensors = {k: torch.nn.Parameter(v.detach().clone()) for k, v in payload.tensors.items()}
        mlp = [p for k, p in tensors.items() if k != POST]
        optimizer = torch.optim.Adam(
            [{"params": mlp, "lr": self.cfg.mlp_lr}, {"params": [tensors[POST]], "lr": self.cfg.post_lr}]
        )
        losses = []
        for step in range(self.cfg.outer_steps):
            optimizer.zero_grad(set_to_none=True)
            losses.append(self.meta_step(runtime, tensors, stats, spec, train, val, derive_seed(seed, "outer", step)))
            optimizer.step()
        upload = {k: p.detach().clone() for k, p in tensors.items()}
        # The first outer loss measures the received MLP: the server's early-stopping signal.
        metrics = {"val_loss": losses[0], "outer_loss": sum(losses) / len(losses)}
        return ClientUpdate(client.client_id, upload, float(len(client.train)), metrics), client_state

    def aggregate(self, state: FedL2PState, updates: Iterable[ClientUpdate]) -> tuple[FedL2PState, Metrics]:
        step = method_server_step(self)
        assert step is not None  # the PSG's server step is a weighted mean
        result = step(state, updates)
        if not result.tensors:
            return state, result.metrics
        loss = result.metrics.get("train_val_loss", math.inf)
        if loss < state.best_loss:
            state = dataclasses.replace(state, best_loss=loss, best_tensors=dict(state.tensors), since_best=0)
        else:
            state = dataclasses.replace(state, since_best=state.since_best + 1)
        state = dataclasses.replace(state, tensors=result.tensors, server_optimizer=result.moments)
        return state, result.metrics

    def should_stop(self, state: FedL2PState) -> bool:
        return state.since_best >= self.cfg.patience

    # ------------------------------------------------------------------ personalization
    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedL2PState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        spec = self.spec(runtime, int(budget or self.state_budget(state)))
        tensors = state.best_tensors or state.tensors
        with torch.no_grad():
            rates = self.rates(tensors, feature_statistics(runtime, client.train))
        self.fine_tune(runtime, spec, client.train, rates, seed, epochs=self.cfg.finetune_epochs)
        return ClientModel(lora=spec, adapter=runtime.adapter_state())
