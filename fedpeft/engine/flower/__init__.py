"""The Flower engine: the worker operations of an experiment run as Flower messages (ServerApp / ClientApp).

The server side is the same round loop and runner as with the local engine; only the engine differs:
:class:`GridEngine` sends each node one message per step (a round's local training of all the node's sampled
clients, the base-model evaluation, the personalization) through the ServerApp's ``Grid``, and the node runs the
very same :class:`~fedpeft.worker.Worker` operations the local engine calls in-process. Replies are sorted by
client id before aggregation, so both engines compute the same numbers.

Clients map to SuperNodes by partition: client ``i`` (in sorted client-id order) belongs to partition
``i % num-partitions``, and the node whose node config says ``partition-id = p`` serves partition ``p``. The server
asks each node for its partition with a first query message. The simulation engine gives its virtual nodes
``partition-id`` and ``num-partitions`` itself; in deployment each ``flower-supernode`` is started with
``--node-config "partition-id=P num-partitions=N"``.

Every message carries the run directory and the resolved config YAML, from which a node builds its worker once
per run: in the simulation, in the ClientApp's own long-lived process; in deployment, in a worker process the
node keeps for the run (the ClientApp Flower starts per message only relays). Nothing outside this package (and
the app entry points in :mod:`fedpeft.apps`) handles Flower types:

- ``messages``: message types, record keys and node config keys;
- ``codec``: tensors into an ``ArrayRecord``, everything else into JSON in a ``ConfigRecord``; tasks and results;
- ``client``: a node's handler of every message, and the simulation's ClientApp;
- ``relay`` / ``node_worker``: a deployment node's long-lived worker process and the light relay to it;
- ``grid``: :class:`GridEngine`, the engine the ServerApp runs the experiment with, composed of ``membership``
  (which node serves which client), ``exchange`` (the one loop that sends messages and takes in replies),
  ``outbox`` (steps of units at once, bundled per node), ``node_stats`` and ``base_sync``;
- ``secagg`` / ``secagg_mod``: rounds under SecAgg+.

Importing this package imports none of them (a deployment's ClientApp imports only the light ones); its names
are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedpeft.engine.flower.client import client_app
    from fedpeft.engine.flower.codec import ClientTaskError, NodeResult, NodeTask, decode, encode, tensors_digest
    from fedpeft.engine.flower.grid import GridEngine, flower_config

_WHERE = {
    "client_app": "client",
    "ClientTaskError": "codec",
    "NodeResult": "codec",
    "NodeTask": "codec",
    "decode": "codec",
    "encode": "codec",
    "tensors_digest": "codec",
    "GridEngine": "grid",
    "flower_config": "grid",
}

__all__ = [
    "ClientTaskError",
    "GridEngine",
    "NodeResult",
    "NodeTask",
    "client_app",
    "decode",
    "encode",
    "flower_config",
    "tensors_digest",
]


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
