"""A node's long-lived worker process, and the relay that hands it a Flower message.

Flower's deployment runtime starts one ClientApp process per message. Building a worker there (importing torch,
loading the model, building the data) would cost every message seconds. Instead the ClientApp of a deployment
(:mod:`fedpeft.apps.node`) imports only this module and Flower: it passes the message's content to a worker
process that lives on the node for the whole run, started by the first message of the run and reached over a Unix
socket, and returns that process's answer. The worker process (:mod:`fedpeft.engine.flower.node_worker`) keeps
the model, the data and the clients' state between messages.

One worker process serves one (run, node): its socket, key, pid, lock and log files live in the node's worker
directory (node config ``worker-dir``, default ``$TMPDIR/fedpeft-<uid>``, readable by the node's user only). The
process ends when the server closes the run (a ``query.close`` message), when the SuperNode that started it is
gone, on SIGTERM, SIGINT or SIGHUP, or when nothing of its run reached it for ``worker-idle-timeout`` seconds (node
config, default :data:`DEFAULT_IDLE_TIMEOUT`): no message and no keepalive (``query.alive``, which the server of a
deployment sends every node each :data:`KEEPALIVE_SECONDS` while the run lives, and which renews the lease
without reaching the worker). A run stopped with ``flwr stop`` or a SuperLink that is lost can no longer send
anything, so that lease is what ends their workers. Whichever way it ends, the worker removes its files but the
log.

This module imports nothing heavy (no torch, no fedpeft worker): its cost is paid by every message.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import TypedDict

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict, UserConfigValue
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from fedpeft.core.processes import process_alive
from fedpeft.engine.flower.messages import CONFIG_KEY, JSON_FIELD, MESSAGE_TYPES, NUM_PARTITIONS, PARTITION_ID

WORKER_DIR = "worker-dir"  # node config: where the node keeps its worker processes' sockets, keys and logs
IDLE_TIMEOUT = "worker-idle-timeout"  # node config: seconds a worker lives once nothing of its run reaches it
DEFAULT_IDLE_TIMEOUT = 60.0  # three keepalives missed: the workers of a run that can no longer send end within a minute
KEEPALIVE_SECONDS = 20.0  # the server's keepalives renew a worker's lease at least this often while the run lives
START_TIMEOUT = 300.0  # seconds a new worker process may take to import, before its first message
EXEC_SECONDS = 2.0  # seconds a just-started process may show an empty command line (/proc/PID/cmdline)
LISTEN_SECONDS = 10.0  # seconds a new worker process may take from binding its socket to listening on it


class RelayError(RuntimeError):
    """The node's worker process could not be started or reached, or it failed to handle the message."""


class PartitionAnswer(TypedDict):
    """A node's answer to the server's partition query (``None``: its node config does not say)."""

    partition_id: int | None
    num_partitions: int | None


def partition_answer(node_config: Mapping[str, UserConfigValue]) -> PartitionAnswer:
    """Which partition of the clients this node serves (from its node config)."""
    return {
        "partition_id": int(node_config[PARTITION_ID]) if PARTITION_ID in node_config else None,
        "num_partitions": int(node_config[NUM_PARTITIONS]) if NUM_PARTITIONS in node_config else None,
    }


def serve_every_message(app: ClientApp, handler: Callable[[Message, Context], Message]) -> None:
    """Register ``handler`` on ``app`` for every message type fedpeft's server sends."""
    for message_type in MESSAGE_TYPES:
        category, _, action = message_type.partition(".")
        register = getattr(app, category)
        (register(action) if action else register())(handler)


def error_reply(message: Message, reason: str) -> Message:
    """The error reply to ``message``: the server leaves out the clients it was for."""
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)


def failure_reason(err: BaseException) -> str:
    """Why a message failed on this node, in one line: the worker's own reason for a :class:`RelayError` (the
    first line and, for a worker that exited, the last line of its log), ``repr`` of anything else."""
    if not isinstance(err, RelayError):
        return repr(err)
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:1] + lines[-1:] if len(lines) > 1 else lines)


def json_content(value: object) -> RecordDict:
    """Message content holding ``value`` (JSON data, no tensors) as :func:`fedpeft.engine.flower.codec.decode`
    reads it."""
    return RecordDict({CONFIG_KEY: ConfigRecord({JSON_FIELD: json.dumps(value)})})


