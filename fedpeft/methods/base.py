"""The method contract: pure client and server functions on named tensors, and every hook an engine calls.

A method is a class registered in ``fedpeft.core.registry.METHODS`` with a pydantic ``Config``. It is generic
over its config, its server state and its client state: ``Method[ConfigT, ServerT, ClientT]``. The runner,
the worker and the engines call only what :class:`Method` declares here, each hook with a default:

- federated phase: ``init_server`` (or ``init_server_for_budget``), ``should_stop``, ``sample``, ``payload``,
  ``client_update``, ``update_spec`` (what the server accepts back), ``aggregate``;
- personalization: ``budgets_of``, ``check_budgets``, ``prepare_personalization``, ``personalize``,
  ``evaluate``;
- base stage: ``export_base``, ``client_base``;
- outputs: ``save_server_artifacts``, ``save_client_artifacts``, ``compute_costs`` (a method's reporting hooks are
  no part of the class: its registry declaration names them, ``fedpeft.catalog.methods``);
- the server's view of the federation: ``bind_federation``.

What no method changes is not a hook but a function of this module (or, where the runner calls it on the method,
a final method, :data:`FINAL`): the server step a config gives (:func:`method_server_step`), the upload of a
client trained in a batch (:func:`trained_update`), whether a method serves as a base stage
(:func:`serves_as_base_stage`, :func:`per_client_base_stage`), the pool rounds sample from (``bind_pool``,
``clients_per_round``).

The default server step (:func:`method_server_step`, :mod:`fedpeft.merging.server_step`) is the weighted mean of
the uploads, which a method's config may replace by a robust rule (``aggregation``) or client-level differential
privacy (``dp``); docs/privacy.md. A ``server_optimizer`` then takes that aggregate as a pseudo-gradient;
docs/server-optimizers.md.

Methods never choose how clients are executed (sequentially, in Flower, in parallel); the engine does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar, final

import torch

from fedpeft.base_models import ClientBase
from fedpeft.core.config import MethodConfig
from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.records import Budget
from fedpeft.core.registry import METHODS
from fedpeft.core.sampling import sample_clients
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData, Example
from fedpeft.merging.parts import build_server_step
from fedpeft.merging.server_step import ServerStep, WeightedMean
from fedpeft.models.multi_lora import LoraTraining, train_alone
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.settings.methods import (  # noqa: F401  (the config bases, importable from the contract's module too)
    DropoutConfig,
    FederatedConfig,
    FederatedLoraConfig,
    FineTuneSettings,
    LoraConfigMixin,
    MeanServerConfigMixin,
    SamplingConfig,
)
from fedpeft.training import EpochHook, LossHook, StepHook, TrainArgs

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from fedpeft.federation import Federation

ConfigT = TypeVar("ConfigT", bound=MethodConfig)
ServerT = TypeVar("ServerT", bound=ServerState)
ClientT = TypeVar("ClientT")


class Method(Generic[ConfigT, ServerT, ClientT]):
    """Base class of registered methods; see the module docstring for the contract.

    Type parameters: the method's config class, its server state (a :class:`ServerState` dataclass) and the
    per-client state it keeps in the client-state store between rounds (``None`` when it keeps none).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    # Has a federated phase (rounds of client_update and aggregate); otherwise only personalize runs.
    federated: ClassVar[bool] = True
    # Personalizes once per budget of the experiment (``budgets``); otherwise once, with budget None.
    uses_budget: ClassVar[bool] = False
    # Tensor-name fragments that never leave the client (checked by the method matrix tests).
    private_keys: ClassVar[tuple[str, ...]] = ()
    # One federated phase per budget (the server state depends on the budget, e.g. FedL2P's learning-rate MLP).
    federated_per_budget: ClassVar[bool] = False
    # A base stage of its own (``base.kind: federated``): ``export_base`` gives the shared base model; with
    # ``per_client_base`` also ``client_base`` (every client gets a base model of its own).
    base_stage: ClassVar[bool] = False
    per_client_base: ClassVar[bool] = False
    # The personalized model is base weights plus at most one LoRA (no extension, routing or instance-wise
    # inference), so it merges into a base model: every such federated method can serve as a base stage, each
    # client's base being its personalized model merged into the weights (the default ``client_base``).
    mergeable: ClassVar[bool] = True
    # Shares knowledge across architectures itself; otherwise a heterogeneous federation runs one copy of the
    # method per architecture group (fedpeft.methods.families.per_architecture).
    architecture_aware: ClassVar[bool] = False
    # Sends tensors between server and clients in its rounds (False: rounds of local training only).
    communicates: ClassVar[bool] = True
    # Trains the base model's own weights (full fine-tuning), which a float16 base cannot (model.dtype float16
    # keeps them in float16, and loss scaling cannot update float16 weights): refused at start there.
    trains_base_weights: ClassVar[bool] = False
    # Trainings a client runs in one round (Ditto-style methods train the global adapter, then the personal one).
    trainings_per_round: ClassVar[int] = 1
    # Its clients each train one LoRA with nothing of their own but data and seed (no extra loss, gradient edit or
    # hook): ``client_update`` runs ``client_training`` and uploads :func:`trained_update`, ``personalize`` runs
    # ``personal_training`` (where it gives one), so an engine may train several clients in one batch
    # (``engine.batch_clients``, fedpeft.models.multi_lora). A subclass that changes those hooks sets it False.
    batchable_clients: ClassVar[bool] = False
    # The clients rounds sample from (the seen pool), given by the runner before a federated phase
    # (:meth:`bind_pool`); DP's fixed denominator m is the number of clients sampled from it.
    _pool: list[str] | None = None

    def __init__(self, cfg: ConfigT) -> None:
        self.cfg: ConfigT = cfg

    @property
    def label(self) -> str:
        """The name of this method's rows in the outputs (``label`` if the config sets one, else the name)."""
        return self.cfg.label or self.cfg.name

    @property
    def rounds(self) -> int:
        """Rounds of the federated phase (0 for a method without one)."""
        return int(getattr(self.cfg, "rounds", 0))

    # ------------------------------------------------------------------ set-up
    def bind_federation(self, federation: Federation) -> None:
        """The server's view of the federation (every architecture's runtime, the public data), for methods
        that compute on the server (distillation). Called once when the worker is built."""

    def check_budgets(self, budgets: list[int]) -> None:
        """Refuse, before any training, budgets this method cannot serve (raise ``UserError``)."""

    @final
    def bind_pool(self, client_ids: Sequence[str]) -> None:
        """The clients the federated phase samples from, given by the runner before its rounds; DP's release
        divides by the number of clients :meth:`sample` draws from them (:meth:`clients_per_round`)."""
        self._pool = list(client_ids)

    @final
    def clients_per_round(self, round_: int = 0) -> int | None:
        """m, the number of clients :meth:`sample` draws in round ``round_`` from the bound pool (``None`` before
        :meth:`bind_pool`); the count does not depend on the seed."""
        return None if self._pool is None else len(self.sample(self._pool, round_, 0))

    # ------------------------------------------------------------------ federated phase
    def init_server(self, runtime: ModelRuntime, seed: int) -> ServerT:
        """The server state before the first round."""
        return ServerState()  # type: ignore[return-value]

    def init_server_for_budget(self, runtime: ModelRuntime, seed: int, budget: int) -> ServerT:
        """The initial server state of the federated phase for ``budget`` (methods with ``federated_per_budget``)."""
        return self.init_server(runtime, seed)

    def should_stop(self, state: ServerT) -> bool:
        """Whether the federated phase ends before its last round (early stopping); checked before every round."""
        return False

    def sample(self, client_ids: list[str], round_: int, seed: int) -> list[str]:
        """The clients of round ``round_``: ``fraction`` of them (at least ``min_clients``), drawn from ``seed``."""
        cfg = self.cfg
        if not isinstance(cfg, SamplingConfig):
            raise NotImplementedError(f"{self.name} has no federated phase")
        return sample_clients(client_ids, cfg.fraction, cfg.min_clients, seed, round_)

    def payload(self, state: ServerT, client_id: str) -> Payload:
        """What the server sends ``client_id`` this round (by default the global tensors)."""
        return Payload(tensors=state.tensors)

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: ClientT | None, seed: int
    ) -> tuple[ClientUpdate, ClientT | None]:
        """One client's local work in one round: its upload and its new client state (``None``: keep none)."""
        raise NotImplementedError(f"{self.name} has no federated phase")

    def client_training(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: ClientT | None, seed: int
    ) -> LoraTraining:
        """Batchable methods (``batchable_clients``): the LoRA training of ``client``'s :meth:`client_update`, which
        an engine may run together with other clients' and upload as :func:`trained_update` gives it."""
        raise NotImplementedError(f"{self.name} does not train its clients together")

    def update_spec(self, payload: Payload) -> dict[str, torch.Size] | None:
        """The keys and shapes of the tensors a client answering ``payload`` uploads; the server rejects an update
        with others (:mod:`fedpeft.engine.validation`). By default exactly the payload's tensors; ``None``: no
        check (a method whose uploads are not determined by what it sends)."""
        return {key: tensor.shape for key, tensor in payload.tensors.items()}

    def aggregate(self, state: ServerT, updates: Iterable[ClientUpdate]) -> tuple[ServerT, Metrics]:
        """The next server state from the round's updates (an iterator: aggregate as it streams): by default the
        new tensors of :func:`method_server_step`."""
        step = method_server_step(self)
        if step is None:
            raise NotImplementedError(f"{self.name}'s server step is not a weighted mean: it overrides aggregate")
        result = step(state, updates)
        if not result.tensors:
            return state, result.metrics
        new_state = dataclasses.replace(state, tensors=result.tensors, server_optimizer=result.moments)
        return new_state, result.metrics

    # ------------------------------------------------------------------ personalization
    def budgets_of(self, client: ClientData, budgets: Sequence[int]) -> list[Budget]:
        """The budgets ``client`` is personalized at: every experiment budget for methods that use one, else
        ``[None]``; tiered methods give the client's own tier."""
        return list(budgets) if self.uses_budget else [None]

    def prepare_personalization(
        self, runtime: ModelRuntime, client: ClientData, state: ServerT, client_state: ClientT | None, seed: int
    ) -> ClientT | None:
        """Work every budget of one client shares (e.g. BayesTune's rank scales), done once before
        :meth:`personalize` runs for each budget; returns the client state those calls receive."""
        return client_state

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerT,
        client_state: ClientT | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        """The model ``client`` keeps at ``budget``, from the final server state and its own state. By default the
        LoRA that :meth:`personal_training` describes, trained alone (a method without one overrides this)."""
        job = self.personal_training(runtime, client, state, client_state, budget, seed)
        if job is None:
            raise NotImplementedError(f"{self.name} gives its clients no personalized model")
        return fine_tune_job(runtime, job)

    def personal_training(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerT,
        client_state: ClientT | None,
        budget: Budget,
        seed: int,
    ) -> LoraTraining | None:
        """Batchable methods: the LoRA training of ``client``'s :meth:`personalize` at ``budget``, which an engine may
        run together with other clients'; the personalized model is its model with the trained adapter. ``None``:
        :meth:`personalize` trains nothing for this client."""
        return None

    def evaluate(self, runtime: ModelRuntime, client: ClientData, model: ClientModel, seed: int) -> Metrics:
        """Metrics of the personalized ``model`` on the client's test split (methods that infer differently, such
        as FedDPA's instance-wise adapter mixing, override this)."""
        runtime.install(model, seed=seed)
        return runtime.evaluate(client.test)

    # ------------------------------------------------------------------ base stage
    def export_base(self, runtime: ModelRuntime, state: ServerT) -> StateDict:
        """Every base tensor of the shared base model this method's final ``state`` gives: by default the weights
        the stage started from (each client's own model then comes from :meth:`client_base`)."""
        return runtime.base_state()

    def client_base(
        self, runtime: ModelRuntime, client: ClientData, state: ServerT, client_state: ClientT | None, seed: int
    ) -> ClientBase | None:
        """One client's own changes to the shared base model, computed on the runtime with the shared base
        installed; ``None`` keeps the shared base.

        By default (a method used as a base stage without one of its own) the client's personalized model from
        the final ``state``, merged into the weights."""
        model = self.personalize(runtime, client, state, client_state, None, seed)
        if model.extension is not None or model.routing is not None:
            raise UserError(f"{self.name}'s personalized model cannot be merged into a base model.")
        return ClientBase(tensors=dict(model.base or {}), lora=model.lora, adapter=dict(model.adapter))

    # ------------------------------------------------------------------ outputs
    def save_server_artifacts(self, state: ServerT, run_dir: Path, seed: int, architecture: str | None = None) -> None:
        """Write what the final server state of ``seed`` leaves besides records (e.g. FedP2EFT's PSG); in a
        heterogeneous federation, once per ``architecture`` with that architecture's state."""

    def save_client_artifacts(
        self, prepared: ClientT | None, client: ClientData, run_dir: Path, label: str, seed: int
    ) -> None:
        """Write what one client's :meth:`prepare_personalization` leaves for the reports (e.g. rank scales)."""

    def compute_costs(self, runtime: ModelRuntime, seed: int) -> list[JSONObject]:
        """Extra ``costs.jsonl`` records (e.g. per-budget FLOPs and forward time)."""
        return []


