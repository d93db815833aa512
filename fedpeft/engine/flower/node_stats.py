"""Per-node counters of the Flower engine's task messages: the ``nodes`` rows of ``costs.jsonl``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flwr.app import Message

from fedpeft.core.jsontypes import JSONObject
from fedpeft.engine.flower.messages import JSON_FIELD, TIMING_KEY

if TYPE_CHECKING:
    from fedpeft.engine.flower.codec import NodeCounters


@dataclass
class _Counters:
    """One node's sums over the replies to its task messages (seconds unless named otherwise)."""

    messages: int = 0
    loads: dict[float | None, int] = field(default_factory=dict)  # node process id -> workers it built for the run
    round_trip: float = 0.0
    start: float = 0.0
    startup: float = 0.0
    overhead: float = 0.0
    work: float = 0.0


class NodeStats:
    """Where the seconds of every node's task messages went, counted from their replies.

    Only replies to task messages (a step's clients, one task or a bundle) count; queries do not.
    """

    def __init__(self) -> None:
        self._nodes: dict[int, _Counters] = {}

    def __contains__(self, node: object) -> bool:
        """Whether ``node`` has answered a task message (its worker is up)."""
        return node in self._nodes

    def count(self, node: int, stats: NodeCounters, reply: Message, round_trip: float) -> None:
        """Add one reply of ``node`` to its counters.

        Args:
            node: the node that answered.
            stats: the counters the node's worker sent with its results (``NodeResult.stats``, or a bundle's sum).
            reply: the reply; a deployment node's ClientApp adds its own timing to it.
            round_trip: the seconds the server waited for the reply.
        """
        counters = self._nodes.setdefault(node, _Counters())
        timing: dict[str, float | None] = {}
        if TIMING_KEY in reply.content.config_records:  # a deployment node: its ClientApp relayed the message
            timing = json.loads(str(reply.content.config_records[TIMING_KEY][JSON_FIELD]))
        work = float(stats.get("work_seconds", 0.0))
        handled = float(timing.get("relay_seconds") or stats.get("seconds", 0.0))
        # Starting the worker process and building its model are the run's one-off costs, not a message's.
        startup = float(timing.get("worker_start_seconds") or 0.0) + float(stats.get("load_seconds", 0.0))
        counters.messages += 1
        counters.loads[stats.get("pid")] = int(stats.get("model_loads", 0))
        counters.round_trip += round_trip
        counters.start += float(timing.get("start_seconds") or 0.0)
        counters.startup += startup
        counters.overhead += max(0.0, handled - work - startup)
        counters.work += work

    def rows(self) -> list[JSONObject]:
        """Per node: messages, model loads (workers its processes built for the run) and where the seconds of
        its messages went: Flower's start of a ClientApp process per message, the node worker's start and model
        load (once per run), fedpeft's relay and codec, and the clients' work; ``message_seconds`` is the sum of
        the server's waits for the node's replies."""
        rows: list[JSONObject] = []
        for node, counters in sorted(self._nodes.items()):
            values = {
                "messages": counters.messages,
                "model_loads": sum(counters.loads.values()),
                "message_seconds": counters.round_trip,
                "flower_start_seconds": counters.start,
                "worker_startup_seconds": counters.startup,
                "fedpeft_overhead_seconds": counters.overhead,
                "client_work_seconds": counters.work,
            }
            rows += [{"node": node, "metric": metric, "value": value} for metric, value in values.items()]
        return rows