def to_bytes(content: RecordDict) -> bytes:
    """A message content as Flower serializes it."""
    return bytes(recorddict_to_proto(content).SerializeToString())


def from_bytes(data: bytes) -> RecordDict:
    """The message content :func:`to_bytes` serialized."""
    proto = ProtoRecordDict()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto)


@dataclass(frozen=True)
class WorkerAddress:
    """Where the worker process of one (run, node) listens, and the files beside its socket."""

    directory: Path
    name: str

    @classmethod
    def of(cls, run_id: int, node_id: int, node_config: Mapping[str, UserConfigValue]) -> WorkerAddress:
        """The address of the worker process of (run, node): in the node config's ``worker-dir``, else in
        ``<tmp>/fedpeft-<uid>``, under a short name hashed from the two ids."""
        directory = node_config.get(WORKER_DIR) or Path(tempfile.gettempdir()) / f"fedpeft-{os.getuid()}"
        # A short name: a Unix socket's path is limited to about 100 bytes.
        name = hashlib.sha256(f"{run_id}:{node_id}".encode()).hexdigest()[:16]
        return cls(Path(str(directory)), name)

    @property
    def socket(self) -> Path:
        """The Unix socket the worker process listens on."""
        return self.directory / f"{self.name}.sock"

    @property
    def key(self) -> Path:
        """The file of the secret key that authenticates connections to the socket (mode 0600)."""
        return self.directory / f"{self.name}.key"

    @property
    def log(self) -> Path:
        """The file that receives the worker process's stdout and stderr."""
        return self.directory / f"{self.name}.log"

    @property
    def lock(self) -> Path:
        """The file locked while a worker process is started, so that one starts at a time."""
        return self.directory / f"{self.name}.lock"

    @property
    def pid(self) -> Path:
        """The file holding the process id of the worker process last started; its modification time is the
        worker's lease, which the server's keepalives renew (:func:`renew`)."""
        return self.directory / f"{self.name}.pid"

    @property
    def leftovers(self) -> list[Path]:
        """The files a worker that has ended leaves nothing of: all but its log."""
        return [self.socket, self.key, self.pid, self.lock]

    def remove_leftovers(self) -> None:
        """Remove :attr:`leftovers` (the log stays, for the node's operator)."""
        for path in self.leftovers:
            with contextlib.suppress(OSError):
                path.unlink()


def _connect(address: WorkerAddress) -> Connection | None:
    """A connection to the running worker process, or None when none listens."""
    if not address.socket.exists() or not address.key.exists():
        return None
    try:
        return Client(str(address.socket), family="AF_UNIX", authkey=address.key.read_bytes())
    except (ConnectionRefusedError, FileNotFoundError):
        return None


