"""A secure Flower deployment on loopback: TLS, SuperNode authentication, SecAgg+, a refused node."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from flower_helpers import (
    assert_nothing_left,
    launch,
    launch_command,
    make_certs,
    one_torch_thread,
    read_records,
    tiny_raw,
)

from fedpeft.apps.loopback import LoopbackDeployment

__all__ = ["one_torch_thread"]  # the fixture applies here


# ---------------------------------------------------------------------------------------------- deployment
@pytest.mark.slow
def test_deployment_on_loopback(tmp_path):
    """A secure deployment on loopback (TLS, SuperNode authentication with registered keys): a SuperLink and two
    SuperNodes, each with its own run directory; the federated round runs as SecAgg+ (its plain form is the same
    task handling the base evaluation and personalization messages use here, and the simulation tests run it), so
    one deployment covers both. A node without a registered key cannot join; a node that claims a served
    partition stops the next run with one sentence and a non-zero status. Neither run leaves a worker behind."""
    # Every message starts a ClientApp process on its node (Flower's deployment runtime) that relays to the node's
    # worker process, so the run is short: one client per node, the pretrained base, one round of FedIT. The
    # base-model transfer to nodes that lack it is tested in-process (test_nodes_without_the_base_model_receive_it).
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0] | {"rounds": 1}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    raw["engine"] = {"secagg": {}}  # the round as SecAgg+: each node masks its update, the server sees the sum
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    node_dirs = [tmp_path / f"node{i}" for i in range(2)]  # as on separate machines: each node its own run dir
    worker_dir = Path(tempfile.mkdtemp(prefix="fp"))  # short: a Unix socket's path is limited to ~100 bytes
    node_configs = [
        f"partition-id={i} num-partitions=2 run-dir='{node_dirs[i]}' worker-dir='{worker_dir}'" for i in range(2)
    ]
    certs = make_certs(tmp_path / "certs", nodes=4)
    env = {"OMP_NUM_THREADS": "1"}  # the "machines" share this machine's cores
    with LoopbackDeployment(tmp_path, node_configs, env, certs=certs) as deployment:
        # A node whose key was never registered is turned away by the SuperLink.
        intruder = deployment.start_node(2, "partition-id=0 num-partitions=2", key=certs / "node-3", wait=False)
        assert intruder.wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in deployment.log("supernode2").read_text()

        # A ClientApp process per message (4 per node for the SecAgg+ round) on a loaded machine.
        finished = launch(deployment, config, out, node_timeout=60)
        logs = finished.stdout + finished.stderr
        (tmp_path / "flwr-run.log").write_text(logs)
        assert finished.returncode == 0, logs[-4000:]
        assert (out / "summary.md").exists(), logs[-4000:]
        # The server closed the run: each node's worker process has ended and removed its files but its log.
        assert_nothing_left(worker_dir)
        # The launch streamed the ServerApp's progress lines, as a redirected local run prints them.
        assert "fedit: federated training, seed 0: round 1/1" in finished.stderr, logs[-4000:]
        noise = [line for line in finished.stderr.splitlines() if "Loading weights" in line or "Warning" in line]
        assert not noise, noise

        # A registered node that claims partition 0, which a node serves already: the next run stops at once.
        deployment.register(certs / "node-4")
        deployment.start_node(3, "partition-id=0 num-partitions=2", key=certs / "node-4")
        refused = subprocess.run(
            launch_command(config, tmp_path / "out2", node_timeout=60),
            cwd=tmp_path,
            env=deployment.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert refused.returncode == 2, refused.stderr[-3000:]
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("error: SuperNodes") and "both claim partition-id=0" in last, last
        assert refused.stderr.count("both claim") == 1 and "Exit Code" not in refused.stderr
        assert "Traceback" not in refused.stdout + refused.stderr
        # Refused at start, while the nodes' workers were starting (the server's first query starts them): ended.
        assert_nothing_left(worker_dir)

    records = {key: value for key, value in read_records(out).items() if key[7] == "test"}  # evaluations
    train = {key[0] for key in read_records(out) if key[7] == "train"}
    assert train == {"fedit"}  # the secure round's training records (loss, clients, examples)
    clients = ["lat1-seen-00", "lat1-seen-01"]
    assert sorted((key[0], key[3]) for key in records) == [(m, c) for m in ("base", "fedit") for c in clients]
    assert all(0.0 <= value <= 1.0 for value in records.values())
    assert "fedit" in (out / "summary.md").read_text()
    assert "Secure aggregation completed" in logs, logs[-4000:]
    # Each node served its own partition, client i on node i, and kept its state and FedIT's global adapter (the
    # one every client keeps, written once) in its run dir.
    for node_dir in node_dirs:
        assert (node_dir / "adapters" / "fedit" / "global" / "adapter_model.safetensors").is_file()
    # Per node: one message for the base evaluation, one for the personalization (the secure round's messages
    # are the protocol's own), one model load for the whole run, and the seconds split into their parts.
    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    nodes: dict[int, dict[str, float]] = {}
    for row in costs:
        if row["method"] == "engine":
            nodes.setdefault(row["node"], {})[row["metric"]] = row["value"]
    assert len(nodes) == 2
    for counters in nodes.values():
        assert counters["messages"] == 2 and counters["model_loads"] == 1
        parts = ("flower_start_seconds", "worker_startup_seconds", "fedpeft_overhead_seconds", "client_work_seconds")
        assert all(counters[part] > 0 for part in parts), counters
        assert counters["message_seconds"] > counters["client_work_seconds"]


# An asynchronous schedule on loopback (FedAsync not held up by a slow node) is tests/test_benchmarks.py's
# test_async_deployment_quick_..., which runs benchmarks/async_deployment.py's quick mode on two SuperNodes.
