"""FedP2EFT's personalization-strategy generator (PSG): client statistics in, BayesTune-LoRA rank scales out.

From "Federated Learning to Personalize PEFT for Multilingual LLMs" (FedP2EFT; Lee et al., AAAI 2026,
https://arxiv.org/abs/2502.04387), Section 3.3 and Appendix A.4. A one-hidden-layer MLP maps the 2L statistics of
:func:`fedpeft.adapters.feature_statistics` (mean and SD of each LoRA-targeted layer's input) to the L * r_init
rank scales lambda; hidden width 2 * input, ReLU, Xavier-normal weights with gain 1e-6 and biases 1e-4 (so a fresh
PSG outputs lambda ~ 1e-4 everywhere), output clamped to >= 1e-4 with a straight-through gradient. Clients train it
by L1 regression toward the scales BayesTune-LoRA learned on their data (:func:`regress_toward`), summed over all
scales as in the authors' reference code, or averaged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes
from torch import nn

from fedpeft.adapters.bayestune import SCALE_MAX, SCALE_MIN, clamp_st
from fedpeft.core.errors import UserError
from fedpeft.core.io import write_bytes_atomic, write_text_atomic
from fedpeft.core.types import StateDict
from fedpeft.settings.methods import PsgLoss


class StrategyGenerator(nn.Module):
    """The PSG MLP: ``2L -> 4L (ReLU) -> L * rank``.

    Args:
        num_modules: L, the number of LoRA modules.
        rank: r_init, the ranks per module before pruning.
        gain: Xavier-normal gain of both weight matrices.
        bias: constant initial value of both bias vectors.
    """

    def __init__(self, num_modules: int, rank: int, *, gain: float = 1e-6, bias: float = 1e-4) -> None:
        super().__init__()
        self.num_modules, self.rank = num_modules, rank
        inputs = 2 * num_modules
        self.hidden = nn.Linear(inputs, 2 * inputs)
        self.output = nn.Linear(2 * inputs, num_modules * rank)
        for layer in (self.hidden, self.output):
            nn.init.xavier_normal_(layer.weight, gain=gain)
            nn.init.constant_(layer.bias, bias)

    def forward(self, statistics: torch.Tensor) -> torch.Tensor:
        """The raw (unclamped) scales, shape ``(L, rank)``; rank them with these, use :meth:`scales` as values."""
        return self.output(torch.relu(self.hidden(statistics))).reshape(self.num_modules, self.rank)

    def scales(self, statistics: torch.Tensor) -> torch.Tensor:
        """The scales clamped to ``[1e-4, 1000]``, straight-through."""
        return clamp_st(self.forward(statistics))


def make_generator(
    num_modules: int, rank: int, *, seed: int, gain: float = 1e-6, bias: float = 1e-4, state: StateDict | None = None
) -> StrategyGenerator:
    """A PSG initialized from ``seed`` (or loaded from ``state``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = StrategyGenerator(num_modules, rank, gain=gain, bias=bias)
    if state is not None:
        generator.load_state_dict(state)
    return generator


def regression_loss(predicted: torch.Tensor, target: torch.Tensor, reduction: PsgLoss) -> torch.Tensor:
    """The L1 distance between the PSG's scales and their target: summed over all scales, or their mean.

    With ``"sum"`` the loss (and its gradient) is the number of scales times the ``"mean"`` one.
    """
    distance = (predicted - target).abs()
    if reduction == "sum":
        return distance.sum()
    if reduction == "mean":
        return distance.mean()
    raise ValueError(f"unknown PSG loss reduction {reduction!r}; use 'sum' or 'mean'")


def regress_toward(
    generator: StrategyGenerator,
    statistics: torch.Tensor,
    target: torch.Tensor,
    *,
    steps: int,
    lr: float,
    reduction: PsgLoss = "sum",
) -> tuple[float, float]:
    """Stage 2: ``steps`` Adam steps on the L1 distance (:func:`regression_loss`) between the PSG's clamped scales
    and ``target``.

    The target is clamped like the scales the forward pass used, so ranks held at the floor give no gradient.

    Returns:
        The loss before the first and after the last step.
    """
    goal = target.detach().float().clamp(SCALE_MIN, SCALE_MAX)
    optimizer = torch.optim.Adam(generator.parameters(), lr=lr)
    with torch.no_grad():
        before = float(regression_loss(generator.scales(statistics), goal, reduction))
    for _ in range(steps):
        loss = regression_loss(generator.scales(statistics), goal, reduction)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = float(regression_loss(generator.scales(statistics), goal, reduction))
    return before, after


def save_generator(path: Path, tensors: StateDict, meta: Mapping[str, object]) -> None:
    """Write PSG weights (``path``, safetensors) and what personalization needs (``path`` with ``.json``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = safetensors_bytes({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata={"format": "pt"})
    write_bytes_atomic(path, data)
    write_text_atomic(path.with_suffix(".json"), json.dumps(meta, indent=2) + "\n")


def load_generator(path: Path) -> tuple[StateDict, dict[str, Any]]:
    """Read PSG weights and their metadata written by :func:`save_generator`."""
    meta_path = path.with_suffix(".json")
    if not path.is_file() or not meta_path.is_file():
        raise UserError(f"No trained PSG at {path}; run a `fedp2eft` method to completion first.")
    return load_file(str(path)), json.loads(meta_path.read_text())
