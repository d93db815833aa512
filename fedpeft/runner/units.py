"""The units of a run (the base stage of a seed, its clients' bases, the base row, one method for one seed): each
runs unless ``parts/`` holds its records already, alone or, where the engine runs several at once, in threads that
take turns for their server code; the order they are listed in is the order of the run's outputs."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fedpeft.core.records import ResultRecord
from fedpeft.engine.rounds import Engine
from fedpeft.report.loggers import MetricLog
from fedpeft.rundir import RunDirectory

log = logging.getLogger("fedpeft")

ENGINE_PART = "engine"  # parts/engine.jsonl: the engine's own cost rows
UnitWork = Callable[[], tuple[list[ResultRecord], list[dict]]]  # a unit's work: its records and cost rows


class Units:
    """Runs the units of one started run and lists them (:attr:`parts`) in the order a one-at-a-time run does,
    which is the order their records and costs are merged in."""

    def __init__(self, directory: RunDirectory, engine: Engine, metric_log: MetricLog) -> None:
        self.directory = directory
        self.engine = engine
        self.metric_log = metric_log
        self.parts: list[str] = []  # the units of this run, in the order a one-at-a-time run lists them

    def add(self, name: str) -> None:
        """List the unit ``name`` (once) without running it: a unit whose work writes its own part."""
        if name not in self.parts:
            self.parts.append(name)

    def run(self, name: str, work: Any, *, listed: bool = False) -> None:
        """Run the unit ``name`` (its ``work`` gives its records and cost rows) unless its part is done already,
        then write its part and hand its records to the metric loggers."""
        if not listed:
            self.parts.append(name)
        if self.directory.part_done(name):  # a part whose last line was cut is a unit to run again
            log.info("unit %s already done", name)
            return
        records, costs = work()
        self.directory.write_part(name, records, costs)
        self.directory.drop_clients(name)
        self.metric_log.unit(records)

    def run_seeds(self, evaluations: list[tuple[str, UnitWork]], methods: list[list[tuple[str, UnitWork]]]) -> None:
        """Run the units of one or more seeds: each seed's base model evaluation (``evaluations``), then its methods
        (``methods``), one after the other, or, where the engine runs several at once (``concurrent_units``), the
        base model's evaluations in a thread of their own beside at most ``concurrent_units - 1`` methods, each in a
        thread of its own; the threads take turns for their server code (:class:`~fedpeft.core.turns.Turns`). The
        first failure is raised once every unit has ended."""
        pairs = zip(evaluations, methods, strict=True)
        units = [unit for evaluation, seed_methods in pairs for unit in [evaluation, *seed_methods]]
        turns = self.engine.turns
        queued = [unit for seed_methods in methods for unit in seed_methods]
        if turns is None or self.engine.concurrent_units < 2 or len(units) < 2:
            for name, work in units:
                self.run(name, work)
            return
        self.parts += [name for name, _ in units]  # in the order a one-at-a-time run lists them

        # The base model's evaluations do not take a method's place: once they end, no further method starts.
        groups = [(evaluations, 1), (queued, min(self.engine.concurrent_units - 1, len(queued)))]
        groups = [(group, slots) for group, slots in groups if group]

        def runner(count: int, slots: int) -> Callable[[str, UnitWork], None]:
            # A unit that waits for a free thread takes over the count of the unit whose thread it gets: between the
            # one ending and the other starting, the engine still counts a running unit, so no step leaves without it.
            handoffs = itertools.count(count - slots, -1)

            def run(name: str, work: UnitWork) -> None:
                try:
                    with turns.hold():
                        self.run(name, work, listed=True)
                finally:
                    with turns.hold():
                        if next(handoffs) <= 0:
                            self.engine.unit_ended()

            return run

        # Before any thread starts: the engine waits for all of them to ask.
        self.engine.units_started(sum(slots for _, slots in groups))
        with contextlib.ExitStack() as stack:
            futures = []
            for group, slots in groups:
                pool = stack.enter_context(ThreadPoolExecutor(slots, thread_name_prefix="unit"))
                run = runner(len(group), slots)
                futures += [pool.submit(run, name, work) for name, work in group]
            try:
                errors = [future.exception() for future in futures]
            except BaseException:  # Ctrl-C, SIGTERM: this thread only; the units' threads end at their next wait
                self.engine.stop()
                raise
        for error in errors:
            if error is not None:
                raise error

    def write_engine_costs(self, rows: list[dict[str, Any]]) -> None:
        """Keep the engine's own cost rows (a Flower engine's per-node messages, model loads and seconds) in
        ``costs.jsonl`` as method ``engine``, phase ``nodes``; each sitting of a resumed run adds its rows."""
        if not rows:
            return
        _, earlier = self.directory.read_part(ENGINE_PART)
        sittings = [cost["sitting"] for cost in earlier]
        sitting = max(sittings) + 1 if sittings else 0
        costs = [{"method": "engine", "seed": None, "phase": "nodes", "sitting": sitting, **row} for row in rows]
        self.directory.write_part(ENGINE_PART, [], costs, append=True)
        self.add(ENGINE_PART)
