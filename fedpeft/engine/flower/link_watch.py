"""A deployment's ServerApp that outlives a restart of its SuperLink.

Flower 1.42 starts a deployment's ServerApp (``flwr-serverapp``) from the SuperLink's SuperExec, and a thread of the
ServerApp raises SIGINT once that parent process is gone: when the SuperLink stops or restarts. Python runs the
handler (Flower's, which ends the process) only when the main thread next runs Python code; for fedpeft, whose main
thread waits for the methods' threads, that is when they are done, just before the outputs are written, so the run
is lost at its end. Meanwhile the ServerApp's Grid retries every call until the SuperLink answers again, and a
SuperLink restarted with its ``--database`` knows the run, its nodes and its messages: the run can go on (tested on
loopback: a SuperLink restarted mid-run, the run completes with every round).

:class:`SuperLinkWatch` lets it go on. It takes that one SIGINT for what it is (a SIGINT while the parent is alive,
or a second one, is Flower's as before: ``flwr stop``, a SuperLink that refuses the run), and ends the process
itself when the SuperLink does not answer within ``seconds`` of its SuperExec's end: the run cannot go on then, and
``fedpeft launch``, which waits longer, says so with the command that resumes it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType

from flwr.serverapp import Grid

log = logging.getLogger("fedpeft")


class SuperLinkWatch:
    """While in its ``with`` block: the run goes on through a restart of the SuperLink (see the module docstring).

    Args:
        grid: the ServerApp's Grid (asked for the node ids to learn whether the SuperLink answers).
        seconds: how long to wait for the SuperLink after its SuperExec ended before ending this process.
        poll: seconds between two checks of the parent process.
        end: how the process ends when the SuperLink does not come back (``os._exit`` by default; the tests
            replace it).
    """

    def __init__(
        self,
        grid: Grid,
        seconds: float,
        *,
        poll: float = 1.0,
        end: Callable[[int], object] = os._exit,
    ) -> None:
        self.grid = grid
        self.seconds = seconds
        self.poll = poll
        self.end = end
        self.parent = os.getppid()
        self.answered_again = threading.Event()  # set once the SuperLink answered after its SuperExec ended
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fedpeft-superlink-watch", daemon=True)
        self._swallowed = False
        self._previous: Callable[[int, FrameType | None], object] | int | None = None

    def parent_gone(self) -> bool:
        """Whether the process that started this ServerApp (the SuperLink's SuperExec) has ended."""
        return os.getppid() != self.parent

    def __enter__(self) -> SuperLinkWatch:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._on_sigint)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        self._thread.join(timeout=5.0)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if not self._swallowed and self.parent_gone():
            self._swallowed = True  # Flower's watch of the parent raises one SIGINT; the run goes on
            log.info("the SuperLink's SuperExec ended (SIGINT from Flower's watch of it); the run goes on")
            return
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            if self.parent_gone():
                break
        else:
            return
        log.warning(
            "the SuperLink restarted or stopped (its SuperExec, which started this ServerApp, ended); the run goes "
            "on if it answers again within %.0f s",
            self.seconds,
        )
        threading.Thread(target=self._probe, name="fedpeft-superlink-probe", daemon=True).start()
        deadline = time.monotonic() + self.seconds
        while not self.answered_again.wait(self.poll):
            if self._stop.is_set():
                return
            if time.monotonic() > deadline:
                log.error(
                    "error: the SuperLink did not answer within %.0f s; this ServerApp ends (resume the run once "
                    "the SuperLink is back)",
                    self.seconds,
                )
                for handler in [*log.handlers, *logging.getLogger().handlers]:
                    handler.flush()
                self.end(1)
                return
        log.info("the SuperLink answers again; the run goes on")

    def _probe(self) -> None:
        """Ask the SuperLink something (Flower's Grid retries until it answers); any answer, a refusal included,
        means that it is back."""
        try:
            self.grid.get_node_ids()
        except Exception as err:  # the SuperLink answered, with a refusal: the run's own calls will say what
            log.debug("the SuperLink answered with %r", err)
        finally:
            self.answered_again.set()
