"""The Flower engine's codec and the config a node builds from the server's.

The engine's other tests: tests/test_flower_simulation.py (the simulation engine), tests/test_flower_nodes.py (the
in-process grid: concurrent methods, failing clients and nodes), tests/test_flower_deployment.py (a secure deployment
on loopback) and tests/test_flower_operations.py (a SuperNode killed and restarted on loopback, a site's bad data,
the node workers' lease), split so that ``--dist loadfile`` can run the slow ones on different workers. Their shared
helpers are in tests/flower_helpers.py; other test files import them from here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml
from flower_helpers import (
    ATOL,
    REPO,
    InProcessGrid,
    RoundLog,
    launch,
    lose_and_restart,
    one_torch_thread,
    read_records,
    task_identity,
    tiny_raw,
)

from fedpeft.core.config import ExperimentConfig, validate
from fedpeft.core.types import ClientUpdate, Payload, ServerState
from fedpeft.engine.flower import decode, encode, flower_config, tensors_digest

# Other test files import the helpers from here; the autouse fixture applies to this file's tests too.
__all__ = [
    "ATOL",
    "REPO",
    "InProcessGrid",
    "RoundLog",
    "launch",
    "lose_and_restart",
    "one_torch_thread",
    "read_records",
    "task_identity",
    "tiny_raw",
]


# ---------------------------------------------------------------------------------------------- codec
def test_codec_round_trip_keeps_order_dtypes_and_structure():
    tensors = {
        "z.weight": torch.randn(3, 4),
        "a.bias": torch.arange(5, dtype=torch.int64),
        "m.half": torch.randn(2, 2).to(torch.bfloat16),
        "m.flag": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    value = {
        "state": ServerState(tensors=tensors, round=3),
        "other": {"scales": torch.ones(2), "names": ("a", "b"), 7: None},
        "update": ClientUpdate("c1", {"w": torch.zeros(1)}, 12.0, {"loss": 0.5}, {"counts": [torch.ones(3)]}),
        "payload": Payload({"w": torch.full((2,), 3.0)}, {"lr": 1e-4, "nested": {"k": [1, 2.0, "x", None]}}),
    }
    back = decode(encode(value))
    state = back["state"]
    assert isinstance(state, ServerState) and state.round == 3
    assert list(state.tensors) == list(tensors)
    for key, tensor in tensors.items():
        assert state.tensors[key].dtype == tensor.dtype and state.tensors[key].shape == tensor.shape
        assert torch.equal(state.tensors[key], tensor), key
    other = back["other"]
    assert torch.equal(other["scales"], torch.ones(2))
    assert other["names"] == ("a", "b") and other[7] is None
    update = back["update"]
    assert isinstance(update, ClientUpdate) and update.client_id == "c1" and update.weight == 12.0
    assert update.metrics == {"loss": 0.5} and torch.equal(update.extras["counts"][0], torch.ones(3))
    assert back["payload"].config == value["payload"].config
    assert tensors_digest(state.tensors) == tensors_digest(tensors)


def test_codec_refuses_what_cannot_travel():
    with pytest.raises(TypeError, match="cannot travel"):
        encode({"handle": object()})


@dataclasses.dataclass
class _TypedState(ServerState):
    """A method's typed server state, as methods declare them."""

    init_seed: int = 0
    layout: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    individual: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


def test_codec_round_trips_a_typed_server_state():
    state = _TypedState(tensors={"w": torch.ones(2)}, round=3, init_seed=7, layout=[("q", 4)])
    state.individual["c0"] = torch.arange(3.0)
    back = decode(encode({"state": state, "groups": {"small": state}}))
    assert type(back["state"]) is _TypedState and back["state"].init_seed == 7 and back["state"].round == 3
    assert back["state"].layout == [("q", 4)] and torch.equal(back["state"].individual["c0"], torch.arange(3.0))
    assert type(back["groups"]["small"]) is _TypedState


def test_flower_config_keeps_client_state_on_disk():
    cfg = flower_config(ExperimentConfig())
    assert cfg.engine.name == "flower" and cfg.engine.state == "disk"


@pytest.mark.parametrize("dataset", ["synthetic-fedaya", "synthetic-masakhanews"])
def test_client_side_config_builds_the_servers_data(dataset):
    """Datasets read keys left unset as their own defaults (Fed-Aya's natural partition, MasakhaNEWS' client
    count): the text a ClientApp rebuilds the config from keeps which keys were given, so a node builds the
    server's clients; the fully resolved dump would mark every key as given."""
    from fedpeft.core.config import dump_config, dump_given
    from fedpeft.worker import build_data

    cfg = flower_config(validate({"name": "x", "data": {"name": dataset}, "model": {"name": "tiny-llama"}}))
    server = build_data(cfg)
    given = validate(yaml.safe_load(dump_given(cfg)))
    node = build_data(given)
    assert [c.client_id for c in node.clients] == [c.client_id for c in server.clients]
    assert [len(c.train) for c in node.clients] == [len(c.train) for c in server.clients]
    resolved = validate(yaml.safe_load(dump_config(cfg)))
    assert resolved.data.model_fields_set > given.data.model_fields_set
