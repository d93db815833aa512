"""Client-side guidance by a global LoRA: regularizers and client-global similarities, as pure tensor functions.

From "From Aggregation to Guidance: Strategies for Personalized Federated Fine-Tuning of Foundation Models"
(Piórczyński, Łapacz et al., 2025). A client trains L = (1 - beta) L_SFT + beta L_REG with

- ``l2``: L_REG = sum over modules of ||A_k - A_G||_F^2 + ||B_k - B_G||_F^2 (:func:`l2_distance`);
- ``kd``: L_REG = T^2 * KL(p_k || p_G) with p = softmax(logits / T), averaged over each sample's response tokens
  and then over samples (:func:`kd_loss`);

and beta may be scaled per client by a similarity s_k in [0, 1] between its local LoRA and the global one:
cosine of the flattened factors or of the products B A (:func:`cosine_similarity`), or the subspace alignment
ratio (:func:`subspace_alignment_ratio`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F

from fedpeft.merging.lora import lora_delta, lora_pairs, low_rank_svd

IGNORE_INDEX = -100


def l2_distance(params: Mapping[str, torch.Tensor], anchors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """sum over shared names of ||params[n] - anchors[n]||_F^2 (differentiable in ``params``)."""
    terms = [((params[n] - anchors[n].to(params[n].device, params[n].dtype)) ** 2).sum() for n in anchors]
    if not terms:
        raise ValueError("no tensor to regularize toward")
    return torch.stack(terms).sum()


def kd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    temperature: float = 2.0,
    direction: Literal["student_teacher", "teacher_student"] = "student_teacher",
) -> torch.Tensor:
    """T^2 * KL between softened student and teacher distributions.

    Args:
        student_logits: class logits ``(batch, classes)`` or causal-LM logits ``(batch, length, vocab)``.
        teacher_logits: the same shape, without gradient.
        labels: for causal-LM logits, the training labels (``-100`` outside the response); logits at position
            i are scored when the label at i + 1 is a response token (the next-token shift).
        temperature: T.
        direction: ``student_teacher`` = KL(p_student || p_teacher) (the paper's), ``teacher_student`` the reverse.

    Returns:
        A scalar: the per-sample mean over response tokens, averaged over samples (over the batch for classes).
    """
    log_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    if direction == "student_teacher":
        pointwise = (log_s.exp() * (log_s - log_t)).sum(-1)
    else:
        pointwise = (log_t.exp() * (log_t - log_s)).sum(-1)
    scale = temperature**2
    if pointwise.dim() == 1:
        return scale * pointwise.mean()
    if labels is None:
        return scale * pointwise.mean()
    mask = (labels[:, 1:] != IGNORE_INDEX).to(pointwise.dtype)
    per_token = pointwise[:, :-1] * mask
    tokens = mask.sum(-1)
    has = tokens > 0
    if not bool(has.any()):
        return student_logits.sum() * 0.0
    return scale * (per_token.sum(-1)[has] / tokens[has]).mean()


def _flat(state: Mapping[str, torch.Tensor], keys: list[str]) -> torch.Tensor:
    return torch.cat([state[k].detach().to(torch.float64).reshape(-1) for k in keys])


def cosine_similarity(
    local: Mapping[str, torch.Tensor],
    global_: Mapping[str, torch.Tensor],
    *,
    on: Literal["factors", "products"] = "factors",
    scaling: float = 1.0,
) -> float:
    """Cosine between the client's and the global LoRA: of all A and B flattened, or of all products s B A.

    The product form does not change when a factor is scaled by c and the other by 1 / c.
    """
    pairs = lora_pairs(global_)
    if on == "factors":
        keys = [k for pair in pairs.values() for k in pair]
        a, b = _flat(local, keys), _flat(global_, keys)
    else:
        a = torch.cat([lora_delta(local, m, scaling).reshape(-1) for m in pairs])
        b = torch.cat([lora_delta(global_, m, scaling).reshape(-1) for m in pairs])
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else 0.0


def energy_rank(singular_values: torch.Tensor, energy: float = 0.95) -> int:
    """The fewest top singular values whose cumulative energy sqrt(cumsum s^2 / sum s^2) reaches ``energy``."""
    squares = singular_values.to(torch.float64) ** 2
    total = float(squares.sum())
    if total <= 0:
        return 0
    cumulative = (squares.cumsum(0) / total).sqrt()
    return int((cumulative < energy - 1e-12).sum()) + 1


def subspace_alignment_ratio(
    local: Mapping[str, torch.Tensor],
    global_: Mapping[str, torch.Tensor],
    *,
    energy: float = 0.95,
) -> float:
    """SAR: mean over modules of ||Pi_G Delta_k||_F / ||Delta_k||_F.

    Pi_G projects onto the top left singular vectors of Delta_G = B_G A_G that reach ``energy``
    (:func:`energy_rank`). Modules where either update is zero count as 0. The LoRA scaling cancels out.
    """
    ratios = []
    for a_key, b_key in lora_pairs(global_).values():
        B_k, A_k = local[b_key].to(torch.float64), local[a_key].to(torch.float64)
        U, S, _ = low_rank_svd(global_[b_key].to(torch.float64), global_[a_key].to(torch.float64))
        k = energy_rank(S, energy)
        norm = float(torch.linalg.matrix_norm(B_k @ A_k))
        if k == 0 or norm == 0.0:
            ratios.append(0.0)
            continue
        projected = U[:, :k].transpose(0, 1) @ B_k @ A_k
        ratios.append(float(torch.linalg.matrix_norm(projected)) / norm)
    return sum(ratios) / len(ratios) if ratios else 0.0


def weighted_beta(beta: float, similarity: float) -> float:
    """beta_k = beta * s_k with s_k clipped to [0, 1]."""
    return beta * min(1.0, max(0.0, similarity))
