"""Run-time control of a sparse mixture-of-experts model: top-k, output rescaling, activation counts, FLOPs.

A :class:`MoeControl` finds the routers and MoE blocks of a transformers model (OLMoE's ``OlmoeTopKRouter`` and
``OlmoeSparseMoeBlock``, and any block with the same shape: a ``gate`` router with integer ``top_k`` and
``num_experts`` next to an ``experts`` module) and acts on them without touching their classes:

- **top-k**: a client's compute tier sets the routers' ``top_k`` attribute (the number of experts each token
  is sent to). OLMoE does not renormalize the selected gate values, so fewer experts means less gate mass.
- **rescaler**: a forward hook on every MoE block multiplies the block's output by one scalar ``scale`` (FLAME's
  s_i; 1.0 leaves the model unchanged). It is a tensor the training loop can optimize.
- **load balancing**: :func:`router_balancing` makes the model's own training loss include its router
  load-balancing loss (transformers' auxiliary loss of MoE causal LMs), for a base stage that stands in for
  MoE pretraining.
- **activation counts**: inside :meth:`MoeControl.counting`, a forward hook on every router adds, per block and
  expert, the number of tokens routed to the expert, and the number of tokens the block processed. Only real
  tokens count: positions the batch's ``attention_mask`` marks as padding are left out (they cost compute but
  carry no training signal), so a frequency ``counts / tokens`` lies in [0, 1] and sums to top-k over experts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from fedpeft.core.errors import UserError


@dataclass(frozen=True)
class Routing:
    """How a client runs the MoE layers: experts per token (``None``: the model's own) and the output scale."""

    top_k: int | None = None
    scale: float = 1.0


def is_router(module: nn.Module) -> bool:
    """Whether ``module`` is a top-k router: integer ``top_k`` and ``num_experts`` and an (experts, hidden) weight."""
    top_k, num_experts = getattr(module, "top_k", None), getattr(module, "num_experts", None)
    weight = getattr(module, "weight", None)
    return (
        isinstance(top_k, int)
        and isinstance(num_experts, int)
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.shape[0] == num_experts
    )


def _int_attribute(module: nn.Module, name: str) -> int:
    """``module.<name>`` as an int: a router's ``top_k`` or ``num_experts`` (torch types them Tensor | Module)."""
    return int(getattr(module, name))


def _float_attribute(module: nn.Module, name: str) -> float:
    """``module.<name>`` as a float (a plain attribute, such as a model's ``router_aux_loss_coef``)."""
    return float(getattr(module, name))


def moe_blocks(model: nn.Module) -> list[tuple[str, nn.Module, nn.Module]]:
    """``(name, block, router)`` of every MoE block of ``model``: a module with a router ``gate`` and ``experts``."""
    found = []
    for name, module in model.named_modules():
        gate = getattr(module, "gate", None)
        if isinstance(gate, nn.Module) and is_router(gate) and isinstance(getattr(module, "experts", None), nn.Module):
            found.append((name, module, gate))
    return found


@dataclass
class ExpertCounts:
    """Tokens routed to each expert and tokens processed, per MoE block (float64, accumulated over batches)."""

    counts: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)

    def frequencies(self) -> dict[str, torch.Tensor]:
        """Per block, the share of the block's tokens routed to each expert (zeros when it saw no token)."""
        return {b: c / self.tokens[b] if self.tokens[b] > 0 else torch.zeros_like(c) for b, c in self.counts.items()}


