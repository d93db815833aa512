"""Operating a deployment: what a run leaves on the nodes, a site's failure, a lost SuperNode that comes back, a
SuperLink restarted with its database (docs/flower.md, "Lost nodes, stragglers and restarts").

The fast tests run the server's side over an in-process grid and a node's worker files with stand-in processes;
one slow test runs a worker process, and one a secure deployment on loopback (TLS, registered SuperNodes) through
several runs: a SuperNode killed mid-round and restarted as the docs say, the SuperLink restarted, a site with a
bad data file. It replaces the loopback test of a killed node that tests/test_flower_nodes.py had.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from flower_helpers import (
    InProcessGrid,
    assert_nothing_left,
    launch_command,
    make_certs,
    one_torch_thread,
    read_records,
    task_identity,
    tiny_raw,
)
from flwr.app import Message

from fedpeft.apps.loopback import LoopbackDeployment
from fedpeft.core.config import validate
from fedpeft.core.errors import UserError
from fedpeft.core.processes import process_alive
from fedpeft.engine.flower import flower_config, relay
from fedpeft.engine.flower.keepalive import Keepalive
from fedpeft.engine.flower.membership import register_sites

__all__ = ["one_torch_thread", "task_identity"]  # fixtures used here

CLIENTS = {"site-a": ("ana", "bo"), "site-b": ("cy", "dee"), "site-c": ("eve",)}


def write_site(directory: Path, clients: Iterable[str], *, broken_line: int | None = None) -> Path:
    """A site's data directory: one JSONL file of reviews by ``clients``; ``broken_line`` (1-based) cut short."""
    rows = [
        {"text": f"{client} found it {word} number {i}", "label": label, "client": client}
        for client in clients
        for i, (word, label) in enumerate([("good", "positive"), ("bad", "negative")] * 4)
    ]
    lines = [json.dumps(row) for row in rows]
    if broken_line is not None:
        lines[broken_line - 1] = lines[broken_line - 1][:20]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "reviews.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def site_raw(**data: object) -> dict:
    """FedIT over site-local data (the model is never loaded by the tests that refuse the run)."""
    return {
        "name": "sites",
        "seeds": [0],
        "data": {"name": "files", "partition": "natural", "label_names": ["negative", "positive"], "sites": 2} | data,
        "model": {"name": "minilm", "max_length": 16},
        "budgets": [2],
        "methods": [{"name": "fedit", "rounds": 1, "fraction": 1.0, "local_steps": 1, "batch_size": 4, "rank": 2}],
        "output": {"plots": False},
    }


def site_grid(*data_paths: Path | None) -> InProcessGrid:
    """An in-process grid of one node per data path (None: a node without a data-path)."""
    grid = InProcessGrid(num_nodes=len(data_paths))
    for context, path in zip(grid.contexts.values(), data_paths, strict=True):
        context.node_config.clear()
        if path is not None:
            context.node_config["data-path"] = str(path)
    return grid


# ---------------------------------------------------------------------------------------------- a site's failure
def test_a_site_that_cannot_read_its_data_stops_the_run_at_once_with_its_own_sentence(tmp_path, task_identity):
    """A truncated JSONL line at one site: the run stops as soon as that site answers, with the site's sentence,
    its node id and data-path, and nothing else (no repr of the relay's error, no hint about data-paths)."""
    good = write_site(tmp_path / "site-a", CLIENTS["site-a"])
    bad = write_site(tmp_path / "site-b", CLIENTS["site-b"], broken_line=3)
    cfg = flower_config(validate(site_raw()))
    started = time.monotonic()
    with pytest.raises(UserError) as refused:
        register_sites(site_grid(good, bad), cfg, node_timeout=600)
    assert time.monotonic() - started < 60  # not node-timeout
    message = str(refused.value)
    assert message.startswith(f"SuperNode 1001 (data-path '{bad}'): {bad / 'reviews.jsonl'} line 3 is not valid JSON")
    assert "\n" not in message and "Error(" not in message and "--node-config" not in message


