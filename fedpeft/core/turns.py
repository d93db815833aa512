"""Turns between threads that run server code: one at a time, handed over while a thread waits.

Several units of a run (the methods of a seed) may run at once on the Flower engine so that the nodes always have
a message waiting; their server code (sampling, aggregation, checkpoints) still runs one thread at a time, each
thread holding the turn except while it waits for replies. Every step of a unit therefore runs as it would alone,
and the numbers do not depend on how the threads interleave.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


class Turns:
    """A lock that knows its holder, so that a thread can give its turn away while it waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Run the block as the one thread with the turn."""
        self._lock.acquire()
        self._holder = threading.get_ident()
        try:
            yield
        finally:
            self._holder = None
            self._lock.release()

    def wait(self, seconds: float, until: Callable[[float], object] | None = None) -> None:
        """Sleep ``seconds``, or block in ``until(seconds)`` (e.g. a wait for replies, which returns as soon as one
        comes); a thread that holds the turn lets another thread have it meanwhile."""
        pause = until or time.sleep
        if self._holder != threading.get_ident():
            pause(seconds)
            return
        self._holder = None
        self._lock.release()
        try:
            pause(seconds)
        finally:
            self._lock.acquire()
            self._holder = threading.get_ident()
