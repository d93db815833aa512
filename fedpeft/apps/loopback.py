"""A Flower deployment on this one machine: a SuperLink and SuperNodes on loopback, for tests and benchmarks.

Each component is a real Flower process (``flower-superlink``, ``flower-supernode``) started in its own session
and stopped by process id; ``flwr run`` talks to the SuperLink through a connection written to a private
``FLWR_HOME``. With ``certs`` (a directory from ``fedpeft certs``) the deployment is the secure one of
docs/flower.md: TLS with the CA's certificate, and SuperNode authentication with each node's registered key;
without, it is insecure, for experiments on one machine only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

CONNECTION = "local-deployment"


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopbackDeployment:
    """A SuperLink and one SuperNode per node config, on loopback, in ``workdir`` (logs and ``FLWR_HOME``).

    Use as a context manager: the processes start on entry and are stopped (SIGTERM, then SIGKILL) on exit.

    Args:
        workdir: where the logs and the Flower home go.
        node_configs: one ``--node-config`` string per SuperNode.
        env: extra environment variables for every process.
        certs: a directory written by ``fedpeft certs`` (``ca.crt``, ``server.pem``, ``server.key`` and a key pair
            ``node-<i>`` per SuperNode, i from 1): TLS and SuperNode authentication; None: insecure.
        database: the SuperLink's database file (``--database``), where it keeps the node registrations and the
            runs across a restart (:meth:`restart_superlink`); the SuperLink then runs through
            :mod:`fedpeft.apps.superlink`, which waits longer for a busy database; None: in memory.
    """

    def __init__(
        self,
        workdir: Path,
        node_configs: list[str],
        env: dict[str, str] | None = None,
        certs: Path | None = None,
        database: Path | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.node_configs = node_configs
        self.certs = Path(certs) if certs is not None else None
        self.database = Path(database) if database is not None else None
        self.bin_dir = Path(sys.executable).parent
        self.link_port = free_port()
        self.home = self.workdir / "flwr-home"
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",  # no internet: use this environment as it is
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",  # start ClientApp processes soon after a message arrives
            **(env or {}),
        }
        self.processes: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> LoopbackDeployment:
        self.home.mkdir(parents=True, exist_ok=True)
        security = "insecure = true" if self.certs is None else f'root-certificates = "{self.certs / "ca.crt"}"'
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.link_port}"\n{security}\n'
        )
        try:
            self.start_superlink()
            for i, node_config in enumerate(self.node_configs):
                if self.certs is not None:
                    self.register(self.node_key(i))
                self.start_node(i, node_config)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start_superlink(self) -> subprocess.Popen:
        """Start the SuperLink (again, after :meth:`kill`) and wait until it listens. With a ``database`` it runs as
        docs/flower.md recommends then, through :mod:`fedpeft.apps.superlink` (a longer SQLite busy timeout)."""
        link = ["flower-superlink", "--port", str(self.link_port), "--disable-runtime-dependency-installation"]
        if self.database is not None:
            link = [sys.executable, "-m", "fedpeft.apps.superlink", *link[1:], "--database", str(self.database)]
        if self.certs is None:
            link.append("--insecure")
        else:
            link += ["--ssl-ca-certfile", str(self.certs / "ca.crt"), "--ssl-certfile", str(self.certs / "server.pem")]
            link += ["--ssl-keyfile", str(self.certs / "server.key"), "--enable-supernode-auth"]
        return self.start("superlink", link, self.link_port)

    def restart_superlink(self) -> None:
        """Stop the SuperLink (SIGTERM) and start it again on the same port; with a ``database`` it keeps the node
        registrations, and the SuperNodes, which retry meanwhile, connect again with their node ids."""
        self.stop_one("superlink")
        self.start_superlink()

    def log(self, name: str) -> Path:
        """The log file of component ``name`` (``superlink``, ``supernode<i>``)."""
        return self.workdir / f"{name}.log"

    def start(self, name: str, args: list[str], port: int | None) -> subprocess.Popen:
        """Start component ``name`` (``args[0]``: a command of this environment, or an absolute path) and wait until
        it listens on ``port`` (None: do not wait)."""
        with open(self.log(name), "ab") as handle:
            process = subprocess.Popen(
                [str(self.bin_dir / args[0]), *args[1:]],
                cwd=self.workdir,
                env=self.env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        if port is not None:
            self._wait_for_port(port, process, self.log(name))
        return process

    def node_key(self, index: int) -> Path:
        """The private key of SuperNode ``index`` (its public key is the same path with ``.pub``)."""
        if self.certs is None:
            raise ValueError("an insecure deployment has no node keys")
        return self.certs / f"node-{index + 1}"

    def register(self, key: Path) -> None:
        """Register a SuperNode's public key with the SuperLink (``flwr supernode register``)."""
        command = [str(self.bin_dir / "flwr"), "supernode", "register", f"{key}.pub", CONNECTION]
        subprocess.run(command, cwd=self.workdir, env=self.env, check=True, capture_output=True, timeout=120)

    def start_node(
        self, index: int, node_config: str, *, key: Path | None = None, wait: bool = True
    ) -> subprocess.Popen:
        """Start SuperNode ``index`` (again, after :meth:`kill`) with its node config; in a secure deployment with
        ``key`` (default: its own, :meth:`node_key`). ``wait``: until it listens on its port."""
        port = free_port()
        args = ["flower-supernode", "--superlink", f"127.0.0.1:{self.link_port}", "--port", str(port)]
        if self.certs is None:
            args.append("--insecure")
        else:
            key = key or self.node_key(index)
            args += ["--root-certificates", str(self.certs / "ca.crt")]
            args += ["--auth-supernode-private-key", str(key)]
        return self.start(f"supernode{index}", [*args, "--node-config", node_config], port if wait else None)

    def restart_node(
        self, index: int, node_config: str, *, timeout: float = 180.0, poll: float = 2.0
    ) -> subprocess.Popen:
        """Start SuperNode ``index`` again after it died, as docs/flower.md says: a node whose key is registered
        keeps its node id, which the SuperLink lets activate again only once it lists it as offline (60 s after
        its last heartbeat, Flower 1.42); so wait for that, then start it. A node of an insecure deployment gets a
        new id and starts at once."""
        if self.certs is not None:
            node = self.node_id(index)
            deadline = time.monotonic() + timeout
            while self.node_status().get(node) == "online":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the SuperLink still lists node {node} as online after {timeout:g} s")
                time.sleep(poll)
        return self.start_node(index, node_config)

    def node_id(self, index: int, timeout: float = 120.0) -> int:
        """The node id SuperNode ``index`` got at its latest start (from its log), once it has connected (at most
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.findall(r"SuperNode ID: (\d+)", self.log(f"supernode{index}").read_text(errors="replace"))
            if found:
                return int(found[-1])
            if time.monotonic() > deadline:
                raise RuntimeError(f"SuperNode {index} did not connect within {timeout:g} s")
            time.sleep(0.5)

    def node_status(self) -> dict[int, str]:
        """The SuperLink's status of every SuperNode it knows (``flwr supernode list``): online, offline, ..."""
        command = [str(self.bin_dir / "flwr"), "supernode", "list", CONNECTION, "--format", "json"]
        listed = subprocess.run(command, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=120)
        try:
            nodes = json.loads(listed.stdout)["nodes"]
        except (json.JSONDecodeError, KeyError):
            return {}
        return {int(node["node-id"]): str(node["status"]) for node in nodes}

    def stop_one(self, name: str) -> None:
        """Stop component ``name`` as an operator does (SIGTERM, then SIGKILL after 15 s): a SuperNode stopped so
        signs off, and may start again at once."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)

    def kill(self, name: str) -> None:
        """Kill component ``name`` and what it started, at once (a machine that fails)."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)

    def run(self, app: Path, run_config: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
        """``flwr run <app> <connection> --stream --run-config <run_config>``; its output is captured."""
        command = [str(self.bin_dir / "flwr"), "run", str(app), CONNECTION, "--stream", "--run-config", run_config]
        return subprocess.run(command, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        """Stop every started process and what it started (its own session), by id: SIGTERM, then SIGKILL."""
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
        self.processes.clear()

    @staticmethod
    def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"process exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return
            time.sleep(0.3)
        raise RuntimeError(f"nothing listens on port {port} after {timeout} s:\n{log.read_text()[-3000:]}")