def test_more_data_holding_nodes_than_sites_are_named(tmp_path, task_identity):
    """A third node with data: refused with its client held twice (both nodes and data-paths named), or, with
    distinct clients, with every data-holding node and its data-path; a node without a data-path is no site."""
    paths = {site: write_site(tmp_path / site, clients) for site, clients in CLIENTS.items()}
    cfg = flower_config(validate(site_raw()))
    with pytest.raises(UserError) as twice:
        register_sites(site_grid(paths["site-a"], paths["site-b"], paths["site-a"]), cfg, node_timeout=30)
    assert str(twice.value).startswith(
        f"Client 'ana' is on two sites (SuperNodes 1000 and 1002): data-paths '{paths['site-a']}' and "
        f"'{paths['site-a']}'"
    )
    with pytest.raises(UserError) as three:
        register_sites(site_grid(*paths.values()), cfg, node_timeout=30)
    assert str(three.value).startswith(
        f"3 SuperNodes hold data (node 1000 with data-path '{paths['site-a']}', node 1001 with data-path "
        f"'{paths['site-b']}', node 1002 with data-path '{paths['site-c']}'), but data.sites is 2"
    )
    data, owners, _ = register_sites(site_grid(None, paths["site-a"], paths["site-c"]), cfg, node_timeout=30)
    assert owners == {"ana": 1001, "bo": 1001, "eve": 1002} and len(data.clients) == 3

    with pytest.raises(UserError) as few:
        register_sites(site_grid(paths["site-a"], None), cfg, node_timeout=1)
    assert str(few.value) == (
        "1 of the 2 sites (data.sites) reported their clients within 1 s; node 1001: it has no data-path in its "
        "node config; start each site's SuperNode with --node-config \"data-path='DIR'\"."
    )


# ---------------------------------------------------------------------------------------------- workers' files
class KeepaliveGrid(InProcessGrid):
    """Records the message types it receives per node; answers none of them (a node busy with a long step)."""

    def __init__(self, num_nodes: int) -> None:
        super().__init__(num_nodes)
        self.pulled: list[str] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            self.served[message.metadata.dst_node_id].append(message.metadata.message_type)
            ids.append(f"m{len(self.pulled)}-{message.metadata.dst_node_id}-{len(ids)}")
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulled += list(message_ids)
        return []


