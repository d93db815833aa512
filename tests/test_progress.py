"""The progress display: plain lines when the output is a file (stages, base-stage epochs, rounds, clients done,
each with the time left), bars with totals on a terminal and one line that stays for each finished stage, units that
run at once (threads) each counting their own stage's rounds; and what `fedpeft run` prints at its end and in its
--help."""

from __future__ import annotations

import io
import itertools
import re
import threading
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console
from rich.progress import TimeRemainingColumn
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.core.progress import Progress, duration
from fedpeft.report.terminal import run_end_block
from fedpeft.training import TrainArgs, train_loop


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_plain_line_per_round_names_the_stage_and_the_round_and_the_time_left(capsys):
    """Rounds of 90 s: the time left is the rounds to come at the pace so far; the last round's line has none."""
    clock = Clock()
    progress = Progress(plain=True, clock=clock)
    progress.stage("fedit: federated training, seed 0")
    progress.rounds(3)
    clock.now = 90.0
    progress.advance_round({"train_loss": 0.51234, "clients": 3, "seconds": 1.25})
    clock.now = 200.0
    progress.advance_round({})
    clock.now = 270.0
    progress.advance_round({})
    assert capsys.readouterr().err.splitlines() == [
        "fedit: federated training, seed 0",
        "fedit: federated training, seed 0: round 1/3, train loss 0.5123, 3 clients, 1.2 s, ~3 min left",
        "fedit: federated training, seed 0: round 2/3, ~1 min 40 s left",
        "fedit: federated training, seed 0: round 3/3",
    ]


def test_a_resumed_stage_reckons_the_time_left_from_the_rounds_of_this_sitting(capsys):
    clock = Clock()
    progress = Progress(plain=True, clock=clock)
    progress.stage("s")
    clock.now = 1000.0  # the time before a resume is not this sitting's
    progress.rounds(10, 4)
    clock.now = 1012.0
    progress.advance_round({})
    assert capsys.readouterr().err.splitlines() == ["s", "s: round 5/10, ~1 min left"]


def test_durations_read_as_seconds_minutes_or_hours():
    assert [duration(s) for s in (0.04, 12.34, 59.4, 60, 192.4, 3599, 7500)] == [
        "0.0 s",
        "12.3 s",
        "59.4 s",
        "1 min",
        "3 min 12 s",
        "1 h",
        "2 h 5 min",
    ]
    assert (duration(52.7, whole=True), duration(2.54, whole=True)) == ("53 s", "2.5 s")


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
    rounds = [line.split(", ~")[0] for line in capsys.readouterr().err.splitlines() if "round" in line]
    assert rounds == ["a: round 1/2", "b: round 1/2", "a: round 2/2", "b: round 2/2"]


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
        assert progress._bars is not None and len(progress._bars.task_ids) == 2 * 2  # each unit's last stage


def test_plain_lines_say_each_base_stage_epoch_with_its_loss_and_seconds(capsys):
    clock = Clock()
    progress = Progress(plain=True, clock=clock)
    progress.stage("base model (centralized), seed 0")
    progress.epochs(2)
    clock.now = 61.0
    progress.advance_epoch(1, 2, 1.23456)
    clock.now = 120.5
    progress.advance_epoch(2, 2, 0.9)
    assert capsys.readouterr().err.splitlines() == [
        "base model (centralized), seed 0",
        "base model (centralized), seed 0: epoch 1/2, loss 1.2346, 61.0 s, ~1 min 1 s left",
        "base model (centralized), seed 0: epoch 2/2, loss 0.9000, 59.5 s",
    ]


def finish_clients(progress: Progress, clock: Clock, total: int, seconds: float) -> None:
    progress.clients(total)
    for _ in range(total):
        clock.now += seconds
        progress.advance_client()


