"""AdaLoRA: per-client adaptive rank allocation under a rank budget, with PEFT's implementation.

Q. Zhang et al., "Adaptive Budget Allocation for Parameter-Efficient Fine-Tuning" (AdaLoRA), ICLR 2023,
https://arxiv.org/abs/2303.10512. Each update is kept in SVD form P diag(E) Q; importance scores prune singular
values from an initial rank of 1.5 r per layer down to a total of r per layer on average (the budget), with an
orthogonality penalty on P and Q. A baseline of FedP2EFT (2025): every client runs AdaLoRA alone, no federation.

Training runs through the project's loop on PEFT's ``AdaLoraModel`` (its forward adds the orthogonal
regularization to the loss; ``update_and_allocate(step)`` runs after every optimizer step). The result is
converted to a plain LoRA with the final rank pattern: rank i of layer l is kept when AdaLoRA kept it,
A' = diag(E) A and B' = B on the kept ranks, alpha'_l / r'_l = AdaLoRA's scaling, layers left with no rank are
dropped. The converted adapter computes exactly what the AdaLoRA model computes and is saved as a PEFT LoRA.
"""

from __future__ import annotations

import math

import torch
from peft import AdaLoraConfig, PeftModel, get_peft_model
from peft.tuners.adalora import AdaLoraLayer, AdaLoraModel

from fedpeft.core.types import ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.adalora_config import AdaLoraBaselineConfig
from fedpeft.methods.base import Budget, Method
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime, unload_adapters
from fedpeft.training import TrainArgs

ADAPTER = "adalora"
_PREFIX = "base_model.model."


def schedule(total_steps: int, warmup_fraction: float, final_fraction: float) -> tuple[int, int]:
    """AdaLoRA's (tinit, tfinal) for ``total_steps``, as PEFT's ``AdaLoraConfig`` takes them for any step count:
    ``tinit + tfinal < total_steps`` (a budget phase of at least one step). With two steps or more the final phase
    lasts at least one step, so that the final allocation to the target budget (at step ``total_steps - tfinal``,
    steps counted from 0) happens during training; a single step leaves it none, and the allocation follows that
    step (:meth:`AdaLoraBaseline.personalize`)."""
    if total_steps < 2:
        return 0, 0
    tfinal = min(max(1, round(final_fraction * total_steps)), total_steps - 1)
    tinit = min(max(round(warmup_fraction * total_steps), 0), total_steps - tfinal - 1)
    return tinit, tfinal


def to_lora(model: PeftModel, head_modules: list[str], dropout: float) -> tuple[LoraSpec, StateDict]:
    """The plain LoRA that computes what the AdaLoRA adapter of ``model`` computes, on its kept ranks."""
    tensors: StateDict = {}
    for name, module in model.named_modules():
        to_save = getattr(module, "modules_to_save", None)
        if isinstance(to_save, torch.nn.ModuleDict) and ADAPTER in to_save:  # the task head, as LoRA saves it
            tensors.update({f"{name}.{k}": v.detach().clone() for k, v in to_save[ADAPTER].named_parameters()})
    ranks: list[tuple[str, int]] = []
    alphas: list[tuple[str, float]] = []
    for name, module in model.named_modules():
        if not isinstance(module, AdaLoraLayer) or ADAPTER not in module.lora_A:
            continue
        values = module.lora_E[ADAPTER].detach().view(-1)
        kept = values != 0
        rank = int(kept.sum())
        if rank == 0:
            continue
        target = name.removeprefix(_PREFIX)
        scaling = module.scaling[ADAPTER] / (float(module.ranknum[ADAPTER].detach()) + 1e-5)
        # AdaLoRA keeps its factors in ParameterDicts (PEFT's LoraLayer declares module dicts).
        lora_a, lora_b = module.lora_A[ADAPTER], module.lora_B[ADAPTER]
        assert isinstance(lora_a, torch.Tensor) and isinstance(lora_b, torch.Tensor)
        a = (lora_a.detach() * module.lora_E[ADAPTER].detach())[kept]
        tensors[f"{name}.lora_A.weight"] = a.clone()
        tensors[f"{name}.lora_B.weight"] = lora_b.detach()[:, kept].clone()
        ranks.append((target, rank))
        alphas.append((target, rank * scaling))
    spec = LoraSpec(
        rank=max(r for _, r in ranks),
        alpha=float(max(r for _, r in ranks)),
        targets=tuple(t for t, _ in ranks),
        dropout=dropout,
        rank_pattern=tuple(ranks),
        alpha_pattern=tuple(alphas),
        head=bool(head_modules),
    )
    return spec, tensors


class AdaLoraBaseline(Method[AdaLoraBaselineConfig, ServerState, None]):
    """Each client fine-tunes an AdaLoRA adapter whose total rank shrinks to r per layer (r = the budget)."""

    name = "adalora"
    Config = AdaLoraBaselineConfig
    federated = False
    uses_budget = True

    def adalora_config(self, runtime: ModelRuntime, rank: int, total_steps: int) -> AdaLoraConfig:
        cfg = self.cfg
        init_rank = max(rank, math.ceil(cfg.init_rank_multiplier * rank))
        tinit, tfinal = schedule(total_steps, cfg.warmup_fraction, cfg.final_fraction)
        return AdaLoraConfig(
            init_r=init_rank,
            target_r=rank,
            lora_alpha=cfg.alpha_multiplier * init_rank,  # type: ignore[arg-type]  # PEFT annotates int; a float works
            lora_dropout=cfg.dropout,
            target_modules=list(runtime.loaded.lora_targets),
            modules_to_save=list(runtime.loaded.head_modules) or None,
            tinit=tinit,
            tfinal=tfinal,
            deltaT=cfg.delta_t,
            beta1=cfg.beta1,
            beta2=cfg.beta2,
            orth_reg_weight=cfg.orth_reg_weight,
            total_step=total_steps,
        )

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        rank = int(budget or 8)
        cfg = self.cfg
        total = runtime.steps_for(len(client.train), cfg.batch_size, cfg.epochs, None)
        runtime.install(ClientModel())  # the client's base weights
        runtime.detach_adapters()
        config = self.adalora_config(runtime, rank, total)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = get_peft_model(runtime.base_model, config, adapter_name=ADAPTER)
        tuner = model.base_model
        assert isinstance(tuner, AdaLoraModel)
        final_step = total - config.tfinal  # the final allocation's step, counted from 0

        def allocate(step: int) -> None:
            tuner.update_and_allocate(step)
            if step == total - 1 and final_step == total:  # no final phase (one step): allocate after the last step
                tuner.update_and_allocate(final_step)

        try:
            params = {n: p for n, p in model.named_parameters() if p.requires_grad}
            args = TrainArgs(
                lr=cfg.lr,
                batch_size=cfg.batch_size,
                seed=seed,
                steps=total,
                # The tuner, not the PeftModel: a PeftModel without a task type calls the transformer directly,
                # skipping AdaLoraModel.forward, which adds the orthogonal regularization to the loss.
                model=tuner,
                after_step=allocate,
            )
            runtime.train(client.train, args, params)
            spec, tensors = to_lora(model, list(runtime.loaded.head_modules), cfg.dropout)
        finally:
            unload_adapters(model)
        return ClientModel(lora=spec, adapter=tensors)