def test_keepalives_reach_every_listed_node_until_the_run_ends(task_identity):
    grid = KeepaliveGrid(num_nodes=2)
    with Keepalive(grid, interval=0.05):
        deadline = time.monotonic() + 10
        while min(len(served) for served in grid.served.values()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    sent = {node: len(served) for node, served in grid.served.items()}
    assert all(count >= 3 for count in sent.values()) and grid.pulled  # the earlier ones' replies were asked for
    assert {t for served in grid.served.values() for t in served} == {"query.alive"}
    time.sleep(0.3)
    assert {node: len(served) for node, served in grid.served.items()} == sent  # none after its block


def stand_in_worker(address: relay.WorkerAddress) -> subprocess.Popen:
    """A process that stands in for a worker still importing: the pid file names it, its command line holds the
    socket path (as the relay starts workers), and it writes the files a worker has."""
    address.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    process = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(120)", str(address.socket)])
    for path in (address.key, address.lock, address.log):
        path.write_text("x")
    address.pid.write_text(str(process.pid))
    return process


def test_closing_a_worker_that_still_starts_ends_it_and_leaves_its_log_only(tmp_path):
    """A run refused while its workers import (the server's first query starts them): the close ends the process
    by its pid file, only if the pid is that worker's, and removes every file but the log."""
    node_config = {relay.WORKER_DIR: str(tmp_path / "w")}
    address = relay.WorkerAddress.of(3, 5, node_config)
    starting = stand_in_worker(address)
    assert relay.renew(3, 5, node_config)  # a keepalive renews the lease of a worker of this run
    assert relay.close(3, 5, node_config)
    assert starting.wait(timeout=10) == -signal.SIGTERM
    assert sorted(p.name for p in address.directory.iterdir()) == [address.log.name]
    assert not relay.close(3, 5, node_config) and not relay.renew(3, 5, node_config)

    # A pid file whose process is no worker of this address (the id was reused): left alone, files removed.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        address.pid.write_text(str(other.pid))
        address.key.write_text("x")
        assert not relay.close(3, 5, node_config)
        assert process_alive(other.pid) and not address.pid.exists() and not address.key.exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_a_worker_ends_when_its_lease_runs_out_or_on_sigterm_and_removes_its_files(tmp_path_factory):
    """A real node worker: keepalives keep it past its idle timeout; without them it ends (a run stopped with
    ``flwr stop``, a lost SuperLink); SIGTERM ends another. Each leaves its log only."""
    worker_dir = Path(tempfile.mkdtemp(prefix="fl"))  # short: a Unix socket's path is limited to ~100 bytes
    node_config = {relay.WORKER_DIR: str(worker_dir), relay.IDLE_TIMEOUT: 4}
    leased, signalled = relay.WorkerAddress.of(1, 1, node_config), relay.WorkerAddress.of(1, 2, node_config)
    relay.prestart(1, 1, node_config)
    relay.prestart(1, 2, node_config)
    pids = [int(leased.pid.read_text()), int(signalled.pid.read_text())]
    try:
        deadline = time.monotonic() + 300
        while not (leased.socket.exists() and signalled.socket.exists()) and time.monotonic() < deadline:
            for node in (1, 2):  # a worker's lease starts with its pid file, before its slow imports
                relay.renew(1, node, node_config)
            time.sleep(0.5)
        assert leased.socket.exists() and signalled.socket.exists(), leased.log.read_text()[-2000:]
        renewed_until = time.monotonic() + 8  # twice their idle timeout
        while time.monotonic() < renewed_until:
            assert relay.renew(1, 1, node_config) and relay.renew(1, 2, node_config)
            assert all(process_alive(pid) for pid in pids)
            time.sleep(0.5)
        os.kill(pids[1], signal.SIGTERM)  # and the other's lease runs out
        deadline = time.monotonic() + 20
        while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(process_alive(pid) for pid in pids)
        assert sorted(p.name for p in worker_dir.iterdir()) == sorted([leased.log.name, signalled.log.name])
        assert "no message, no keepalive" in leased.log.read_text()
        assert "SIGTERM received" in signalled.log.read_text()
    finally:
        for pid in pids:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- on loopback
@pytest.mark.slow
def test_a_killed_supernode_rejoins_and_a_bad_site_stops_the_run_at_once(tmp_path):
    """A secure deployment as docs/flower.md sets it up (TLS, registered SuperNodes, the SuperLink's database),
    through two things an operator meets:

    1. A SuperNode killed mid-round: the server takes it as lost when Flower marks it offline; restarted then, as
       the docs say, it keeps its node id and takes its clients back at the next step, and every later round has
       every client. ``fedpeft launch`` streams the progress lines; the completed run leaves no worker behind.
    2. A site whose data file has a broken line: the launch ends with exit code 2 within seconds, with that site's
       sentence once, and leaves no worker behind.

    A SuperLink restarted with its database mid-run, its SuperNodes coming back to it, is
    tests/test_flower_superlink.py's.
    """
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0] | {"rounds": 6}])
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    sites = {site: write_site(tmp_path / "data" / site, CLIENTS[site]) for site in ("site-a", "site-b")}
    sites_config = tmp_path / "sites.yaml"
    sites_config.write_text(yaml.safe_dump(site_raw()))
    out = tmp_path / "out"
    worker_dir = Path(tempfile.mkdtemp(prefix="fp"))  # short: a Unix socket's path is limited to ~100 bytes
    node_configs = [
        f"partition-id={i} num-partitions=2 data-path='{path}' run-dir='{tmp_path / f'node{i}'}' "
        f"worker-dir='{worker_dir}'"
        for i, path in enumerate(sites.values())
    ]
    certs = make_certs(tmp_path / "certs", nodes=2)
    checkpoint = out / "checkpoints" / "fedit" / "seed0.safetensors"

    def wait_for_round(done: int, run: subprocess.Popen) -> None:
        from fedpeft.core.checkpoints import load_checkpoint
        from fedpeft.methods.base import method_class

        method_class("fedit")  # a checkpoint names its state's class, known once the method is imported, as in a run
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and run.poll() is None:
            try:
                if load_checkpoint(checkpoint)["state"].round >= done:
                    return
            except Exception:  # absent, or being replaced
                pass
            time.sleep(0.5)
        raise AssertionError(f"round {done} never completed")

    deployment = LoopbackDeployment(
        tmp_path, node_configs, {"OMP_NUM_THREADS": "1"}, certs=certs, database=tmp_path / "superlink.db"
    )
    launch = launch_command(config, out, node_timeout=180)
    with deployment:
        node_ids = [deployment.node_id(i) for i in range(2)]
        with open(tmp_path / "launch.log", "w") as log:
            run = subprocess.Popen(launch, cwd=tmp_path, env=deployment.env, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_for_round(1, run)
                deployment.kill("supernode1")  # its SuperNode and ClientApp processes; its worker follows
                killed = time.monotonic()
                deployment.restart_node(1, node_configs[1])  # once the SuperLink lists it offline
                rejoin_seconds = time.monotonic() - killed
                assert run.wait(timeout=900) == 0, (tmp_path / "launch.log").read_text()[-4000:]
            finally:
                if run.poll() is None:
                    run.kill()
        streamed = (tmp_path / "launch.log").read_text()
        assert deployment.node_id(1) == node_ids[1]  # a registered key keeps its node id
        assert 20 < rejoin_seconds < 90, rejoin_seconds  # Flower's heartbeat: offline 60 s after the last one
        assert_nothing_left(worker_dir)

        write_site(sites["site-b"], CLIENTS["site-b"], broken_line=5)
        refused_launch = launch_command(sites_config, tmp_path / "out2", node_timeout=600)
        started = time.monotonic()
        refused = subprocess.run(
            refused_launch, cwd=tmp_path, env=deployment.env, capture_output=True, text=True, timeout=600
        )
        refused_seconds = time.monotonic() - started
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert_nothing_left(worker_dir)

    # 1. Every round but those the killed node missed has both clients; once back, it missed none.
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    trained = sorted((r for r in rows if r["split"] == "train" and r["metric"] == "clients"), key=lambda r: r["round"])
    clients = [r["value"] for r in trained]
    assert clients[0] == 2.0 and 1.0 in clients and clients[-1] == 2.0, clients
    missed = [i for i, count in enumerate(clients) if count < 2.0]
    assert missed == list(range(missed[0], missed[-1] + 1)) and len(missed) <= 3, clients
    lines = streamed.splitlines()
    back = next(i for i, line in enumerate(lines) if f"node {node_ids[1]} answers again" in line)
    after = [line for line in lines[back:] if re.search(r"round \d+/6", line)]
    assert after and all("2 clients" in line for line in after), after
    rounds = [line for line in lines if re.match(r"fedit: federated training, seed 0: round \d+/6", line)]
    assert len(rounds) == 6, streamed[-3000:]  # the ServerApp's progress lines reached the launcher
    assert {key[3] for key in read_records(out) if key[0] == "fedit" and key[7] == "test"} == {
        "lat1-seen-00",
        "lat1-seen-01",
    }
    # 3. The bad site's sentence, once, as the last line; not after node-timeout (600 s) but at once.
    assert refused_seconds < 120, refused_seconds
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error")]
    bad_file = sites["site-b"] / "reviews.jsonl"
    assert len(errors) == 1 and refused.stderr.count("not valid JSON") == 1, refused.stderr[-3000:]
    assert errors[0].startswith(
        f"error: SuperNode {node_ids[1]} (data-path '{sites['site-b']}'): {bad_file} line 5 is not valid JSON ("
    ), errors
    assert refused.stderr.strip().splitlines()[-1] == errors[0]
    assert "Exit Code" not in refused.stderr and "Error(" not in refused.stderr and not refused.stdout.strip()
