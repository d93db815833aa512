"""One-time alignment of PQ-LoRA frames across architectures on public data (FedMosaic, Sec. 4.2.2 and A.5).

P and Q can be averaged across architectures only if the frozen frames A (r x d_in) and B (d_out x r) of the
k-th PQ site of every architecture map to and from "the same" r-dimensional space. Before federation, with the
smallest architecture as the frozen pivot p and each other architecture j in turn:

- **A**: collect the inputs h of every PQ site on public data (base models only, adapters off), then train A_j
  to minimize ``mean ||A_p h_p - A_j h_j||^2 + lambda ||A_j A_j^T - I||_F^2`` (Adam, cosine schedule), and
  project it to orthonormal rows (A_j <- U V^T of its thin SVD). Tokens correspond one to one when the two
  tokenizers are the same; across tokenizers each sequence is mean-pooled over its tokens.
- **B**: with the codes z = A h (P = I, Q = 0), the B-outputs are H = z B^T. A regularized CCA between H_p and
  H_j gives projections Pi_p, Pi_j onto r maximally correlated directions; then
  ``B_j <- (Pi_j^+)^T Pi_p^T B_p`` and B_j's columns are made orthonormal again (polar factor).

Hidden states do not depend on A (the adapters are off), so they are computed once and A is trained on them,
which is the paper's "forward with LoRA scaled by 0" without repeating the forward passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from fedpeft.adapters.pq_lora import Site, nearest_orthonormal_columns, nearest_orthonormal_rows
from fedpeft.data.types import Example

if TYPE_CHECKING:
    from fedpeft.models.runtime import ModelRuntime

Frames = dict[str, dict[str, torch.Tensor]]
"""PQ frames of one architecture: site key -> {"A": r x d_in, "B": d_out x r}."""


@dataclass(frozen=True)
class AlignmentSettings:
    """Knobs of the alignment (defaults: the paper's, except the learning rate; see docs/methods/fedmosaic.md)."""

    lam: float = 0.5
    lr: float = 5e-5
    epochs: float = 1.0
    batch_size: int = 4
    cca_reg: float = 1e-3
    max_rows: int = 20_000
    encode_batch_size: int = 16


def same_tokenizer(first: ModelRuntime, second: ModelRuntime) -> bool:
    """Whether two runtimes tokenize alike (then tokens correspond one to one)."""
    return first.tokenizer.get_vocab() == second.tokenizer.get_vocab()


@torch.no_grad()
def site_inputs(
    runtime: ModelRuntime, modules: list[str], examples: list[Example], batch_size: int = 16
) -> dict[str, list[torch.Tensor]]:
    """The inputs of ``modules`` under the base model: per module, one (tokens x d_in) tensor per example."""
    from fedpeft.models.runtime import ClientModel

    model = runtime.install(ClientModel())
    lookup = dict(runtime.target_modules)
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in modules}
    current: dict[str, torch.Tensor] = {}

    def hook_for(name: str):  # noqa: ANN202
        def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            mask = current.get("mask")  # none for image inputs: every position counts
            for i, row in enumerate(inputs[0].float()):
                captured[name].append((row if mask is None else row[mask[i]]).cpu())

        return hook

    handles = [lookup[name].register_forward_pre_hook(hook_for(name)) for name in modules]
    was_training = model.training
    model.eval()
    try:
        with runtime.forward_context():
            for start in range(0, len(examples), batch_size):
                batch = {
                    k: v.to(runtime.device) for k, v in runtime.encode(examples[start : start + batch_size]).items()
                }
                batch.pop("labels", None)
                current.pop("mask", None)
                if "attention_mask" in batch:
                    current["mask"] = batch["attention_mask"].bool().cpu()
                model(**batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return captured


def paired_rows(
    pivot: list[torch.Tensor], other: list[torch.Tensor], token_level: bool, max_rows: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Matched feature rows of two models on the same examples, and each row's example index.

    ``token_level``: token t of an example in one model matches token t in the other (shared tokenizer; the
    shorter length wins); otherwise each example is one row, the mean over its tokens.
    """
    rows_p, rows_o, owners = [], [], []
    for index, (a, b) in enumerate(zip(pivot, other, strict=True)):
        if token_level:
            length = min(len(a), len(b))
            rows_p.append(a[:length])
            rows_o.append(b[:length])
            owners.append(torch.full((length,), index))
        else:
            rows_p.append(a.mean(0, keepdim=True))
            rows_o.append(b.mean(0, keepdim=True))
            owners.append(torch.tensor([index]))
    x_p, x_o, owner = torch.cat(rows_p), torch.cat(rows_o), torch.cat(owners)
    if len(owner) > max_rows:
        keep = torch.randperm(len(owner), generator=generator)[:max_rows].sort().values
        x_p, x_o, owner = x_p[keep], x_o[keep], owner[keep]
    return x_p, x_o, owner


def align_input_frame(
    x_pivot: torch.Tensor,
    a_pivot: torch.Tensor,
    x_other: torch.Tensor,
    a_init: torch.Tensor,
    owner: torch.Tensor,
    settings: AlignmentSettings,
    generator: torch.Generator,
) -> torch.Tensor:
    """A_j trained so that A_j h_j matches A_p h_p, then projected to orthonormal rows.

    Minibatches hold the rows of ``settings.batch_size`` examples; Adam with a cosine-annealed learning rate.
    """
    target = x_pivot @ a_pivot.T
    a_other = torch.nn.Parameter(a_init.clone())
    examples = int(owner.max()) + 1
    batches = max(1, math.ceil(examples / settings.batch_size))
    steps = max(1, math.ceil(settings.epochs * batches))
    optimizer = torch.optim.Adam([a_other], lr=settings.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    identity = torch.eye(a_init.shape[0])
    order = torch.randperm(examples, generator=generator)
    for step in range(steps):
        position = step % batches
        if position == 0 and step:
            order = torch.randperm(examples, generator=generator)
        chosen = order[position * settings.batch_size : (position + 1) * settings.batch_size]
        rows = torch.isin(owner, chosen)
        if not rows.any():
            continue
        fit = (x_other[rows] @ a_other.T - target[rows]).pow(2).sum(-1).mean()
        orthogonality = (a_other @ a_other.T - identity).pow(2).sum()
        loss = fit + settings.lam * orthogonality
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return nearest_orthonormal_rows(a_other.detach())


def regularized_cca(
    x: torch.Tensor, y: torch.Tensor, components: int, reg: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Regularized CCA: projections ``(Pi_x, Pi_y)`` (d_x x k, d_y x k) and the canonical correlations (k).

    Each side is first reduced to its principal subspace (exact when the features have low rank, as B-outputs
    of rank r do); ``reg`` is added to each covariance relative to its mean eigenvalue.
    """
    x = (x - x.mean(0)).double()
    y = (y - y.mean(0)).double()
    n = x.shape[0]

    def reduce(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u, s, vh = torch.linalg.svd(data, full_matrices=False)
        keep = int((s > s[0] * 1e-9).sum()) if s.numel() and s[0] > 0 else 0
        return u[:, :keep] * s[:keep], vh[:keep]

    def inverse_sqrt(cov: torch.Tensor) -> torch.Tensor:
        cov = cov + reg * torch.trace(cov) / cov.shape[0] * torch.eye(cov.shape[0], dtype=cov.dtype)
        values, vectors = torch.linalg.eigh(cov)
        return vectors @ torch.diag(values.clamp_min(1e-12).rsqrt()) @ vectors.T

    scores_x, basis_x = reduce(x)
    scores_y, basis_y = reduce(y)
    k = min(components, scores_x.shape[1], scores_y.shape[1])
    whiten_x = inverse_sqrt(scores_x.T @ scores_x / max(n - 1, 1))
    whiten_y = inverse_sqrt(scores_y.T @ scores_y / max(n - 1, 1))
    cross = scores_x.T @ scores_y / max(n - 1, 1)
    u, s, vh = torch.linalg.svd(whiten_x @ cross @ whiten_y)
    pi_x = basis_x.T @ (whiten_x @ u[:, :k])
    pi_y = basis_y.T @ (whiten_y @ vh.T[:, :k])
    return pi_x.float(), pi_y.float(), s[:k].float()


def align_output_frame(
    codes_pivot: torch.Tensor,
    b_pivot: torch.Tensor,
    codes_other: torch.Tensor,
    b_init: torch.Tensor,
    reg: float = 1e-3,
) -> torch.Tensor:
    """B_j <- (Pi_j^+)^T Pi_p^T B_p from a CCA of the B-outputs z B^T, with orthonormal columns again."""
    rank = b_pivot.shape[1]
    pi_p, pi_j, _ = regularized_cca(codes_pivot @ b_pivot.T, codes_other @ b_init.T, rank, reg)
    aligned = torch.linalg.pinv(pi_j).T @ pi_p.T @ b_pivot
    if aligned.shape[1] < rank:  # fewer correlated directions than r: keep the frame's remaining columns
        aligned = torch.cat([aligned, b_init[:, aligned.shape[1] :]], dim=1)
    return nearest_orthonormal_columns(aligned)


def align_frames(
    pivot: ModelRuntime,
    pivot_sites: list[Site],
    pivot_frames: Frames,
    other: ModelRuntime,
    other_sites: list[Site],
    other_frames: Frames,
    public: list[Example],
    settings: AlignmentSettings,
    generator: torch.Generator,
) -> tuple[Frames, dict[str, float]]:
    """The frames of ``other`` aligned to the pivot's, site by site (sites pair by key).

    Returns:
        The aligned frames and diagnostics per site: the relative fit ``||A_p h_p - A_j h_j|| / ||A_p h_p||``
        before and after (``<key>/fit_before``, ``<key>/fit_after``).
    """
    pairs = [(p, o) for p in pivot_sites for o in other_sites if p.kind == o.kind == "pq" and p.key == o.key]
    if not pairs or not public:
        return {k: {n: t.clone() for n, t in v.items()} for k, v in other_frames.items()}, {}
    token_level = same_tokenizer(pivot, other)
    inputs_p = site_inputs(pivot, [p.module for p, _ in pairs], public, settings.encode_batch_size)
    inputs_o = site_inputs(other, [o.module for _, o in pairs], public, settings.encode_batch_size)
    aligned: Frames = {k: {n: t.clone() for n, t in v.items()} for k, v in other_frames.items()}
    report: dict[str, float] = {}
    for p, o in pairs:
        x_p, x_o, owner = paired_rows(inputs_p[p.module], inputs_o[o.module], token_level, settings.max_rows, generator)
        a_p, b_p = pivot_frames[p.key]["A"], pivot_frames[p.key]["B"]
        a_init, b_init = other_frames[o.key]["A"], other_frames[o.key]["B"]
        target_norm = (x_p @ a_p.T).norm().clamp_min(1e-12)
        report[f"{o.key}/fit_before"] = float((x_o @ a_init.T - x_p @ a_p.T).norm() / target_norm)
        a_j = align_input_frame(x_p, a_p, x_o, a_init, owner, settings, generator)
        report[f"{o.key}/fit_after"] = float((x_o @ a_j.T - x_p @ a_p.T).norm() / target_norm)
        b_j = align_output_frame(x_p @ a_p.T, b_p, x_o @ a_j.T, b_init, settings.cca_reg)
        aligned[o.key] = {"A": a_j, "B": b_j}
    return aligned, report


class Runtimes(Protocol):
    """What the alignment reads of a federation (:class:`~fedpeft.federation.Federation`): each architecture's
    runtime."""

    def runtime(self, name: str) -> ModelRuntime:
        """The loaded runtime of architecture ``name``."""
        ...


def align_federation(
    federation: Runtimes,
    sites: dict[str, list[Site]],
    frames: dict[str, Frames],
    pivot: str,
    public: list[Example],
    settings: AlignmentSettings,
    generator: torch.Generator,
) -> tuple[dict[str, Frames], dict[str, float]]:
    """Every architecture's frames aligned to the pivot's (the pivot's are kept).

    Args:
        federation: a :class:`~fedpeft.federation.Federation` (its runtimes are loaded).
        sites: the adapter sites of every architecture.
        frames: the initial (random orthonormal) frames of every architecture.
        pivot: the architecture the others are aligned to.
        public: the public examples.

    Returns:
        The aligned frames and the fit diagnostics, keyed ``<architecture>/<site key>/fit_before|fit_after``.
    """
    aligned = dict(frames)
    report: dict[str, float] = {}
    for name in frames:
        if name == pivot:
            continue
        aligned[name], fits = align_frames(
            federation.runtime(pivot),
            sites[pivot],
            frames[pivot],
            federation.runtime(name),
            sites[name],
            frames[name],
            public,
            settings,
            generator,
        )
        report.update({f"{name}/{key}": value for key, value in fits.items()})
    return aligned, report
