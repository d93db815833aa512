"""A deployment node's long-lived worker process: the light ClientApp relays, the worker builds its model once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedpeft.core.config import dump_given, validate
from fedpeft.engine.flower import relay
from fedpeft.engine.flower.codec import NodeResult, NodeTask, decode, encode
from fedpeft.engine.flower.messages import EVALUATE_BASE, PARTITION_QUERY

HEAVY = ("torch", "transformers", "fedpeft.worker", "fedpeft.methods", "fedpeft.engine.rounds")


def test_the_deployment_clientapp_imports_nothing_heavy():
    """Flower starts a ClientApp process per message: its module must import Flower and the relay only."""
    code = (
        "import sys, fedpeft.apps.node as n; "
        f"print([m for m in {HEAVY!r} if m in sys.modules]); print(type(n.node_app).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "ClientApp"]


@pytest.fixture
def worker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A short path: a Unix socket's path is limited to about 100 bytes.
    return Path(tmp_path_factory.mktemp("nw", numbered=True))


@pytest.mark.slow
def test_the_node_worker_builds_its_model_once_and_ends_when_closed(tmp_path, worker_dir):
    raw = {
        "name": "node-worker",
        "seeds": [0],
        "data": {"name": "synthetic-xnli", "groups": ["lat1"], "clients_per_group": 3, "unseen_pool": False},
        "model": {"name": "tiny-bert", "max_length": 32},
        "base": {"kind": "pretrained"},
        "budgets": [2],
        "methods": [{"name": "lora", "epochs": 1}],
    }
    cfg = validate(raw)
    node_config = {relay.WORKER_DIR: str(worker_dir), "partition-id": 1, "num-partitions": 2}
    address = relay.WorkerAddress.of(7, 11, node_config)

    def evaluate(clients: list[str]) -> NodeResult:
        task = NodeTask("evaluate_base", str(tmp_path / "run"), dump_given(cfg), [(c, {"seed": 0}) for c in clients])
        content, _ = relay.forward(EVALUATE_BASE, task.to_content(), node_config, run_id=7, node_id=11)
        return NodeResult.from_content(content)

    try:
        first = evaluate(["lat1-seen-00", "lat1-seen-01"])
        second = evaluate(["lat1-seen-02", "no-such-client"])
        # One message carries several clients; a failing client fails alone.
        assert [r["client"] for r in first.results] == ["lat1-seen-00", "lat1-seen-01"]
        assert all(0.0 <= row["value"] <= 1.0 for r in first.results for row in r["value"])
        assert "error" not in second.results[0] and "no-such-client" in second.results[1]["error"]
        # The same process answered both messages and built its worker (model and data) once.
        assert first.stats["pid"] == second.stats["pid"] and second.stats["model_loads"] == 1
        assert 0.0 < first.stats["work_seconds"] <= first.stats["seconds"]
        # It runs the fedpeft of the process that started it (in deployment: the app bundle's copy).
        assert f"{Path(relay.__file__).resolve().parents[3]}" in address.log.read_text()
        partition, started = relay.forward(PARTITION_QUERY, encode({}), node_config, run_id=7, node_id=11)
        assert decode(partition) == {"partition_id": 1, "num_partitions": 2} and started == 0.0
        assert first.stats["load_seconds"] > 0.0 == second.stats["load_seconds"]
        # The worker directory is the node user's alone: the key lets only its processes in.
        assert (worker_dir.stat().st_mode & 0o077) == 0 and (address.key.stat().st_mode & 0o077) == 0
    finally:
        closed = relay.close(7, 11, node_config)
    assert closed
    deadline = time.monotonic() + 10  # the worker removes its socket, key, pid file and lock, in that order
    while any(path.exists() for path in address.leftovers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(path.exists() for path in address.leftovers)
    assert not relay.close(7, 11, node_config)  # nothing runs any more
    assert "closed by the server" in address.log.read_text()
