"""A node's worker process for one run: it keeps the model, the data and the clients' state between messages.

Started by :mod:`fedpeft.engine.flower.relay` on the first message of a run, as
``python -m fedpeft.engine.flower.node_worker SOCKET KEY --parent PID --idle-timeout S``; it answers one message at
a time over a Unix socket, authenticated with the key in the file ``KEY``, with the same handler the simulation's
ClientApp calls (:func:`fedpeft.engine.flower.client.handle_content`). It ends on a ``close`` request, when the
process ``PID`` (the SuperNode's) is gone, on SIGTERM, SIGINT or SIGHUP, or once its lease is ``S`` seconds old:
the lease is renewed by every request and by the server's keepalives (:func:`fedpeft.engine.flower.relay.renew`).
However it ends, it removes its socket, key, pid and lock files (its log stays).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import Listener
from pathlib import Path

from fedpeft.core.processes import process_alive
from fedpeft.engine.flower.relay import DEFAULT_IDLE_TIMEOUT, WorkerAddress, from_bytes, lease_of, to_bytes

log = logging.getLogger("fedpeft")


def end(address: WorkerAddress, reason: str, code: int = 0) -> None:
    """End this process at once, removing the files of ``address`` but its log."""
    log.info("node worker %s ends: %s", os.getpid(), reason)
    address.remove_leftovers()
    logging.shutdown()
    os._exit(code)


def end_on_signals(address: WorkerAddress) -> None:
    """SIGTERM, SIGINT and SIGHUP end the process through :func:`end` (set before torch and the worker are
    imported, which takes seconds: a worker ended meanwhile leaves its files neither)."""

    def on_signal(signum: int, frame: object) -> None:
        end(address, f"{signal.Signals(signum).name} received", 128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)


def serve(socket_path: Path, key_path: Path, *, parent: int | None, idle_timeout: float) -> None:
    """Answer requests on ``socket_path`` (authenticated with the key in ``key_path``) until told to close, the
    parent is gone, a signal ends it, or its lease is ``idle_timeout`` seconds old; then remove its files."""
    import torch  # noqa: F401  (ArrayRecord.to_torch_state_dict needs torch imported)

    from fedpeft.engine.flower.client import NodeWorkers, handle_content

    address = WorkerAddress(socket_path.parent, socket_path.stem)
    listener = Listener(str(socket_path), family="AF_UNIX", authkey=key_path.read_bytes())
    os.chmod(socket_path, 0o600)
    last = [time.time()]
    busy = threading.Lock()
    workers = NodeWorkers()  # this process's worker, for every request it answers

    def watch() -> None:  # ends the process from outside the blocking accept()
        while True:
            time.sleep(1.0)
            if parent is not None and not process_alive(parent):
                end(address, "its SuperNode is gone")
            renewed = max(last[0], lease_of(address.pid))
            if not busy.locked() and time.time() - renewed > idle_timeout:
                end(address, f"nothing of its run came for {idle_timeout:g} s (no message, no keepalive)")

    threading.Thread(target=watch, daemon=True).start()
    log.info("node worker %s (fedpeft from %s) listens on %s", os.getpid(), Path(__file__).parents[2], socket_path)
    while True:
        try:
            connection = listener.accept()
        except Exception as err:  # a client that failed authentication, or went away: wait for the next
            log.warning("a connection was refused: %r", err)
            continue
        with busy, connection:
            try:
                message_type, data, node_config = connection.recv()
            except (EOFError, OSError):
                continue
            if message_type == "close":
                with contextlib.suppress(OSError):
                    connection.send(("ok", b""))
                break
            reply: tuple[str, bytes | str]
            try:
                reply = ("ok", to_bytes(handle_content(message_type, from_bytes(data), node_config, workers)))
            except Exception as err:
                log.warning("%s failed on this node: %r\n%s", message_type, err, traceback.format_exc())
                reply = ("error", repr(err))
            with contextlib.suppress(OSError):
                connection.send(reply)
            last[0] = time.time()
    log.info("node worker %s closed by the server", os.getpid())
    listener.close()
    address.remove_leftovers()


def main() -> None:
    """Command-line entry point (started by the relay, not by users)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("socket", type=Path)
    parser.add_argument("key", type=Path)
    parser.add_argument("--parent", type=int, default=None)
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT)
    args = parser.parse_args()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s fedpeft: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    end_on_signals(WorkerAddress(args.socket.parent, args.socket.stem))
    serve(args.socket, args.key, parent=args.parent, idle_timeout=args.idle_timeout)


if __name__ == "__main__":
    main()
