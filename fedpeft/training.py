"""The one local training loop.

Every method trains through :func:`train_loop`; what differs between methods enters through hooks:
``extra_loss`` adds terms to the task loss (FedProx's proximal term, guidance losses, BayesTune priors),
``after_backward`` edits gradients before the optimizer step, ``after_step`` runs after it (AdaLoRA's budget
allocation reads the gradients and masks the weights the step produced).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from fedpeft.core.types import Metrics

LossHook = Callable[[torch.nn.Module, dict[str, torch.Tensor], Any], torch.Tensor]
StepHook = Callable[[int], None]


def train_loop(
    model: torch.nn.Module,
    batches: Iterator[dict[str, torch.Tensor]],
    params: dict[str, torch.nn.Parameter],
    *,
    steps: int,
    lr: float,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    extra_loss: LossHook | None = None,
    after_backward: StepHook | None = None,
    optimizer_groups: list[dict[str, Any]] | None = None,
    after_step: StepHook | None = None,
) -> Metrics:
    """Run ``steps`` AdamW steps on ``params`` only; every other parameter stays frozen.

    Args:
        model: a module whose forward takes a batch dict (with ``labels``) and returns an output with ``.loss``.
        batches: an endless iterator of batch dicts.
        params: the parameters to train, by name.
        steps: number of optimizer steps.
        lr: learning rate (of every group without its own ``lr``).
        extra_loss: ``f(model, batch, outputs) -> scalar`` added to the task loss.
        after_backward: ``f(step)`` called after backward, before clipping and the optimizer step.
        optimizer_groups: optional extra parameter groups (``{"params": [...], "lr": ...}``) trained alongside.
        after_step: ``f(step)`` called after the optimizer step, before the gradients are cleared.

    Returns:
        ``{"loss": mean task loss over the steps, "steps": steps}``.
    """
    trainable = {id(p) for p in params.values()}
    for group in optimizer_groups or []:
        trainable.update(id(p) for p in group["params"])
    saved_flags = {name: p.requires_grad for name, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)
    for p in params.values():
        p.requires_grad_(True)
    groups: list[dict[str, Any]] = [{"params": list(params.values())}, *(optimizer_groups or [])]
    optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    model.train()
    total_loss = 0.0
    try:
        for step in range(steps):
            batch = next(batches)
            outputs = model(**batch)
            loss = outputs.loss
            total_loss += float(loss.detach())
            if extra_loss is not None:
                loss = loss + extra_loss(model, batch, outputs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if after_backward is not None:
                after_backward(step)
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], max_grad_norm)
            optimizer.step()
            if after_step is not None:
                after_step(step)
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(saved_flags.get(name, False))
        model.eval()
    return {"loss": total_loss / max(steps, 1), "steps": float(steps)}
