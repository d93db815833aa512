"""One asynchronous phase's clients in flight on the Flower engine, their replies taken as they come.

An asynchronous schedule (:mod:`fedpeft.engine.asynchronous`) sends each client's work as it dispatches it and
takes the replies in the order they arrive. Phases that run at once (the methods of a seed,
``engine.concurrent_methods``) each keep their own :class:`PhaseArrivals`, so that a reply reaches the phase that
sent its request, even when the same client trains for two methods at once. While units run at once, a phase's
requests wait in the :class:`~fedpeft.engine.flower.outbox.Outbox` like a synchronous step's and leave in one
message per node with the other units' requests due for that node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, cast

from flwr.app import Message

from fedpeft.core.turns import Turns
from fedpeft.core.types import Payload, TrainResult
from fedpeft.engine.flower.codec import ClientTaskError, NodeResult, NodeTask
from fedpeft.engine.flower.exchange import Exchange
from fedpeft.engine.flower.membership import Membership
from fedpeft.engine.flower.messages import OPERATIONS
from fedpeft.engine.flower.outbox import Outbox, Request
from fedpeft.engine.rounds import ClientOutcome

UNSERVED = "no SuperNode serves its partition now (its node was lost)"


class ArrivalHost(Protocol):
    """What a phase's arrivals use of the engine that holds them (the Flower engine's ``GridEngine``)."""

    membership: Membership
    exchange: Exchange
    outbox: Outbox
    turns: Turns | None
    run_dir: str
    config_text: str
    on_client: Callable[[], None] | None

    def sync_base(self, seed: int) -> None:
        """Make sure every node has the base model of ``seed``."""

    def first_task_timeout(self, nodes: list[int]) -> float | None:
        """The reply timeout of a message to ``nodes``."""
        ...

    def outcomes(
        self, node: int, client_ids: list[str], reply: NodeResult | Message | str
    ) -> Iterator[tuple[str, object, float]]:
        """Each client's result or error in a node's reply."""
        ...


class PhaseArrivals:
    """The clients one asynchronous phase (``label``, ``seed``) has in flight on ``engine``; implements
    :class:`~fedpeft.engine.asynchronous.Arrivals`."""

    def __init__(self, engine: ArrivalHost, label: str, seed: int) -> None:
        self.engine, self.label, self.seed = engine, label, seed
        self._submitted: list[tuple[str, Request]] = []
        self._ready: list[ClientOutcome] = []
        self._waiting: list[Request] = []  # this phase's requests the outbox knows of (units at once)

    def submit(self, round_: int, client_id: str, payload: Payload) -> None:
        """Send ``client_id``'s training from ``payload`` (of server step ``round_``) to its node; its outcome
        comes from :meth:`next_outcomes` (at once a failure when no node serves it now)."""
        engine = self.engine
        engine.membership.refresh()
        engine.sync_base(self.seed)  # a node that took over a partition mid-phase needs the base model
        node = engine.membership.node_of(client_id)
        if node is None:
            self._ready.append(ClientOutcome.of_training(client_id, ClientTaskError(UNSERVED), 0.0))
            return
        step = {"label": self.label, "seed": self.seed, "round_": round_, "payload": payload}
        task = NodeTask("train", engine.run_dir, engine.config_text, [(client_id, step)])
        timeout = engine.first_task_timeout([node])
        group = f"{self.label}-seed{self.seed}-{client_id}-step{round_ + 1}"
        request = Request(node, OPERATIONS["train"], task, group, timeout)
        self._submitted.append((client_id, request))
        if engine.turns is None:
            engine.exchange.send([request])
        else:
            engine.outbox.put([request], unit=self._waiting)

    def reachable(self, client_ids: list[str]) -> list[str]:
        """Those of ``client_ids`` that a node serves now (a lost node's clients are not drawn until one does)."""
        return [c for c in client_ids if self.engine.membership.node_of(c) is not None]

    def next_outcomes(self) -> list[ClientOutcome]:
        """Wait until at least one submitted client's outcome is in; return every one in, in client-id order (a
        node that did not answer in time is lost and its client failed, as in a synchronous round)."""
        engine = self.engine
        while True:
            answered = [(c, r) for c, r in self._submitted if r.reply is not None]
            self._submitted = [(c, r) for c, r in self._submitted if r.reply is None]
            self._waiting[:] = [r for r in self._waiting if r.reply is None]
            for client_id, request in answered:
                assert request.reply is not None
                for done, outcome, seconds in engine.outcomes(request.node, [client_id], request.reply):
                    if engine.on_client is not None:
                        engine.on_client()
                    trained = cast("TrainResult | BaseException", outcome)  # what train gives
                    self._ready.append(ClientOutcome.of_training(done, trained, seconds))
            if self._ready:
                ready, self._ready = sorted(self._ready, key=lambda o: o.client_id), []
                return ready
            if not self._submitted:
                raise RuntimeError("no client is in flight to wait for")
            engine.exchange.poll()
            if all(r.reply is None for _, r in self._submitted):
                engine.exchange.pause()

    def drain(self) -> None:
        """Wait for the clients still in flight (their work may change their state on disk) and drop their
        outcomes; nodes that do not answer in time are lost as usual."""
        try:
            while self._submitted:
                self.next_outcomes()
            self._ready = []
        finally:
            self.close()

    def close(self) -> None:
        """The phase waits for nothing more: the outbox stops counting it among the units that wait (requests of
        its still queued are dropped)."""
        self.engine.outbox.leave(self._waiting)
