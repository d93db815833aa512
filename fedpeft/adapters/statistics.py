"""Client statistics: mean and standard deviation of the input features of every LoRA-targeted layer.

FedP2EFT's PSG and FedL2P's learning-rate MLP read a client's data through these statistics: for each layer l
that LoRA wraps, the mean and the standard deviation of that layer's input h_{l-1} over all features and all
(non-padding) tokens of all the client's training samples, computed with the frozen base model and no adapter.
The result is ``[E(h_0), SD(h_0), ..., E(h_{L-1}), SD(h_{L-1})]``, 2L scalars in the order of
``ModelRuntime.target_modules``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedpeft.data.types import Example

if TYPE_CHECKING:
    from fedpeft.models.runtime import ModelRuntime


@torch.no_grad()
def feature_statistics(runtime: ModelRuntime, examples: list[Example], batch_size: int = 64) -> torch.Tensor:
    """The 2L input-feature statistics of ``examples`` under the runtime's base model.

    Args:
        runtime: a :class:`~fedpeft.models.runtime.ModelRuntime`; its current base weights are used and any
            adapter is bypassed.
        examples: the client's training examples (their first ``train.max_statistics_batches`` batches where a
            rehearsal sets it: the runtime's ``statistics_max_batches``).
        batch_size: examples per forward pass (does not change the result beyond float rounding).

    Returns:
        A float32 tensor of shape ``(2 * L,)``: mean and SD of each targeted layer's input, interleaved.
    """
    if not examples:
        raise ValueError("feature statistics need at least one example")
    cap = runtime.statistics_max_batches  # a rehearsal's cut (``train.max_statistics_batches``)
    examples = examples if cap is None else examples[: cap * batch_size]
    modules = [module for _, module in runtime.target_modules]
    count = len(modules)
    # Accumulated where the features are (a GPU's 0-dim sums cannot be added into CPU tensors).
    sums = torch.zeros(count, dtype=torch.float64, device=runtime.device)
    squares = torch.zeros(count, dtype=torch.float64, device=runtime.device)
    sizes = torch.zeros(count, dtype=torch.float64, device=runtime.device)
    mask: dict[str, torch.Tensor] = {}

    def hook_for(index: int):  # noqa: ANN202
        def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            features = inputs[0].detach().to(torch.float64)
            keep = mask.get("tokens")  # none for image inputs: every position counts
            if keep is not None and features.dim() == 3 and keep.shape == features.shape[:2]:
                features = features[keep]
            features = features.reshape(-1, features.shape[-1])
            sums[index] += features.sum()
            squares[index] += (features * features).sum()
            sizes[index] += features.numel()

        return hook

    handles = [module.register_forward_pre_hook(hook_for(i)) for i, module in enumerate(modules)]
    body = statistics_module(runtime.base_model, modules)
    previous = runtime.active
    model = runtime.activate(None)
    was_training = model.training
    model.eval()
    try:
        with runtime.forward_context():
            for start in range(0, len(examples), batch_size):
                encoded = runtime.encode(examples[start : start + batch_size])
                batch = {k: v.to(runtime.device) for k, v in encoded.items()}
                batch.pop("labels", None)
                mask.pop("tokens", None)
                if "attention_mask" in batch:
                    mask["tokens"] = batch["attention_mask"].bool()
                body(**batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
        if previous is not None:
            runtime.activate(previous)
    mean = sums / sizes.clamp_min(1.0)
    variance = (squares / sizes.clamp_min(1.0) - mean * mean).clamp_min(0.0)
    return torch.stack([mean, variance.sqrt()], dim=1).reshape(-1).to("cpu", torch.float32)


def statistics_module(model: torch.nn.Module, targets: list[torch.nn.Module]) -> torch.nn.Module:
    """The part of ``model`` the statistics run: its transformer body (transformers' ``base_model``, e.g. the
    decoder of a causal LM, the encoder of a classifier) when every targeted layer lies inside it, else all of it.

    The statistics read the inputs of the body's layers only. Skipping the task head matters for causal LMs with
    large vocabularies: Gemma 3's output projection onto 262,144 tokens costs more than its 18 blocks together,
    and its logits (batch x length x 262,144 floats) are thrown away.
    """
    body = getattr(model, "base_model", model)
    if body is model or not isinstance(body, torch.nn.Module):
        return model
    inside = {id(module) for module in body.modules()}
    return body if all(id(module) in inside for module in targets) else model
