"""BayesTune-LoRA: rank-wise scales lambda on PEFT's LoRA, their Bayesian penalties, pruning to a rank budget.

From "Federated Learning to Personalize PEFT for Multilingual LLMs" (FedP2EFT; Lee et al., AAAI 2026,
https://arxiv.org/abs/2502.04387), Section 3.2, adapting BayesTune (Kim & Hospedales, 2023). Every LoRA module l
computes ``W + (alpha / r) * B diag(lambda_l) A`` with one scale per rank. The scales are this project's own
parameters, applied by a forward hook on each ``lora_A[adapter]`` module (output * lambda_l), so PEFT's classes,
dropout and scaling stay untouched. Training minimizes (Eq. 1, 4, 5)

    L_CE + (alpha_s / N) * sum_{l,i} ||B_{l,:,i} - B0_{l,:,i}||_1 / lambda_{l,i}
         + (alpha_p / N) * sum_{l,i} (log lambda_{l,i} + 100 * lambda_{l,i}),

with lambda clamped to [1e-4, 1000] in the forward pass and a straight-through gradient. One trained lambda then
serves every budget r: keep the top-(r * L) scales over all modules, drop modules left without a rank, re-train a
fresh LoRA of that structure with lambda frozen, and fold lambda into A (``A' = diag(lambda) A``) so the result is a
plain PEFT LoRA with a ``rank_pattern``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from peft.tuners.lora import LoraLayer
from torch.utils.hooks import RemovableHandle

from fedpeft.adapters.weights import layer_weight
from fedpeft.analysis.scales import SCALE_MAX, SCALE_MIN, kept_ranks
from fedpeft.core.errors import UserError
from fedpeft.core.records import Budget
from fedpeft.core.types import Metrics, StateDict
from fedpeft.data.types import Example
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.settings.methods import BayesTuneSettings
from fedpeft.training import TrainArgs

PRUNED_SLOT = "bayestune-pruned"


@dataclass
class ClientScales:
    """A client's rank scales, computed once and shared by every budget.

    Attributes:
        scales: raw (unclamped) scales, shape ``(L, r_init)``, rows in ``runtime.target_modules`` order.
        modules: the L module names.
        metrics: how they were obtained (training loss, ...).
    """

    scales: torch.Tensor
    modules: list[str]
    metrics: Metrics


def clamp_st(values: torch.Tensor, low: float = SCALE_MIN, high: float = SCALE_MAX) -> torch.Tensor:
    """``values`` clamped to ``[low, high]`` in the forward pass, with the identity as gradient (straight-through)."""
    # ``values - values.detach()`` is exactly 0 but carries the identity gradient; the forward value is exact.
    return values.detach().clamp(low, high) + (values - values.detach())


def bayestune_penalties(
    b_matrices: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor] | torch.Tensor,
    b_init: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparsity penalty L_s (Eq. 4) and the scale prior L_p (Eq. 5), on clamped scales.

    Args:
        b_matrices: LoRA B of each module, shape ``(d_l, r_l)`` (column i belongs to rank i).
        scales: raw scales of each module, shape ``(r_l,)`` (or one ``(L, r)`` tensor); clamped straight-through.
        b_init: B at initialization (``None``: zeros, as in LoRA).

    Returns:
        ``(L_s, L_p)``, two scalars, not yet weighted by alpha / N.
    """
    clamped = [clamp_st(s) for s in scales]
    moved = list(b_matrices) if b_init is None else [b - b0 for b, b0 in zip(b_matrices, b_init, strict=True)]
    sparsity = torch.stack([(m.abs().sum(0) / s).sum() for m, s in zip(moved, clamped, strict=True)]).sum()
    prior = torch.stack([(s.log() + 100.0 * s).sum() for s in clamped]).sum()
    return sparsity, prior


def prune_to_budget(scores_by_module: dict[str, torch.Tensor], budget: int) -> dict[str, torch.Tensor]:
    """The rank structure of budget r: the top-(r * L) scores over the concatenation of every module's scores
    (:func:`fedpeft.analysis.scales.kept_ranks`, the one definition, which the report's rank structures use too).

    Ties go to the earlier module and rank, so the structures of growing budgets are nested.

    Args:
        scores_by_module: module name -> scores of its ranks (in module order).
        budget: r, the average rank per module.

    Returns:
        module name -> sorted indices (int64, on the CPU) of its kept ranks, only for modules that keep at least
        one rank.
    """
    scores = {name: s.detach().reshape(-1).float().cpu().numpy() for name, s in scores_by_module.items()}
    return {name: torch.from_numpy(kept).long() for name, kept in kept_ranks(scores, budget).items()}


def check_budget(budget: Budget, r_max: int) -> int:
    """The budget as an int, or a UserError when it is missing or outside ``1 .. r_max``."""
    if budget is None or not 1 <= int(budget) <= r_max:
        raise UserError(
            f"Budget r={budget} is outside what the rank scales were trained for (1 <= r <= r_max={r_max}); "
            f"use budgets up to {r_max} or raise the method's r_max."
        )
    return int(budget)


