"""The Flower engine: the worker operations of an experiment run as Flower messages (ServerApp / ClientApp).

The server side is the same round loop and runner as with the local engine; only the engine differs:
:class:`GridEngine` sends every client's task (a round's local training, the base-model evaluation, the
personalization) as one Message through the ServerApp's ``Grid``, and the ClientApp runs the very same
:class:`~fedpeft.worker.Worker` operation the local engine calls in-process. Replies are sorted by client id
before aggregation, so both engines compute the same numbers.

Clients map to SuperNodes by partition: client ``i`` (in sorted client-id order) belongs to partition
``i % num-partitions``, and the node whose node config says ``partition-id = p`` serves partition ``p``. The server
asks each node for its partition with a first query message. The simulation engine gives its virtual nodes
``partition-id`` and ``num-partitions`` itself; in deployment each ``flower-supernode`` is started with
``--node-config "partition-id=P num-partitions=N"``.

Every message carries the run directory and the resolved config YAML, from which the ClientApp builds its worker
once per process (cached at module level). Nothing outside this package (and the app entry points in
:mod:`fedpeft.apps.flower`) handles Flower types:

- ``messages``: message types, record keys and node config keys;
- ``codec``: tensors into an ``ArrayRecord``, everything else into JSON in a ``ConfigRecord``; tasks and results;
- ``client``: the ClientApp and its handlers;
- ``grid``: :class:`GridEngine`, the engine the ServerApp runs the experiment with.
"""

from __future__ import annotations

from fedpeft.engine.flower.client import client_app
from fedpeft.engine.flower.codec import ClientTask, ClientTaskError, TaskResult, decode, encode, tensors_digest
from fedpeft.engine.flower.grid import GridEngine, flower_config

__all__ = [
    "ClientTask",
    "ClientTaskError",
    "GridEngine",
    "TaskResult",
    "client_app",
    "decode",
    "encode",
    "flower_config",
    "tensors_digest",
]
