"""Which SuperNode serves which client: partitions or sites, nodes lost and back.

Clients map to nodes by partition (client ``i`` in sorted client-id order belongs to partition
``i % num-partitions``; each node says which partition it serves), or, with site-local data (``data.sites``), to
the node that holds their data (:func:`register_sites`). A node that does not answer is lost: its clients are left
out until it, or a node in its place, answers again at the start of a later step (:meth:`Membership.refresh`).

Flower's SuperLink decides when a node is gone: a SuperNode sends a heartbeat every 17 to 23 s, and the SuperLink
marks it offline 60 s after the last one (Flower 1.42: ``HEARTBEAT_PATIENCE`` times a 30 s interval, fixed in the
SuperNode). From then on every message to it is answered with Flower's ``NODE_UNAVAILABLE`` error, which is when
the server takes it as lost (or sooner, after ``reply-timeout``); and only from then on may a SuperNode that keeps
its node id (a registered key, with node authentication) activate again. A lost node is asked again once Flower
has heard from it since the loss (a heartbeat or its activation moved its ``online_until``), so a node that died
is never waited for, and one that is back takes its clients back at the start of the next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from flwr.serverapp import Grid

from fedpeft.core.config import ExperimentConfig, dump_given
from fedpeft.core.errors import UserError
from fedpeft.data.sites import SiteAnswer, join_sites, node_data_config
from fedpeft.data.types import FederatedData
from fedpeft.engine.flower.codec import encode
from fedpeft.engine.flower.exchange import Exchange, SharedStep
from fedpeft.engine.flower.messages import NUM_PARTITIONS, PARTITION_ID, PARTITION_QUERY, SITE_QUERY
from fedpeft.engine.flower.outbox import Request
from fedpeft.engine.flower.relay import PartitionAnswer

log = logging.getLogger("fedpeft")

# node -> (partition, num_partitions) as the node said; (-1, None): a node that did not say
Answers = dict[int, tuple[int | None, int | None]]


class Membership:
    """The nodes that serve the clients, learnt from the nodes and kept up to date as nodes are lost and back.

    Args:
        exchange: the messages to the nodes go through it.
        client_ids: every client of the run.
        sites: with site-local data, the node that holds each client (:func:`register_sites`); otherwise the
            clients map to nodes by partition.
        config_text: the experiment config as given (a site's node builds its clients from it).
        node_timeout: seconds to wait for SuperNodes to cover every partition (and for a site's answer).
        reply_timeout: seconds to wait for a node's reply to one message (None: no limit).
        on_change: called when a client moves to another node (a new node may lack what the old one held).
    """

    def __init__(
        self,
        exchange: Exchange,
        client_ids: list[str],
        *,
        sites: dict[str, int] | None = None,
        config_text: str = "",
        node_timeout: float = 120.0,
        reply_timeout: float | None = None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.exchange = exchange
        self.grid = exchange.grid
        self.config_text = config_text
        self.node_timeout = node_timeout
        self.reply_timeout = reply_timeout
        self.on_change = on_change
        self._client_index = {client_id: i for i, client_id in enumerate(sorted(client_ids))}
        self._partition_nodes: list[int | None] | None = None
        self._answers: Answers = {}
        self._lost: set[int] = set()  # nodes that did not answer a message
        self._lost_until: dict[int, float | None] = {}  # Flower's online_until of each lost node when it was lost
        self.returned: set[int] = set()  # nodes back from a loss whose next task may start a worker again
        self._owners: dict[str, int | None] | None = dict(sites) if sites is not None else None
        self._not_sites: set[int] = set()  # nodes without a data-path (site-local data)
        self._discovery = SharedStep(exchange.pause)
        self._refreshing = SharedStep(exchange.pause)

    @property
    def mapped(self) -> bool:
        """Whether the clients were mapped to nodes (by site, or once the nodes said their partitions)."""
        return self._partition_nodes is not None or self._owners is not None

    @property
    def lost(self) -> frozenset[int]:
        """The nodes lost since the last :meth:`refresh` that found them back."""
        return frozenset(self._lost)

    def node_of(self, client_id: str) -> int | None:
        """The node that serves ``client_id``: the node that holds its data (site-local data), or the node of
        partition ``index % num_partitions`` (None while that node is lost)."""
        if self._owners is not None:
            return self._owners[client_id]
        nodes = self._nodes()
        return nodes[self._client_index[client_id] % len(nodes)]

    def serving_nodes(self) -> list[int]:
        """The nodes that serve some client now."""
        nodes = self._owners.values() if self._owners is not None else self._nodes()
        return sorted({n for n in nodes if n is not None})

    def lose(self, node: int, reason: str) -> None:
        """``node`` did not answer: its clients are left out until it, or a node in its place, answers again."""
        if node not in self._lost:
            log.warning("node %s is lost (%s); its clients are left out until a node serves them again", node, reason)
            self._lost.add(node)
            self._lost_until[node] = online_until(self.grid).get(node)
            self.returned.discard(node)

    def refresh(self) -> None:
        """After a node was lost, at the start of a step: ask the lost nodes Flower has heard from since and the
        nodes that joined since which partition they serve (or which clients they hold), and map every partition
        to a node that answers. A restarted SuperNode keeps its node id when it has a registered key (node
        authentication), else it gets a new one; either way it takes its clients back from this step on."""
        self._refreshing.run(lambda: not self._lost, self._refresh_now)

    def _online(self) -> set[int]:
        """The nodes to count on now: those Flower lists as online, but a lost node only once Flower has heard from
        it since it was lost (until then it may be a dead node that Flower's heartbeat has not yet timed out)."""
        heard = online_until(self.grid)
        return {n for n, until in heard.items() if n not in self._lost or until is None or until != self._lost_until[n]}

    def _found_again(self, node: int) -> None:
        if node in self._lost:
            log.info("node %s answers again; it serves its clients from this step on", node)
            self._lost.discard(node)
            self._lost_until.pop(node, None)
            self.returned.add(node)

    # ------------------------------------------------------------------ partitions
    def _nodes(self) -> list[int | None]:
        """Node id of each partition, learnt from the nodes (waits for nodes in deployment)."""
        self._discovery.run(lambda: self._partition_nodes is not None, self._discover)
        assert self._partition_nodes is not None
        return self._partition_nodes

    def _discover(self) -> None:
        def assigned() -> bool:
            nodes = _assign_partitions(self._answers)
            if nodes is not None:
                log.info("clients map to nodes by partition: %s", nodes)
                self._partition_nodes = list(nodes)
            return nodes is not None

        poll_nodes(
            self.grid,
            ask=self._query_partitions,
            asked=lambda node: node in self._answers,
            ready=assigned,
            timeout=self.node_timeout,
            failure=lambda: _missing_partitions_message(self._answers, self.node_timeout),
            sleep=self.exchange.sleep,
        )

    def _query_partitions(self, nodes: list[int], timeout: float | None = None) -> None:
        """Ask ``nodes`` which partition each serves (into ``_answers``; -1: a node that did not say)."""
        timeout = timeout or self.node_timeout
        queries = [Request(node, PARTITION_QUERY, encode({}), "partition", timeout) for node in nodes]
        for query in self.exchange.run(queries):
            answer = query.answer
            if answer is None:
                log.warning("node %s did not say which partition it serves; it gets no clients", query.node)
                self._answers[query.node] = (-1, None)
                continue
            partition = cast(PartitionAnswer, answer)
            self._answers[query.node] = (partition["partition_id"], partition["num_partitions"])

    def _refresh_now(self) -> None:
        if self._owners is not None:
            self._refresh_sites()
            return
        if self._partition_nodes is None:
            return
        listed = self._online()
        ask = sorted(n for n in listed if n not in self._answers or n in self._lost)
        for node in ask:
            self._answers.pop(node, None)
        self._query_partitions(ask, timeout=min(self.reply_timeout or 30.0, 30.0))
        for node in ask:
            if node in self._answers and self._answers[node][0] != -1:
                self._found_again(node)
        live = {n: a for n, a in self._answers.items() if n in listed and n not in self._lost}
        before = list(self._partition_nodes)
        self._partition_nodes = _assign_partitions(live, partial=len(before)) or before
        if self._partition_nodes != before:
            log.info("clients map to nodes by partition: %s", self._partition_nodes)
            self.on_change()

    # ------------------------------------------------------------------ sites
    def _refresh_sites(self) -> None:
        """:meth:`refresh` for site-local data: a node that joined since (a restarted SuperNode has a new id), or a
        lost one still connected, takes back the clients it holds whose node is lost; a client that a node in
        service holds already is refused, never moved."""
        assert self._owners is not None
        listed = self._online()
        serving = set(self.serving_nodes())
        ask = sorted(n for n in listed if (n not in serving and n not in self._not_sites) or n in self._lost)
        request = encode({"config": self.config_text})
        timeout = max(min(self.reply_timeout or 30.0, 30.0), self.node_timeout)  # may start the node's worker
        claims: dict[int, list[str]] = {}
        for query in self.exchange.run([Request(n, SITE_QUERY, request, "site", timeout) for n in ask]):
            answer = query.answer
            if answer is None:
                continue
            if answer.get("data_path") is None:
                self._not_sites.add(query.node)  # no data-path: never a site, not asked again
            elif "error" in answer:
                log.warning(
                    "SuperNode %s (data-path %r) cannot serve its clients: %s",
                    query.node,
                    answer["data_path"],
                    answer["error"],
                )
            else:
                claims[query.node] = [entry["id"] for entry in cast(SiteAnswer, answer)["clients"]]
                self._found_again(query.node)
        before = dict(self._owners)
        for client_id, owner in before.items():
            if owner in self._lost or (owner is not None and owner not in listed):
                self._owners[client_id] = None
        for node, clients in sorted(claims.items()):
            for client_id in clients:
                owner = self._owners.get(client_id, -1)
                if owner == -1:
                    log.warning("node %s holds client %s, which the run did not register: left out", node, client_id)
                elif owner is None:
                    self._owners[client_id] = node
                elif owner != node:
                    raise UserError(
                        f"SuperNodes {owner} and {node} both hold client {client_id!r}; each client's data must "
                        "live on one site: stop the node that should not serve it (check `flwr supernode list`)."
                    )
        if self._owners != before:
            log.info("clients map to nodes by site: %s", _by_node(self._owners))
            self.on_change()


def register_sites(
    grid: Grid, cfg: ExperimentConfig, *, node_timeout: float, poll_interval: float = 1.0
) -> tuple[FederatedData, dict[str, int], ExperimentConfig]:
    """Site-local data (``data.sites``): ask the SuperNodes which clients their ``data-path`` holds, until
    ``cfg.data.sites`` of them have answered.

    Returns the server's view of the data (ids, groups, pools and sizes; no example), the node of each client,
    and the config to run with (the one the nodes build their data from: for the generic datasets it names the
    unseen pool drawn over every site's clients).

    Raises:
        UserError: at once, a site that cannot build its clients (its own sentence, with its node id and
            data-path), a client on two sites, more nodes with data than ``data.sites``, or reports that do not fit
            together (different class names); fewer sites than ``data.sites`` within ``node_timeout`` seconds.
    """
    expected = cfg.data.sites
    assert expected is not None
    exchange = Exchange(grid)
    request = encode({"config": dump_given(cfg)})
    reports: dict[int, SiteAnswer] = {}
    not_sites: set[int] = set()  # nodes without a data-path
    silent: dict[int, str] = {}  # nodes that gave no answer, and why

    def ask(nodes: list[int]) -> None:
        for query in exchange.run([Request(node, SITE_QUERY, request, "site", node_timeout) for node in nodes]):
            answer = query.answer
            if answer is None:
                silent[query.node] = str(query.failure)
                log.warning("node %s did not say which clients it holds (%s); it gets none", query.node, query.failure)
            elif answer.get("data_path") is None:
                not_sites.add(query.node)
            elif "error" in answer:  # the site's own sentence: nothing to wait for
                raise UserError(f"SuperNode {query.node} (data-path {answer['data_path']!r}): {answer['error']}")
            else:
                reports[query.node] = cast(SiteAnswer, answer)
                check_distinct_clients(reports)

    def every_site() -> bool:
        if len(reports) > expected:
            raise UserError(
                f"{len(reports)} SuperNodes hold data ({_sites_text(reports)}), but data.sites is {expected}; stop "
                "the nodes that should not take part, or raise data.sites."
            )
        return len(reports) == expected

    def failure() -> str:
        text = f"{len(reports)} of the {expected} sites (data.sites) reported their clients within {node_timeout:.0f} s"
        text += "".join(f"; node {n}: it has no data-path in its node config" for n in sorted(not_sites))
        text += "".join(f"; node {n} did not answer: {reason}" for n, reason in sorted(silent.items()))
        if not_sites or not (reports or silent):
            return text + "; start each site's SuperNode with --node-config \"data-path='DIR'\"."
        return text + "; start the missing sites' SuperNodes."

    poll_nodes(
        grid,
        ask=ask,
        asked=lambda node: node in reports or node in not_sites or node in silent,
        ready=every_site,
        timeout=node_timeout,
        failure=failure,
        interval=poll_interval,
    )
    data = join_sites(cfg.data, reports)
    owners = {entry["id"]: node for node, report in reports.items() for entry in report["clients"]}
    run_cfg = cfg.model_copy(update={"data": node_data_config(cfg.data, data)})
    log.info("clients map to nodes by site: %s", _by_node(owners))
    return data, owners, run_cfg


def check_distinct_clients(reports: dict[int, SiteAnswer]) -> None:
    """Refuse a client reported by two sites, naming both nodes and their data-paths (never prefer one: either
    site may be wrong)."""
    owners: dict[str, int] = {}
    for node, report in sorted(reports.items()):
        for entry in report["clients"]:
            first = owners.setdefault(entry["id"], node)
            if first != node:
                raise UserError(
                    f"Client {entry['id']!r} is on two sites (SuperNodes {first} and {node}): data-paths "
                    f"{reports[first].get('data_path')!r} and {report.get('data_path')!r}; each client's data must "
                    "live on one site: give the clients distinct ids."
                )


def _sites_text(reports: dict[int, SiteAnswer]) -> str:
    return ", ".join(f"node {n} with data-path {r.get('data_path')!r}" for n, r in sorted(reports.items()))


def online_until(grid: Grid) -> dict[int, float | None]:
    """Every node Flower lists as online now, with the time until which its last heartbeat keeps it so (None where
    the grid does not say: a simulation's nodes never time out, a test's grid has no heartbeat)."""
    until: dict[int, float | None] = {}
    for node in grid.get_nodes():
        value = float(node.online_until)
        until[int(node.node_id)] = value if 0.0 < value < 1e100 else None
    return until


def poll_nodes(
    grid: Grid,
    *,
    ask: Callable[[list[int]], None],
    asked: Callable[[int], bool],
    ready: Callable[[], bool],
    timeout: float,
    failure: Callable[[], str],
    sleep: Callable[[float], None] = time.sleep,
    interval: float = 1.0,
) -> None:
    """Ask every SuperNode that connects and was not ``asked`` yet (``ask(node ids)``), every ``interval``
    seconds until ``ready()``.

    Raises:
        UserError: ``failure()``, the sentence for a run that was not ready after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        ask(sorted(int(n) for n in grid.get_node_ids() if not asked(int(n))))
        if ready():
            return
        if time.monotonic() > deadline:
            raise UserError(failure())
        sleep(interval)


def _by_node(owners: dict[str, int | None] | dict[str, int]) -> dict[int | None, list[str]]:
    grouped: dict[int | None, list[str]] = {}
    for client_id, node in owners.items():
        grouped.setdefault(node, []).append(client_id)
    return grouped


def _assign_partitions(answers: Answers, partial: int = 0) -> list[int | None] | None:
    """Node id per partition, or None while some partition has no node yet.

    Nodes that declare no partition (no node config) split the clients by their sorted node ids. With
    ``partial`` (the number of partitions known already), a partition without a node gets None instead.
    """
    usable = {n: a for n, a in answers.items() if a[0] != -1}
    declared = {n: a for n, a in usable.items() if a[0] is not None}
    if not declared:
        found: list[int | None] = [*sorted(usable)]
        if partial:  # undeclared nodes fill the partitions in node-id order
            return found[:partial] + [None] * (partial - len(found[:partial]))
        return found or None
    totals = {a[1] for a in declared.values()}
    if len(totals) != 1 or None in totals:
        raise UserError(
            f"The SuperNodes disagree on {NUM_PARTITIONS} ({sorted(map(str, totals))}); start every node with "
            f'the same --node-config "{NUM_PARTITIONS}=N".'
        )
    total = int(next(iter(totals)))  # type: ignore[arg-type]
    owners: dict[int, int] = {}
    for node, (partition, _) in sorted(declared.items()):
        if partition is None or not 0 <= partition < total:
            raise UserError(
                f"SuperNode {node} says {PARTITION_ID}={partition}, outside 0..{total - 1}; fix its --node-config."
            )
        if partition in owners:  # never prefer one silently: either may be the impostor
            raise UserError(
                f"SuperNodes {owners[partition]} and {node} both claim {PARTITION_ID}={partition}; each partition "
                "needs exactly one node: stop the node that should not serve it (check `flwr supernode list`)."
            )
        owners[partition] = node
    if len(owners) < total and not partial:
        return None
    return [owners.get(p) for p in range(total)]


def _missing_partitions_message(answers: Answers, waited: float) -> str:
    declared = {a[0] for a in answers.values() if a[0] is not None and a[0] >= 0}
    totals = {a[1] for a in answers.values() if a[1] is not None}
    if not answers or not totals:
        return f"No SuperNode connected within {waited:.0f} s; start flower-supernode on the client machines."
    total = max(totals)
    missing = [p for p in range(total) if p not in declared]
    return (
        f"No SuperNode serves partition(s) {missing} of {total} after {waited:.0f} s; start one per partition "
        f'with --node-config "{PARTITION_ID}=P {NUM_PARTITIONS}={total}".'
    )
