"""The one local training loop.

Every method trains through :func:`train_loop`; what differs between methods enters through hooks:
``extra_loss`` adds terms to the task loss (FedProx's proximal term, guidance losses, BayesTune priors),
``after_backward`` edits gradients before the optimizer step, ``after_step`` runs after it (AdaLoRA's budget
allocation reads the gradients and masks the weights the step produced).

At LLM scale the loop also accumulates gradients over micro-batches (an item of ``batches`` that is a list of
batches is one optimizer step), runs forward passes under ``autocast`` (bfloat16 / float16 compute) and, for
float16, scales the loss with a ``GradScaler``.

:func:`train_clients_loop` is the same loop for several clients at once (``engine.batch_clients``): one
forward/backward per step over their joined batches, each client with its own loss, clipping and AdamW state.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from fedpeft.core.types import Metrics

LossHook = Callable[[torch.nn.Module, dict[str, torch.Tensor], Any], torch.Tensor]
StepHook = Callable[[int], None]
EpochHook = Callable[[int, int, float], None]
"""``f(epoch, epochs, loss)`` after each epoch's last step: the epoch (from 1), how many there are and the mean task
loss over the epoch's steps (for progress display only: it changes nothing the loop computes)."""
Batch = dict[str, torch.Tensor]
Step = Batch | list[Batch]
"""One optimizer step's data: a batch, or the micro-batches of one step (gradient accumulation)."""


def loss_units(batch: Batch) -> int:
    """How many terms the task loss of ``batch`` averages: the predicted tokens of a causal LM (labels of
    shape (batch, length), shifted by one, ``-100`` ignored), else the examples."""
    labels = batch["labels"]
    if labels.dim() > 1:
        return int((labels[:, 1:] != -100).sum())
    return int(labels.shape[0])


