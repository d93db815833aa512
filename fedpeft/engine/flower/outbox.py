"""What the server sends a node: requests, one message each or several bundled into one.

Units that run at once (the methods of a seed, ``engine.concurrent_methods``) each put their step's requests in
the :class:`Outbox`; the requests due for a node at the same time leave as one message (``train.bundle``), which
the node's worker runs one after the other. Flower charges every message a fixed cost (the SuperNode's poll, a
new ClientApp process), so a node then goes from one unit's step to the next without it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from flwr.app import Message, RecordDict

from fedpeft.engine.flower.codec import NodeBundle, NodeCounters, NodeResult, NodeTask, decode, unbundle_results
from fedpeft.engine.flower.messages import BUNDLE


@dataclass(eq=False)
class Request:
    """One message's worth of work for one node: a query, or a step's task for the node's clients; it waits in
    the outbox or for its reply.

    Attributes:
        node: the node it goes to.
        message_type: the message type (a task's: ``OPERATIONS[task.op]``).
        content: a query's content, or a task (encoded only when it is sent).
        group: the message's group id (which step it belongs to).
        timeout: seconds to wait for the reply once sent (None: no limit).
        queued: when it was made (``time.monotonic``).
        reply: once answered: the reply (a task's read as its :class:`NodeResult`; Flower's error reply as it
            came), or why none came.
    """

    node: int
    message_type: str
    content: RecordDict | NodeTask
    group: str
    timeout: float | None
    queued: float = field(default_factory=time.monotonic)
    reply: NodeResult | Message | str | None = None

    @property
    def failure(self) -> str | None:
        """Why no usable reply came (not sent, no reply in time, Flower's error reply); None otherwise."""
        if isinstance(self.reply, str):
            return self.reply
        if isinstance(self.reply, Message) and self.reply.has_error():
            return str(self.reply.error.reason)
        return None

    @property
    def answer(self) -> Mapping[str, object] | None:
        """A query's reply, decoded; None when it failed (:attr:`failure`)."""
        if isinstance(self.reply, Message) and not self.reply.has_error():
            return cast("Mapping[str, object]", decode(self.reply.content))  # every query's answer is a mapping
        return None


def message_of(requests: list[Request]) -> Message:
    """The one message that carries ``requests`` (all for one node): the request's own, or a bundle of tasks."""
    first = requests[0]
    if len(requests) == 1:
        content = first.content.to_content() if isinstance(first.content, NodeTask) else first.content
        return Message(content, int(first.node), first.message_type, group_id=first.group)
    tasks = [r.content for r in requests if isinstance(r.content, NodeTask)]
    if len(tasks) != len(requests):
        raise ValueError("only tasks travel in a bundle")
    group = "+".join(r.group for r in requests)
    return Message(NodeBundle(tasks).to_content(), int(first.node), BUNDLE, group_id=group)


def replies_of(reply: Message, requests: list[Request]) -> tuple[list[NodeResult | Message], NodeCounters | None]:
    """Each request's part of ``reply``, the node's answer to the message that carried ``requests``, and the
    counters the node sent with its results (None for a query's reply or an error reply: nothing to count).

    A task's part is its :class:`NodeResult`; a query's part, and every request's part of an error reply, is the
    reply itself."""
    if reply.has_error() or not isinstance(requests[0].content, NodeTask):
        return [reply] * len(requests), None
    if len(requests) == 1:
        result = NodeResult.from_content(reply.content)
        return [result], result.stats
    results, stats = unbundle_results(reply.content)
    return list(results), stats


class Outbox:
    """The requests of units that run at once, waiting to leave together.

    The queued requests are due once every running unit waits for a reply (no other step will join them now), or
    once the oldest has waited ``coalesce_seconds``; they then leave as one message per node.

    Args:
        coalesce_seconds: the longest a request waits here for the other units' requests.
    """

    def __init__(self, coalesce_seconds: float = 1.0) -> None:
        self.coalesce_seconds = coalesce_seconds
        self._queued: list[Request] = []
        self._waiting: list[list[Request]] = []  # the requests of each unit whose thread waits for their replies
        self._units_running = 0

    def units_started(self, count: int) -> None:
        """``count`` units begin, each in a thread of its own."""
        self._units_running += count

    def unit_ended(self) -> None:
        """A unit's thread ends."""
        self._units_running -= 1

    def put(self, requests: list[Request], *, unit: list[Request] | None = None) -> None:
        """Queue one unit's ``requests``; its thread waits for their replies until :meth:`leave`.

        ``unit``: the requests the unit already waits for, which the new ones join (an asynchronous phase sends
        its clients one at a time, and counts as one unit however many it has in flight); the list is the one
        to :meth:`leave` with."""
        self._queued += requests
        if unit is None:
            self._waiting.append(requests)
            return
        if all(mine is not unit for mine in self._waiting):
            self._waiting.append(unit)
        unit += requests

    def leave(self, requests: list[Request]) -> None:
        """The unit that put ``requests`` waits no more (answered, or interrupted: those still queued stay here)."""
        self._waiting = [mine for mine in self._waiting if mine is not requests]
        self._queued = [r for r in self._queued if all(r is not mine for mine in requests)]

    def due(self) -> list[list[Request]]:
        """Take out the queued requests if they are due, grouped by node (in node order): each group is one
        message's worth; nothing while they may still wait for other units' requests."""
        if not self._queued:
            return []
        every_unit_waits = sum(any(r.reply is None for r in mine) for mine in self._waiting) >= self._units_running
        if not every_unit_waits and time.monotonic() - self._queued[0].queued < self.coalesce_seconds:
            return []
        by_node: dict[int, list[Request]] = {}
        for request in self._queued:
            by_node.setdefault(request.node, []).append(request)
        self._queued = []
        return [requests for _, requests in sorted(by_node.items())]
