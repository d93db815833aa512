"""What FedMosaic and its baselines share: compute matching, hooked adapters per architecture, batch replay.

- Compute matching (FedMosaic paper, Sec. A.6 and Table 15): every method trains ``round(local_steps /
  compute_scale)`` steps per round, ``compute_scale`` being its compute per step relative to SFT's, so that all
  methods spend SFT's compute per round. The defaults are the paper's measured ratios (Table 15);
  ``benchmarks/fedmosaic_costs.py`` measures ours.
- Adapters of these methods are :class:`~fedpeft.adapters.hooked.HookedAdapter` s whose ordinary-LoRA tensors
  are named after the architecture (``<architecture>:<module>.lora_A``), so averaging by name never mixes
  architectures, while PQ-LoRA tensors (``pq<k>.<type>.P``) are shared by all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypeVar

import torch

from fedpeft.adapters.hooked import GATED, SUM, HookedAdapter
from fedpeft.adapters.pq_lora import NUM_BLOCKS, layer_of, plan_sites
from fedpeft.adapters.weights import layer_weight
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData, Example
from fedpeft.methods.base import Budget, Method, local_training
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.settings.methods import PAPER_COMPUTE_SCALE, HeteroConfig  # noqa: F401  (PAPER_COMPUTE_SCALE: importable here too)
from fedpeft.training import Batch, LossHook, labelled_tail

if TYPE_CHECKING:
    from fedpeft.federation import Federation


def matched_steps(cfg: HeteroConfig) -> int:
    """Local steps of one round after compute matching: ``max(1, round(local_steps / compute_scale))``."""
    return max(1, round(int(cfg.local_steps or 1) / float(cfg.compute_scale)))


def example_batches(count: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """The example indices of each step of ``ModelRuntime.train`` (the same shuffles as ``runtime.batches``)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(count, generator=generator).tolist()
        for start in range(0, count, batch_size):
            yield order[start : start + batch_size]


def hooked_adapter(
    runtime: ModelRuntime,
    seed: int,
    *,
    rank: int,
    alpha: float | None = None,
    blocks: int = NUM_BLOCKS,
    pq: bool = True,
    branches: tuple[str, ...] = ("local", "global"),
    mix: str = GATED,
) -> HookedAdapter:
    """A fresh adapter for the runtime's architecture; every client of an architecture gets the same one."""
    sites = plan_sites(
        runtime.target_modules, runtime.loaded.lora_targets, runtime.architecture, num_blocks=blocks, pq=pq
    )
    adapter = HookedAdapter(sites, rank=rank, alpha=alpha, branches=branches, mix=mix)
    adapter.initialize(torch.Generator().manual_seed(derive_seed(seed, "adapter", runtime.architecture)))
    return adapter.add_head(runtime)


def gradient_module(runtime: ModelRuntime, suffix: str) -> str:
    """The module whose weight gradient RELA reads: the last layer's module ending in ``suffix`` (default the
    MLP ``down_proj``), or the last adapted module of the last layer when no module has that name."""
    names = [name for name, _ in runtime.target_modules]
    last = max(layer_of(name) or 0 for name in names)
    in_last = [name for name in names if layer_of(name) == last]
    matching = [name for name in in_last if name == suffix or name.endswith("." + suffix)]
    return (matching or in_last)[-1]


def frozen_gradient(runtime: ModelRuntime, module: str, examples: list[Example]) -> torch.Tensor:
    """The gradient of the task loss of the runtime's frozen base model w.r.t. ``module``'s weight, flattened.

    The caller makes sure no adapter is active on ``runtime`` (``runtime.install(ClientModel())`` or its own
    extension disabled).
    """
    weight = layer_weight(dict(runtime.target_modules)[module])
    model = runtime.activate(None)
    was_training, had_grad = model.training, weight.requires_grad
    batch = {k: v.to(runtime.device) for k, v in runtime.encode(examples).items()}
    model.eval()
    try:
        with runtime.forward_context(), torch.enable_grad():
            weight.requires_grad_(True)
            (grad,) = torch.autograd.grad(model(**labelled_tail(model, batch)).loss, weight)
    finally:
        weight.requires_grad_(had_grad)
        model.train(was_training)
    return grad.detach().reshape(-1).to(torch.float32)


def install_adapter(runtime: ModelRuntime, adapter: HookedAdapter) -> None:
    """Put ``adapter`` on the runtime's base model (PEFT adapters off)."""
    runtime.install(ClientModel(extension=adapter))


_SHARED_KEY = re.compile(r"^pq\d+\.")


def is_shared_key(name: str) -> bool:
    """Whether a tensor name is a PQ-LoRA one (``pq<k>.<type>.P|Q``), shared across architectures."""
    return bool(_SHARED_KEY.match(name))


def architecture_keys(tensors: StateDict, architecture: str) -> StateDict:
    """The tensors a client of ``architecture`` uses: PQ-LoRA ones and its architecture's ordinary LoRA."""
    return {k: v for k, v in tensors.items() if is_shared_key(k) or k.startswith(f"{architecture}:")}


@dataclass
class BranchedState(ServerState):
    """The shared branch of every architecture (``tensors``), each client's architecture and the architectures
    in the federation's order."""

    assignment: dict[str, str] = field(default_factory=dict)
    architectures: list[str] = field(default_factory=list)


HeteroConfigT = TypeVar("HeteroConfigT", bound=HeteroConfig)
BranchedStateT = TypeVar("BranchedStateT", bound=BranchedState)