def initial_spec(runtime: ModelRuntime, r_init: int, alpha_multiplier: float, dropout: float) -> LoraSpec:
    """The unpruned BayesTune-LoRA: rank r_init on every targeted layer, alpha = alpha_multiplier * r_init."""
    # The layers as captured before PEFT wrapped them; min(weight.shape) = min(in, out) for Linear and Conv1D.
    limit = min(min(layer_weight(module).shape) for _, module in runtime.target_modules)
    if r_init > limit:
        raise UserError(
            f"BayesTune-LoRA's initial rank r_init={r_init} exceeds the largest rank this model allows ({limit}); "
            f"lower the method's r_init (and r_max if needed)."
        )
    targets = tuple(runtime.loaded.lora_targets)
    return LoraSpec(rank=r_init, alpha=float(alpha_multiplier * r_init), targets=targets, dropout=dropout)


def pruned_spec(structure: dict[str, torch.Tensor], budget: int, alpha_multiplier: float, dropout: float) -> LoraSpec:
    """A plain PEFT LoRA of a pruned structure: only modules with rank > 0, by full name, alpha_l = mult * r_l."""
    ranks = tuple((name, int(kept.numel())) for name, kept in structure.items())
    return LoraSpec(
        rank=budget,
        alpha=float(alpha_multiplier * budget),
        targets=tuple(name for name, _ in ranks),
        dropout=dropout,
        rank_pattern=ranks,
        alpha_pattern=tuple((name, float(alpha_multiplier * r)) for name, r in ranks),
        slot=PRUNED_SLOT,
    )


def lora_layers(runtime: ModelRuntime) -> dict[str, LoraLayer]:
    """The LoRA layers of the active adapter, by base-model module name, in ``runtime.target_modules`` order."""
    assert runtime.active is not None, "no active adapter"
    key = runtime.active.key
    layers = {}
    for name, _ in runtime.target_modules:
        module = runtime.base_model.get_submodule(name)
        if isinstance(module, LoraLayer) and key in module.lora_A:
            layers[name] = module
    return layers


class RankScaleHooks:
    """Context that multiplies the output of each module's ``lora_A[adapter]`` by its clamped scales.

    ``scales`` is either one trainable ``(L, r)`` tensor (clamped straight-through once per model forward) or one
    frozen tensor per module (clamped once).
    """

    def __init__(self, runtime: ModelRuntime, scales: torch.Tensor | Sequence[torch.Tensor]) -> None:
        self.runtime = runtime
        self.layers = lora_layers(runtime)
        self.scales = scales
        self.rows: Sequence[torch.Tensor] = []
        self.handles: list[RemovableHandle] = []
        if len(scales) != len(self.layers):
            raise ValueError(f"{len(scales)} scale rows for {len(self.layers)} LoRA modules")
        self.key = runtime.active.key  # type: ignore[union-attr]
        for row, layer in zip(scales, self.layers.values(), strict=True):
            if row.numel() != layer.lora_A[self.key].out_features:
                raise ValueError(
                    f"scales of {row.numel()} ranks for a LoRA of rank {layer.lora_A[self.key].out_features}"
                )

    def _refresh(self, *_: object) -> None:
        if isinstance(self.scales, torch.Tensor):
            self.rows = clamp_st(self.scales).unbind(0)

    def __enter__(self) -> RankScaleHooks:
        if not isinstance(self.scales, torch.Tensor):
            self.rows = [s.detach().clamp(SCALE_MIN, SCALE_MAX) for s in self.scales]
        self.handles.append(self.runtime.base_model.register_forward_pre_hook(self._refresh))
        for index, layer in enumerate(self.layers.values()):

            def scale(
                module: torch.nn.Module, inputs: tuple[object, ...], output: torch.Tensor, i: int = index
            ) -> torch.Tensor:
                return output * self.rows[i].to(output.dtype)

            self.handles.append(layer.lora_A[self.key].register_forward_hook(scale))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def stage1_step_count(runtime: ModelRuntime, num_examples: int, cfg: BayesTuneSettings) -> int:
    """Optimizer steps of stage 1 (the training of the scales) for a client with ``num_examples`` examples.

    ``cfg.stage1_epochs`` passes at ``cfg.batch_size`` (ceil(N / batch) steps per epoch, with gradient
    accumulation counted as in :meth:`ModelRuntime.train`), at most ``cfg.stage1_steps`` when that is set.
    """
    steps = runtime.steps_for(num_examples, cfg.batch_size * runtime.grad_accum_steps, cfg.stage1_epochs, None)
    return steps if cfg.stage1_steps is None else min(steps, cfg.stage1_steps)


