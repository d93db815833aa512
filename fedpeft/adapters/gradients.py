"""Per-sample gradients of the task loss with respect to the active adapter's tensors, with torch.func.

Merging methods weigh coordinates by how the loss of single samples reacts to them (diagonal empirical Fisher,
gradient correlations). :func:`per_sample_gradients` computes one gradient per example with
``vmap(grad(functional_call(...)))`` over the PEFT model, in eval mode (dropout off).

Each example is encoded on its own, so it carries no padding; examples of equal encoded shape are stacked and
vmapped together. Without padding the attention mask is all ones and is left out, which keeps transformers'
mask construction free of data-dependent branches that vmap cannot trace. Causal LMs (generation) take the
whole right-padded batch at once: a token never attends to the padding on its right and padded labels carry no
loss, so leaving the mask out changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch.func import functional_call, grad, vmap

from fedpeft.data.types import Example
from fedpeft.training import logits_cut

if TYPE_CHECKING:
    from fedpeft.models.runtime import ModelRuntime


def state_key(param_name: str, adapter: str) -> str:
    """A PEFT parameter name -> its key in ``get_peft_model_state_dict`` (adapter name dropped).

    ``...q_proj.lora_A.<adapter>.weight`` -> ``...q_proj.lora_A.weight`` and
    ``...classifier.modules_to_save.<adapter>.weight`` -> ``...classifier.weight``.
    """
    return param_name.replace(f".modules_to_save.{adapter}.", ".").replace(f".{adapter}.", ".")


def adapter_parameters_by_key(
    runtime: ModelRuntime, select: Callable[[str], bool] | None = None
) -> dict[str, torch.nn.Parameter]:
    """The active adapter's parameters keyed like :meth:`ModelRuntime.adapter_state`, optionally filtered."""
    assert runtime.active is not None
    adapter = runtime.active.key
    params = {state_key(name, adapter): p for name, p in runtime.adapter_parameters().items()}
    return {k: p for k, p in params.items() if select is None or select(k)}


def _shape_groups(encoded: Sequence[dict[str, torch.Tensor]]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for index, batch in enumerate(encoded):
        signature = tuple((k, tuple(v.shape)) for k, v in sorted(batch.items()))
        groups.setdefault(signature, []).append(index)
    return groups


def per_sample_gradients(
    runtime: ModelRuntime, examples: Sequence[Example], select: Callable[[str], bool] | None = None
) -> tuple[torch.Tensor, list[tuple[str, torch.Size]]]:
    """Gradients of each example's loss w.r.t. the active adapter's tensors, flattened into rows.

    Args:
        runtime: a :class:`~fedpeft.models.runtime.ModelRuntime` with the adapter of interest installed.
        examples: the samples (one gradient each).
        select: keeps the adapter tensors (by state key) to differentiate; all of them by default.

    Returns:
        ``(gradients, layout)``: a float32 ``(len(examples), J)`` tensor whose columns are the selected tensors
        flattened and concatenated in ``layout`` order (``[(state key, shape), ...]``).
    """
    params = adapter_parameters_by_key(runtime, select)
    if not params:
        raise ValueError("no adapter tensor selected for per-sample gradients")
    assert runtime.active is not None and runtime.peft is not None
    names = {key: name for name, key in ((n, state_key(n, runtime.active.key)) for n in runtime.adapter_parameters())}
    model = runtime.peft
    detached = {names[k]: p.detach() for k, p in params.items()}
    layout = [(k, p.shape) for k, p in params.items()]

    cut: dict[str, int] = {}  # a causal LM's logits from the first position a loss reads (labelled_tail)

    def loss(weights: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs: dict[str, object] = {k: v.unsqueeze(0) for k, v in batch.items()}
        return functional_call(model, weights, args=(), kwargs={**inputs, **cut}, strict=False).loss

    per_example = grad(loss)
    encoded = []
    if runtime.task == "generation":
        # A causal LM never attends to the right padding of its own row and the padded labels are -100, so the
        # whole right-padded batch is exact without its mask: one vmap over every example.
        batch = {k: v.to(runtime.device) for k, v in runtime.encode(list(examples)).items()}
        batch.pop("attention_mask", None)
        keep, batch["labels"] = logits_cut(model, batch["labels"])  # logits only where the loss reads them
        if isinstance(keep, torch.Tensor):  # positions per row: each example's own
            batch["logits_to_keep"] = keep
        elif keep is not None:
            cut["logits_to_keep"] = keep
        encoded = [{k: v[i] for k, v in batch.items()} for i in range(len(examples))]
    for example in examples if not encoded else []:
        batch = {k: v.to(runtime.device) for k, v in runtime.encode([example]).items()}
        mask = batch.get("attention_mask")
        if mask is not None and bool(mask.all()):
            batch.pop("attention_mask")
        encoded.append({k: v[0] for k, v in batch.items()})
    rows: list[torch.Tensor | None] = [None] * len(encoded)
    was_training = model.training
    model.eval()
    attention = _eager_attention(runtime.base_model)
    padding_warning = _without_padding_warning(runtime.base_model)
    try:
        # grad differentiates inside; nothing outside the transform needs a graph
        with torch.no_grad(), runtime.autocast():
            for indices in _shape_groups(encoded).values():
                stacked = {k: torch.stack([encoded[i][k] for i in indices]) for k in encoded[indices[0]]}
                grads = vmap(per_example, in_dims=(None, 0))(detached, stacked)
                flat = torch.cat([grads[names[k]].reshape(len(indices), -1) for k, _ in layout], dim=1)
                for position, index in enumerate(indices):
                    rows[index] = flat[position]
    finally:
        model.train(was_training)
        attention()
        padding_warning()
    return torch.stack(rows).float(), layout  # type: ignore[arg-type]


_PADDING_CHECK = "warn_if_padding_and_no_attention_mask"  # transformers' PreTrainedModel method


def _without_padding_warning(model: torch.nn.Module) -> Callable[[], None]:
    """Silence transformers' check for padding without an attention mask (GPT-2 runs it on every forward pass)
    in ``model`` and its submodels; returns the function that restores it.

    The check reads token ids in a Python ``if`` (``pad_token_id in input_ids``), which vmap cannot trace; the
    examples here carry no padding, or padding that changes nothing (module docstring), so it has nothing to say.
    """
    silenced = [m for m in model.modules() if callable(getattr(m, _PADDING_CHECK, None))]
    for module in silenced:
        setattr(module, _PADDING_CHECK, _no_warning)  # an instance attribute over the class's method

    def restore() -> None:
        for module in silenced:
            delattr(module, _PADDING_CHECK)

    return restore


def _no_warning(*args: object, **kwargs: object) -> None:
    return None


def _eager_attention(model: torch.nn.Module) -> Callable[[], None]:
    """Switch a transformers model from SDPA to eager attention; returns the function that switches back.

    vmap has no batching rule for CPU SDPA kernels and falls back to a slow per-sample loop; eager attention is
    plain matmuls and softmax, which vmap batches (same numbers up to float rounding).
    """
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switch = getattr(model, "set_attn_implementation", None)  # transformers models only
    if current != "sdpa" or switch is None:
        return lambda: None
    try:
        switch("eager")
    except (ValueError, ImportError):
        return lambda: None
    return lambda: switch(current)
