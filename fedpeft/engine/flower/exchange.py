"""The server's one loop for Flower messages: send, take in the replies, give up on those overdue.

Every message goes through :class:`Exchange`: the queries of node membership and of the base model, a unit's
steps, and the steps of units that run at once, which wait in the :class:`~fedpeft.engine.flower.outbox.Outbox`
to leave together. Several units' threads may wait at once (taking turns, :class:`~fedpeft.core.turns.Turns`):
whichever thread pulls takes in the replies of every message in flight, and each reply reaches its request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from flwr.serverapp import Grid

from fedpeft.engine.flower.node_stats import NodeStats
from fedpeft.engine.flower.outbox import Outbox, Request, message_of, replies_of


@dataclass
class _Flight:
    """A message sent and not answered yet."""

    node: int
    requests: list[Request]
    sent: float
    limit: float | None  # seconds it may take to answer


class Exchange:
    """Sends requests as messages over a ServerApp's ``Grid`` and takes in their replies.

    Args:
        grid: the Grid the ServerApp's main received.
        poll_interval: seconds between two pulls of replies.
        max_in_flight: at most this many of one caller's direct requests are sent and unanswered at once.
        stop: once set, nothing more is sent or received: the caller gets a ``KeyboardInterrupt`` (the run was
            interrupted; what is in flight is dropped).
        sleep: how a caller waits ``seconds`` for replies (the engine's: it lets another unit's thread run).
        outbox: where the requests of units that run at once wait to leave together.
        stats: counts the replies to task messages, per node.
    """

    def __init__(
        self,
        grid: Grid,
        *,
        poll_interval: float = 0.1,
        max_in_flight: int = 64,
        stop: threading.Event | None = None,
        sleep: Callable[[float], None] = time.sleep,
        outbox: Outbox | None = None,
        stats: NodeStats | None = None,
    ) -> None:
        self.grid = grid
        self.poll_interval = poll_interval
        self.max_in_flight = max_in_flight
        self.stop = stop
        self.sleep = sleep
        self.outbox = outbox or Outbox()
        self.stats = stats
        self._in_flight: dict[str, _Flight] = {}

    def run(self, requests: Iterable[Request], *, bundled: bool = False) -> Iterator[Request]:
        """Send ``requests`` and yield each once answered (its ``reply`` set), as the replies arrive.

        Sent directly, at most ``max_in_flight`` of them are unanswered at once, and each task is encoded only
        when it is sent, so few payloads are in memory at once. ``bundled`` (units that run at once): they wait in
        the outbox, which sends them with the other units' requests for the same nodes once they are due.
        """
        pending = iter(requests)
        queued = list(pending) if bundled else []
        if bundled:
            self.outbox.put(queued)
        waiting = list(queued)  # sent or queued, not yielded yet
        exhausted = bundled
        try:
            while True:
                self._check_stop()
                if not exhausted:
                    exhausted = self._send_next(pending, waiting)
                if exhausted and not waiting:
                    return
                self._send(self.outbox.due())  # every unit's requests, whichever thread finds them due
                if self._in_flight and any(r.reply is None for r in waiting):
                    self._poll()
                answered = [r for r in waiting if r.reply is not None]
                waiting = [r for r in waiting if r.reply is None]
                yield from answered
                if waiting:
                    self.pause()
        finally:
            if bundled:
                self.outbox.leave(queued)

    def complete(self, requests: list[Request], *, bundled: bool = False) -> None:
        """Send ``requests`` (as :meth:`run` does) and return once every one is answered."""
        for _ in self.run(requests, bundled=bundled):
            pass

    def pause(self) -> None:
        """Wait one poll interval (another unit's thread may run meanwhile)."""
        self.sleep(self.poll_interval)

    def send(self, requests: list[Request]) -> None:
        """Send each of ``requests`` as a message of its own, at once (no ``max_in_flight`` limit); their replies
        come in through :meth:`poll` (or any thread's pull)."""
        self.check_stop()
        self._send([[request] for request in requests])

    def poll(self) -> None:
        """Take in the replies that came for any message in flight (and the bundled requests that are due), and
        give up on those overdue; a set stop event raises ``KeyboardInterrupt``."""
        self.check_stop()
        self._send(self.outbox.due())
        if self._in_flight:
            self._poll()

    def check_stop(self) -> None:
        """Raise ``KeyboardInterrupt`` once the stop event is set (the run was interrupted)."""
        self._check_stop()

    def _send_next(self, pending: Iterator[Request], waiting: list[Request]) -> bool:
        """Send the next of ``pending`` (into ``waiting``) while fewer than ``max_in_flight`` of ``waiting`` are
        unanswered; returns whether ``pending`` is exhausted."""
        unanswered = sum(r.reply is None for r in waiting)
        if unanswered >= self.max_in_flight:
            return False
        batch: list[Request] = []
        exhausted = True
        for request in pending:
            batch.append(request)
            if unanswered + len(batch) >= self.max_in_flight:
                exhausted = False
                break
        waiting += batch
        self._send([[request] for request in batch])
        return exhausted

    def _send(self, messages: list[list[Request]]) -> None:
        """Push one message per group of requests (a group: one node's)."""
        if not messages:
            return
        batch = [message_of(requests) for requests in messages]
        sent = time.monotonic()
        for requests, message_id in zip(messages, self.grid.push_messages(batch), strict=True):
            if not message_id:
                for request in requests:
                    request.reply = "the message could not be sent"
                continue
            timeouts = [r.timeout for r in requests]
            limit = None if None in timeouts else max(t for t in timeouts if t is not None)
            self._in_flight[str(message_id)] = _Flight(requests[0].node, requests, sent, limit)

    def _poll(self) -> None:
        """Take in the replies that came for any message in flight, and give up on those overdue."""
        replies = list(self.grid.pull_messages(list(self._in_flight)))
        self._check_stop()  # replies that come after an interrupt are the ended backend's errors
        for reply in replies:
            flight = self._in_flight.pop(reply.metadata.reply_to_message_id, None)
            if flight is None:
                continue
            results, counters = replies_of(reply, flight.requests)
            if counters is not None and self.stats is not None:
                self.stats.count(flight.node, counters, reply, time.monotonic() - flight.sent)
            for request, result in zip(flight.requests, results, strict=True):
                request.reply = result
        now = time.monotonic()
        for message_id, flight in list(self._in_flight.items()):
            if flight.limit is not None and now - flight.sent > flight.limit:
                del self._in_flight[message_id]
                for request in flight.requests:
                    request.reply = f"no reply within {flight.limit:g} s"

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise KeyboardInterrupt("the run was interrupted")


class SharedStep:
    """A step every unit needs done (node discovery, a refresh, a base sync), which several units' threads may
    reach at once: one thread does it, the others wait until it has finished.

    Args:
        pause: how a thread waits a moment (the exchange's: another unit's thread may run meanwhile).
    """

    def __init__(self, pause: Callable[[], None]) -> None:
        self._pause = pause
        self._busy = False

    def run(self, done: Callable[[], bool], do: Callable[[], object]) -> None:
        """``do()`` unless ``done()``, checked after the thread doing it, if any, has finished (it may have done
        it meanwhile)."""
        while self._busy:
            self._pause()
        if done():
            return
        self._busy = True
        try:
            do()
        finally:
            self._busy = False
