"""The worker operations an engine may run for a client, by name: one explicit table, used in this process by the
local engine and on a node for a Flower message (:data:`fedpeft.engine.flower.messages.OPERATIONS` gives each its
message type). Nothing else of a worker can be called by name."""

from __future__ import annotations

from collections.abc import Callable

Operation = Callable[..., object]
"""Called with the worker (:class:`fedpeft.worker.Worker`), ``client_id`` and the operation's keyword arguments."""

# Each calls the method of the worker it is given (a subclass's, or a stand-in a test patched in).
WORKER_OPERATIONS: dict[str, Operation] = {
    "train": lambda worker, **kwargs: worker.train(**kwargs),
    "evaluate_base": lambda worker, **kwargs: worker.evaluate_base(**kwargs),
    "evaluate_round": lambda worker, **kwargs: worker.evaluate_round(**kwargs),
    "personalize": lambda worker, **kwargs: worker.personalize(**kwargs),
    "prepare_client_base": lambda worker, **kwargs: worker.prepare_client_base(**kwargs),
    # The server's work that needs the model, run once for no client (Engine.call_worker): the client is ignored.
    "check_model": lambda worker, client_id, **kwargs: worker.check_model(**kwargs),
    "init_server": lambda worker, client_id, **kwargs: worker.init_server(**kwargs),
    "export_base": lambda worker, client_id, **kwargs: worker.export_base(**kwargs),
    "save_base_model": lambda worker, client_id, **kwargs: worker.save_base_model(**kwargs),
    "compute_costs": lambda worker, client_id, **kwargs: worker.compute_costs(**kwargs),
}

SERVER_OPERATIONS = frozenset({"check_model", "init_server", "export_base", "save_base_model", "compute_costs"})
"""The operations that are the server's own work on the model, never a client's (no Flower message names them)."""


def operation(op: str) -> Operation:
    """The worker operation named ``op``.

    Raises:
        ValueError: ``op`` names none of :data:`WORKER_OPERATIONS`.
    """
    if op not in WORKER_OPERATIONS:
        raise ValueError(f"unknown worker operation {op!r}; the operations are {sorted(WORKER_OPERATIONS)}")
    return WORKER_OPERATIONS[op]
