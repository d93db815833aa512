"""The progress display: one plain line per round when the output is a file, and units that run at once (threads)
each counting their own stage's rounds."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from fedpeft.core.progress import Progress


def test_a_plain_line_per_round_names_the_stage_and_the_round(capsys):
    progress = Progress(plain=True)
    progress.stage("fedit: federated training, seed 0")
    progress.rounds(2)
    progress.advance_round({"train_loss": 0.51234, "clients": 3, "seconds": 1.25})
    progress.advance_round({})
    assert capsys.readouterr().err.splitlines() == [
        "fedit: federated training, seed 0: round 1/2, train loss 0.5123, 3 clients, 1.2 s",
        "fedit: federated training, seed 0: round 2/2",
    ]


def test_units_in_threads_count_their_own_rounds(capsys):
    """Two units' rounds interleaved (as units that run at once take turns): each line counts its own stage."""
    progress = Progress(plain=True)
    turn = [threading.Event(), threading.Event()]

    def unit(index: int, name: str) -> None:
        progress.stage(name)
        progress.rounds(2)
        for _ in range(2):
            turn[index].wait(5)
            turn[index].clear()
            progress.advance_round({})
            turn[1 - index].set()

    threads = [threading.Thread(target=unit, args=(i, n)) for i, n in enumerate(["a", "b"])]
    for thread in threads:
        thread.start()
    turn[0].set()
    for thread in threads:
        thread.join(10)
    assert capsys.readouterr().err.splitlines() == ["a: round 1/2", "b: round 1/2", "a: round 2/2", "b: round 2/2"]


def test_bars_of_units_in_threads_leave_each_other_alone():
    progress = Progress(enabled=True, console=Console(file=io.StringIO(), force_terminal=True))
    with progress:

        def unit(name: str) -> None:
            for stage in range(3):
                progress.stage(f"{name} {stage}")
                progress.rounds(2)
                progress.clients(4)
                for _ in range(4):
                    progress.advance_client()
                progress.advance_round({})

        threads = [threading.Thread(target=unit, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert progress._bars is not None and len(progress._bars.task_ids) == 2 * 3  # each unit's last stage
