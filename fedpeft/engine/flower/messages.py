"""Names both sides of fedpeft's Flower messages agree on: message types, record keys, node config keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from fedpeft.core.types import StateDict

# Message types ("<category>.<action>", as Flower requires) of the operations a ClientApp serves.
TRAIN = "train"  # one client's local training in one federated round
EVALUATE_BASE = "evaluate.base"  # the base model on one client's test split
PERSONALIZE = "train.personalize"  # one client's personalization at every budget, then its evaluation
EVALUATE_ROUND = "evaluate.round"  # one client's current model during a federated phase (eval.every)
CLIENT_BASE = "train.client_base"  # one client's own base model after a per-client base stage
BUNDLE = "train.bundle"  # several of the above for one node, of methods that run at once
PARTITION_QUERY = "query.partition"  # which partition of the clients a node serves
SITE_QUERY = "query.site"  # site-local data: which clients a node's data-path holds, with their sizes
BASE_QUERY = "query.base"  # does the node hold the base model of a seed (and receive it if not)
CLOSE_QUERY = "query.close"  # the run is over: the node ends its worker process
ALIVE_QUERY = "query.alive"  # the run lives: the node renews its worker's lease (fedpeft.engine.flower.relay)

# Every message type a node handles.
MESSAGE_TYPES = [TRAIN, EVALUATE_BASE, PERSONALIZE, EVALUATE_ROUND, CLIENT_BASE, PARTITION_QUERY, BASE_QUERY]
MESSAGE_TYPES += [CLOSE_QUERY, SITE_QUERY, BUNDLE, ALIVE_QUERY]

# Worker operation -> message type. Only these operations can be called through a message.
OPERATIONS = {"train": TRAIN, "evaluate_base": EVALUATE_BASE, "personalize": PERSONALIZE}
OPERATIONS["evaluate_round"] = EVALUATE_ROUND
OPERATIONS["prepare_client_base"] = CLIENT_BASE

# Keys of a message's RecordDict and of its ConfigRecord.
ARRAYS_KEY = "fedpeft.arrays"  # ArrayRecord: every tensor of the message
CONFIG_KEY = "fedpeft.config"  # ConfigRecord: the rest, as JSON
JSON_FIELD = "json"
TIMING_KEY = "fedpeft.timing"  # ConfigRecord a deployment's ClientApp adds: where the message's time went

# Node config keys (``flower-supernode --node-config``); the simulation engine sets the first two itself.
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
NODE_RUN_DIR = "run-dir"  # optional: where this node keeps its copy of the run directory
DATA_PATH = "data-path"  # site-local data (data.sites): the directory (or file, glob, hub id) of this site's data


class _BaseQuery(TypedDict):
    run_dir: str
    path: str  # the base checkpoint, relative to the run directory
    digest: str  # of its tensors (codec.tensors_digest)


class BaseQuery(_BaseQuery, total=False):
    """The content of a base query: which base checkpoint the node should hold, and its tensors when the server
    sends them (the node then stores them)."""

    tensors: StateDict
