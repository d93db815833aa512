"""The parts of the Flower engine's server side, each on its own: node membership (a node lost and back), the
outbox (steps of units that run at once bundled per node) and the exchange loop (replies, timeouts, an interrupt),
over the in-process grid of tests/test_flower.py."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from flwr.app import Context, Message, RecordDict

from fedpeft.core.turns import Turns
from fedpeft.engine.flower.codec import NodeBundle, NodeResult, NodeTask, encode
from fedpeft.engine.flower.exchange import Exchange
from fedpeft.engine.flower.membership import Membership
from fedpeft.engine.flower.messages import BUNDLE, EVALUATE_BASE, OPERATIONS, PARTITION_QUERY
from fedpeft.engine.flower.node_stats import NodeStats
from fedpeft.engine.flower.outbox import Outbox, Request, message_of
from tests.test_flower import InProcessGrid, one_torch_thread, task_identity, tiny_raw  # noqa: F401


class SilentGrid(InProcessGrid):
    """An InProcessGrid whose node ``silent`` takes every message and never answers."""

    def __init__(self, num_nodes: int, silent: int) -> None:
        super().__init__(num_nodes)
        self.silent = silent
        self.unanswered: set[str] = set()
        self.pushes: list[int] = []  # the number of messages of every push

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(super().push_messages(messages))
        self.pushes.append(len(messages))
        self.unanswered |= {i for m, i in zip(messages, ids, strict=True) if m.metadata.dst_node_id == self.silent}
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return super().pull_messages([i for i in message_ids if i not in self.unanswered])


def partition_query(node: int, timeout: float | None = 5.0) -> Request:
    return Request(node, PARTITION_QUERY, encode({}), "partition", timeout)


def task(node: int, group: str, op: str = "evaluate_base", config_text: str = "", run_dir: str = "") -> Request:
    return Request(node, OPERATIONS[op], NodeTask(op, run_dir, config_text, []), group, None)


# ---------------------------------------------------------------------------------------------- membership
def test_a_lost_node_comes_back_and_a_restarted_one_takes_over_its_partition(task_identity):  # noqa: F811
    grid = InProcessGrid(num_nodes=2)
    changes: list[str] = []
    membership = Membership(Exchange(grid), ["d", "c", "b", "a"], on_change=lambda: changes.append("changed"))
    assert not membership.mapped
    # Clients by sorted id, partition i % 2; each node asked once which partition it serves.
    assert [membership.node_of(c) for c in "abcd"] == [1000, 1001, 1000, 1001]
    assert membership.mapped and grid.served == {1000: [PARTITION_QUERY], 1001: [PARTITION_QUERY]}

    membership.lose(1001, "no reply within 1 s")
    assert membership.lost == {1001}
    assert membership.node_of("b") == 1001  # until the next step's refresh
    membership.refresh()  # still connected, and it answers: back, nothing moved
    assert not membership.lost and membership.node_of("b") == 1001 and not changes
    assert grid.served == {1000: [PARTITION_QUERY], 1001: [PARTITION_QUERY] * 2}  # only the lost node is asked
    membership.refresh()  # nothing lost: no message
    assert sum(len(served) for served in grid.served.values()) == 3

    # Restarted: the same node config under a new node id.
    membership.lose(1001, "node lost")
    config = grid.contexts.pop(1001).node_config
    grid.contexts[1005] = Context(run_id=1, node_id=1005, node_config=config, state=RecordDict(), run_config={})
    grid.served[1005] = []
    membership.refresh()
    assert [membership.node_of(c) for c in "abcd"] == [1000, 1005, 1000, 1005]
    assert membership.serving_nodes() == [1000, 1005] and changes == ["changed"]
    assert grid.served[1005] == [PARTITION_QUERY] and grid.served[1000] == [PARTITION_QUERY]

    # Gone for good: its partition's clients have no node until one serves it again.
    membership.lose(1005, "node lost")
    del grid.contexts[1005]
    membership.refresh()
    assert [membership.node_of(c) for c in "abcd"] == [1000, None, 1000, None]
    assert membership.serving_nodes() == [1000] and changes == ["changed", "changed"]


# ---------------------------------------------------------------------------------------------- outbox
def test_the_outbox_waits_for_every_unit_and_then_sends_one_message_per_node(task_identity):  # noqa: F811
    outbox = Outbox(coalesce_seconds=3600.0)
    outbox.units_started(2)
    first = [task(1000, "fedit-round0"), task(1001, "fedit-round0")]
    outbox.put(first)
    assert outbox.due() == []  # the other unit may still add its step
    second = [task(1000, "base", op="evaluate_base")]
    outbox.put(second)
    groups = outbox.due()  # every unit waits: nothing else will join
    assert [[r.group for r in group] for group in groups] == [["fedit-round0", "base"], ["fedit-round0"]]
    assert outbox.due() == []  # taken out once

    bundle, single = message_of(groups[0]), message_of(groups[1])
    assert bundle.metadata.message_type == BUNDLE and bundle.metadata.group_id == "fedit-round0+base"
    assert bundle.metadata.dst_node_id == 1000 and len(NodeBundle.from_content(bundle.content).tasks) == 2
    assert single.metadata.message_type == EVALUATE_BASE and single.metadata.group_id == "fedit-round0"

    # A unit whose requests were all answered waits no more (its thread has yet to put its next step).
    for request in [*first, *second]:
        request.reply = "no reply within 1 s"
    outbox.leave(second)
    third = [task(1001, "base-1")]
    outbox.put(third)
    assert outbox.due() == []
    outbox.leave(first)
    outbox.put([task(1001, "fedit-round1")])
    assert [[r.group for r in group] for group in outbox.due()] == [["base-1", "fedit-round1"]]

    # A request waits at most coalesce_seconds; one whose unit left (interrupted) never goes out.
    outbox = Outbox(coalesce_seconds=0.0)
    outbox.units_started(2)
    interrupted = [task(1000, "fedit-round0")]
    outbox.put(interrupted)
    outbox.leave(interrupted)
    assert outbox.due() == []
    outbox.put([task(1000, "base")])
    assert [[r.group for r in group] for group in outbox.due()] == [["base"]]


def test_steps_of_units_at_once_leave_as_one_bundle_per_node(tmp_path: Path, task_identity):  # noqa: F811
    """Two units' threads, taking turns as the runner's do, each wait for their step's replies; the steps due for
    a node together leave as one message, and each unit gets its own task's result back."""
    raw = tiny_raw(base={"kind": "pretrained"})
    raw["data"] = {**raw["data"], "groups": ["lat1"], "unseen_pool": False}
    config_text = yaml.safe_dump(raw)
    grid = InProcessGrid(num_nodes=2)
    turns, stats = Turns(), NodeStats()
    outbox = Outbox(coalesce_seconds=3600.0)
    exchange = Exchange(grid, poll_interval=0.01, sleep=turns.wait, outbox=outbox, stats=stats)
    units = {
        "fedit": [task(n, "fedit", config_text=config_text, run_dir=str(tmp_path)) for n in (1000, 1001)],
        "base": [task(1000, "base", config_text=config_text, run_dir=str(tmp_path))],
    }
    outbox.units_started(len(units))

    def unit(requests: list[Request]) -> None:
        with turns.hold():
            exchange.complete(requests, bundled=True)
            outbox.unit_ended()

    threads = [threading.Thread(target=unit, args=(requests,)) for requests in units.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert grid.served == {1000: [BUNDLE], 1001: [EVALUATE_BASE]}
    assert all(isinstance(r.reply, NodeResult) for requests in units.values() for r in requests)
    messages = {row["node"]: row["value"] for row in stats.rows() if row["metric"] == "messages"}
    assert messages == {1000: 1, 1001: 1} and 1000 in stats


# ---------------------------------------------------------------------------------------------- exchange
def test_a_node_that_does_not_answer_in_time_gets_the_reason_instead_of_a_reply(task_identity):  # noqa: F811
    grid = SilentGrid(num_nodes=3, silent=1001)
    exchange = Exchange(grid, poll_interval=0.01)
    queries = [partition_query(1000, timeout=0.2), partition_query(1001, timeout=0.2), partition_query(1002)]
    answered = list(exchange.run(queries))
    assert [q.node for q in answered] == [1000, 1002, 1001]  # as the replies came; the silent node's after 0.2 s
    assert answered[-1].reply == "no reply within 0.2 s" and answered[-1].failure == "no reply within 0.2 s"
    assert answered[0].answer == {"partition_id": 0, "num_partitions": 3} and answered[0].failure is None
    assert grid.served[1001] == [PARTITION_QUERY]  # sent once, never again

    # At most max_in_flight unanswered at once: the next message leaves once one is answered.
    exchange = Exchange(grid, max_in_flight=2, poll_interval=0.01)
    list(exchange.run(partition_query(n) for n in (1000, 1002, 1000)))
    assert grid.pushes[-2:] == [2, 1]


def test_an_interrupt_ends_the_wait_for_replies(task_identity):  # noqa: F811
    grid = SilentGrid(num_nodes=2, silent=1001)
    stop = threading.Event()
    exchange = Exchange(grid, poll_interval=0.01, stop=stop, sleep=lambda seconds: stop.set())
    replies = exchange.run([partition_query(1000), partition_query(1001, timeout=None)])
    assert next(replies).node == 1000
    with pytest.raises(KeyboardInterrupt, match="interrupted"):
        next(replies)