FINAL = frozenset({"bind_pool", "clients_per_round"})
"""The public methods of :class:`Method` that are no hooks: final (mypy refuses an override), the same for every
method, called on it by the runner; no part of :func:`contract`."""


def contract() -> dict[str, object]:
    """Every public member of the method contract, by name, as :class:`Method` defines it: the hooks (functions,
    classmethods, properties) and the class flags, not the :data:`FINAL` methods. What a wrapper of a method (the
    per-architecture groups) must either answer for itself or hand to the method it wraps."""
    return {name: member for name, member in vars(Method).items() if not name.startswith("_") and name not in FINAL}


def method_server_step(method: Method[Any, Any, Any]) -> ServerStep | None:
    """The server step ``method``'s config gives it (:func:`~fedpeft.merging.parts.build_server_step`), or ``None``
    when its ``aggregate`` is not a weighted mean of the uploads: its config names the parts of the step, innermost
    first (``MeanServerConfigMixin.server_parts``, in :mod:`fedpeft.settings.methods`; none for such a method, and
    then ``core.config.method_config`` refuses ``aggregation``, ``dp``, ``server_optimizer`` and an asynchronous
    ``schedule``, and secure aggregation cannot run it).

    By default the weighted mean (:class:`~fedpeft.merging.server_step.WeightedMean`), wrapped, in this order,
    by the config's ``dp`` (:class:`~fedpeft.merging.dp.DifferentialPrivacy`) or robust ``aggregation`` rule
    (:class:`~fedpeft.merging.robust.RobustRule`), then an asynchronous ``schedule``'s staleness weighting
    and mixing (:class:`~fedpeft.merging.staleness.StalenessMixing`), then its ``server_optimizer``
    (:class:`~fedpeft.merging.server_opt.ServerOptimizer`), each where the config sets it. A method that
    overrides ``aggregate`` around the mean calls the step this returns; a config without those settings (no
    federated phase) gives the weighted mean.
    """
    cfg = method.cfg
    if not isinstance(cfg, MeanServerConfigMixin):
        return WeightedMean()
    return build_server_step(cfg, method.clients_per_round)


