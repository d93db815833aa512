"""Merging LoRA adapters in two spaces, and truncated SVD back to a LoRA of rank r.

For a LoRA module with scaling s = lora_alpha / r the update is Delta = s B A. Given the K clients' adapters:

- ``ab`` space (FedIT's): the operator merges the A's and the B's separately; A_G = M({A_k}), B_G = alpha M({B_k}).
  A summing operator (task_arithmetic, iso_c) takes the A's with weights that sum to 1, so that A keeps its scale
  from round to round and the sum lives in B alone (Delta_G is then on the scale of the sum, as in ``knots``).
- ``knots`` space (KnOTS, Stoica et al., ICLR 2025): the stacked updates [Delta_1 .. Delta_K] = U S [V_1^T .. V_K^T]
  share one left basis U; the operator merges the per-client blocks S V_k^T, Delta_G = alpha U M({S V_k^T}), and a
  truncated SVD gives back (B_G, A_G) of rank r (FlexLoRA's step). The SVD runs on QR factors of [s_1 B_1 .. s_K B_K]
  and of each A_k^T (blockdiag(A_1..A_K) factors block by block), so no d x (K d) matrix is ever formed.

Tensors other than LoRA A/B pairs (a classification head) are averaged with the client weights in both spaces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import StateDict
from fedpeft.merging.operators import SUMMING_OPERATORS, apply_operator, operator_weights
from fedpeft.settings.server import MergeConfig, Split

_EXACT = torch.float64
_ISO_RANK_TOL = 1e-6  # as fedpeft.merging.operators.isotropic


def _working_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision adapters are merged in float32; float32 and float64 ones in their own precision."""
    return torch.promote_types(dtype, torch.float32)


def lora_pairs(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, str]]:
    """``{module: (A key, B key)}`` of the LoRA tensors in a PEFT state dict (``...lora_A.weight`` names)."""
    pairs: dict[str, tuple[str, str]] = {}
    for key in state:
        if ".lora_A." in key:
            module = key.split(".lora_A.")[0]
            b_key = key.replace(".lora_A.", ".lora_B.")
            if b_key in state:
                pairs[module] = (key, b_key)
    return pairs


