"""Client-side work of an experiment, as named operations any engine can call in any process.

A :class:`Worker` holds what one process needs to act as any client: the federated data, the model runtime (the
base model loaded once), the configured methods and the per-client state stores. The local engine calls it
in-process; the Flower ClientApp builds one per process from the run directory and calls the same operations, so
both engines compute the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from safetensors.torch import save_file

from fedpeft.base_models import ClientBase, client_base_tensors, train_centralized_base
from fedpeft.continual import OthersSample, memory_view
from fedpeft.core.checkpoints import SUFFIX, load_checkpoint, save_checkpoint
from fedpeft.core.config import BASE_STAGE_LABEL, ExperimentConfig, MethodConfig, ModelConfig, method_config
from fedpeft.core.faults import FaultConfig, before_work, corrupt, reaching_faults
from fedpeft.core.io import relative_path, staged_dir, staged_files, write_text_atomic
from fedpeft.core.records import ResultRecord, result_record
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import client_seed
from fedpeft.core.stores import ClientStateStore, make_store
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, TrainResult, on_cpu
from fedpeft.data.types import ClientData, FederatedData
from fedpeft.federation import build_federation
from fedpeft.methods.base import Budget, Method, method_class, per_client_base_stage
from fedpeft.methods.families.per_architecture import for_architectures
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.models.text import warn_unknown_text

BASE_LABEL = "base"
CLIENT_BASE_TYPES = (ClientBase, LoraSpec)  # the dataclasses of a client's own base model, as checkpointed


def build_method(entry: MethodConfig | dict[str, Any], experiment: ExperimentConfig | None = None) -> Method:
    """Instantiate a registered method from its typed config (or a config mapping ``{"name": ..., **fields}``).

    With the ``experiment`` config of a heterogeneous federation, a method that cannot share across
    architectures runs once per architecture group (:mod:`fedpeft.methods.families.per_architecture`).
    """
    cfg = method_config(entry)
    method: Method = method_class(cfg.name)(cfg)
    if experiment is not None:
        method = for_architectures(method, len(experiment.models) > 1)
    return method


def build_data(cfg: ExperimentConfig) -> FederatedData:
    """Build the federated dataset named in the config."""
    import fedpeft.data.catalog  # noqa: F401  (registers the datasets)

    return DATASETS.get(cfg.data.name)(cfg.data)


def build_runtime(cfg: ExperimentConfig, data: FederatedData, model: ModelConfig | None = None) -> ModelRuntime:
    """Load the base model once for this process (``model``: another architecture's; default: the first one)."""
    from fedpeft.models.runtime import resolve_device
    from fedpeft.models.table import load_model

    model = model or (next(iter(cfg.models.values())) if cfg.models else cfg.model)
    device = resolve_device(cfg.device)
    loaded = load_model(model, task=data.task, num_labels=data.num_labels, corpus=data.corpus, device=device)
    runtime_class = ModelRuntime
    if getattr(loaded.model.config, "vision_config", None) is not None:  # image-text models (LLaVA)
        from fedpeft.models.multimodal import MultimodalRuntime

        runtime_class = MultimodalRuntime
    return runtime_class(
        loaded,
        max_length=model.max_length,
        device=device,
        eval_batch_size=cfg.eval.batch_size,
        max_new_tokens=cfg.eval.max_new_tokens,
        dtype=model.dtype,
        grad_accum_steps=cfg.train.grad_accum_steps,
        chat_template=model.chat_template,
        max_steps=cfg.train.max_steps,
        eval_max_batches=cfg.eval.max_batches,
    )


@runtime_checkable
class SavableExtension(Protocol):
    """An adapter PEFT lacks (PQ-LoRA, gated branches) that writes itself to a directory."""

    def save(self, directory: Path) -> Path: ...


def records_of(
    method: str,
    budget: Budget,
    client: ClientData,
    seed: int,
    round_: int | None,
    metrics: Metrics,
    split: str = "test",
) -> list[ResultRecord]:
    """Tidy ``results.jsonl`` records of one client's evaluation (or, with another ``split``, other facts)."""
    return [
        result_record(
            method,
            budget,
            pool=client.pool,
            client=client.client_id,
            group=client.group,
            seed=seed,
            round_=round_,
            split=split,
            metric=name,
            value=value,
        )
        for name, value in metrics.items()
    ]


@dataclasses.dataclass
class ClientRound:
    """One client's round of local work, set up by :meth:`Worker.begin_training` and closed by
    :meth:`Worker.finish_training`; what the method computes between the two is the only part that differs between
    training one client (:meth:`Worker.train`) and a batch of them (:mod:`fedpeft.engine.batched`).

    Attributes:
        client: the client as it trains this round (a stream's episodic memory so far).
        runtime: the runtime of its architecture, its base model in place.
        payload: what the server sent it.
        client_state: its own state from earlier rounds (``None``: none yet).
        seed: its seed of this round.
        round_: the round (from 0).
        store: where its new state is kept.
        faults: the injected faults that strike it this round.
    """

    client: ClientData
    runtime: ModelRuntime
    payload: Payload
    client_state: Any
    seed: int
    round_: int
    store: ClientStateStore
    faults: list[FaultConfig]


@dataclasses.dataclass
class Personalizing:
    """A client ready to be personalized at each of its budgets (:meth:`Worker.begin_personalization`).

    Attributes:
        client: the client.
        runtime: the runtime of its architecture, its base model in place.
        prepared: what :meth:`Method.prepare_personalization` gave it, shared by its budgets.
        budgets: the budgets it is personalized at.
        seconds: the time its preparation took.
    """

    client: ClientData
    runtime: ModelRuntime
    prepared: Any
    budgets: list[Budget]
    seconds: float


def state_at(budget: Budget, state: ServerState, budget_states: dict[int, ServerState] | None) -> ServerState:
    """The server state a client personalizes from at ``budget``: the budget's own federated phase's, for a method
    with one per budget (``budget_states``), else ``state``."""
    return budget_states[budget] if budget_states and isinstance(budget, int) else state


class Worker:
    """Everything one process needs to run any client's work of one experiment."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        *,
        data: FederatedData | None = None,
        runtime: ModelRuntime | None = None,
        load_model: bool = True,
        state: Literal["memory", "disk"] | None = None,
    ) -> None:
        """``runtime``: the first architecture's, already loaded (default: loaded here); ``load_model`` False leaves
        it unloaded until something asks for :attr:`runtime` (a server whose worker processes hold the model);
        ``state``: where per-client state lives between rounds (default ``engine.state``; ``disk`` where worker
        processes share the clients: :class:`~fedpeft.engine.resources.EngineSettings`)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.state: Literal["memory", "disk"] = state or cfg.engine.state
        if cfg.threads:
            # Tiny models run fastest on one thread; big ones want every core.
            torch.set_num_threads(cfg.threads)
        self.data = data if data is not None else build_data(cfg)
        self.federation = build_federation(
            cfg, self.data.clients, runtime, self._build_architecture, public=self.data.base_train
        )
        if load_model:
            self.runtime  # noqa: B018  (loads it now)
        self.methods: dict[str, Method] = {}
        for entry in cfg.methods:
            method = build_method(entry, cfg)
            method.bind_federation(self.federation)
            self.methods[method.label] = method
        self.methods[BASE_STAGE_LABEL] = build_method(cfg.base.method)
        self.clients = {c.client_id: c for c in self.data.clients}
        self._stores: dict[tuple[str, int], ClientStateStore] = {}
        self._base_seed: int | None = None
        self._loaded_undo: dict[str, torch.Tensor] = {}  # loaded tensors the shared base of a seed replaced
        self._client_undo: dict[str, torch.Tensor] = {}  # shared tensors a client's own base replaced
        self._shared_saved: set[Path] = set()  # shared adapters this process wrote (written once)
        self._others: OthersSample | None = None  # the round evaluation's "Others" sample, drawn on first use

    @property
    def runtime(self) -> ModelRuntime:
        """The runtime of the first architecture (the only one in a homogeneous federation), loaded on first use."""
        return self.federation.runtime(self.federation.names[0])

    @property
    def model_loads(self) -> int:
        """How many models this process has loaded for the worker (a runtime given to it not counted)."""
        return sum(self.federation.builds.values())

    # ------------------------------------------------------------------ base weights
    def base_checkpoint(self, seed: int) -> Path:
        """Where the base model of ``seed`` lives; a centralized base stage (standing in for pretraining) is
        trained once from ``base.seed`` and shared by every run seed, like a real pretrained checkpoint, unless
        ``base.per_seed`` trains one per run seed."""
        if self.cfg.base.shared:
            return self.run_dir / "checkpoints" / f"base-centralized{SUFFIX}"
        return self.run_dir / "checkpoints" / f"base-seed{seed}{SUFFIX}"

    def use_base(self, seed: int | None) -> None:
        """Make the base model of ``seed`` the runtime's starting point (``None``: the loaded weights).

        The runtime's parameters are the one copy of the base weights: a seed's base model is put in place over
        the loaded weights, and of those the worker keeps only the tensors it replaced (all of them after a
        centralized base stage, the merged layers and the head after a federated LoRA one), to go back to them.
        """
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

    # ------------------------------------------------------------------ per-client base models
    @property
    def per_client_base(self) -> bool:
        """Whether the base stage gives every client a base model of its own (FedDPA-T, DEPT(SPEC))."""
        return self.cfg.base.kind == "federated" and per_client_base_stage(self.methods[BASE_STAGE_LABEL])

    def client_base_path(self, seed: int, client_id: str) -> Path:
        """Where one client's own changes to the shared base model of ``seed`` live."""
        return self.run_dir / "checkpoints" / "client-base" / f"seed{seed}" / f"{client_id}{SUFFIX}"

    def prepare_client_base(self, seed: int, client_id: str, state: ServerState | None = None) -> int:
        """Compute and store one client's own base model (its changes to the shared one); returns its bytes.

        Runs where the client's base-stage state lives (its node), right after the base stage, with the stage's
        final server ``state``; a stored one is kept (resume).
        """
        path = self.client_base_path(seed, client_id)
        if path.exists():
            return 0
        method = self.methods[BASE_STAGE_LABEL]
        self.use_base(seed)
        client_state = self.store(BASE_STAGE_LABEL, seed).get(client_id)
        pseed = client_seed(seed, method.name, "client-base", None, client_id)
        delta = method.client_base(self.runtime, self.clients[client_id], state or ServerState(), client_state, pseed)
        save_checkpoint({"client_base": delta}, path, CLIENT_BASE_TYPES)
        self.runtime.install(ClientModel())
        return path.stat().st_size

    # ------------------------------------------------------------------ the server's work on the model
    # Run once for no client (``Engine.call_worker``): in this process, or on a worker process when those hold the
    # model, so that the server's process needs none.
    def check_model(self, budgets: Sequence[int]) -> None:
        """The checks of a run that need the loaded model: refuse a budget above the rank its layers allow, and warn
        of clients whose text its tokenizer cannot read.

        Raises:
            UserError: a budget the model cannot serve.
        """
        for budget in budgets:
            self.runtime.check_budget(budget)
        if self.cfg.data.sites is None:  # site-local examples stay on their nodes
            warn_unknown_text(self.runtime.text, self.data.clients, self.cfg.model.name)

    def init_server(self, label: str, seed: int, budget: int | None = None) -> ServerState:
        """The initial server state of method ``label`` for ``seed`` (and ``budget``, for a method with a federated
        phase per budget), from the base model its phase starts from."""
        method = self.methods[label]
        self.use_base(None if label == BASE_STAGE_LABEL else seed)
        if budget is None:
            state = method.init_server(self.runtime, seed)
        else:
            state = method.init_server_for_budget(self.runtime, seed, budget)
        return on_cpu(state) if self.runtime.device.type != "cpu" else state

    def export_base(self, seed: int, state: ServerState) -> None:
        """Write the base model of ``seed`` that the federated base stage's final ``state`` gives (its checkpoint,
        :meth:`base_checkpoint`)."""
        self.use_base(None)
        tensors = self.methods[BASE_STAGE_LABEL].export_base(self.runtime, state)
        save_checkpoint({"tensors": tensors}, self.base_checkpoint(seed))

    def save_base_model(self, seed: int | None = None) -> None:
        """Write the base model saved adapters load onto, in Hugging Face format (:func:`base_model_dir`): the
        loaded weights (``seed`` None) or the base model of ``seed``; in a heterogeneous federation every
        architecture's (the others' are their loaded, or centrally trained, weights)."""
        tensors = self.pretrained if seed is None else load_checkpoint(self.base_checkpoint(seed))["tensors"]
        federation = self.federation
        if not federation.heterogeneous:
            write_base_model(self.runtime, tensors, base_model_dir(self.run_dir), self.data.label_names)
            return
        for name in federation.names:
            runtime, own = federation.runtime(name), tensors
            if runtime is not self.runtime:
                runtime.load_base(None)  # the weights its base stage left (checkpoints/base-centralized-<name>)
                own = runtime.base_state()
            write_base_model(runtime, own, base_model_dir(self.run_dir, name), self.data.label_names)

    def compute_costs(self, label: str, seed: int) -> list[dict]:
        """Method ``label``'s own ``costs.jsonl`` rows of ``seed`` (e.g. per-budget FLOPs and forward time)."""
        return self.methods[label].compute_costs(self.runtime, seed)

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

    def store(self, label: str, seed: int) -> ClientStateStore:
        key = (label, seed)
        if key not in self._stores:
            root = self.run_dir / "client_state" / label / f"seed{seed}"
            self._stores[key] = make_store(self.state, root)
        return self._stores[key]

    # ------------------------------------------------------------------ architectures
    def _build_architecture(self, name: str) -> ModelRuntime:
        """Load architecture ``name``; with a centralized base stage, its base model is trained once on the base
        corpus like the first architecture's (``checkpoints/base-centralized-<name>.safetensors``) and reused; the
        first architecture is loaded as it is (its base stage is the run's own)."""
        if name == self.federation.names[0]:
            return build_runtime(self.cfg, self.data)
        runtime = build_runtime(self.cfg, self.data, self.cfg.models[name])
        base = self.cfg.base
        if base.kind == "centralized":
            path = self.run_dir / "checkpoints" / f"base-centralized-{name}{SUFFIX}"
            if not path.exists():
                train_centralized_base(runtime, self.data.base_train, base)
                save_checkpoint({"tensors": runtime.base_state()}, path)
            runtime.set_initial_base(load_checkpoint(path)["tensors"])
        return runtime

    def runtime_for(self, client_id: str) -> ModelRuntime:
        """The runtime of the client's architecture (the worker's one runtime in a homogeneous federation)."""
        return self.federation.runtime_of(client_id)

    def base_model_of(self, client_id: str) -> Path:
        """The directory of the base model the client's adapters load onto (its architecture's, in a heterogeneous
        federation)."""
        federation = self.federation
        return base_model_dir(self.run_dir, federation.architecture_of(client_id) if federation.heterogeneous else None)

    def client_in_round(self, client_id: str, round_: int, rounds: int) -> ClientData:
        """The client as it trains in round ``round_``: a stream dataset gives its episodic memory so far."""
        return memory_view(self.clients[client_id], round_, rounds)

    # ------------------------------------------------------------------ operations
    def train(self, label: str, seed: int, round_: int, client_id: str, payload: Payload) -> TrainResult:
        """One client's local work in one federated round (with the config's injected faults, if any strike):
        its update, and the faults that struck it."""
        work = self.begin_training(label, seed, round_, client_id, payload)
        update, client_state = self.methods[label].client_update(
            work.runtime, work.client, payload, work.client_state, work.seed
        )
        return self.finish_training(work, update, client_state)

    def begin_training(self, label: str, seed: int, round_: int, client_id: str, payload: Payload) -> ClientRound:
        """Everything of a client's round before its method's work: the injected faults that strike it (one that
        crashes or delays the client does so here), its base model put in place, its data, state and seed."""
        faults = [fault for fault in self.cfg.faults if fault.applies(label, client_id, round_)]
        before_work(faults)
        method = self.methods[label]
        if label == BASE_STAGE_LABEL:
            self.use_base(None)
        else:
            self.use_client_base(seed, client_id)
        store = self.store(label, seed)
        return ClientRound(
            client=self.client_in_round(client_id, round_, method.rounds),
            runtime=self.runtime_for(client_id),
            payload=payload,
            client_state=store.get(client_id),
            seed=client_seed(seed, method.name, "train", round_, client_id),
            round_=round_,
            store=store,
            faults=faults,
        )

    def finish_training(self, work: ClientRound, update: ClientUpdate, client_state: Any) -> TrainResult:
        """Everything of a client's round after its method's work: its update and new state moved to the CPU, the
        state kept, the update as the injected faults leave it."""
        if work.runtime.device.type != "cpu":  # what travels and stays between rounds lives on the CPU
            update, client_state = on_cpu((update, client_state))
        if client_state is not None:
            work.store.put(work.client.client_id, client_state, work.round_)
        return TrainResult(corrupt(work.faults, update, work.payload), reaching_faults(work.faults))

    def evaluate_base(self, seed: int, client_id: str) -> list[ResultRecord]:
        """The base model (no personalization) on one client's test split (the client's own, if it has one)."""
        self.use_client_base(seed, client_id)
        client = self.clients[client_id]
        runtime = self.runtime_for(client_id)
        runtime.install(ClientModel())
        return records_of(BASE_LABEL, None, client, seed, None, runtime.evaluate(client.test))

    def personalize(
        self,
        label: str,
        seed: int,
        client_id: str,
        state: ServerState,
        *,
        save_adapters: bool = False,
        budget_states: dict[int, ServerState] | None = None,
    ) -> tuple[list[ResultRecord], float]:
        """Personalize one client at every budget of the method and evaluate it.

        ``budget_states`` holds the server state of each budget for methods with one federated phase per budget.
        Returns the records and the seconds spent personalizing (evaluation excluded).
        """
        method = self.methods[label]
        ready = self.begin_personalization(label, seed, client_id, state)
        records: list[ResultRecord] = []
        seconds = ready.seconds
        for budget in ready.budgets:
            pseed = client_seed(seed, method.name, "personalize", budget, client_id)
            budget_state = state_at(budget, state, budget_states)
            started = time.perf_counter()
            model = method.personalize(ready.runtime, ready.client, budget_state, ready.prepared, budget, pseed)
            seconds += time.perf_counter() - started
            records += self.personalized_records(label, seed, client_id, budget, budget_state, model, save_adapters)
        return records, seconds

    def begin_personalization(self, label: str, seed: int, client_id: str, state: ServerState) -> Personalizing:
        """Everything of a client's personalization before its budgets: its base model put in place and the work
        every budget shares (:meth:`Method.prepare_personalization`, e.g. BayesTune's rank scales), timed, its
        artifacts saved."""
        method = self.methods[label]
        self.use_client_base(seed, client_id)
        client = self.clients[client_id]
        runtime = self.runtime_for(client_id)
        started = time.perf_counter()
        pseed = client_seed(seed, method.name, "prepare", None, client_id)
        prepared = method.prepare_personalization(runtime, client, state, self.store(label, seed).get(client_id), pseed)
        seconds = time.perf_counter() - started
        method.save_client_artifacts(prepared, client, self.run_dir, label, seed)
        return Personalizing(client, runtime, prepared, method.budgets_of(client, self.cfg.budgets), seconds)

    def personalized_records(
        self,
        label: str,
        seed: int,
        client_id: str,
        budget: Budget,
        state: ServerState,
        model: ClientModel,
        save_adapters: bool,
    ) -> list[ResultRecord]:
        """Evaluate one client's personalized ``model`` at ``budget`` (from the server ``state`` of that budget),
        its variants too, save its adapter if asked; returns the records (:meth:`personalize`'s, per budget)."""
        method = self.methods[label]
        client = self.clients[client_id]
        runtime = self.runtime_for(client_id)
        rounds = method.rounds if method.federated else None
        pseed = client_seed(seed, method.name, "personalize", budget, client_id)
        metrics = method.evaluate(runtime, client, model, pseed)
        records = records_of(label, budget, client, seed, rounds, metrics)
        if save_adapters and model.lora is not None:
            shared = self._is_shared(model, state, runtime)
            target = self.save_adapter(label, budget, client_id, shared=shared)
            if model.routing is not None:  # how a mixture-of-experts model runs this adapter
                write_text_atomic(target / "routing.json", json.dumps(dataclasses.asdict(model.routing)) + "\n")
        elif save_adapters and isinstance(model.extension, SavableExtension):  # adapters PEFT lacks
            model.extension.save(adapter_dir(self.run_dir, label, budget, client_id))
        records += records_of(label, budget, client, seed, rounds, model.info, split="personalize")
        for name, variant in model.variants.items():
            runtime.install(variant, seed=pseed)
            metrics = runtime.evaluate(client.test)
            records += records_of(f"{label}-{name}", budget, client, seed, rounds, metrics)
        return records

    def _is_shared(self, model: ClientModel, state: ServerState, runtime: ModelRuntime) -> bool:
        """Whether the client's personalized model is the server's global adapter as it is (FedIT or FedProx
        without fine-tuning): the same for every client, so saved once. Decided on content: the active adapter's
        tensors equal ``state.tensors`` (same names, dtypes, shapes and values), on the shared base model."""
        if model.base is not None or model.extension is not None or self.per_client_base or not state.tensors:
            return False
        if model.routing is not None:  # how the client runs the adapter (e.g. FLAME's learned rescaler) is its own
            return False
        return same_tensors(runtime.adapter_state(), state.tensors)

    def evaluate_round(
        self, label: str, seed: int, round_: int, client_id: str, state: ServerState
    ) -> list[ResultRecord]:
        """A client's current model after ``round_`` completed rounds of a federated phase: accuracy on its own
        test examples seen so far (``split: test``; for generation also METEOR, ROUGE-1 and ROUGE-L) and on the
        other clients' (``split: others``)."""
        from fedpeft import continual

        method = self.methods[label]
        self.use_base(seed)
        rounds = method.rounds
        client = self.client_in_round(client_id, max(round_ - 1, 0), rounds)
        budget = self.cfg.budgets[0] if method.uses_budget else None
        pseed = client_seed(seed, method.name, "evaluate", round_, client_id)
        client_state = self.store(label, seed).get(client_id)
        runtime = self.runtime_for(client_id)
        model = method.personalize(runtime, client, state, client_state, budget, pseed)
        runtime.install(model, seed=pseed)
        own = continual.seen_test(self.clients[client_id], round_, rounds)
        others = self._others_sample().without(client_id)
        records = records_of(label, budget, client, seed, round_, continual.scores(runtime, own))
        if others:
            value = {"accuracy": continual.accuracy(runtime, others)}
            records += records_of(label, budget, client, seed, round_, value, split=continual.OTHERS_SPLIT)
        return records

    def _others_sample(self) -> OthersSample:
        """The "Others" sample of the round evaluation, drawn once for this worker (its clients do not change)."""
        if self._others is None:
            evaluation = self.cfg.eval
            self._others = OthersSample(
                self.data.clients, evaluation.others_per_client, self.cfg.data.seed, evaluation.others_clients
            )
        return self._others

    def save_adapter(self, label: str, budget: Budget, client_id: str, *, shared: bool = False) -> Path:
        """Write the active adapter in PEFT format (loadable with ``PeftModel.from_pretrained``); returns its directory.

        A client's own adapter goes to :func:`adapter_dir`; a ``shared`` one (the global adapter every client keeps)
        goes to ``adapters/<label>/global/`` (``adapters/<label>/<budget>/global/`` at a budget), written once by
        this process however many clients keep it.
        """
        runtime = self.runtime_for(client_id)
        assert runtime.active is not None and runtime.peft is not None
        target = adapter_dir(self.run_dir, label, budget, None if shared else client_id)
        if shared and target in self._shared_saved:
            return target
        # Relative to the adapter directory (``../../../base_model`` for adapters/<label>/global/), so it still
        # holds after the run is moved.
        config = runtime.saved_adapter_config(relative_path(self.base_model_of(client_id), target))
        tensors = {k: v.contiguous() for k, v in runtime.adapter_state().items()}
        with staged_files(target) as staging:  # each file written whole, then renamed into place
            config.save_pretrained(str(staging))
            save_file(tensors, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        if shared:
            self._shared_saved.add(target)
        return target


SHARED_ADAPTER_DIR = "global"  # the one adapter every client of a method keeps
OWN_ADAPTERS_DIR = "clients"  # budget-less methods' per-client adapters: adapters/<label>/clients/<client>/


BASE_MODEL_DIR = "base_model"


def base_model_dir(run_dir: Path, architecture: str | None = None) -> Path:
    """Where a run keeps a base model in Hugging Face format, the base its saved adapters name: ``base_model/``,
    or ``base_model/<architecture>/`` for each architecture of a heterogeneous federation."""
    root = Path(run_dir) / BASE_MODEL_DIR
    return root / architecture if architecture is not None else root


def adapter_dir(run_dir: Path, label: str, budget: Budget, client_id: str | None) -> Path:
    """Where a run keeps an adapter of method ``label``.

    ``client_id`` ``None`` is the adapter every client keeps: ``adapters/<label>/global/`` (budget-less) or
    ``adapters/<label>/r<budget>/global/``. A client's own adapter: ``adapters/<label>/r<budget>/<client>/`` (a tier
    name instead of ``r<budget>``), or ``adapters/<label>/clients/<client>/`` for a budget-less method.
    """
    root = Path(run_dir) / "adapters" / label
    if budget is not None:
        root = root / (f"r{budget}" if isinstance(budget, int) else str(budget))  # rank or tier
    if client_id is None:
        return root / SHARED_ADAPTER_DIR
    return (root / OWN_ADAPTERS_DIR if budget is None else root) / client_id


def write_base_model(
    runtime: ModelRuntime, tensors: dict[str, torch.Tensor], directory: Path, label_names: list[str] | None
) -> None:
    """Write ``tensors`` as ``runtime``'s model in Hugging Face format to ``directory`` (its config naming the
    classes after ``label_names``, its tokenizer or image processor beside it), whole or not at all."""
    config = labelled_config(runtime.base_model.config, label_names)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with staged_dir(directory) as target:  # written whole, then renamed into place
        config.save_pretrained(target)
        save_file(
            {k: v.detach().contiguous() for k, v in tensors.items()},
            str(target / "model.safetensors"),
            metadata={"format": "pt"},
        )
        for processor in (runtime.tokenizer, getattr(runtime.loaded, "image_processor", None)):
            if processor is not None:
                processor.save_pretrained(target)


def labelled_config(config: Any, label_names: list[str] | None) -> Any:
    """A copy of a model config that names its classes (``id2label``, ``label2id``) after the dataset's labels,
    when it has one output per label; otherwise the config itself."""
    if not label_names or getattr(config, "num_labels", None) != len(label_names):
        return config
    import copy

    named = copy.deepcopy(config)
    named.id2label = dict(enumerate(label_names))
    named.label2id = {name: index for index, name in enumerate(label_names)}
    return named


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
