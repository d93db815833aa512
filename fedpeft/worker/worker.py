"""The worker: what one process needs to act as any client of an experiment, and its operations by name.

A :class:`Worker` holds the federated data, the model runtime of each architecture (the base model loaded once), the
configured methods and the client-state stores, and composes one room per job: :class:`BaseModels` (the base model
in place), :class:`ClientStates` (the per-client states), :class:`ClientTraining` (a client's round),
:class:`Personalization` (a client personalized at its budgets and evaluated), :class:`Evaluation` (the base row,
the evaluation after a round) and :class:`SavedAdapters` (the adapters written). The operations an engine calls
(:data:`fedpeft.engine.operations.WORKER_OPERATIONS`) are its methods, each handing over to the room that does it;
the server's work on the model, run once for no client, is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch

from fedpeft.continual import memory_view
from fedpeft.core.checkpoints import load_checkpoint, save_checkpoint
from fedpeft.core.config import BASE_STAGE_LABEL, ExperimentConfig
from fedpeft.core.records import ResultRecord
from fedpeft.core.seeds import client_seed
from fedpeft.core.stores import ClientStateStore
from fedpeft.core.types import Payload, ServerState, TrainResult, on_cpu
from fedpeft.data.types import ClientData, FederatedData
from fedpeft.federation import build_federation
from fedpeft.methods.base import Method
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.models.text import warn_unknown_text
from fedpeft.worker.bases import CLIENT_BASE_TYPES, BaseModels
from fedpeft.worker.build import build_architecture, build_data, build_method
from fedpeft.worker.evaluation import Evaluation
from fedpeft.worker.files import SavedAdapters, base_model_dir, write_base_model
from fedpeft.worker.personalization import Personalization
from fedpeft.worker.states import ClientStates
from fedpeft.worker.training import ClientTraining


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
        ``state``: where per-client state lives between rounds (default ``engine.state``; a run passes the store of
        its engine's settings, ``disk`` where worker processes share the clients:
        :class:`~fedpeft.engine.resources.EngineSettings`)."""
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
        self.states = ClientStates(self.state, self.run_dir)
        self.bases = BaseModels(cfg, self.run_dir, self.federation, self.methods)
        self.adapters = SavedAdapters(self.run_dir, self.federation)
        rooms = (self.methods, self.clients, self.federation, self.bases, self.states)
        self.training = ClientTraining(cfg, *rooms)
        self.personalization = Personalization(cfg, self.run_dir, *rooms, self.adapters)
        self.evaluation = Evaluation(cfg, self.data, self.methods, self.federation, self.bases, self.states)

    def _build_architecture(self, name: str) -> ModelRuntime:
        return build_architecture(self.cfg, self.data, self.run_dir, name, first=name == self.federation.names[0])

    @property
    def runtime(self) -> ModelRuntime:
        """The runtime of the first architecture (the only one in a homogeneous federation), loaded on first use."""
        return self.federation.runtime(self.federation.names[0])

    @property
    def model_loads(self) -> int:
        """How many models this process has loaded for the worker (a runtime given to it not counted)."""
        return sum(self.federation.builds.values())

    def runtime_for(self, client_id: str) -> ModelRuntime:
        """The runtime of the client's architecture (the worker's one runtime in a homogeneous federation)."""
        return self.federation.runtime_of(client_id)

    def client_in_round(self, client_id: str, round_: int, rounds: int) -> ClientData:
        """The client as it trains in round ``round_``: a stream dataset gives its episodic memory so far."""
        return memory_view(self.clients[client_id], round_, rounds)

    def store(self, label: str, seed: int) -> ClientStateStore:
        """The store of method ``label``'s client states for ``seed`` (:meth:`ClientStates.store`)."""
        return self.states.store(label, seed)

    # ------------------------------------------------------------------ a client's operations
    def train(self, label: str, seed: int, round_: int, client_id: str, payload: Payload) -> TrainResult:
        """One client's local work in one federated round: its update, and the injected faults that struck it
        (:meth:`ClientTraining.train`)."""
        return self.training.train(label, seed, round_, client_id, payload)

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
        """One client personalized at every budget of the method and evaluated: its records and the seconds spent
        personalizing (:meth:`Personalization.personalize`)."""
        return self.personalization.personalize(
            label, seed, client_id, state, save_adapters=save_adapters, budget_states=budget_states
        )

    def evaluate_base(self, seed: int, client_id: str) -> list[ResultRecord]:
        """The base model on one client's test split (:meth:`Evaluation.evaluate_base`)."""
        return self.evaluation.evaluate_base(seed, client_id)

    def evaluate_round(
        self, label: str, seed: int, round_: int, client_id: str, state: ServerState
    ) -> list[ResultRecord]:
        """A client's current model after ``round_`` completed rounds (:meth:`Evaluation.evaluate_round`)."""
        return self.evaluation.evaluate_round(label, seed, round_, client_id, state)

    def prepare_client_base(self, seed: int, client_id: str, state: ServerState | None = None) -> int:
        """Compute and store one client's own base model (its changes to the shared one); returns its bytes.

        Runs where the client's base-stage state lives (its node), right after the base stage, with the stage's
        final server ``state``; a stored one is kept (resume).
        """
        path = self.bases.client_base_path(seed, client_id)
        if path.exists():
            return 0
        method = self.methods[BASE_STAGE_LABEL]
        self.bases.use_base(seed)
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
        self.bases.use_base(None if label == BASE_STAGE_LABEL else seed)
        if budget is None:
            state = method.init_server(self.runtime, seed)
        else:
            state = method.init_server_for_budget(self.runtime, seed, budget)
        return on_cpu(state) if self.runtime.device.type != "cpu" else state

    def export_base(self, seed: int, state: ServerState) -> None:
        """Write the base model of ``seed`` that the federated base stage's final ``state`` gives (its checkpoint,
        :meth:`BaseModels.base_checkpoint`)."""
        self.bases.use_base(None)
        tensors = self.methods[BASE_STAGE_LABEL].export_base(self.runtime, state)
        save_checkpoint({"tensors": tensors}, self.bases.base_checkpoint(seed))

    def save_base_model(self, seed: int | None = None) -> None:
        """Write the base model saved adapters load onto, in Hugging Face format (:func:`base_model_dir`): the
        loaded weights (``seed`` None) or the base model of ``seed``; in a heterogeneous federation every
        architecture's (the others' are their loaded, or centrally trained, weights)."""
        tensors = (
            self.bases.pretrained if seed is None else load_checkpoint(self.bases.base_checkpoint(seed))["tensors"]
        )
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