def trained_update(client: ClientData, adapter: StateDict, metrics: Metrics) -> ClientUpdate:
    """The upload of a batchable method's ``client`` whose ``client_training`` trained ``adapter``: the adapter,
    weighted by the client's training examples."""
    return ClientUpdate(client.client_id, adapter, float(len(client.train)), metrics)


class BaseStageFlags(Protocol):
    """The class flags of a method (:class:`Method`, class or instance) that say how it serves as a base stage."""

    base_stage: ClassVar[bool]
    per_client_base: ClassVar[bool]
    federated: ClassVar[bool]
    mergeable: ClassVar[bool]
    uses_budget: ClassVar[bool]


def serves_as_base_stage(method: type[BaseStageFlags] | BaseStageFlags) -> bool:
    """Whether ``base: {kind: federated, method: <this>}`` works for ``method`` (a class or an instance): a base
    stage of its own, or a federated method without budgets whose personalized models merge into base weights."""
    return method.base_stage or (method.federated and method.mergeable and not method.uses_budget)


def per_client_base_stage(method: type[BaseStageFlags] | BaseStageFlags) -> bool:
    """Whether ``method`` (a class or an instance), as the base stage, gives every client a base model of its own."""
    return method.per_client_base or not method.base_stage


def method_class(name: str) -> type[Method[Any, Any, Any]]:
    """The registered class of the method ``name`` (or an alias), imported on first use.

    Raises:
        UserError: no method is registered as ``name``.
        TypeError: what is registered as ``name`` is not a :class:`Method` subclass.
    """
    cls = METHODS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"the method {name!r} is registered as {cls!r}, which is not a subclass of Method")
    return cls


