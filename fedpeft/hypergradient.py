"""Hypergradients by the implicit function theorem with a truncated Neumann series.

J. Lorraine, P. Vicol, D. Duvenaud, "Optimizing Millions of Hyperparameters by Implicit Differentiation",
AISTATS 2020, https://arxiv.org/abs/1911.02590 (the hypergradient FedL2P uses). At a stationary point w* of the
inner loss L_T(w, lambda), the implicit function theorem gives

    dL_V/dlambda = dL_V/dlambda|_direct - (d^2 L_T / dlambda dw) H^{-1} dL_V/dw,      H = d^2 L_T / dw dw,

and H^{-1} v is approximated by psi * sum_{j=0..Q} (I - psi H)^j v (it converges to H^{-1} v as Q grows when
0 < psi < 2 / ||H||). Pure functions of gradients built with autograd: no model, no optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Tensors = list[torch.Tensor]


def neumann_inverse_hvp(
    hvp: Callable[[Tensors], Sequence[torch.Tensor]], vector: Sequence[torch.Tensor], *, steps: int, psi: float
) -> Tensors:
    """psi * sum_{j=0..steps} (I - psi H)^j v, the truncated Neumann approximation of H^{-1} v.

    Args:
        hvp: ``v -> H v`` for a list of tensors shaped like ``vector``.
        vector: v.
        steps: Q, the number of Hessian-vector products.
        psi: the step of the series.
    """
    term = [v.detach().clone() for v in vector]
    total = [t.clone() for t in term]
    for _ in range(steps):
        products = hvp(term)
        term = [t - psi * h.detach() for t, h in zip(term, products, strict=True)]
        total = [a + t for a, t in zip(total, term, strict=True)]
    return [psi * a for a in total]


def _grads(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor]) -> Tensors:
    grads = torch.autograd.grad(outputs, inputs, grad_outputs=weights, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs, strict=True)]


def ift_hypergradient(
    val_grads: Sequence[torch.Tensor],
    train_grads: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    hparams: Sequence[torch.Tensor],
    *,
    steps: int = 3,
    psi: float = 0.1,
    clamp: float | None = 1.0,
    direct: Sequence[torch.Tensor] | None = None,
) -> Tensors:
    """The implicit-function-theorem hypergradient of the outer loss with respect to ``hparams``.

    Args:
        val_grads: dL_V/dw at the inner solution, one tensor per parameter.
        train_grads: dL_T/dw at the same point, computed with ``create_graph=True`` so that they can be
            differentiated again with respect to ``params`` and ``hparams``.
        params: w, the tensors ``train_grads`` were taken with respect to.
        hparams: lambda, the tensors the hypergradient is taken with respect to.
        steps: Q, the Neumann steps.
        psi: the Neumann step size.
        clamp: clamp every hypergradient entry to [-clamp, clamp] (``None``: no clamping).
        direct: dL_V/dlambda through L_V's own dependence on lambda, if it has one.

    Returns:
        One tensor per hyperparameter.
    """
    inverse = neumann_inverse_hvp(lambda v: _grads(train_grads, params, v), val_grads, steps=steps, psi=psi)
    mixed = _grads(train_grads, hparams, inverse)
    result = [-m if direct is None else d - m for m, d in zip(mixed, direct or mixed, strict=True)]
    if clamp is not None:
        result = [r.clamp(-clamp, clamp) for r in result]
    return result