def low_rank_svd(left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD U S V^T of ``left @ right`` (d_out x m times m x d_in) without forming the product.

    Returns U (d_out x p), S (p,), Vh (p x d_in), p = min(d_out, m, d_in), S in descending order.
    """
    q_left, r_left = torch.linalg.qr(left)
    q_right, r_right = torch.linalg.qr(right.transpose(0, 1))
    U_c, S, Vh_c = torch.linalg.svd(r_left @ r_right.transpose(0, 1), full_matrices=False)
    return q_left @ U_c, S, Vh_c @ q_right.transpose(0, 1)


def tsvd(matrix: torch.Tensor, rank: int) -> torch.Tensor:
    """The best rank-``rank`` approximation of ``matrix`` in Frobenius norm (Eckart-Young)."""
    U, S, Vh = torch.linalg.svd(matrix, full_matrices=False)
    return (U[:, :rank] * S[:rank]) @ Vh[:rank]


def lora_factors(
    U: torch.Tensor,
    S: torch.Tensor,
    Vh: torch.Tensor,
    rank: int,
    *,
    scaling: float = 1.0,
    split: Split = "sqrt",
    tol: float = 1e-5,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) of rank ``rank`` with s B A = the rank-``rank`` truncation of U diag(S) Vh.

    Directions whose singular value is at or below ``tol`` (or missing, when U S Vh has lower rank) get B's column
    zero and A's row drawn like a fresh LoRA's (uniform in +-1/sqrt(d_in), from ``seed``), so they stay trainable.
    """
    d_out, d_in = U.shape[0], Vh.shape[1]
    values = torch.zeros(rank, dtype=S.dtype)
    kept = min(rank, S.numel())
    values[:kept] = S[:kept] / scaling
    live = torch.zeros(rank, dtype=torch.bool)
    live[:kept] = S[:kept] > tol
    left = torch.zeros(d_out, rank, dtype=U.dtype)
    right = torch.zeros(rank, d_in, dtype=Vh.dtype)
    left[:, :kept] = U[:, :kept]
    right[:kept] = Vh[:kept]
    if split == "sqrt":
        B, A = left * values.sqrt(), values.sqrt()[:, None] * right
    elif split == "b":
        B, A = left * values, right
    else:
        B, A = left, values[:, None] * right
    if not bool(live.all()):
        generator = torch.Generator().manual_seed(seed)
        bound = 1.0 / d_in**0.5
        fresh = (torch.rand(rank, d_in, generator=generator, dtype=A.dtype) * 2 - 1) * bound
        A = torch.where(live[:, None], A, fresh)
        B = torch.where(live[None, :], B, torch.zeros_like(B))
    return B, A


def knots_factors(
    Bs: Sequence[torch.Tensor],
    As: Sequence[torch.Tensor],
    scalings: Sequence[float],
    *,
    operator: str = "mean",
    weights: Sequence[float] | None = None,
    density: float = 0.2,
    majority_sign: Literal["total", "frequency"] = "total",
    tol: float = 1e-5,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KnOTS: (U, M) with U M = M_op({Delta_k}) merged in the shared basis of the stacked updates.

    [s_1 B_1 A_1 .. s_K B_K A_K] = U S [V_1^T .. V_K^T] (singular values <= ``tol`` dropped); the operator merges
    the blocks S V_k^T. With ``mean``, U M = sum_k w_k s_k B_k A_k exactly. Returns U (d_out x m, orthonormal
    columns) and M (m x d_in).
    """
    work = _working_dtype(Bs[0].dtype)
    q_b, r_b = torch.linalg.qr(torch.cat([s * B.to(work) for s, B in zip(scalings, Bs, strict=True)], dim=1))
    q_as, r_as = zip(*(torch.linalg.qr(A.to(work).transpose(0, 1)) for A in As), strict=True)
    core = r_b @ torch.block_diag(*(r.transpose(0, 1) for r in r_as))
    U_c, S, Vh_c = torch.linalg.svd(core, full_matrices=False)
    m = int((S > tol).sum())
    U = q_b @ U_c[:, :m]
    blocks, start = [], 0
    for q_a in q_as:
        width = q_a.shape[1]
        blocks.append(S[:m, None] * (Vh_c[:m, start : start + width] @ q_a.transpose(0, 1)))
        start += width
    if m == 0:
        return U, torch.zeros(0, As[0].shape[1], dtype=work)
    merged = apply_operator(operator, blocks, weights, density=density, majority_sign=majority_sign, seed=seed)
    return U, merged


def merge_lora_states(
    states: Sequence[Mapping[str, torch.Tensor]],
    sizes: Sequence[float],
    cfg: MergeConfig,
    *,
    scaling: float | Mapping[str, float] = 1.0,
    seed: int = 0,
) -> StateDict:
    """Merge the clients' adapter state dicts (PEFT names) into one global adapter of the same shapes.

    Args:
        states: one adapter state dict per client, all with the same keys and shapes.
        sizes: the clients' training-sample counts (used when ``cfg.weighting == "data"``).
        cfg: operator, space, alpha and options.
        scaling: LoRA scaling s = lora_alpha / r, one float or ``{module: s}`` (module = key before ``.lora_A.``).
        seed: seed of DARE's drops and of re-initialized directions (derived per module).
    """
    if not states:
        return {}
    counts = list(sizes) if cfg.weighting == "data" else [1.0] * len(states)
    weights = operator_weights(cfg.operator, counts)
    mean_weights = operator_weights("mean", counts)
    # In the A/B space a summing operator sums the B's only: the A's are points near a shared random init, not
    # updates, and a sum of A's would multiply their scale by K every round (the clients start from A_G).
    a_weights = mean_weights if cfg.operator in SUMMING_OPERATORS else weights
    pairs = lora_pairs(states[0])
    lora_keys = {k for pair in pairs.values() for k in pair}
    merged: StateDict = {}
    for key, first in states[0].items():
        if key not in lora_keys:
            stack = [s[key].to(_EXACT) for s in states]
            merged[key] = apply_operator("mean", stack, mean_weights).to(first.dtype)
    density, sign = cfg.density, cfg.majority_sign
    for module, (a_key, b_key) in pairs.items():
        module_seed = derive_seed(seed, "merge", module)
        dtype = states[0][a_key].dtype
        As = [s[a_key].to(_working_dtype(dtype)) for s in states]
        Bs = [s[b_key].to(_working_dtype(dtype)) for s in states]
        if cfg.space == "ab":
            seed_a, seed_b = derive_seed(module_seed, "A"), derive_seed(module_seed, "B")
            A = apply_operator(cfg.operator, As, a_weights, seed=seed_a, density=density, majority_sign=sign)
            B = apply_operator(cfg.operator, Bs, weights, seed=seed_b, density=density, majority_sign=sign)
            B = cfg.alpha * B
        else:
            s = float(scaling[module] if isinstance(scaling, Mapping) else scaling)
            # Iso-C merges by the sum and flattens its spectrum below; the truncation then keeps the directions
            # that were the sum's strongest (the flat spectrum alone would leave the choice to rounding noise).
            isotropic = cfg.operator == "iso_c"
            U, M = knots_factors(
                Bs, As, [s] * len(states), operator="task_arithmetic" if isotropic else cfg.operator,
                weights=weights, tol=cfg.tol, seed=module_seed, density=density, majority_sign=sign,
            )  # fmt: skip
            rank = As[0].shape[0]
            if M.shape[0] == 0:
                U_g, S_g, Vh_g = U, torch.zeros(0, dtype=M.dtype), M
            else:
                U_m, S_g, Vh_g = torch.linalg.svd(cfg.alpha * M, full_matrices=False)
                U_g = U @ U_m
                if isotropic:
                    keep = S_g > _ISO_RANK_TOL * S_g[0]
                    U_g, Vh_g, S_g = U_g[:, keep], Vh_g[keep], S_g[keep].mean().expand(int(keep.sum())).clone()
            B, A = lora_factors(
                U_g, S_g, Vh_g, rank, scaling=s, split=cfg.split, tol=cfg.tol, seed=derive_seed(module_seed, "init")
            )
        merged[a_key] = A.to(dtype)
        merged[b_key] = B.to(dtype)
    return {k: merged[k] for k in states[0]}


def lora_delta(state: Mapping[str, torch.Tensor], module: str, scaling: float = 1.0) -> torch.Tensor:
    """The dense update s B A of one module of an adapter state dict, in the (out, in) layout of B A; a layer that
    stores its weight (in, out), GPT-2's ``Conv1D``, takes it through :func:`fedpeft.models.targets.to_weight_layout`.
    """
    a_key, b_key = f"{module}.lora_A.weight", f"{module}.lora_B.weight"
    return scaling * (state[b_key].to(_EXACT) @ state[a_key].to(_EXACT))
