"""The base model in place on a worker's runtime: the loaded weights, the base model of a seed (a centralized or
federated base stage's checkpoint) or a client's own base model on top of it (per-client base stages), put in place
over the one copy of the weights the runtime holds, and taken back to the loaded weights when asked."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from fedpeft.base_models import ClientBase, client_base_tensors
from fedpeft.core.checkpoints import SUFFIX, load_checkpoint
from fedpeft.core.config import BASE_STAGE_LABEL, ExperimentConfig
from fedpeft.federation import Federation
from fedpeft.methods.base import Method, per_client_base_stage
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime

CLIENT_BASE_TYPES = (ClientBase, LoraSpec)  # the dataclasses of a client's own base model, as checkpointed


class BaseModels:
    """Which base model the runtime of a worker starts from, and where each base model lives.

    The runtime's parameters are the one copy of the base weights: a seed's base model is put in place over the
    loaded weights, and of those only the tensors it replaced are kept (all of them after a centralized base stage,
    the merged layers and the head after a federated LoRA one), to go back to them; a client's own base model is
    put in place over the seed's the same way.

    Args:
        cfg: the experiment's config (its ``base`` settings).
        run_dir: the run directory, which holds the base models' checkpoints.
        federation: the worker's architectures; the base models are the first architecture's.
        methods: the worker's methods by label, the base stage's (``base-stage``) among them.
    """

    def __init__(
        self, cfg: ExperimentConfig, run_dir: Path, federation: Federation, methods: Mapping[str, Method]
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.federation = federation
        self.methods = methods
        self._base_seed: int | None = None
        self._loaded_undo: dict[str, torch.Tensor] = {}  # loaded tensors the shared base of a seed replaced
        self._client_undo: dict[str, torch.Tensor] = {}  # shared tensors a client's own base replaced

    @property
    def runtime(self) -> ModelRuntime:
        """The runtime of the first architecture, whose base models these are."""
        return self.federation.runtime(self.federation.names[0])

    def base_checkpoint(self, seed: int) -> Path:
        """Where the base model of ``seed`` lives; a centralized base stage (standing in for pretraining) is
        trained once from ``base.seed`` and shared by every run seed, like a real pretrained checkpoint, unless
        ``base.per_seed`` trains one per run seed."""
        if self.cfg.base.shared:
            return self.run_dir / "checkpoints" / f"base-centralized{SUFFIX}"
        return self.run_dir / "checkpoints" / f"base-seed{seed}{SUFFIX}"

    def use_base(self, seed: int | None) -> None:
        """Make the base model of ``seed`` the runtime's starting point (``None``: the loaded weights), the
        tensors it replaces kept to go back to them."""
        if self._client_undo:  # back to the shared base
            self.runtime.override_initial_base(self._client_undo)
            self._client_undo = {}
        if seed is not None and self._base_seed is not None and self._base_of(seed) == self._base_of(self._base_seed):
            self._base_seed = seed  # the same base model (shared by the seeds): in place already
            return
        if seed is None or self.cfg.base.kind == "pretrained":
            self._use_shared_base({})
        else:
            path = self.base_checkpoint(seed)
            if not path.exists():
                raise RuntimeError(f"base model of seed {seed} is missing at {path}")
            self._use_shared_base(load_checkpoint(path)["tensors"])
        self._base_seed = seed

    def _base_of(self, seed: int) -> Path | None:
        """The base model of ``seed``: its checkpoint, or None for the loaded weights (a pretrained base)."""
        return None if self.cfg.base.kind == "pretrained" else self.base_checkpoint(seed)

    def _use_shared_base(self, tensors: dict[str, torch.Tensor]) -> None:
        """Make the loaded weights with ``tensors`` in place the weights the runtime restores, and load them."""
        weights = self.runtime.weights
        if self._loaded_undo:  # back to the loaded weights
            weights.override_initial_base(self._loaded_undo)
        changed = {k: v for k, v in tensors.items() if not same_tensor(v, weights.initial_tensor(k))}
        self._loaded_undo = weights.override_initial_base(changed)
        weights.load_base(None)

    @property
    def pretrained(self) -> dict[str, torch.Tensor]:
        """The loaded weights, by canonical parameter name: the runtime's own tensors where the current base keeps
        them, the worker's kept ones elsewhere (no copy: read them before the weights change)."""
        initial = {name: self.runtime.weights.initial_tensor(name) for name in self.runtime.base_params}
        return {**initial, **self._client_undo, **self._loaded_undo}

    @property
    def per_client_base(self) -> bool:
        """Whether the base stage gives every client a base model of its own (FedDPA-T, DEPT(SPEC))."""
        return self.cfg.base.kind == "federated" and per_client_base_stage(self.methods[BASE_STAGE_LABEL])

    def client_base_path(self, seed: int, client_id: str) -> Path:
        """Where one client's own changes to the shared base model of ``seed`` live."""
        return self.run_dir / "checkpoints" / "client-base" / f"seed{seed}" / f"{client_id}{SUFFIX}"

    def use_client_base(self, seed: int, client_id: str) -> None:
        """Make ``client_id``'s own base model of ``seed`` the starting point (the shared one if there is none)."""
        self.use_base(seed)
        if not self.per_client_base:
            return
        path = self.client_base_path(seed, client_id)
        if not path.exists():
            raise RuntimeError(f"the base model of client {client_id} (seed {seed}) is missing at {path}")
        delta = load_checkpoint(path, CLIENT_BASE_TYPES)["client_base"]
        if delta is not None:
            self._client_undo = self.runtime.override_initial_base(client_base_tensors(self.runtime, delta))
        self.runtime.install(ClientModel())


def same_tensor(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two tensors hold the same dtype, shape and values (wherever each lives)."""
    if first.dtype != second.dtype or first.shape != second.shape:
        return False
    return torch.equal(first.detach().to(second.device), second.detach())


def same_tensors(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    """Whether two named-tensor mappings hold the same names, dtypes, shapes and values."""
    if first.keys() != second.keys():
        return False
    for key, tensor in first.items():
        other = second[key]
        if tensor.dtype != other.dtype or tensor.shape != other.shape:
            return False
        if not torch.equal(tensor.detach().cpu(), other.detach().cpu()):
            return False
    return True