def train_loop(
    model: torch.nn.Module,
    batches: Iterator[Step],
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
    autocast: Callable[[], AbstractContextManager[Any]] | None = None,
    scaler: torch.amp.GradScaler | None = None,
    epoch_steps: int | None = None,
    after_epoch: EpochHook | None = None,
) -> Metrics:
    """Run ``steps`` AdamW steps on ``params`` only; every other parameter stays frozen.

    Args:
        model: a module whose forward takes a batch dict (with ``labels``) and returns an output with ``.loss``.
        batches: an endless iterator of batch dicts; an item that is a list of batch dicts is one step with
            gradient accumulation: each micro-batch's loss is weighted by its share of the step's loss terms
            (:func:`loss_units`), so the step equals one step on the micro-batches joined into one batch.
        params: the parameters to train, by name.
        steps: number of optimizer steps.
        lr: learning rate (of every group without its own ``lr``).
        extra_loss: ``f(model, batch, outputs) -> scalar`` added to the task loss.
        after_backward: ``f(step)`` called after backward, before clipping and the optimizer step.
        optimizer_groups: optional extra parameter groups (``{"params": [...], "lr": ...}``) trained alongside.
        after_step: ``f(step)`` called after the optimizer step, before the gradients are cleared.
        autocast: returns the context every forward pass (and loss) runs in (mixed precision); ``None``: none.
        scaler: a float16 ``GradScaler``: the loss is scaled before backward and the gradients unscaled before
            ``after_backward`` and clipping; the scaler skips a step whose gradients overflowed.
        epoch_steps: the steps of one pass over the data, for ``after_epoch``.
        after_epoch: called after every ``epoch_steps`` steps and after the last step (see :data:`EpochHook`);
            reading the epoch's loss makes the host wait for the device once per epoch.

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
    # Summed on the model's device in float64 (the sum of the same float32 values as Python floats would be): reading
    # the loss every step would make the host wait for the device, which then idles while the next batch is made.
    total_loss: torch.Tensor | None = None
    context = autocast if autocast is not None else contextlib.nullcontext
    epochs = math.ceil(steps / epoch_steps) if epoch_steps else 0
    reported_loss, reported_steps = 0.0, 0  # the loss sum and steps of the epochs passed to after_epoch
    try:
        for step in range(steps):
            item = next(batches)
            if isinstance(item, dict):
                micro: list[tuple[Batch, float | None]] = [(item, None)]
            else:
                units = [loss_units(b) for b in item]
                micro = [(b, n / sum(units)) for b, n in zip(item, units, strict=True) if n > 0]
                if not micro:  # no loss term in the whole step: no gradient, so the step changes nothing
                    optimizer.zero_grad(set_to_none=True)
            for index, (batch, weight) in enumerate(micro):
                with context():
                    outputs = model(**batch)
                    task_loss = outputs.loss if weight is None else outputs.loss * weight
                    loss = task_loss
                    if extra_loss is not None:
                        extra = extra_loss(model, batch, outputs)
                        loss = loss + (extra if weight is None else extra * weight)
                value = task_loss.detach().to(torch.float64)
                total_loss = value if total_loss is None else total_loss + value
                if index == 0:
                    optimizer.zero_grad(set_to_none=True)
                (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.unscale_(optimizer)
            if after_backward is not None:
                after_backward(step)
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], max_grad_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            if after_step is not None:
                after_step(step)
            done = step + 1
            if after_epoch is not None and epoch_steps and (done % epoch_steps == 0 or done == steps):
                loss_sum = 0.0 if total_loss is None else float(total_loss)
                epoch_loss = (loss_sum - reported_loss) / (done - reported_steps)
                after_epoch(math.ceil(done / epoch_steps), epochs, epoch_loss)
                reported_loss, reported_steps = loss_sum, done
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(saved_flags.get(name, False))
        model.eval()
    total = 0.0 if total_loss is None else float(total_loss)
    return {"loss": total / max(steps, 1), "steps": float(steps)}


ClientLosses = Callable[[list[int], list[Batch]], list[torch.Tensor]]
"""``f(clients, batches) -> losses``: the task loss of each given client (by index) on its batch, all computed in
one forward pass (:mod:`fedpeft.models.multi_lora`)."""


def train_clients_loop(
    losses: ClientLosses,
    streams: Sequence[Iterator[Batch]],
    params: Sequence[dict[str, torch.nn.Parameter]],
    *,
    steps: Sequence[int],
    lr: Sequence[float],
    weight_decay: Sequence[float],
    max_grad_norm: float | None = 1.0,
    autocast: Callable[[], AbstractContextManager[Any]] | None = None,
) -> list[Metrics]:
    """:func:`train_loop` for several clients at once: every step is one forward/backward over the batches of the
    clients still training, and each client keeps what it has alone (its AdamW state, learning rate and weight
    decay, its gradient clipping and its mean loss), so each client's parameters end as :func:`train_loop` would
    leave them. A client whose ``steps`` are done drops out of the later steps.

    Args:
        losses: computes the task loss of each given client on its batch (see :data:`ClientLosses`); the
            gradient of their sum reaches each client's ``params`` from its own loss only.
        streams: each client's endless batch iterator.
        params: each client's trained parameters (disjoint between clients).
        steps, lr, weight_decay: each client's optimizer steps, learning rate and weight decay.
        max_grad_norm: clips each client's gradient norm on its own (``None``: no clipping).
        autocast: returns the context every forward pass (and loss) runs in; ``None``: none.

    Returns:
        Each client's ``{"loss": mean task loss over its steps, "steps": its steps}``.
    """
    # One parameter group per client: AdamW keeps its moments and step count per parameter and skips a parameter
    # without a gradient, so one optimizer steps every client still training exactly as its own optimizer would.
    groups = [
        {"params": list(own.values()), "lr": rate, "weight_decay": decay}
        for own, rate, decay in zip(params, lr, weight_decay, strict=True)
    ]
    optimizer = torch.optim.AdamW(groups)
    totals = [0.0] * len(params)
    context = autocast if autocast is not None else contextlib.nullcontext
    for step in range(max(steps, default=0)):
        active = [k for k, total in enumerate(steps) if step < total]
        batches = [next(streams[k]) for k in active]
        with context():
            task_losses = losses(active, batches)
        for k, value in zip(active, torch.stack([loss.detach() for loss in task_losses]).tolist(), strict=True):
            totals[k] += value
        optimizer.zero_grad(set_to_none=True)  # a client that is done keeps no gradient: the step skips it
        torch.stack(task_losses).sum().backward()
        if max_grad_norm is not None:
            for k in active:
                torch.nn.utils.clip_grad_norm_(list(params[k].values()), max_grad_norm)
        optimizer.step()
    return [{"loss": totals[k] / max(total, 1), "steps": float(total)} for k, total in enumerate(steps)]