def _connect_listening(address: WorkerAddress, seconds: float = LISTEN_SECONDS) -> Connection | None:
    """:func:`_connect` to a worker process whose socket has just appeared: the socket file exists from its bind,
    a moment before it listens, so a refused connection is tried again for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        connection = _connect(address)
        if connection is not None or time.monotonic() > deadline:
            return connection
        time.sleep(0.05)


def _starting(address: WorkerAddress) -> int | None:
    """The process id of a worker process of ``address`` that was started and is alive (it may still be importing,
    before its socket exists), or None."""
    try:
        pid = int(address.pid.read_text())
    except (OSError, ValueError):
        return None
    if not process_alive(pid):
        return None
    # The id may have been reused since: it must be this address's worker. A process in its first moments (just
    # exec'd) shows an empty command line for a while; so does a kernel thread, for good.
    deadline = time.monotonic() + EXEC_SECONDS
    while True:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # no /proc here: trust the pid file
            return pid
        if command or time.monotonic() > deadline:
            return pid if str(address.socket).encode() in command else None
        time.sleep(0.01)


def _wait_for_socket(address: WorkerAddress, pid: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not address.socket.exists():
        if not process_alive(pid):
            tail = address.log.read_text(errors="replace")[-2000:]
            raise RelayError(f"the node's worker process exited before it listened:\n{tail}")
        if time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            raise RelayError(f"the node's worker process did not start within {START_TIMEOUT:.0f} s")
        time.sleep(0.05)


def prestart(run_id: int, node_id: int, node_config: Mapping[str, UserConfigValue]) -> None:
    """Start the worker process of (run, node) without waiting for it, unless one runs or starts already: a
    node's first message (the server's partition query) lets the worker import while the next message travels."""
    address = WorkerAddress.of(run_id, node_id, node_config)
    address.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(address.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _starting(address) is None and _connect(address) is None:
            _start(address, node_config, wait=False)


def _start(address: WorkerAddress, node_config: Mapping[str, UserConfigValue], *, wait: bool = True) -> None:
    """Start the worker process of ``address`` in its own session, so that it outlives this ClientApp process;
    with ``wait``, return once it listens."""
    address.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        address.socket.unlink()
    descriptor = os.open(address.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secrets.token_bytes(32))
    idle = float(node_config.get(IDLE_TIMEOUT) or DEFAULT_IDLE_TIMEOUT)
    command = [sys.executable, "-m", "fedpeft.engine.flower.node_worker", str(address.socket), str(address.key)]
    command += ["--parent", str(os.getppid()), "--idle-timeout", str(idle)]
    # The worker imports the fedpeft this process runs: in deployment, the copy the app bundle (FAB) brought from
    # the server, not whatever version the node has installed.
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(address.log, "ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    address.pid.write_text(str(process.pid))
    if wait:
        _wait_for_socket(address, process.pid)


def connect(run_id: int, node_id: int, node_config: Mapping[str, UserConfigValue]) -> tuple[Connection, float]:
    """A connection to the worker process of (run, node), started first if none runs (one starts at a time);
    and the seconds spent starting it (0 when it ran already)."""
    address = WorkerAddress.of(run_id, node_id, node_config)
    connection = _connect(address)
    if connection is not None:
        return connection, 0.0
    started = time.perf_counter()
    address.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(address.lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        connection = _connect(address)  # another message's process may have started it meanwhile
        if connection is None:
            pid = _starting(address)  # started by an earlier message, still importing
            if pid is not None:
                _wait_for_socket(address, pid)
            else:
                _start(address, node_config)
            connection = _connect_listening(address)
    if connection is None:
        raise RelayError(f"the node's worker process does not answer on {address.socket}")
    return connection, time.perf_counter() - started


def forward(
    message_type: str, content: RecordDict, node_config: Mapping[str, UserConfigValue], *, run_id: int, node_id: int
) -> tuple[RecordDict, float]:
    """Have the node's worker process handle one message; returns the reply's content and the seconds spent
    starting the worker process (0 when it ran already).

    Raises :class:`RelayError` with the worker's reason when it could not handle the message.
    """
    config = {key: value for key, value in node_config.items() if isinstance(value, (str, int, float, bool))}
    connection, start_seconds = connect(run_id, node_id, node_config)
    with connection:
        connection.send((message_type, to_bytes(content), config))
        status, data = connection.recv()
    if status != "ok":
        raise RelayError(str(data))
    return from_bytes(data), start_seconds


def close(run_id: int, node_id: int, node_config: Mapping[str, UserConfigValue]) -> bool:
    """End the worker process of (run, node) if one runs or starts; whether one did. A worker still importing
    (started by the run's first message, no socket yet) is ended with SIGTERM; the files of one that was killed
    are removed."""
    address = WorkerAddress.of(run_id, node_id, node_config)
    connection = _connect(address)
    if connection is not None:
        with connection:
            connection.send(("close", b"", {}))
            with contextlib.suppress(EOFError, ConnectionError):
                connection.recv()
        return True
    pid = _starting(address)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + LISTEN_SECONDS
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    address.remove_leftovers()  # a worker that ended before its handler was set, or was killed, left them
    return pid is not None


def renew(run_id: int, node_id: int, node_config: Mapping[str, UserConfigValue]) -> bool:
    """Renew the lease of the worker process of (run, node), without reaching it (it may be busy with a long
    message): the server's keepalive. Whether a worker of that run is on this node."""
    address = WorkerAddress.of(run_id, node_id, node_config)
    try:
        os.utime(address.pid)
    except OSError:
        return False
    return True


def lease_of(pid_file: Path) -> float:
    """When the lease of the worker whose pid file is ``pid_file`` was last renewed (``time.time``); 0 if unknown."""
    try:
        return pid_file.stat().st_mtime
    except OSError:
        return 0.0
