"""The ClientApp of a deployment (``flwr run .`` with SuperNodes): it relays every message to the node's
long-lived worker process (:mod:`fedpeft.engine.flower.relay`).

Flower starts a ClientApp process per message, so this module imports Flower and the relay only: the model, the
data and the clients' state live in the worker process, built once per node and run. The simulation engine's
ClientApp (:data:`fedpeft.engine.flower.client.client_app`) runs the same handler in its own long-lived process.
"""

from __future__ import annotations

import json
import logging
import time

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from fedpeft.core.processes import process_age
from fedpeft.engine.flower import relay
from fedpeft.engine.flower.messages import (
    ALIVE_QUERY,
    CLOSE_QUERY,
    DATA_PATH,
    JSON_FIELD,
    PARTITION_QUERY,
    SITE_QUERY,
    TIMING_KEY,
)
from fedpeft.engine.flower.relay import serve_every_message
from fedpeft.engine.flower.secagg_mod import secure_aggregation_mod

log = logging.getLogger("fedpeft")

__all__ = ["node_app"]


def relay_message(message: Message, context: Context) -> Message:
    """Hand ``message`` to this node's worker process; its answer (or its failure) is the reply."""
    entered, age = time.perf_counter(), process_age()
    message_type = message.metadata.message_type
    run_id, node_id = message.metadata.run_id, context.node_id
    try:
        if message_type == CLOSE_QUERY:  # the run is over: end the worker process, if one runs
            closed = relay.close(run_id, node_id, context.node_config)
            return Message(relay.json_content({"closed": closed}), reply_to=message)
        if message_type == ALIVE_QUERY:  # the run lives: renew the worker's lease, without reaching it
            renewed = relay.renew(run_id, node_id, context.node_config)
            return Message(relay.json_content({"renewed": renewed}), reply_to=message)
        if message_type == PARTITION_QUERY:  # from the node config; the worker starts meanwhile, for what follows
            relay.prestart(run_id, node_id, context.node_config)
            return Message(relay.json_content(relay.partition_answer(context.node_config)), reply_to=message)
        if message_type == SITE_QUERY and not context.node_config.get(DATA_PATH):  # no site: no worker needed
            return Message(relay.json_content({"data_path": None}), reply_to=message)
        content, spawn = relay.forward(
            message_type, message.content, context.node_config, run_id=run_id, node_id=node_id
        )
    except Exception as err:  # the server leaves out the clients of this message
        log.warning("%s failed on this node: %r", message_type, err)
        reason = relay.failure_reason(err)
        if message_type == SITE_QUERY:  # the site could not even start its worker: that is its answer
            answer = {"data_path": str(context.node_config[DATA_PATH]), "error": reason}
            return Message(relay.json_content(answer), reply_to=message)
        return relay.error_reply(message, reason)
    # Where this message's time went on the node: Flower's start of this process, then the relay to the worker.
    timing = {"start_seconds": age, "relay_seconds": time.perf_counter() - entered, "worker_start_seconds": spawn}
    content[TIMING_KEY] = ConfigRecord({JSON_FIELD: json.dumps(timing)})
    return Message(content, reply_to=message)


node_app = ClientApp(mods=[secure_aggregation_mod])
serve_every_message(node_app, relay_message)
