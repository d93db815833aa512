"""Folding LoRA products into the frozen base weights, shared by FLoRA, FedEX-LoRA, FedSVD and ReLoRA (guided).

The methods here keep an update of the base weights (the part of the global model that lives in the weights rather
than in an adapter) as one full-size tensor per LoRA module, under the key ``<module>.base_delta`` next to the
adapter tensors of the server state (``<module>.lora_A.weight`` ...). A client's model is then the base weights
with those deltas added (:func:`folded_weights`) plus whatever adapter the method installs on top.

Keys follow ``ModelRuntime.adapter_state()``: PEFT names (``base_model.model.<module>.lora_A.weight``); the base
weight a module adapts is ``<module>.weight`` without the PEFT prefix (:func:`base_weight_key`). Only plain LoRA
modules (2-D factors) fold; fused expert LoRA is refused by :func:`lora_modules`.

A ``<module>.base_delta`` is kept in the (out, in) layout of the product B A, whatever layout the layer stores its
weight in, so the server sums and checks products without knowing the model; :func:`folded_weights` puts it in the
weight's layout when it adds it (transposed for GPT-2's ``Conv1D``, whose weight is (in, out), as PEFT's merge
does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedpeft.core.errors import UserError
from fedpeft.core.types import StateDict
from fedpeft.models.runtime import ModelRuntime
from fedpeft.models.targets import in_out_weight_names, to_lora_layout, to_weight_layout

PEFT_PREFIX = "base_model.model."
DELTA = ".base_delta"
A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"


def lora_modules(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """The module keys of the plain LoRA modules in ``tensors`` (each with a 2-D A and B), in key order."""
    modules = []
    for key, tensor in tensors.items():
        if key.endswith(A_SUFFIX):
            module = key[: -len(A_SUFFIX)]
            b = tensors.get(module + B_SUFFIX)
            if tensor.dim() != 2 or b is None or b.dim() != 2:
                raise UserError(f"LoRA module {module} is not a plain linear LoRA; this method folds only those.")
            modules.append(module)
    return modules


def is_delta(key: str) -> bool:
    """Whether ``key`` names a folded base update (``<module>.base_delta``)."""
    return key.endswith(DELTA)


def delta_key(module: str) -> str:
    return module + DELTA


def module_of_delta(key: str) -> str:
    return key[: -len(DELTA)]


def base_weight_key(module: str) -> str:
    """The base parameter a LoRA module adapts (``base_model.model.x.query`` -> ``x.query.weight``)."""
    return module.removeprefix(PEFT_PREFIX) + ".weight"


def head_keys(adapter: Mapping[str, torch.Tensor]) -> list[str]:
    """The keys of an adapter state that are not LoRA factors (the task head) nor folded updates."""
    return [k for k in adapter if ".lora_A." not in k and ".lora_B." not in k and not is_delta(k)]


def lora_scaling(alpha: float | None, rank: int) -> float:
    """The LoRA scaling alpha / r (alpha defaults to 2 * r, as in ``lora_spec``)."""
    return float(alpha if alpha is not None else 2 * rank) / rank


def stack_factors(
    factors: Sequence[tuple[torch.Tensor, torch.Tensor]], coefficients: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """FLoRA's stacking: A_k stacked as rows (each times its coefficient c_k), B_k as columns, in float64.

    Returns (A, B) of rank sum_k r_k with ``B @ A == sum_k c_k B_k A_k`` exactly (up to float64 rounding), for
    factors of any ranks r_k. ``factors``: (A_k of shape (r_k, in), B_k of shape (out, r_k)).
    """
    a = torch.cat([c * ak.to(torch.float64) for (ak, _), c in zip(factors, coefficients, strict=True)], dim=0)
    b = torch.cat([bk.to(torch.float64) for _, bk in factors], dim=1)
    return a, b


def refactor(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The SVD re-factorization of ``M = B A`` at the same rank r: A' = V_r^T (orthonormal rows), B' = U_r S_r.

    ``B' A' == B A`` exactly (M has rank at most r). Computed in float64 without forming M: A^T = Q R (thin QR),
    B R^T = U S W^T (an (out, r) SVD), so M = U S (Q W)^T. Returns the factors in the dtypes of ``a`` and ``b``.
    """
    q, r = torch.linalg.qr(a.to(torch.float64).T)
    u, s, wh = torch.linalg.svd(b.to(torch.float64) @ r.T, full_matrices=False)
    return (q @ wh.T).T.contiguous().to(a.dtype), (u * s).contiguous().to(b.dtype)


def add_deltas(previous: StateDict, deltas: Mapping[str, torch.Tensor]) -> StateDict:
    """``previous`` (``<module>.base_delta`` tensors) plus ``deltas`` (by module), summed in float64 and kept in
    the dtype of ``previous``."""
    out = dict(previous)
    for module, delta in deltas.items():
        key = delta_key(module)
        out[key] = (out[key].to(torch.float64) + delta.to(torch.float64)).to(out[key].dtype)
    return out


def in_out_weights(runtime: ModelRuntime) -> frozenset[str]:
    """The base weights (canonical names) of the layers LoRA wraps that are stored (in, out) (GPT-2's ``Conv1D``)."""
    return in_out_weight_names(runtime.target_modules)


def zero_deltas(runtime: ModelRuntime, modules: Sequence[str]) -> StateDict:
    """A zero ``<module>.base_delta`` of each module's (out, in) shape and its base weight's dtype."""
    in_out = in_out_weights(runtime)
    out = {}
    for module in modules:
        name = base_weight_key(module)
        weight = to_lora_layout(runtime.base_params[name], name in in_out)
        out[delta_key(module)] = torch.zeros(weight.shape, dtype=weight.dtype)
    return out


def folded_weights(runtime: ModelRuntime, tensors: Mapping[str, torch.Tensor], head: bool = False) -> StateDict:
    """The base tensors the ``<module>.base_delta`` entries of ``tensors`` change: W0 + delta, W0 being the weights
    :meth:`ModelRuntime.load_base` restores (the base the phase started from, with any client base); with
    ``head`` also the task head of ``tensors`` as base tensors (the head of a model without adapter).

    Restores those weights into the runtime (``load_base(None)``) to read them.
    """
    runtime.load_base(None)
    in_out = in_out_weights(runtime)
    out: StateDict = {}
    for key, delta in tensors.items():
        if is_delta(key):
            name = base_weight_key(module_of_delta(key))
            weight = runtime.base_params[name].detach()
            folded = to_weight_layout(delta.to(torch.float64), name in in_out)
            out[name] = (weight.to(torch.float64) + folded).to(weight.dtype)
    if head:
        for key in head_keys(tensors):
            out[key.removeprefix(PEFT_PREFIX)] = tensors[key].detach().clone()
    return out


def full_base(runtime: ModelRuntime, overrides: Mapping[str, torch.Tensor]) -> StateDict:
    """Every base tensor of the runtime's restored base weights, with ``overrides`` in place."""
    runtime.load_base(None)
    return {**runtime.base_state(), **{k: v.detach().clone() for k, v in overrides.items()}}
