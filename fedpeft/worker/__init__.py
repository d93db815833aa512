"""Client-side work of an experiment, as named operations any engine can call in any process.

A :class:`Worker` holds what one process needs to act as any client: the federated data, the model runtime (the
base model loaded once), the configured methods and the per-client state stores. The local engine calls it
in-process; the Flower ClientApp builds one per process from the run directory and calls the same operations, so
both engines compute the same numbers.

One module per job: :mod:`~fedpeft.worker.worker` (the worker and its operations by name),
:mod:`~fedpeft.worker.build` (methods, data and runtimes built once per process), :mod:`~fedpeft.worker.bases`
(the base model in place), :mod:`~fedpeft.worker.states` (the per-client states), :mod:`~fedpeft.worker.training`
(a client's round), :mod:`~fedpeft.worker.personalization` (a client personalized at its budgets and evaluated),
:mod:`~fedpeft.worker.evaluation` (the base row, the evaluation after a round, the records of a client) and
:mod:`~fedpeft.worker.files` (the base model and the adapters a run keeps).
"""

from fedpeft.core.config import BASE_STAGE_LABEL
from fedpeft.worker.bases import CLIENT_BASE_TYPES, BaseModels, same_tensor, same_tensors
from fedpeft.worker.build import build_architecture, build_data, build_method, build_runtime
from fedpeft.worker.evaluation import BASE_LABEL, Evaluation, records_of
from fedpeft.worker.files import (
    BASE_MODEL_DIR,
    OWN_ADAPTERS_DIR,
    SHARED_ADAPTER_DIR,
    SavedAdapters,
    adapter_dir,
    base_model_dir,
    labelled_config,
    write_base_model,
)
from fedpeft.worker.personalization import Personalization, Personalizing, SavableExtension, state_at
from fedpeft.worker.states import ClientStates
from fedpeft.worker.training import ClientRound, ClientTraining
from fedpeft.worker.worker import Worker

__all__ = [
    "BASE_LABEL",
    "BASE_MODEL_DIR",
    "BASE_STAGE_LABEL",
    "CLIENT_BASE_TYPES",
    "OWN_ADAPTERS_DIR",
    "SHARED_ADAPTER_DIR",
    "BaseModels",
    "ClientRound",
    "ClientStates",
    "ClientTraining",
    "Evaluation",
    "Personalization",
    "Personalizing",
    "SavableExtension",
    "SavedAdapters",
    "Worker",
    "adapter_dir",
    "base_model_dir",
    "build_architecture",
    "build_data",
    "build_method",
    "build_runtime",
    "labelled_config",
    "records_of",
    "same_tensor",
    "same_tensors",
    "state_at",
    "write_base_model",
]
