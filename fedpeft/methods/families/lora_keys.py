"""What the LoRA-splitting methods share: which adapter tensors are A, B or head, and where LoRA goes.

FFA-LoRA, FedSA-LoRA, FedALT, Potara and Fisher merging treat the two LoRA factors (and the task head)
differently; they name them through these helpers, by the keys of ``ModelRuntime.adapter_state()``.
"""

from __future__ import annotations

from collections.abc import Callable

from fedpeft.core.errors import UserError
from fedpeft.core.types import StateDict
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.models.targets import matches


def is_lora_a(key: str) -> bool:
    return ".lora_A." in key


def is_lora_b(key: str) -> bool:
    return ".lora_B." in key


def is_lora(key: str) -> bool:
    """A LoRA factor (A or B); everything else in an adapter state is the task head."""
    return is_lora_a(key) or is_lora_b(key)


def module_of(key: str) -> str:
    """The module a LoRA tensor belongs to (``...q_proj.lora_A.weight`` -> ``...q_proj``)."""
    for marker in (".lora_A.", ".lora_B."):
        if marker in key:
            return key.split(marker)[0]
    return key


def only(state: StateDict, keep: Callable[[str], bool]) -> StateDict:
    """The tensors of ``state`` whose key passes the predicate ``keep``."""
    return {k: v for k, v in state.items() if keep(k)}


def target_spec(
    runtime: ModelRuntime, rank: int, alpha: float | None, dropout: float, targets: list[str] | None
) -> LoraSpec:
    """A LoRA of ``rank`` on ``targets`` (default: the model's linear layers); alpha defaults to 2 * rank."""
    chosen = tuple(targets) if targets else tuple(runtime.loaded.lora_targets)
    # runtime.target_modules: every linear layer LoRA may wrap, captured before PEFT replaced them.
    if targets and not any(matches(name, chosen) for name, _ in runtime.target_modules):
        raise UserError(
            f"The LoRA targets {list(chosen)} match no linear layer of the model; choose among "
            f"{', '.join(runtime.loaded.lora_targets)}."
        )
    return LoraSpec(rank=rank, alpha=float(alpha if alpha is not None else 2 * rank), targets=chosen, dropout=dropout)


def install_partial(runtime: ModelRuntime, spec: LoraSpec, tensors: StateDict, seed: int) -> StateDict:
    """Install a fresh adapter (A from ``seed``, B = 0, base head) with ``tensors`` loaded over it.

    ``tensors`` may hold any subset of the adapter (only A, only B, no head); returns the full state installed.
    """
    runtime.install(ClientModel(lora=spec), seed=seed)
    state = {**runtime.adapter_state(), **tensors}
    runtime.load_adapter(state)
    return state
