"""The one local training loop.

Every method trains through :func:`train_loop`, told how by one :class:`TrainArgs` (which the runtime and its
trainer pass down as they got it); what differs between methods enters through its hooks: ``extra_loss`` adds
terms to the task loss (FedProx's proximal term, guidance losses, BayesTune priors), ``after_backward`` edits
gradients before the optimizer step, ``after_step`` runs after it (AdaLoRA's budget allocation reads the gradients
and masks the weights the step produced).

At LLM scale the loop also accumulates gradients over micro-batches (an item of ``batches`` that is a list of
batches is one optimizer step), runs forward passes under ``autocast`` (bfloat16 / float16 compute) and, for
float16, scales the loss with a ``GradScaler``.

:func:`train_clients_loop` is the same loop for several clients at once (``engine.batch_clients``): one
forward/backward per step over their joined batches, each client with its own loss, clipping and AdamW state.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
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


@dataclass(frozen=True, kw_only=True)
class TrainArgs:
    """How one local training runs: the one definition that :meth:`fedpeft.models.runtime.ModelRuntime.train`, the
    :class:`~fedpeft.models.trainer.Trainer` and :func:`train_loop` read, each the fields of its own job.

    Attributes:
        lr: learning rate (of every parameter group without its own ``lr``).
        batch_size: examples of one optimizer step (of one micro-batch with gradient accumulation).
        seed: the seed of the minibatch order and of what the forward passes draw.
        epochs: passes over the examples (default one), unless ``steps`` is set.
        steps: exactly this many optimizer steps (before ``train.max_steps`` cuts them).
        weight_decay: AdamW's weight decay.
        max_grad_norm: clips the global gradient norm (``None``: no clipping).
        extra_loss: ``f(model, batch, outputs) -> scalar`` added to the task loss.
        after_backward: ``f(step)`` called after backward, before clipping and the optimizer step.
        after_step: ``f(step)`` called after the optimizer step, before the gradients are cleared.
        after_epoch: told each pass over the examples (progress: :data:`EpochHook`).
        optimizer_groups: extra parameter groups (``{"params": [...], "lr": ...}``) trained alongside.
        model: the module to call instead of the runtime's own (a PEFT model of another adapter type wrapped
            around the base model after ``detach_adapters``).
    """

    lr: float
    batch_size: int
    seed: int
    epochs: float | None = None
    steps: int | None = None
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    extra_loss: LossHook | None = None
    after_backward: StepHook | None = None
    after_step: StepHook | None = None
    after_epoch: EpochHook | None = None
    optimizer_groups: list[dict[str, Any]] | None = None
    model: torch.nn.Module | None = None

    @property
    def hooked(self) -> bool:
        """Whether the training runs more than the plain loop: a hook that changes what it computes (``after_epoch``
        only reports), extra parameter groups or another model."""
        hooks = (self.extra_loss, self.after_backward, self.after_step, self.optimizer_groups, self.model)
        return any(hook is not None for hook in hooks)


def first_scored(labels: torch.Tensor) -> int:
    """The first position whose logits a causal LM's loss reads: the one before the first labelled position of any
    row (``-100`` is unlabelled; position t predicts label t + 1), 0 when no position is labelled."""
    labelled = (labels != -100).any(0).nonzero()
    return max(int(labelled[0]) - 1, 0) if labelled.numel() else 0


def scored_positions(labels: torch.Tensor) -> torch.Tensor | None:
    """Per row, the positions whose logits a causal LM's loss reads (batch x k): from the one before the row's first
    label through its last label, k the widest such span of the rows (a row whose span would pass the end starts
    earlier); ``None`` when k is the whole length. In a batch whose prompts differ in length (a picture or four,
    a short question or a long one) every row keeps only its own answer's positions."""
    width = labels.shape[1]
    positions = torch.arange(width, device=labels.device)
    labelled = labels != -100
    first = torch.where(labelled, positions, width).amin(1)
    last = torch.where(labelled, positions, -1).amax(1)
    start = (first - 1).clamp_min(0)
    keep = int((last - start + 1).max()) if labels.numel() else width
    if keep >= width:
        return None
    start = torch.minimum(start, torch.tensor(width - max(keep, 1), device=labels.device))
    return start[:, None] + torch.arange(max(keep, 1), device=labels.device)


