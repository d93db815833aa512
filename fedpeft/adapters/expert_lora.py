"""LoRA factors per expert and per rank component, as pure tensor functions.

PEFT's ``target_parameters`` puts one LoRA on a fused expert tensor of E experts: ``lora_A`` of shape
(r * E, in) whose rows ``j*r .. (j+1)*r - 1`` are expert j's A^j, and ``lora_B`` of shape (out, r * E) whose
columns ``j, j + E, j + 2E, ...`` are expert j's B^j (PEFT reads B as (out, r, E)). Expert j's update is
``scaling * B^j @ A^j``. A plain LoRA module (``lora_A`` (r, in), ``lora_B`` (out, r)) is the case E = 1, so
every function here serves both.

Rank components are ordered: component c of expert j is row c of A^j and column c of B^j. HetLoRA truncates to
the first components and zero-pads back; FlexLoRA rebuilds factors from an SVD.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedpeft.core.jsontypes import JSONObject

A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"


@dataclass(frozen=True)
class LoraModule:
    """One LoRA-carrying module of an adapter state.

    Attributes:
        key: the state-key prefix (``key + ".lora_A.weight"``, ``key + ".lora_B.weight"``).
        experts: number of experts of a fused expert tensor; 1 for a plain module.
        block: the MoE block (module name in the base model) whose router feeds the experts; ``None`` if plain.
    """

    key: str
    experts: int = 1
    block: str | None = None

    def to_dict(self) -> JSONObject:
        return {"key": self.key, "experts": self.experts, "block": self.block}


def module_key(state_key: str) -> str | None:
    """The module prefix of a LoRA factor's state key, ``None`` for other tensors (heads)."""
    for suffix in (A_SUFFIX, B_SUFFIX):
        if state_key.endswith(suffix):
            return state_key[: -len(suffix)]
    return None


def lora_layout(peft_model: torch.nn.Module, adapter: str, blocks: list[str]) -> dict[str, LoraModule]:
    """Every LoRA module of adapter ``adapter`` on ``peft_model``, by state-key prefix.

    Args:
        peft_model: the PEFT model.
        adapter: the adapter name.
        blocks: names of the MoE blocks in the base model (to tie fused expert LoRA to its router).
    """
    from peft.tuners.lora import LoraLayer

    layout: dict[str, LoraModule] = {}
    for name, module in peft_model.named_modules():
        if not isinstance(module, LoraLayer) or adapter not in module.lora_A:
            continue
        experts = int(getattr(module, "num_experts", 1) or 1)
        block = None
        if experts > 1:
            inner = name.removeprefix("base_model.model.")
            owners = [b for b in blocks if inner.startswith(b + ".")]
            block = max(owners, key=len) if owners else None
        layout[name] = LoraModule(name, experts, block)
    return layout


# ------------------------------------------------------------------------------------------ expert blocks


def split_a(a: torch.Tensor, experts: int) -> torch.Tensor:
    """``lora_A`` (r * E, in) -> per-expert A^j, shape (E, r, in)."""
    return a.reshape(experts, -1, a.shape[-1])


def split_b(b: torch.Tensor, experts: int) -> torch.Tensor:
    """``lora_B`` (out, r * E) -> per-expert B^j, shape (E, out, r)."""
    return b.reshape(b.shape[0], -1, experts).permute(2, 0, 1)