def train_scales(
    runtime: ModelRuntime,
    examples: list[Example],
    initial_scales: torch.Tensor,
    cfg: BayesTuneSettings,
    *,
    seed: int,
    steps: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Train a fresh BayesTune-LoRA (A random, B = 0, lambda = ``initial_scales``) on Eq. 1; return lambda.

    ``cfg`` provides ``r_init``, ``alpha_multiplier``, ``dropout``, ``lr``, ``lambda_lr``, ``alpha_s``, ``alpha_p``,
    ``batch_size`` and stage 1's budget ``stage1_epochs`` / ``stage1_steps`` (:func:`stage1_step_count`), which
    ``steps`` overrides when given. Gradients are not clipped: the penalties' gradients scale as 1 / lambda^2 by
    design and Adam is invariant to their scale, while a global clip would shrink the task gradients to nothing.

    Returns:
        The raw (unclamped) trained scales, shape ``(L, r_init)``, and the training metrics.
    """
    if steps is None:
        steps = stage1_step_count(runtime, len(examples), cfg)
    runtime.install(ClientModel(lora=initial_spec(runtime, cfg.r_init, cfg.alpha_multiplier, cfg.dropout)), seed=seed)
    scales = torch.nn.Parameter(initial_scales.detach().clone().float().to(runtime.device))
    key = runtime.active.key  # type: ignore[union-attr]
    b_matrices = [layer_weight(layer.lora_B[key]) for layer in lora_layers(runtime).values()]
    weight_s, weight_p = cfg.alpha_s / len(examples), cfg.alpha_p / len(examples)

    def penalty(model: torch.nn.Module, batch: dict[str, torch.Tensor], outputs: object) -> torch.Tensor:
        sparsity, prior = bayestune_penalties(b_matrices, scales)
        return weight_s * sparsity + weight_p * prior

    with RankScaleHooks(runtime, scales):
        args = TrainArgs(
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            seed=seed,
            steps=steps,
            extra_loss=penalty,
            optimizer_groups=[{"params": [scales], "lr": cfg.lambda_lr}],
            max_grad_norm=None,
        )
        metrics = runtime.train(examples, args)
    return scales.detach().cpu().clone(), metrics


def fold_scales(adapter: StateDict, kept_scales: dict[str, torch.Tensor]) -> StateDict:
    """Fold frozen scales into LoRA A (``A' = diag(lambda) A``) so that plain PEFT computes the same function."""
    folded = dict(adapter)
    for name, scale in kept_scales.items():
        key = f"base_model.model.{name}.lora_A.weight"
        folded[key] = adapter[key] * scale.to(adapter[key].dtype).unsqueeze(1)
    return folded


class PrunedAdapters:
    """The pruned structure each runtime holds as a PEFT adapter: only the latest one, since pruned structures are
    one-off shapes (they differ per client and budget). The method that prunes owns one."""

    def __init__(self) -> None:
        self._latest: weakref.WeakKeyDictionary[ModelRuntime, LoraSpec] = weakref.WeakKeyDictionary()

    def use(self, runtime: ModelRuntime, spec: LoraSpec) -> None:
        """``spec`` is now ``runtime``'s pruned structure: remove the PEFT adapter of the previous one."""
        previous = self._latest.get(runtime)
        if previous is not None and previous != spec:
            runtime.remove_adapter(previous)
        self._latest[runtime] = spec


def finetune_pruned(
    runtime: ModelRuntime,
    examples: list[Example],
    scales: torch.Tensor,
    budget: int,
    cfg: BayesTuneSettings,
    *,
    seed: int,
    pruned: PrunedAdapters,
) -> ClientModel:
    """Personalize at budget r from trained scales: prune, re-train a fresh LoRA with lambda frozen, fold lambda.

    ``cfg`` provides ``alpha_multiplier``, ``dropout``, ``batch_size``, ``finetune_lr`` (or ``lr``) and
    ``finetune_epochs``; ``pruned`` keeps the runtime's previous pruned structure, whose adapter this one replaces.

    Returns:
        A plain LoRA ``ClientModel`` (rank pattern, lambda folded into A).
    """
    names = [name for name, _ in runtime.target_modules]
    by_module = dict(zip(names, scales.detach().cpu(), strict=True))
    structure = prune_to_budget(by_module, budget)
    spec = pruned_spec(structure, budget, cfg.alpha_multiplier, cfg.dropout)
    runtime.install(ClientModel(lora=spec), seed=seed)
    pruned.use(runtime, spec)
    kept = {name: by_module[name][idx].clamp(SCALE_MIN, SCALE_MAX) for name, idx in structure.items()}
    layers = lora_layers(runtime)
    if list(layers) != list(kept):
        raise RuntimeError(f"PEFT built LoRA on {list(layers)[:3]}... instead of the pruned structure")
    with RankScaleHooks(runtime, [kept[name].to(runtime.device) for name in layers]):
        lr = cfg.finetune_lr or cfg.lr
        runtime.train(examples, TrainArgs(lr=lr, batch_size=cfg.batch_size, seed=seed, epochs=cfg.finetune_epochs))
    return ClientModel(lora=spec, adapter=fold_scales(runtime.adapter_state(), kept))
