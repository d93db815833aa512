"""The base model on every node: a base model the server trained (a ``centralized`` or ``federated`` base stage)
reaches each node that serves clients before they train, once per seed and node."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.engine.flower.codec import encode, tensors_digest
from fedpeft.engine.flower.exchange import Exchange, SharedStep
from fedpeft.engine.flower.membership import Membership
from fedpeft.engine.flower.messages import BASE_QUERY, BaseQuery
from fedpeft.engine.flower.outbox import Request

log = logging.getLogger("fedpeft")


class BaseSync:
    """Asks every serving node whether it holds the base model of a seed (a digest of its tensors), and sends it
    to those that lack it.

    Args:
        exchange: the messages to the nodes go through it.
        membership: the nodes that serve clients.
        checkpoint: where the server keeps the base model of a seed (nothing to send while it does not exist).
        run_dir: the run directory (absolute); the nodes keep the base model at the same path inside their own.
        reply_timeout: seconds to wait for a node's reply (None: no limit); at least ``node_timeout``, since the
            base query may be a node's first message, which starts its worker process.
        node_timeout: seconds a node's first message may take.
    """

    def __init__(
        self,
        exchange: Exchange,
        membership: Membership,
        checkpoint: Callable[[int], Path],
        *,
        run_dir: str,
        reply_timeout: float | None,
        node_timeout: float,
    ) -> None:
        self.exchange = exchange
        self.membership = membership
        self.checkpoint = checkpoint
        self.run_dir = run_dir
        self.timeout = None if reply_timeout is None else max(reply_timeout, node_timeout)
        self._synced: set[int] = set()  # seeds whose base model every serving node holds
        self._step = SharedStep(exchange.pause)

    def sync(self, seed: int) -> None:
        """Make sure every serving node holds the base model of ``seed`` (sent only to nodes that lack it)."""
        self._step.run(lambda: seed in self._synced, lambda: self._sync_now(seed))

    def forget(self) -> None:
        """The nodes changed: a new node may lack the base models the others hold."""
        self._synced.clear()

    def _sync_now(self, seed: int) -> None:
        path = self.checkpoint(seed)
        if not path.exists():
            return
        tensors = load_checkpoint(path)["tensors"]
        request: BaseQuery = {
            "run_dir": self.run_dir,
            "path": str(path.resolve().relative_to(self.run_dir)),
            "digest": tensors_digest(tensors),
        }
        lacking = []
        for query in self.exchange.run([self._query(n, request) for n in self.membership.serving_nodes()]):
            answer = query.answer
            if answer is None or not answer["present"]:
                lacking.append(query.node)
        if lacking:
            log.info("sending the base model of seed %s to nodes %s", seed, lacking)
            for send in self.exchange.run([self._query(n, {**request, "tensors": tensors}) for n in lacking]):
                answer = send.answer
                if answer is None or not answer["present"]:
                    reason = send.failure or "?"
                    log.warning("node %s could not store the base model of seed %s (%s)", send.node, seed, reason)
        self._synced.add(seed)

    def _query(self, node: int, request: BaseQuery) -> Request:
        return Request(node, BASE_QUERY, encode(request), "base", self.timeout)