class MoeControl:
    """Top-k, rescaler and activation counting for the MoE blocks of one model (see the module docstring)."""

    def __init__(self, model: nn.Module, blocks: list[tuple[str, nn.Module, nn.Module]]) -> None:
        self.model = model
        self.blocks = blocks
        self.num_experts = _int_attribute(blocks[0][2], "num_experts")
        self.default_top_k = _int_attribute(blocks[0][2], "top_k")
        self.scale = torch.ones((), requires_grad=False)
        # Parameters of one expert per block, read before any adapter wraps the experts.
        self.expert_sizes = [expert_parameter_count(block) for _, block, _ in blocks]
        self._counts: ExpertCounts | None = None
        self._token_mask: torch.Tensor | None = None
        for name, block, router in blocks:
            block.register_forward_hook(self._rescale)
            router.register_forward_hook(self._make_counter(name))
        # The inner decoder always receives the batch's attention mask as a keyword argument.
        decoder = getattr(model, "base_model", model)
        decoder.register_forward_pre_hook(self._remember_mask, with_kwargs=True)

    @classmethod
    def of(cls, model: nn.Module) -> MoeControl | None:
        """The control of ``model``'s MoE blocks, or ``None`` for a dense model."""
        blocks = moe_blocks(model)
        return cls(model, blocks) if blocks else None

    # ------------------------------------------------------------------ settings
    @property
    def top_k(self) -> int:
        return _int_attribute(self.blocks[0][2], "top_k")

    def set_top_k(self, top_k: int | None) -> None:
        """Route every token to ``top_k`` experts in every block (``None``: the model's own top-k)."""
        k = self.default_top_k if top_k is None else int(top_k)
        if not 1 <= k <= self.num_experts:
            raise UserError(
                f"top_k={k} is impossible for a model with {self.num_experts} experts; use 1..{self.num_experts}."
            )
        for _, _, router in self.blocks:
            router.top_k = k  # type: ignore[assignment]  # torch types module attributes as Tensor | Module

    def configure(self, routing: Routing | None) -> None:
        """Apply a client's routing (``None``: the model's own top-k and no rescaling); the scale is frozen."""
        routing = routing or Routing()
        self.set_top_k(routing.top_k)
        weight = self.blocks[0][2].weight
        assert isinstance(weight, torch.Tensor)  # is_router checked it
        self.scale = torch.tensor(float(routing.scale), device=weight.device)

    def trainable_scale(self) -> torch.Tensor:
        """Make the current scale a trainable leaf tensor and return it (for the optimizer)."""
        self.scale = self.scale.detach().clone().requires_grad_(True)
        return self.scale

    def inactive_parameters(self, top_k: int) -> int:
        """Expert parameters a token does not touch at ``top_k``: (E - k) experts of every block."""
        return sum((self.num_experts - top_k) * size for size in self.expert_sizes)

    # ------------------------------------------------------------------ hooks
    def _rescale(self, module: nn.Module, args: tuple[object, ...], output: torch.Tensor) -> torch.Tensor:
        return output * self.scale.to(output.dtype)

    def _remember_mask(self, module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        mask = kwargs.get("attention_mask")
        self._token_mask = mask.reshape(-1).bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    def _make_counter(self, name: str):  # noqa: ANN202
        def count(module: nn.Module, args: tuple[object, ...], output: tuple[torch.Tensor, ...]) -> None:
            if self._counts is None:
                return
            indices = output[-1]  # (tokens, top_k) expert indices of OLMoE-style routers
            mask = self._token_mask
            if mask is not None and mask.numel() == indices.shape[0]:
                indices = indices[mask.to(indices.device)]
            num_experts = _int_attribute(module, "num_experts")
            counts = torch.bincount(indices.reshape(-1), minlength=num_experts).to(torch.float64).cpu()
            store = self._counts
            store.counts[name] = store.counts[name] + counts if name in store.counts else counts
            store.tokens[name] = store.tokens.get(name, 0.0) + float(indices.shape[0])

        return count

    @contextlib.contextmanager
    def counting(self) -> Iterator[ExpertCounts]:
        """Count expert activations of every forward pass inside the block."""
        names = [name for name, _, _ in self.blocks]
        counts = ExpertCounts(
            {name: torch.zeros(self.num_experts, dtype=torch.float64) for name in names}, dict.fromkeys(names, 0.0)
        )
        self._counts = counts
        try:
            yield counts
        finally:
            self._counts = None


@contextlib.contextmanager
def router_balancing(model: nn.Module, coef: float | None = None) -> Iterator[float]:
    """Inside the block, ``model``'s loss includes its router load-balancing loss times ``coef``.

    The loss is the one transformers' MoE causal LMs (OLMoE, Mixtral, Qwen-MoE) compute when their config has
    ``output_router_logits`` set: per expert, the share of tokens routed to it times its mean router probability,
    summed and multiplied by the number of experts (Switch Transformer's auxiliary loss, over real tokens only).
    It keeps the router from sending every token to the same few experts, so the experts specialise. ``None``
    uses the model config's own ``router_aux_loss_coef``; ``0`` adds nothing. Models without that loss (dense
    models) are left unchanged. Yields the coefficient in effect (``0.0`` where nothing is added).
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "output_router_logits") or not hasattr(model, "router_aux_loss_coef"):
        yield 0.0
        return
    saved = (config.output_router_logits, model.router_aux_loss_coef)
    coef = _float_attribute(model, "router_aux_loss_coef") if coef is None else float(coef)
    config.output_router_logits = coef > 0
    model.router_aux_loss_coef = coef  # type: ignore[assignment]  # torch types module attributes as Tensor | Module
    try:
        yield coef if coef > 0 else 0.0
    finally:
        config.output_router_logits, model.router_aux_loss_coef = saved


# ---------------------------------------------------------------------------------------------- FLOPs


def expert_parameter_count(block: nn.Module) -> int:
    """Parameters of one expert of ``block`` (its fused expert tensors divided by the number of experts)."""
    experts = block.get_submodule("experts")
    total = sum(p.numel() for p in experts.parameters(recurse=False))
    return total // _int_attribute(block.get_submodule("gate"), "num_experts")


def active_parameters(model: nn.Module, top_k: int | None = None) -> int:
    """Parameters one token's forward pass uses: all of ``model``'s, less the experts it is not routed to.

    As in OLMoE's "1B active of 7B", embeddings count. ``top_k=None`` keeps each router's own top-k.
    Works on a model built on the ``meta`` device (shapes only).
    """
    total = sum(p.numel() for p in model.parameters())
    for _, block, router in moe_blocks(model):
        k = _int_attribute(router, "top_k") if top_k is None else top_k
        total -= (_int_attribute(router, "num_experts") - k) * expert_parameter_count(block)
    return total


def lora_active_parameters(lora_state: dict[str, torch.Tensor], experts: dict[str, int], top_k: int) -> int:
    """LoRA parameters one token uses: every plain LoRA module's, and ``top_k / E`` of each fused expert LoRA.

    Args:
        lora_state: adapter tensors by PEFT state key.
        experts: fused expert module key (state key without ``.lora_A.weight``) -> number of experts.
        top_k: experts per token.
    """
    total = 0
    for key, tensor in lora_state.items():
        if ".lora_A." not in key and ".lora_B." not in key:
            continue
        module = key.split(".lora_")[0]
        n = experts.get(module)
        total += tensor.numel() if n is None else tensor.numel() * min(top_k, n) // n
    return total


def forward_flops(active: int, tokens: int = 128) -> int:
    """The analytic forward FLOPs of ``tokens`` tokens: 2 multiply-adds per active parameter and token."""
    return 2 * active * tokens
