"""A Flower deployment on this one machine: a SuperLink and SuperNodes on loopback, for tests and benchmarks.

Each component is a real Flower process (``flower-superlink``, ``flower-supernode``) started in its own session
and stopped by process id; ``flwr run`` talks to the SuperLink through a connection written to a private
``FLWR_HOME``. Insecure (no TLS): for experiments on one machine only.
"""

from __future__ import annotations

import contextlib
import os
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
    """

    def __init__(self, workdir: Path, node_configs: list[str], env: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.node_configs = node_configs
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
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.link_port}"\ninsecure = true\n'
        )
        try:
            link = ["flower-superlink", "--insecure", "--port", str(self.link_port)]
            self.start("superlink", [*link, "--disable-runtime-dependency-installation"], self.link_port)
            for i, node_config in enumerate(self.node_configs):
                self.start_node(i, node_config)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def log(self, name: str) -> Path:
        """The log file of component ``name`` (``superlink``, ``supernode<i>``)."""
        return self.workdir / f"{name}.log"

    def start(self, name: str, args: list[str], port: int) -> subprocess.Popen:
        """Start component ``name`` and wait until it listens on ``port``."""
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
        self._wait_for_port(port, process, self.log(name))
        return process

    def start_node(self, index: int, node_config: str) -> subprocess.Popen:
        """Start SuperNode ``index`` (again, after :meth:`kill`) with its node config."""
        port = free_port()
        args = ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.link_port}", "--port", str(port)]
        return self.start(f"supernode{index}", [*args, "--node-config", node_config], port)

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