def join_a(blocks: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_a`."""
    return blocks.reshape(-1, blocks.shape[-1])


def join_b(blocks: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_b`."""
    experts, out, rank = blocks.shape
    return blocks.permute(1, 2, 0).reshape(out, rank * experts)


def truncate(a: torch.Tensor, b: torch.Tensor, experts: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``rank`` components of every expert (HetLoRA's and FlexLoRA's download to a smaller client)."""
    a_blocks, b_blocks = split_a(a, experts), split_b(b, experts)
    return join_a(a_blocks[:, :rank].contiguous()), join_b(b_blocks[:, :, :rank].contiguous())


def zero_pad(a: torch.Tensor, b: torch.Tensor, experts: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every expert's factors padded with zero components up to ``rank`` (the update B A is unchanged)."""
    a_blocks, b_blocks = split_a(a, experts), split_b(b, experts)
    missing = rank - a_blocks.shape[1]
    if missing < 0:
        raise ValueError(f"cannot pad rank {a_blocks.shape[1]} down to {rank}")
    a_pad = torch.cat([a_blocks, a_blocks.new_zeros(experts, missing, a_blocks.shape[2])], dim=1)
    b_pad = torch.cat([b_blocks, b_blocks.new_zeros(experts, b_blocks.shape[1], missing)], dim=2)
    return join_a(a_pad), join_b(b_pad)


def products(a: torch.Tensor, b: torch.Tensor, experts: int) -> torch.Tensor:
    """Every expert's B^j @ A^j, shape (E, out, in), in float64."""
    return split_b(b, experts).double() @ split_a(a, experts).double()


def product_norms(a: torch.Tensor, b: torch.Tensor, experts: int) -> torch.Tensor:
    """||B^j A^j||_F of every expert, shape (E,), float64 (HetLoRA's aggregation weights before normalizing).

    Computed from the factors: ||B A||_F^2 = trace((B^T B)(A A^T)), never forming the (out, in) product.
    """
    a_blocks, b_blocks = split_a(a, experts).double(), split_b(b, experts).double()
    gram_b = b_blocks.transpose(1, 2) @ b_blocks  # (E, r, r)
    gram_a = a_blocks @ a_blocks.transpose(1, 2)  # (E, r, r)
    return (gram_b * gram_a).sum(dim=(1, 2)).clamp_min(0).sqrt()


def svd_factors(
    factors: list[tuple[torch.Tensor, torch.Tensor]], weights: list[float], experts: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexLoRA's redistribution: the rank-``rank`` SVD factors of sum_i w_i B_i A_i, per expert.

    With M = sum_i w_i B_i A_i = U S V^T, returns B = U_r S_r and A = V_r^T (fused layout, float64). The SVD is
    taken of the stacked low-rank factors (QR of [B_1 .. B_N] and of [A_1; ..; A_N]^T, then the SVD of a small
    core), which equals the SVD of M without forming any (out, in) product. Components beyond the rank of M
    are zero.

    Args:
        factors: every client's (lora_A, lora_B), of any ranks.
        weights: their aggregation weights (normalized here).
        experts: experts of the fused tensor (1 for a plain module).
        rank: the rank of the returned factors.
    """
    total = float(sum(weights))
    scaled = [split_b(b, experts).double() * (w / total) for (_, b), w in zip(factors, weights, strict=True)]
    b_cat = torch.cat(scaled, dim=2)
    a_cat = torch.cat([split_a(a, experts).double() for a, _ in factors], dim=1)
    q_b, r_b = torch.linalg.qr(b_cat)  # (E, out, k), (E, k, R)
    q_a, r_a = torch.linalg.qr(a_cat.transpose(1, 2))  # (E, in, k'), (E, k', R)
    u, s, vh = torch.linalg.svd(r_b @ r_a.transpose(1, 2), full_matrices=False)
    keep = min(rank, s.shape[-1])
    b_new = (q_b @ u[:, :, :keep]) * s[:, None, :keep]
    a_new = vh[:, :keep] @ q_a.transpose(1, 2)
    a_out, b_out = join_a(a_new), join_b(b_new)
    return zero_pad(a_out, b_out, experts, rank) if keep < rank else (a_out, b_out)


# ------------------------------------------------------------------------------- weighted means per expert


def activation_log_weights(frequencies: torch.Tensor, size: float, temperature: float) -> torch.Tensor:
    """FLAME's log gamma_i^j = t * log f_i^j + log |D_i| for every expert j of one client (float64).

    ``t = 0`` gives log |D_i| for every expert, also those the client never activated (0^0 = 1: FedAvg). For
    ``t > 0`` an expert with f = 0 gets -inf (weight 0).
    """
    log_size = torch.log(torch.tensor(float(size), dtype=torch.float64))
    freqs = frequencies.to(torch.float64)
    if temperature == 0:
        return torch.full_like(freqs, float(log_size))
    return temperature * torch.log(freqs) + log_size


def activation_weights(frequencies: torch.Tensor, sizes: torch.Tensor, temperature: float) -> torch.Tensor:
    """Normalized FLAME weights gamma_i^j / sum_i gamma_i^j, shape (clients, experts); an expert no client
    activated gets all-zero weights."""
    logs = torch.stack(
        [activation_log_weights(f, float(n), temperature) for f, n in zip(frequencies, sizes, strict=True)]
    )
    norm = torch.logsumexp(logs, dim=0)
    weights = torch.exp(logs - norm)
    return torch.where(torch.isfinite(norm), weights, torch.zeros_like(weights))


class LogWeightedMean:
    """Streaming per-expert weighted mean of (E, ...) blocks whose weights come as logarithms.

    Keeps a running maximum of the log weights per expert (as an online softmax does), so weights as small as
    f^8 never underflow; an expert whose every weight is 0 (log -inf) keeps the ``previous`` value.
    """

    def __init__(self) -> None:
        self.peak: torch.Tensor | None = None
        self.norm: torch.Tensor | None = None
        self.total: torch.Tensor | None = None

    def add(self, blocks: torch.Tensor, log_weights: torch.Tensor) -> None:
        """Fold in one client's blocks (E, ...) with log weights (E,)."""
        log_weights = log_weights.to(torch.float64)
        values = blocks.detach().to(torch.float64)
        if self.peak is None:
            self.peak = torch.full_like(log_weights, float("-inf"))
            self.norm = torch.zeros_like(log_weights)
            self.total = torch.zeros_like(values)
        assert self.norm is not None and self.total is not None
        peak = torch.maximum(self.peak, log_weights)
        old = _exp_below(self.peak, peak)
        new = _exp_below(log_weights, peak)
        shape = (-1,) + (1,) * (values.dim() - 1)
        self.norm = self.norm * old + new
        self.total = self.total * old.reshape(shape) + values * new.reshape(shape)
        self.peak = peak

    def result(self, previous: torch.Tensor) -> torch.Tensor:
        """The weighted mean per expert, ``previous`` for experts without weight, in ``previous``'s dtype."""
        if self.total is None or self.norm is None:
            return previous.clone()
        shape = (-1,) + (1,) * (previous.dim() - 1)
        mean = self.total / self.norm.clamp_min(torch.finfo(torch.float64).tiny).reshape(shape)
        keep = (self.norm > 0).reshape(shape)
        return torch.where(keep, mean, previous.to(torch.float64)).to(previous.dtype)


def _exp_below(values: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
    """exp(values - peak) where ``values`` is finite (then ``peak`` is too), 0 where it is -inf."""
    finite = torch.isfinite(values)
    return torch.where(finite, torch.exp(torch.where(finite, values - peak, torch.zeros_like(values))), 0.0)


def weighted_expert_mean(
    blocks: list[torch.Tensor], log_weights: list[torch.Tensor], previous: torch.Tensor
) -> torch.Tensor:
    """Per-expert weighted mean of clients' (E, ...) blocks under log weights; see :class:`LogWeightedMean`."""
    mean = LogWeightedMean()
    for block, weights in zip(blocks, log_weights, strict=True):
        mean.add(block, weights)
    return mean.result(previous)