_KEEPS_LOGITS: dict[type, tuple[bool, bool]] = {}


def _logit_cuts(model: torch.nn.Module) -> tuple[bool, bool]:
    get_base = getattr(model, "get_base_model", None)
    kind = type(get_base() if callable(get_base) else model)
    if kind not in _KEEPS_LOGITS:
        try:
            keeps = "logits_to_keep" in inspect.signature(kind.forward).parameters
        except (AttributeError, TypeError, ValueError):
            keeps = False
        # transformers' models that slice with slice_logits_to_keep also take positions per row (a 2-d tensor)
        rows = keeps and hasattr(inspect.getmodule(kind), "slice_logits_to_keep")
        _KEEPS_LOGITS[kind] = (keeps, rows)
    return _KEEPS_LOGITS[kind]


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a transformers causal LM, or a PEFT model around one) computes its logits at the last
    ``logits_to_keep`` positions only when asked."""
    return _logit_cuts(model)[0]


LOGITS_CUT_BYTES = 128 * 2**20
"""The size of a batch's whole logits (float32, every position, the whole vocabulary) from which on
:func:`logits_cut` cuts them. Below it they cost little memory (with their copies and gradients a few times
this), and the numbers stay those of the whole computation: a cut multiplies fewer rows by the output layer and
averages the loss over another layout, which rounds differently in the last bits, and a sparse mixture of experts'
top-k routing carries such bits into other experts (a tiny OLMoE's FLAME run moved its training loss by 0.2 %
and every result with it). Paper-size models pass it at once: Llama 3's 128,256 words from about 260 positions
on (4 sequences of 66 tokens), a LLaVA prompt with its 577 image tokens."""


def _vocabulary(model: torch.nn.Module) -> int | None:
    """The size of ``model``'s output vocabulary (its output layer's rows; else its config's ``vocab_size``)."""
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    weight = getattr(output, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def logits_cut(model: torch.nn.Module, labels: torch.Tensor) -> tuple[int | torch.Tensor | None, torch.Tensor]:
    """``(logits_to_keep, labels)`` for ``model``'s loss on ``labels`` (batch x length) with its logits only where
    the loss reads them: each row's own positions (:func:`scored_positions`) where the model takes positions per
    row, else the positions from the one before any row's first label on (:func:`first_scored`); the labels are
    those of the kept positions, so that transformers' shift by one still pairs each kept position with the
    label after it. ``(None, labels)`` where nothing is cut, and where the whole logits are smaller than
    :data:`LOGITS_CUT_BYTES` (an unknown vocabulary counts as large)."""
    if labels.dim() != 2 or not keeps_logits(model):
        return None, labels
    vocabulary = _vocabulary(model)
    if vocabulary is not None and labels.numel() * vocabulary * 4 < LOGITS_CUT_BYTES:
        return None, labels
    if _logit_cuts(model)[1]:
        positions = scored_positions(labels)
        return (None, labels) if positions is None else (positions, labels.gather(1, positions))
    start = first_scored(labels)
    return (None, labels) if start == 0 else (labels.shape[1] - start, labels[:, start:])


def labelled_tail(model: torch.nn.Module, batch: Batch) -> Batch:
    """``batch`` with ``model``'s logits cut to the positions its loss reads (:func:`logits_cut`), so that the loss
    and its gradients are those of the whole batch. A causal LM's logits over its vocabulary (batch x length x
    vocabulary, their float32 copy, log-softmax and gradients) are most of a step's memory when prompts are long
    and the vocabulary large: LLaVA's 577 image tokens per picture, Llama 3's 128,256 words (a batch of one
    four-picture and three one-picture questions held 11 GB of such tensors over its 2,306 positions a row; cut,
    each row keeps its answer's few). Unchanged where nothing can be cut, the model cannot keep its logits in
    part, or the labels are not one per position."""
    labels = batch.get("labels")
    if labels is None or "logits_to_keep" in batch:
        return batch
    keep, cut = logits_cut(model, labels)
    if keep is None:
        return batch
    return {**batch, "labels": cut, "logits_to_keep": keep}  # type: ignore[dict-item]


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
    args: TrainArgs,
    *,
    steps: int,
    autocast: Callable[[], AbstractContextManager[Any]] | None = None,
    scaler: torch.amp.GradScaler | None = None,
    epoch_steps: int | None = None,
) -> Metrics:
    """Run ``steps`` AdamW steps on ``params`` only; every other parameter stays frozen.

    Args:
        model: a module whose forward takes a batch dict (with ``labels``) and returns an output with ``.loss``.
        batches: an endless iterator of batch dicts; an item that is a list of batch dicts is one step with
            gradient accumulation: each micro-batch's loss is weighted by its share of the step's loss terms
            (:func:`loss_units`), so the step equals one step on the micro-batches joined into one batch.
        params: the parameters to train, by name.
        args: the learning rate, weight decay, clipping, hooks and extra parameter groups (its batch size, seed,
            epochs, steps and model are the caller's, already in ``model``, ``batches`` and ``steps``).
        steps: number of optimizer steps.
        autocast: returns the context every forward pass (and loss) runs in (mixed precision); ``None``: none.
        scaler: a float16 ``GradScaler``: the loss is scaled before backward and the gradients unscaled before
            ``after_backward`` and clipping; the scaler skips a step whose gradients overflowed.
        epoch_steps: the steps of one pass over the data, for ``args.after_epoch``, which is called after every
            ``epoch_steps`` steps and after the last step (see :data:`EpochHook`); reading the epoch's loss makes
            the host wait for the device once per epoch.

    Returns:
        ``{"loss": mean task loss over the steps, "steps": steps}``.
    """
    trainable = {id(p) for p in params.values()}
    for group in args.optimizer_groups or []:
        trainable.update(id(p) for p in group["params"])
    saved_flags = {name: p.requires_grad for name, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)
    for p in params.values():
        p.requires_grad_(True)
    groups: list[dict[str, Any]] = [{"params": list(params.values())}, *(args.optimizer_groups or [])]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, weight_decay=args.weight_decay)
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
            for index, (whole, weight) in enumerate(micro):
                batch = labelled_tail(model, whole)
                with context():
                    outputs = model(**batch)
                    task_loss = outputs.loss if weight is None else outputs.loss * weight
                    loss = task_loss
                    if args.extra_loss is not None:
                        extra = args.extra_loss(model, batch, outputs)
                        loss = loss + (extra if weight is None else extra * weight)
                value = task_loss.detach().to(torch.float64)
                total_loss = value if total_loss is None else total_loss + value
                if index == 0:
                    optimizer.zero_grad(set_to_none=True)
                (scaler.scale(loss) if scaler is not None else loss).backward()
            if scaler is not None:
                scaler.unscale_(optimizer)
            if args.after_backward is not None:
                args.after_backward(step)
            if args.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], args.max_grad_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            if args.after_step is not None:
                args.after_step(step)
            done = step + 1
            if args.after_epoch is not None and epoch_steps and (done % epoch_steps == 0 or done == steps):
                loss_sum = 0.0 if total_loss is None else float(total_loss)
                epoch_loss = (loss_sum - reported_loss) / (done - reported_steps)
                args.after_epoch(math.ceil(done / epoch_steps), epochs, epoch_loss)
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
    args: Sequence[TrainArgs],
    *,
    steps: Sequence[int],
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
        args: each client's learning rate, weight decay and gradient clipping (each clipped on its own); a client
            trained together has no hooks (:attr:`TrainArgs.hooked`).
        steps: each client's optimizer steps.
        autocast: returns the context every forward pass (and loss) runs in; ``None``: none.

    Returns:
        Each client's ``{"loss": mean task loss over its steps, "steps": its steps}``.
    """
    # One parameter group per client: AdamW keeps its moments and step count per parameter and skips a parameter
    # without a gradient, so one optimizer steps every client still training exactly as its own optimizer would.
    groups = [
        {"params": list(own.values()), "lr": own_args.lr, "weight_decay": own_args.weight_decay}
        for own, own_args in zip(params, args, strict=True)
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
        for k in active:
            if (max_norm := args[k].max_grad_norm) is not None:
                torch.nn.utils.clip_grad_norm_(list(params[k].values()), max_norm)
        optimizer.step()
    return [{"loss": totals[k] / max(total, 1), "steps": float(total)} for k, total in enumerate(steps)]