def test_plain_lines_count_clients_every_tenth_with_the_total_and_seconds_per_client(capsys):
    """600 clients of 0.1 s: a line per 60 clients (10 lines, not 600), the last with the stage's seconds."""
    clock = Clock()
    progress = Progress(plain=True, clock=clock)
    progress.stage("lora: personalization and evaluation, seed 0")
    finish_clients(progress, clock, 600, 0.1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "lora: personalization and evaluation, seed 0"
    assert lines[1] == "lora: personalization and evaluation, seed 0: clients 60/600, 0.10 s per client, ~54 s left"
    assert [line.split("clients ")[1].split(",")[0] for line in lines[1:]] == [f"{n}/600" for n in range(60, 601, 60)]
    assert lines[-1] == "lora: personalization and evaluation, seed 0: clients 600/600, 0.10 s per client, 60.0 s"


def test_plain_lines_for_slow_clients_come_every_half_minute_and_a_quick_stage_says_only_its_end(capsys):
    clock = Clock()
    progress = Progress(plain=True, clock=clock)
    progress.stage("slow")
    finish_clients(progress, clock, 100, 31.0)  # a tenth is 310 s: each client's 31 s pass the half minute
    slow = capsys.readouterr().err.splitlines()
    assert len(slow) == 1 + 100 and slow[1] == "slow: clients 1/100, 31.00 s per client, ~51 min 9 s left"
    progress.stage("quick")
    finish_clients(progress, clock, 14, 0.01)
    assert capsys.readouterr().err.splitlines() == ["quick", "quick: clients 14/14, 0.01 s per client, 0.1 s"]


def test_clients_of_federated_rounds_are_not_counted(capsys):
    progress = Progress(plain=True)
    progress.stage("fedit: federated training, seed 0")
    progress.rounds(1)
    progress.advance_client()  # a round's client: the engine calls it after every client
    progress.advance_round({})
    assert capsys.readouterr().err.splitlines() == [
        "fedit: federated training, seed 0",
        "fedit: federated training, seed 0: round 1/1",
    ]


def test_every_bar_has_a_total_and_the_time_left():
    progress = Progress(enabled=True, console=Console(file=io.StringIO(), force_terminal=True))
    assert progress._bars is not None
    assert any(isinstance(column, TimeRemainingColumn) for column in progress._bars.columns)
    with progress:
        progress.stage("base model (centralized), seed 0")
        progress.epochs(3)
        progress.advance_epoch(1, 3, 0.5)
        progress.stage("fedit: federated training, seed 0")
        progress.rounds(10, 4)
        progress.stage("fedit: personalization and evaluation, seed 0")
        progress.clients(600)
        progress.advance_client()
        tasks = progress._bars.tasks
        assert [(task.description.split("[/bold] ")[1], task.completed, task.total) for task in tasks] == [
            ("clients", 1, 600)
        ]
        progress.stage("another")
        progress.epochs(2)
        progress.rounds(5)
        assert all(task.total is not None for task in progress._bars.tasks)


def screen_lines(stream: io.StringIO) -> list[str]:
    """The lines a terminal shows of what was written to it, the bars' redraws (after a carriage return) left out."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    return [line.split("\r")[-1] for line in text.splitlines()]


def test_on_a_terminal_each_finished_stage_leaves_one_line_in_place_of_its_bars():
    """A base stage, a federated stage with an evaluation between its rounds, a personalization and a stage cut
    short: each finished one says what it counted and its time; the evaluation step and the cut stage say nothing."""
    clock = Clock()
    stream = io.StringIO()
    progress = Progress(enabled=True, console=Console(file=stream, force_terminal=True, width=200), clock=clock)
    with progress:
        assert progress._bars is not None
        progress.stage("base model (centralized), seed 0")
        progress.epochs(2)
        clock.now = 30.0
        progress.advance_epoch(1, 2, 1.5)
        clock.now = 61.5
        progress.advance_epoch(2, 2, 0.91234)
        assert progress._bars.tasks == []  # its bars gone with it
        progress.stage("fedit: federated training, seed 0")
        progress.rounds(2)
        for round_ in (1, 2):
            progress.clients(3, step=f"evaluation after round {round_}")
            for _ in range(3):
                clock.now += 10.0
                progress.advance_client()
            progress.advance_round({"train_loss": 0.6 / round_})
        clock.now = 100.0
        progress.stage("fedit: personalization and evaluation, seed 0")
        progress.clients(4)
        for _ in range(4):
            clock.now += 48.0
            progress.advance_client()
        progress.stage("lora: federated training, seed 0")
        progress.rounds(5)
        progress.advance_round({})
    lines = screen_lines(stream)
    stays = [
        "base model (centralized), seed 0: 2 epochs, loss 0.9123, 1 min 2 s",
        "fedit: federated training, seed 0: 2 rounds, train loss 0.3000, 1 min",
        "fedit: personalization and evaluation, seed 0: 4 clients, 48.00 s per client, 3 min 12 s",
    ]
    assert [line for line in lines if ", seed 0: " in line] == stays  # the bars' lines have no colon after the stage


def test_on_a_terminal_a_resumed_stage_says_which_rounds_it_ran_in_one_line_however_narrow(capsys):
    stream = io.StringIO()
    progress = Progress(enabled=True, console=Console(file=stream, force_terminal=True, width=40), clock=Clock())
    with progress:
        progress.stage("fedit: federated training, seed 0")
        progress.rounds(3, 1)
        progress.advance_round({})
        progress.advance_round({})
    assert "fedit: federated training, seed 0: rounds 2-3, 0.0 s" in screen_lines(stream)
    assert capsys.readouterr().err == ""  # the terminal's lines, not the redirected ones


class Toy(torch.nn.Module):
    """A linear classifier whose forward takes a batch dict and returns an object with ``.loss``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(self.linear(inputs), labels))


