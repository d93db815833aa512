"""The runtime's training: the one training loop (:func:`fedpeft.training.train_loop`) on the runtime's model.

A :class:`Trainer` picks what trains (the active adapter, every base weight, or given parameters), draws the
shuffled minibatches (with gradient accumulation, the micro-batches of each step), counts the steps and runs the
loop under the weights' precision (autocast, and a loss scaler for float16).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from fedpeft.core.errors import UserError
from fedpeft.core.types import Metrics
from fedpeft.data.types import Example
from fedpeft.models.text import TextEncoder
from fedpeft.models.weights import ModelWeights
from fedpeft.training import Batch, Step, TrainArgs, train_loop


class Trainer:
    """Training of a runtime's model on examples.

    Args:
        weights: the model and its adapters.
        text: how examples become tensors.
        grad_accum_steps: micro-batches per optimizer step (``train.grad_accum_steps``).
        max_steps: the most optimizer steps of one training call, whatever its epochs or steps
            (``train.max_steps``; ``None``: no cap); a rehearsal cuts every client's training with it.
    """

    def __init__(
        self, weights: ModelWeights, text: TextEncoder, *, grad_accum_steps: int = 1, max_steps: int | None = None
    ) -> None:
        self.weights = weights
        self.text = text
        self.grad_accum_steps = grad_accum_steps
        self.max_steps = max_steps
        # float16 gradients underflow without loss scaling; the scaler's scale carries over between train calls.
        self.scaler = torch.amp.GradScaler(weights.device.type) if weights.dtype == torch.float16 else None

    def steps_for(self, n_examples: int, batch_size: int, epochs: float | None, steps: int | None) -> int:
        """Number of optimizer steps for ``steps`` or ``epochs`` passes over ``n_examples``.

        With gradient accumulation ``batch_size`` is the examples of one step (micro-batch size x accumulation).
        At most ``max_steps`` when that is set.
        """
        if steps is None:
            steps = max(1, math.ceil(float(epochs or 1.0) * math.ceil(n_examples / batch_size)))
        return steps if self.max_steps is None else min(steps, self.max_steps)

    def batches(self, examples: list[Example], batch_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
        """An endless stream of shuffled minibatches; each pass over the data is a new permutation."""
        for chunk in _chunks(examples, batch_size, seed):
            yield self._to_device(self.text.encode(chunk))

    def accumulated_batches(
        self, examples: list[Example], batch_size: int, accumulation: int, seed: int
    ) -> Iterator[list[Batch]]:
        """An endless stream of optimizer steps, each the micro-batches (of ``batch_size``) of one batch of
        ``batch_size * accumulation`` examples drawn as :meth:`batches` draws them: the same examples in the
        same order as ``batches(examples, batch_size * accumulation, seed)``."""
        for chunk in _chunks(examples, batch_size * accumulation, seed):
            yield [
                self._to_device(self.text.encode(chunk[start : start + batch_size]))
                for start in range(0, len(chunk), batch_size)
            ]

    def _to_device(self, batch: dict[str, torch.Tensor]) -> Batch:
        return {k: v.to(self.weights.device) for k, v in batch.items()}

    def train(
        self, examples: list[Example], args: TrainArgs, params: dict[str, torch.nn.Parameter] | str = "adapter"
    ) -> Metrics:
        """Train ``params`` (``"adapter"``, ``"all"`` base weights, or an explicit dict) on ``examples`` as ``args``
        says (``args.model``: the module to call instead of the weights' own).

        With ``grad_accum_steps`` k above 1 a step accumulates k micro-batches of ``args.batch_size``: the same step
        as one batch of ``batch_size * k`` (:meth:`accumulated_batches`), and ``args.epochs`` count those steps.
        """
        if not examples:
            raise ValueError("no training examples")
        weights = self.weights
        if params == "adapter":
            params = weights.adapter_parameters()
        elif params == "all":
            if weights.quantized:
                raise UserError(
                    "A quantized base model (model.quantization) cannot train its own weights; "
                    "train adapters only, or drop model.quantization."
                )
            params = weights.base_params
        assert isinstance(params, dict)
        weights.keep_trained(params.values())  # base weights a client trains are restored after it
        if self.scaler is not None and any(p.dtype == torch.float16 for p in params.values()):
            raise UserError(
                "model.dtype float16 trains adapters only (float16 weights cannot be updated with "
                "loss scaling); use bfloat16 to train the base weights."
            )
        accumulation, batch_size, seed = self.grad_accum_steps, args.batch_size, args.seed
        total = self.steps_for(len(examples), batch_size * accumulation, args.epochs, args.steps)
        stream: Iterator[Step] = (
            self.batches(examples, batch_size, seed)
            if accumulation == 1
            else self.accumulated_batches(examples, batch_size, accumulation, seed)
        )
        model = args.model if args.model is not None else weights.model()
        with weights.adapter_context():
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return train_loop(
                    model,
                    stream,
                    params,
                    args,
                    steps=total,
                    autocast=None if weights.dtype == torch.float32 else weights.autocast,
                    scaler=self.scaler,
                    epoch_steps=math.ceil(len(examples) / (batch_size * accumulation)),
                )


def _chunks(examples: list[Example], size: int, seed: int) -> Iterator[list[Example]]:
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(examples), generator=generator).tolist()
        for start in range(0, len(order), size):
            yield [examples[i] for i in order[start : start + size]]