def lora_spec(
    runtime: ModelRuntime,
    rank: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    targets: list[str] | None = None,
) -> LoraSpec:
    """A LoRA of ``rank`` on ``targets`` (default: all linear layers of the runtime's model and the fused expert
    tensors of a mixture-of-experts model; alpha: 2 * rank)."""
    if targets:
        from fedpeft.methods.families.lora_keys import target_spec

        return target_spec(runtime, rank, alpha, dropout, targets)
    return LoraSpec(
        rank=rank,
        alpha=float(alpha if alpha is not None else 2 * rank),
        targets=tuple(runtime.loaded.lora_targets),
        dropout=dropout,
        target_parameters=tuple(getattr(runtime.loaded, "lora_parameters", ())),
    )


class Schedule(TypedDict):
    """How long a client trains, as :class:`TrainArgs`' ``epochs`` and ``steps`` (one of them ``None``)."""

    epochs: float | None
    steps: int | None


class TrainHooks(TypedDict, total=False):
    """The fields of :class:`TrainArgs` a method may add to :func:`local_training`: what differs between methods
    enters the one training loop through these."""

    max_grad_norm: float | None
    extra_loss: LossHook | None
    after_backward: StepHook | None
    after_step: StepHook | None
    after_epoch: EpochHook | None
    optimizer_groups: list[dict[str, object]] | None
    model: torch.nn.Module | None