def toy_training(after_epoch=None) -> tuple[dict, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Toy()
    generator = torch.Generator().manual_seed(1)
    data = [{"inputs": torch.randn(8, 4, generator=generator), "labels": torch.arange(8) % 3} for _ in range(3)]
    batches = itertools.cycle(data)
    params = dict(model.named_parameters())
    args = TrainArgs(lr=0.1, batch_size=8, seed=0, after_epoch=after_epoch)
    metrics = train_loop(model, batches, params, args, steps=7, epoch_steps=3)
    return metrics, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_the_epoch_hook_sees_each_epochs_mean_loss_and_changes_nothing():
    """7 steps of 3 per epoch: epochs 1, 2 and a partial 3 of 3; their losses average to the loop's loss."""
    seen: list[tuple[int, int, float]] = []
    metrics, weights = toy_training(lambda epoch, epochs, loss: seen.append((epoch, epochs, loss)))
    plain_metrics, plain_weights = toy_training()
    assert metrics == plain_metrics
    torch.testing.assert_close(weights, plain_weights, rtol=0, atol=0)
    assert [(epoch, epochs) for epoch, epochs, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    total = 3 * seen[0][2] + 3 * seen[1][2] + 1 * seen[2][2]
    assert total / 7 == pytest.approx(metrics["loss"], rel=1e-12)


GAIN_SUMMARY = """# wide

Runs: `runs/wide`. Seeds: 0.

## Headline

**Highest mean Accuracy, seen pool** (x100, mean over the pool's clients, one seed): r = 1: lora 63.90
vs base 31.48; r = 2: lora 63.90 vs base 31.48.

**Evidence: too little to call a winner.** These results rest on

- one seed: no spread over seeds;
- fewer than 30 test examples per client on average (Seen pool 20, Unseen pool 20): one test example moves a
  client's score by about 5 points.

## Data

| fact | value |
|---|---|
| dataset | synthetic-xnli with a long description that would be cut in an 80-column table |

## Results

## Seen pool

### r = 2 — Accuracy

| Method | g1 | Mean |
|---|---|---|
| base | 30.21 | 30.21 |

## Gain over base

Per method and budget.

### Seen pool — Accuracy

{table}

### Seen pool — F1

| Method | r = 2 |
|---|---|
| lora | +1.00 |

### Unseen pool — Accuracy

| Method | r = 2 |
|---|---|
| `a_method_with_a_long_label` | **+40.23 ± 12.34** |

## Costs

| Method | Phase |
|---|---|
| lora | personalization |
"""


def wide_gain_table() -> tuple[str, list[str]]:
    """A gain table of 12 budgets (about 160 columns as text) and the cells it holds."""
    budgets = [f"r = {2**k}" for k in range(12)]
    cells = [f"+{k}.{k:02d} ± 1.{k:02d}" for k in range(12)]
    table = "\n".join(
        ["| Method | " + " | ".join(budgets) + " |", "|---" * 13 + "|", "| fedp2eft | " + " | ".join(cells) + " |"]
    )
    return table, budgets + cells


def test_the_end_block_fits_100_columns_keeps_every_cell_and_names_the_summary(tmp_path):
    table, cells = wide_gain_table()
    (tmp_path / "summary.md").write_text(GAIN_SUMMARY.replace("{table}", table))
    lines = run_end_block(tmp_path)
    assert max(len(line) for line in lines[:-1]) <= 100  # the last names the summary's path, however long
    text = "\n".join(lines)
    for cell in [*cells, "a_method_with_a_long_label", "+40.23 ± 12.34"]:
        assert cell in text
    assert text.count("fedp2eft") == 2  # the wide table in two parts, each with the method column
    headings = [line for line in lines if line.startswith("Gain over base")]
    assert headings == ["Gain over base: Seen pool — Accuracy", "Gain over base: Unseen pool — Accuracy"]
    assert lines[-1] == f"Summary (data, every table, costs): {tmp_path / 'summary.md'}"
    assert "Costs" not in text and "synthetic-xnli" not in text
    assert lines[:3] == [  # the headline paragraphs first, wrapped, without markdown
        "Highest mean Accuracy, seen pool (x100, mean over the pool's clients, one seed): r = 1: lora 63.90",
        "vs base 31.48; r = 2: lora 63.90 vs base 31.48.",
        "",
    ]
    assert "- one seed: no spread over seeds;" in lines and "  moves a client's score by about 5 points." in lines
    every = run_end_block(tmp_path, every_table=True)
    assert "Gain over base: Seen pool — F1" in every


def test_the_end_of_a_run_prints_the_block_and_where_the_outputs_are(tmp_path, monkeypatch):
    """`fedpeft run` ends with the block and the output directory (the run itself replaced by a stand-in)."""
    import fedpeft.runner

    table, _ = wide_gain_table()

    class Experiment:
        def __init__(self, cfg, target, progress, data=None) -> None:
            self.target = target

        def run(self, resume: bool, force: bool) -> None:
            (self.target / "summary.md").write_text(GAIN_SUMMARY.replace("{table}", table))

    monkeypatch.setattr(fedpeft.runner, "Experiment", Experiment)
    out = tmp_path / "run"
    out.mkdir()
    result = CliRunner().invoke(app, ["run", "smoke", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[-2:] == [f"Summary (data, every table, costs): {out / 'summary.md'}", f"Outputs written to {out}"]
    assert max(len(line) for line in lines[:-2]) <= 100 and "Gain over base: Seen pool — Accuracy" in lines


def test_run_help_says_what_config_is_with_two_examples():
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "100", "TERMINAL_WIDTH": "100"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "CONFIG is a preset name (fedpeft list presets) or a YAML file." in text
    assert "fedpeft run quickstart" in text and "fedpeft run my.yaml --set seeds=[0] --out runs/x" in text