class BranchedLoraBase(Method[HeteroConfigT, BranchedStateT, dict[str, StateDict]]):
    """Base of the baselines: hooked ordinary-LoRA branches named by architecture.

    ``branches`` are the adapter's branches; ``shared`` is the one the server aggregates (``None``: nothing is
    shared); the others are personal and live in the client state (branch name -> tensors, and ``head``).
    Aggregation is the data-weighted mean per tensor name, which never mixes architectures because ordinary-LoRA
    names carry the architecture.
    Subclasses give the server state (:class:`BranchedLoraMethod`: a :class:`BranchedState`).
    """

    architecture_aware = True
    mergeable = False  # hooked branches (an extension PEFT lacks) do not merge into the weights
    private_keys = ("head/",)
    branches: ClassVar[tuple[str, ...]] = ("global", "local")
    shared: ClassVar[str | None] = "global"
    personal_view: ClassVar[tuple[str, ...]] = ("local",)  # the branches of the model a client keeps

    def adapter(self, runtime: ModelRuntime, seed: int) -> HookedAdapter:
        cfg = self.cfg
        return hooked_adapter(runtime, seed, rank=cfg.rank, alpha=cfg.alpha, pq=False, branches=self.branches, mix=SUM)

    def population(self, runtime: ModelRuntime, seed: int) -> tuple[StateDict, Federation]:
        """The shared branch of every architecture's fresh adapter, and the federation of ``runtime``."""
        from fedpeft.federation import federation_of

        federation = federation_of(runtime)
        population: StateDict = {}
        if self.shared is not None:
            for name in federation.names:
                population.update(self.adapter(federation.runtime(name), seed).branch(self.shared))
        return population, federation

    def architecture(self, state: BranchedStateT, client_id: str) -> str:
        return state.assignment.get(client_id, state.architectures[0])

    def payload(self, state: BranchedStateT, client_id: str) -> Payload:
        return Payload(tensors=architecture_keys(state.tensors, self.architecture(state, client_id)))

    def client_adapter(
        self, runtime: ModelRuntime, shared: StateDict, client_state: dict[str, StateDict] | None
    ) -> HookedAdapter:
        """The client's adapter: the shared branch from the server, personal ones from its state (or copies of
        the shared one at the start)."""
        adapter = self.adapter(runtime, 0)
        for branch in self.branches:
            if branch == self.shared:
                adapter.load_branch(branch, shared)
            elif client_state is not None:
                adapter.load_branch(branch, client_state[branch])
            elif shared:
                adapter.load_branch(branch, shared)
        if client_state is not None:
            adapter.load(client_state["head"])
        return adapter

    def train_branches(
        self,
        runtime: ModelRuntime,
        adapter: HookedAdapter,
        examples: list[Example],
        train: tuple[str, ...],
        active: tuple[str, ...],
        seed: int,
        extra_loss: LossHook | None = None,
    ) -> Metrics:
        """Train the branches ``train`` (and the head) with ``active`` computing, for the compute-matched steps."""
        cfg = self.cfg
        adapter.active = active
        install_adapter(runtime, adapter)
        params = adapter.trainable([f"{b}/" for b in train] + ["head/"])
        try:
            args = local_training(cfg, seed, steps=matched_steps(cfg), extra_loss=extra_loss)
            return runtime.train(examples, args, params)
        finally:
            runtime.detach_extension()

    def train_personal(
        self,
        runtime: ModelRuntime,
        adapter: HookedAdapter,
        examples: list[Example],
        received: StateDict,
        lam: float,
        seed: int,
    ) -> Metrics:
        """Ditto's personal step: the ``local`` branch alone, with ``lam / 2 ||v - w||^2`` toward the global
        branch ``received`` from the server (its own seed, derived from ``seed``)."""
        params = adapter.trainable(["local/"])
        anchors = {f"local/{k}": v for k, v in received.items()}
        term = proximal(params, anchors, lam)
        personal_seed = derive_seed(seed, "personal")
        return self.train_branches(runtime, adapter, examples, ("local",), ("local",), personal_seed, term)

    def client_state(self, adapter: HookedAdapter) -> dict[str, StateDict]:
        """What the client keeps: its personal branches and its head."""
        state: dict[str, StateDict] = {b: adapter.branch(b) for b in self.branches if b != self.shared}
        state["head"] = adapter.group("head/")
        return state

    def shared_update(
        self, client: ClientData, adapter: HookedAdapter, metrics: Metrics, **extras: object
    ) -> ClientUpdate:
        tensors = adapter.branch(self.shared) if self.shared is not None else {}
        return ClientUpdate(client.client_id, tensors, float(len(client.train)), metrics, dict(extras))

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: BranchedStateT,
        client_state: dict[str, StateDict] | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        shared = architecture_keys(state.tensors, runtime.architecture) if state.architectures else {}
        adapter = self.client_adapter(runtime, shared, client_state)
        adapter.active = self.personal_view
        return ClientModel(extension=adapter)


class BranchedLoraMethod(BranchedLoraBase[HeteroConfigT, BranchedState]):
    """A :class:`BranchedLoraBase` whose server state is the plain :class:`BranchedState`."""

    def init_server(self, runtime: ModelRuntime, seed: int) -> BranchedState:
        population, federation = self.population(runtime, seed)
        return BranchedState(
            tensors=population, assignment=dict(federation.assignment), architectures=list(federation.names)
        )


def proximal(params: dict[str, torch.nn.Parameter], anchors: StateDict, lam: float) -> LossHook:
    """An extra-loss hook ``lam / 2 * sum ||p - anchor||^2`` over the named parameters that have an anchor."""
    pairs = [(params[k], anchors[k].to(params[k].dtype)) for k in params if k in anchors]

    def term(model: torch.nn.Module, batch: Batch, outputs: object) -> torch.Tensor:
        if not pairs:
            return torch.zeros(())
        return 0.5 * lam * torch.stack([((p - a) ** 2).sum() for p, a in pairs]).sum()

    return term