class ForwardOutputs(Protocol):
    """What an extra-loss hook (:data:`~fedpeft.training.LossHook`) reads of the model's outputs on the batch: a
    ``transformers`` model output with the task loss and the logits."""

    loss: torch.Tensor
    logits: torch.Tensor


def local_schedule(cfg: FederatedConfig, steps: int | None = None) -> Schedule:
    """How long a client trains in one round, as :class:`TrainArgs`' ``epochs`` and ``steps``: exactly ``steps``
    steps when given, else ``local_epochs`` epochs when set, else ``local_steps`` steps."""
    if steps is not None:
        return {"epochs": None, "steps": steps}
    return {"epochs": cfg.local_epochs, "steps": cfg.local_steps if cfg.local_epochs is None else None}


def local_training(
    cfg: FederatedConfig, seed: int, *, steps: int | None = None, lr: float | None = None, **hooks: Unpack[TrainHooks]
) -> TrainArgs:
    """How a client trains in one round under ``cfg``: its learning rate (or ``lr``), batch size, weight decay and
    :func:`local_schedule`, from ``seed``; ``hooks``: any other field of :class:`TrainArgs` (``extra_loss``, ...)."""
    return TrainArgs(
        lr=cfg.lr if lr is None else lr,
        batch_size=cfg.batch_size,
        seed=seed,
        weight_decay=cfg.weight_decay,
        **local_schedule(cfg, steps),
        **hooks,
    )


def fine_tune_if_asked(
    runtime: ModelRuntime, model: ClientModel, examples: list[Example], cfg: FineTuneSettings, *, seed: int
) -> ClientModel:
    """``model`` as it is, or, with ``cfg.finetune_epochs`` above 0, fine-tuned on ``examples`` for that many epochs
    (at ``cfg.finetune_lr``, else the training ``lr``)."""
    job = fine_tuning(model, examples, cfg, seed=seed)
    return model if job is None else fine_tune_job(runtime, job)


def fine_tuning(
    model: ClientModel, examples: list[Example], cfg: FineTuneSettings, *, seed: int
) -> LoraTraining | None:
    """The training :func:`fine_tune_if_asked` runs (``None`` without ``cfg.finetune_epochs``)."""
    if cfg.finetune_epochs <= 0:
        return None
    args = TrainArgs(lr=cfg.finetune_lr or cfg.lr, batch_size=cfg.batch_size, seed=seed, epochs=cfg.finetune_epochs)
    return LoraTraining(model, examples, args)


def fine_tune_job(runtime: ModelRuntime, job: LoraTraining) -> ClientModel:
    """Run ``job`` alone and return its model with the trained adapter (what :func:`fine_tune` returns)."""
    adapter, _ = train_alone(runtime, job)
    return ClientModel(lora=job.model.lora, adapter=adapter)


def fine_tune(runtime: ModelRuntime, model: ClientModel, examples: list[Example], args: TrainArgs) -> ClientModel:
    """Install ``model`` (fresh LoRA weights from ``args.seed`` where it gives none), train its adapter on
    ``examples`` as ``args`` says and return the trained model."""
    return fine_tune_job(runtime, LoraTraining(model, examples, args))
