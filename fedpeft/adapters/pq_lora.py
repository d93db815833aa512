"""PQ-LoRA: a LoRA whose trainable part has the same shape in every architecture.

From "Not All Clients Are Equal: Collaborative Model Personalization on Heterogeneous Multi-Modal Clients"
(M. Seo, T. Kim, H. Lee, J. Choi, T. Tuytelaars, 2025; FedMosaic). A PQ-LoRA computes

    h = W h_in + B (P A h_in + Q),

with ``A`` (r x d_in, orthonormal rows) and ``B`` (d_out x r, orthonormal columns) frozen, and only
``P`` (r x r) and ``Q`` (r) trained, P = Q = 0 at the start. P and Q do not depend on the model's width, so the
k-th PQ-LoRA of any two architectures can be averaged. A model of |W| layers is cut into N_B equal blocks by
depth; the last layer of each block, I_k = k * floor(|W| / N_B) for k < N_B and I_N_B = |W| (1-indexed), carries
PQ-LoRA on every linear module, the other layers ordinary LoRA.

Since A and B are frozen and identical on every client of an architecture, averaging P gives exactly the average
of the weight updates: B mean(P_i) A = mean(B P_i A). With orthonormal A and B the updates B P A span all
r^2 directions b_i a_j^T (Theorem 1 of the paper).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from fedpeft.models.targets import in_out_features

NUM_BLOCKS = 4
_LAYER = re.compile(r"\.(?:layers|layer|h|blocks)\.(\d+)\.")


def pq_layer_indices(num_layers: int, num_blocks: int = NUM_BLOCKS) -> list[int]:
    """The 1-indexed layers I_1 < ... < I_N_B that carry PQ-LoRA.

    A model shallower than ``num_blocks`` gets one block per layer (N_B is clamped to the depth).
    """
    if num_layers < 1:
        raise ValueError("a model needs at least one layer")
    blocks = min(num_blocks, num_layers)
    step = num_layers // blocks
    return [k * step for k in range(1, blocks)] + [num_layers]


def layer_of(module_name: str) -> int | None:
    """The 0-indexed transformer layer a module belongs to (``model.layers.3.mlp.down_proj`` -> 3)."""
    found = _LAYER.search(module_name)
    return int(found.group(1)) if found else None


def module_type(module_name: str) -> str:
    """The part of a module's name after its layer index (``model.layers.3.self_attn.q_proj`` -> ``self_attn.q_proj``):
    the same for the same module in every architecture of a family and across Llama-like families."""
    found = _LAYER.search(module_name)
    return module_name[found.end() :] if found else module_name


def orthonormal_rows(rank: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """A random ``rank x width`` matrix with orthonormal rows (A A^T = I)."""
    if rank > width:
        raise ValueError(f"rank {rank} exceeds the layer width {width}")
    gaussian = torch.randn(width, rank, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    # Fix the signs so the draw is a uniform (Haar) orthonormal frame.
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    return q.T.contiguous().to(torch.float32)


def orthonormal_columns(height: int, rank: int, generator: torch.Generator) -> torch.Tensor:
    """A random ``height x rank`` matrix with orthonormal columns (B^T B = I)."""
    return orthonormal_rows(rank, height, generator).T.contiguous()


def nearest_orthonormal_rows(matrix: torch.Tensor) -> torch.Tensor:
    """The matrix with orthonormal rows nearest to ``matrix`` in Frobenius norm: U V^T of its thin SVD."""
    u, _, vh = torch.linalg.svd(matrix.to(torch.float64), full_matrices=False)
    return (u @ vh).to(matrix.dtype)


def nearest_orthonormal_columns(matrix: torch.Tensor) -> torch.Tensor:
    """The matrix with orthonormal columns nearest to ``matrix`` (the polar factor)."""
    return nearest_orthonormal_rows(matrix.T).T.contiguous()


def pq_delta(inputs: torch.Tensor, A: torch.Tensor, B: torch.Tensor, P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """B (P A x + Q) for every vector x along the last dimension of ``inputs``."""
    return (inputs @ A.T @ P.T + Q) @ B.T


def pq_weight_update(A: torch.Tensor, B: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """The weight update B P A (d_out x d_in) of a PQ-LoRA; Q adds the input-independent bias B Q."""
    return B @ P @ A


@dataclass(frozen=True)
class Site:
    """One linear module that carries an adapter.

    Attributes:
        module: the module's name in the base model.
        layer: its 0-indexed transformer layer.
        kind: ``"pq"`` (PQ-LoRA) or ``"lora"`` (ordinary LoRA).
        key: the name its tensors travel under: ``pq<k>.<module type>`` for the k-th PQ block (the same in every
            architecture, so it is shared across them; the type is :func:`module_type`), ``<architecture>:<module>``
            for ordinary LoRA (shared only within the architecture).
        d_in, d_out: the module's input and output widths.
    """

    module: str
    layer: int
    kind: str
    key: str
    d_in: int
    d_out: int


def plan_sites(
    modules: list[tuple[str, torch.nn.Module]],
    targets: list[str],
    architecture: str,
    *,
    num_blocks: int = NUM_BLOCKS,
    pq: bool = True,
) -> list[Site]:
    """Which module gets PQ-LoRA and which ordinary LoRA, and under which key its tensors travel.

    Args:
        modules: the ``(name, module)`` pairs LoRA targets (``ModelRuntime.target_modules``).
        targets: the LoRA target names (``loaded.lora_targets``); unused, kept so callers state what the modules are.
        architecture: the architecture name (prefix of ordinary-LoRA keys).
        num_blocks: N_B.
        pq: ``False`` gives ordinary LoRA everywhere (the "vanilla" ablation).
    """
    layers: list[int] = []
    for name, _ in modules:
        layer = layer_of(name)
        if layer is None:
            raise ValueError(f"cannot tell the layer of module {name}")
        layers.append(layer)
    num_layers = max(layers) + 1
    block_of = {index - 1: k for k, index in enumerate(pq_layer_indices(num_layers, num_blocks), start=1)}
    sites = []
    for (name, module), layer in zip(modules, layers, strict=True):
        kind_of = module_type(name)
        d_in, d_out = in_out_features(module)  # GPT-2's Conv1D stores its weight (in, out)
        if pq and layer in block_of:
            sites.append(Site(name, layer, "pq", f"pq{block_of[layer]}.{kind_of}", d_in, d_out))
        else:
            sites.append(Site(name, layer, "lora", f"{architecture}:{name}", d_in, d_out))
    return sites
