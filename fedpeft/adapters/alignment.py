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
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

from fedpeft.adapters.pq_lora import Site, nearest_orthonormal_columns, nearest_orthonormal_rows
from fedpeft.data.types import Example

if TYPE_CHECKING:
    from fedpeft.models.runtime import ModelRuntime

T = TypeVar("T")

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
    capture_bytes: int | None = None  # captured inputs held at once (None: a quarter of the free memory); more sites
    # than that take one forward pass per group


def same_tokenizer(first: ModelRuntime, second: ModelRuntime) -> bool:
    """Whether two runtimes tokenize alike (then tokens correspond one to one)."""
    return first.tokenizer.get_vocab() == second.tokenizer.get_vocab()


class _CapturedError(Exception):
    """Raised at the output layer when the captured inputs are all in: the logits are never needed."""


@torch.no_grad()
def site_inputs(
    runtime: ModelRuntime,
    modules: list[str],
    examples: list[Example],
    batch_size: int = 16,
    *,
    keep: list[torch.Tensor] | None = None,
    pooled: bool = False,
) -> dict[str, list[torch.Tensor]]:
    """The inputs of ``modules`` under the base model: per module, one (rows x d_in) tensor per example, its rows
    the positions its attention mask keeps (every position of an input without one, as images have).

    Args:
        keep: per example, which of those rows to keep (:func:`select_rows`); the rest are dropped as each batch
            is computed, so memory holds only what is kept.
        pooled: each example's rows replaced by their mean (1 x d_in) before ``keep`` applies.
    """
    from fedpeft.models.runtime import ClientModel

    model = runtime.install(ClientModel())
    lookup = dict(runtime.target_modules)
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in modules}
    current: dict[str, torch.Tensor] = {}
    first = [0]  # the index of the batch's first example

    def hook_for(name: str):  # noqa: ANN202
        def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            mask = current.get("mask")  # none for image inputs: every position counts
            for i, row in enumerate(inputs[0].float()):
                rows = row if mask is None else row[mask[i]]
                if pooled:
                    rows = rows.mean(0, keepdim=True)
                if keep is not None:
                    rows = rows[keep[first[0] + i]]
                captured[name].append(rows.cpu())

        return hook

    def stop(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        raise _CapturedError

    handles = [lookup[name].register_forward_pre_hook(hook_for(name)) for name in modules]
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    if isinstance(output, torch.nn.Module) and all(lookup[name] is not output for name in modules):
        handles.append(output.register_forward_pre_hook(stop))
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
                first[0] = start
                try:
                    model(**batch)
                except _CapturedError:
                    pass
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return captured


def row_counts(runtime: ModelRuntime, module: str, examples: list[Example], batch_size: int = 16) -> list[int]:
    """Per example, the rows :func:`site_inputs` gives for it: the tokens its attention mask keeps, from the
    tokenizer alone; for inputs without a mask (images: one size for all), the positions of the first example's."""
    counts: list[int] = []
    for start in range(0, len(examples), batch_size):
        encoded = runtime.encode(examples[start : start + batch_size])
        if "attention_mask" not in encoded:
            (rows,) = site_inputs(runtime, [module], examples[:1])[module]
            return [rows.shape[0]] * len(examples)
        counts += encoded["attention_mask"].sum(1).tolist()
    return counts


def select_rows(lengths: list[int], max_rows: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Per example, the positions among its first ``lengths[i]`` rows that the alignment fits on: all of them, or
    when they are more than ``max_rows`` in all, a uniform draw of ``max_rows`` over every (example, position)."""
    total = sum(lengths)
    if total <= max_rows:
        return [torch.arange(n) for n in lengths]
    keep = torch.randperm(total, generator=generator)[:max_rows].sort().values
    ends = torch.tensor(lengths).cumsum(0)
    owner = torch.searchsorted(ends, keep, right=True)
    positions = keep - (ends - torch.tensor(lengths))[owner]
    return list(positions.split(torch.bincount(owner, minlength=len(lengths)).tolist()))


def paired_rows(
    pivot: list[torch.Tensor], other: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Matched feature rows of two models on the same examples (each example's rows as :func:`site_inputs` kept
    them, the same count on both sides), and each row's example index.

    Both lists are consumed (emptied) as their rows are copied into place, so the rows are held once, not twice as
    a concatenation of lists still referenced would hold them (at true width a site's rows are gigabytes)."""
    counts = torch.tensor([len(rows) for rows in pivot])
    owner = torch.repeat_interleave(torch.arange(len(pivot)), counts)
    return _consumed_cat(pivot), _consumed_cat(other), owner


def _consumed_cat(pieces: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(pieces)`` that releases each piece once copied (``pieces`` is left empty)."""
    total = sum(len(piece) for piece in pieces)
    out = torch.empty(total, pieces[0].shape[1], dtype=pieces[0].dtype)
    pieces.reverse()  # pop from the end, in the original order
    start = 0
    while pieces:
        piece = pieces.pop()
        out[start : start + len(piece)] = piece
        start += len(piece)
    return out


def module_groups(items: list[T], widths: list[int], rows: int, budget: int) -> list[list[T]]:
    """``items`` (sites, or pairs of sites) in groups whose captured rows (``rows`` x width x 4 bytes each) stay
    within ``budget`` bytes, one forward pass each: at true width, every site's inputs at once can pass a machine's
    memory."""
    groups: list[list[T]] = [[]]
    held = 0
    for item, width in zip(items, widths, strict=True):
        size = rows * width * 4
        if groups[-1] and held + size > budget:
            groups.append([])
            held = 0
        groups[-1].append(item)
        held += size
    return groups


def _quarter_of_free_memory() -> int:
    """A quarter of the memory free now: the captured inputs' default budget (other worker processes may be
    capturing at the same time)."""
    import psutil

    return int(psutil.virtual_memory().available // 4)


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


def _principal(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Centred ``data`` (n x d, double) as scores (n x k) times an orthonormal basis (k x d), from its thin SVD,
    without the directions below 1e-9 of the largest."""
    u, s, vh = torch.linalg.svd(data, full_matrices=False)
    keep = int((s > s[0] * 1e-9).sum()) if s.numel() and s[0] > 0 else 0
    return u[:, :keep] * s[:keep], vh[:keep]


def _factored_principal(codes: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_principal` of the centred ``codes @ b.T`` (rank r) without forming it: with ``b = Q R`` (thin QR)
    and the SVD ``(codes - mean) R^T = U S W^T``, the outputs are ``U S (Q W)^T``. n x r and d_out x r at most."""
    q, r = torch.linalg.qr(b.double())
    scores, wh = _principal((codes - codes.mean(0)).double() @ r.T)
    return scores, wh @ q.T


def _reduced_cca(
    x: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor], components: int, reg: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CCA of two sides given as (scores, basis) of their principal subspaces (see :func:`regularized_cca`)."""
    (scores_x, basis_x), (scores_y, basis_y) = x, y
    n = scores_x.shape[0]

    def inverse_sqrt(cov: torch.Tensor) -> torch.Tensor:
        cov = cov + reg * torch.trace(cov) / cov.shape[0] * torch.eye(cov.shape[0], dtype=cov.dtype)
        values, vectors = torch.linalg.eigh(cov)
        return vectors @ torch.diag(values.clamp_min(1e-12).rsqrt()) @ vectors.T

    k = min(components, scores_x.shape[1], scores_y.shape[1])
    whiten_x = inverse_sqrt(scores_x.T @ scores_x / max(n - 1, 1))
    whiten_y = inverse_sqrt(scores_y.T @ scores_y / max(n - 1, 1))
    cross = scores_x.T @ scores_y / max(n - 1, 1)
    u, s, vh = torch.linalg.svd(whiten_x @ cross @ whiten_y)
    pi_x = basis_x.T @ (whiten_x @ u[:, :k])
    pi_y = basis_y.T @ (whiten_y @ vh.T[:, :k])
    return pi_x.float(), pi_y.float(), s[:k].float()


def regularized_cca(
    x: torch.Tensor, y: torch.Tensor, components: int, reg: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Regularized CCA: projections ``(Pi_x, Pi_y)`` (d_x x k, d_y x k) and the canonical correlations (k).

    Each side is first reduced to its principal subspace (exact when the features have low rank, as B-outputs
    of rank r do); ``reg`` is added to each covariance relative to its mean eigenvalue.
    """
    x = (x - x.mean(0)).double()
    y = (y - y.mean(0)).double()
    return _reduced_cca(_principal(x), _principal(y), components, reg)


def low_rank_cca(
    codes_x: torch.Tensor,
    b_x: torch.Tensor,
    codes_y: torch.Tensor,
    b_y: torch.Tensor,
    components: int,
    reg: float = 1e-3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`regularized_cca` of ``codes_x @ b_x.T`` and ``codes_y @ b_y.T`` from the factors, in memory of
    n x r and d_out x r rather than n x d_out. Equal to the formed CCA but for the directions float32 rounding adds
    to formed outputs (which the formed route keeps down to 1e-9 of the largest: at most r directions differ)."""
    return _reduced_cca(_factored_principal(codes_x, b_x), _factored_principal(codes_y, b_y), components, reg)


def align_output_frame(
    codes_pivot: torch.Tensor,
    b_pivot: torch.Tensor,
    codes_other: torch.Tensor,
    b_init: torch.Tensor,
    reg: float = 1e-3,
) -> torch.Tensor:
    """B_j <- (Pi_j^+)^T Pi_p^T B_p from a CCA of the B-outputs z B^T, with orthonormal columns again.

    The CCA is taken from the factors (:func:`low_rank_cca`), never from the formed outputs: they have rank r, so
    the factors give it exactly in memory of rows x r and d_out x r, where the formed outputs of a paper-size site
    (20,000 rows x 14,336 outputs) are 2.3 GB and their SVD took minutes (4,096 x 8,192: 164 s against 0.01 s).
    """
    rank = b_pivot.shape[1]
    pi_p, pi_j, _ = low_rank_cca(codes_pivot, b_pivot, codes_other, b_init, rank, reg)
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
    batch = settings.encode_batch_size
    if token_level:  # token t of an example in one model is token t in the other; the shorter length wins
        counts_p = row_counts(pivot, pairs[0][0].module, public, batch)
        counts_o = row_counts(other, pairs[0][1].module, public, batch)
        lengths = [min(a, b) for a, b in zip(counts_p, counts_o, strict=True)]
    else:  # each example is one row, the mean over its tokens
        lengths = [1] * len(public)
    keep = select_rows(lengths, settings.max_rows, generator)  # one draw of rows for every site
    rows = sum(len(k) for k in keep)

    aligned: Frames = {k: {n: t.clone() for n, t in v.items()} for k, v in other_frames.items()}
    report: dict[str, float] = {}
    budget = settings.capture_bytes or _quarter_of_free_memory()
    # A group of site pairs at a time: both models' inputs at its sites, captured in one forward pass each, fitted
    # pair by pair (in the pairs' order, as the generator is drawn from), then dropped before the next group.
    for group in module_groups(pairs, [p.d_in + o.d_in for p, o in pairs], rows, budget):
        inputs_p = site_inputs(pivot, [p.module for p, _ in group], public, batch, keep=keep, pooled=not token_level)
        inputs_o = site_inputs(other, [o.module for _, o in group], public, batch, keep=keep, pooled=not token_level)
        for number, (p, o) in enumerate(group):
            # Each site's captured rows are held once: consumed into the pair's matrices (a module that a later
            # pair of the group also reads is copied instead).
            later = group[number + 1 :]
            rows_p = list(inputs_p[p.module]) if any(q.module == p.module for q, _ in later) else inputs_p.pop(p.module)
            rows_o = list(inputs_o[o.module]) if any(q.module == o.module for _, q in later) else inputs_o.pop(o.module)
            x_p, x_o, owner = paired_rows(rows_p, rows_o)
            a_p, b_p = pivot_frames[p.key]["A"], pivot_frames[p.key]["B"]
            a_init, b_init = other_frames[o.key]["A"], other_frames[o.key]["B"]
            target_norm = (x_p @ a_p.T).norm().clamp_min(1e-12)
            report[f"{o.key}/fit_before"] = float((x_o @ a_init.T - x_p @ a_p.T).norm() / target_norm)
            a_j = align_input_frame(x_p, a_p, x_o, a_init, owner, settings, generator)
            report[f"{o.key}/fit_after"] = float((x_o @ a_j.T - x_p @ a_p.T).norm() / target_norm)
            b_j = align_output_frame(x_p @ a_p.T, b_p, x_o @ a_j.T, b_init, settings.cca_reg)
            aligned[o.key] = {"A": a_j, "B": b_j}
        del inputs_p, inputs_o  # before the next group's are captured
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
