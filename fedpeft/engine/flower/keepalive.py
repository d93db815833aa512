"""A deployment's keepalives: while its run lives, the ServerApp renews the lease of every node's worker process.

A node's worker process (:mod:`fedpeft.engine.flower.node_worker`) ends once nothing of its run reached it for
``worker-idle-timeout`` seconds. While the run lives, :class:`Keepalive` sends every node Flower lists a
``query.alive`` message each :data:`~fedpeft.engine.flower.relay.KEEPALIVE_SECONDS`, which the node's relay answers
by renewing the lease, without reaching the worker (it may be busy with a long step). A run that can no longer
send anything (stopped with ``flwr stop``, its SuperLink lost, its ServerApp killed) stops renewing, so its
workers end on their own within that timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

from flwr.app import Message
from flwr.serverapp import Grid

from fedpeft.engine.flower.messages import ALIVE_QUERY
from fedpeft.engine.flower.relay import KEEPALIVE_SECONDS, json_content

log = logging.getLogger("fedpeft")


class Keepalive:
    """Renews the workers' leases from a thread of its own, while in its ``with`` block.

    Args:
        grid: the Grid the ServerApp's main received (its calls may come from several threads).
        interval: seconds between two rounds of keepalives.
    """

    def __init__(self, grid: Grid, interval: float = KEEPALIVE_SECONDS) -> None:
        self.grid = grid
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fedpeft-keepalive", daemon=True)
        self._pending: dict[str, float] = {}  # keepalive message id -> when it was sent (monotonic)

    def __enter__(self) -> Keepalive:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.renew()
            except Exception as err:  # a keepalive never stops the run: the next one may get through
                log.debug("keepalive failed: %r", err)

    def renew(self) -> None:
        """Take in (and drop) the replies to earlier keepalives, then send every listed node one."""
        if self._pending:
            for reply in self.grid.pull_messages(list(self._pending)):
                self._pending.pop(reply.metadata.reply_to_message_id, None)
        now = time.monotonic()
        self._pending = {m: sent for m, sent in self._pending.items() if now - sent < 10 * self.interval}
        nodes = sorted(int(node) for node in self.grid.get_node_ids())
        messages = [Message(json_content({}), node, ALIVE_QUERY, group_id="alive") for node in nodes]
        for message_id in self.grid.push_messages(messages) if messages else []:
            if message_id:
                self._pending[str(message_id)] = now
