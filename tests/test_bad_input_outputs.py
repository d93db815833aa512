"""Outputs no command may write over, and results files the reports cannot read: each refusal is one sentence and
exit code 2, and every file (the run's, the user's) stays as it was."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from entry_point import cli
from test_run_dirs import snapshot, tiny_run  # noqa: F401  (the module's run, built once)

Case = Callable[[Path, Path], tuple[list[str], str]]


def _compare_over_the_runs_records(tmp: Path, run: Path) -> tuple[list[str], str]:
    return ["compare", str(run), str(run), "--out", str(run / "results.jsonl")], "among the files of the run"


def _compare_over_a_users_file(tmp: Path, run: Path) -> tuple[list[str], str]:
    (tmp / "notes.md").write_text("my notes\n")
    return ["compare", str(run), str(run), "--out", str(tmp / "notes.md")], "was not written by `fedpeft compare`"


def _compare_through_a_link_to_the_run(tmp: Path, run: Path) -> tuple[list[str], str]:
    (tmp / "link.md").symlink_to(run / "summary.md")
    return ["compare", str(run), str(run), "--out", str(tmp / "link.md")], "among the files of the run"


def _compare_below_a_file(tmp: Path, run: Path) -> tuple[list[str], str]:
    (tmp / "notes.md").write_text("my notes\n")
    return ["compare", str(run), str(run), "--out", str(tmp / "notes.md" / "c.md")], "which is a file"


def _compare_where_nothing_is_written(tmp: Path, run: Path) -> tuple[list[str], str]:
    return ["compare", str(run), str(run), "--out", "/proc/x/c.md"], "choose another place"


def _report_of_two_runs_into_one(tmp: Path, run: Path) -> tuple[list[str], str]:
    other = shutil.copytree(run, tmp / "other")
    return ["report", str(run), str(other), "--out", str(other), "--no-plots"], "is the directory of the run"


def _report_into_a_runs_folder(tmp: Path, run: Path) -> tuple[list[str], str]:
    return ["report", str(run), "--out", str(run / "psg"), "--force"], "among the files of the run"


def _report_csv_over_a_users_file(tmp: Path, run: Path) -> tuple[list[str], str]:
    (tmp / "mine.csv").write_text("a,b\n1,2\n")
    args = ["report", str(run), "--out", str(tmp / "report"), "--no-plots", "--csv", str(tmp / "mine.csv")]
    return args, "--csv"


def _personalize_into_a_runs_adapters(tmp: Path, run: Path) -> tuple[list[str], str]:
    out = run / "adapters" / "mine"
    return ["personalize", str(run), "--budget", "2", "--client", "lat1-seen-00", "--out", str(out)], "the run"


@pytest.mark.parametrize(
    "case",
    [
        _compare_over_the_runs_records,
        _compare_over_a_users_file,
        _compare_through_a_link_to_the_run,
        _compare_below_a_file,
        _compare_where_nothing_is_written,
        _report_of_two_runs_into_one,
        _report_into_a_runs_folder,
        _report_csv_over_a_users_file,
        _personalize_into_a_runs_adapters,
    ],
    ids=lambda case: case.__name__.strip("_"),
)
def test_no_command_writes_over_a_runs_files_or_a_users(case: Case, tiny_run, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    args, expected = case(tmp_path, tiny_run)
    before, run_before = snapshot(tmp_path), snapshot(tiny_run)
    code, _, err = cli(monkeypatch, capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert expected in err, err
    assert snapshot(tmp_path) == before and snapshot(tiny_run) == run_before
    assert not (tmp_path / "report").exists()


def test_compare_writes_a_new_file_and_replaces_its_own(tiny_run, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "comparisons" / "compare.md"
    for _ in range(2):  # the second time over the comparison it wrote
        code, _, err = cli(monkeypatch, capsys, "compare", str(tiny_run), str(tiny_run), "--out", str(out))
        assert code == 0, err
    assert out.read_text().startswith("# A rerun against its reference\n")
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def _foreign(run: Path) -> str:
    (run / "results.jsonl").write_text('{"epoch": 1, "loss": 0.5}\n')
    return "line 1 is not a fedpeft result record"


def _a_test_value_is_nan(run: Path) -> str:
    records = _records(run)
    line = next(i for i, r in enumerate(records, start=1) if r["split"] == "test" and r["method"] != "base")
    records[line - 1]["value"] = float("nan")
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return f"line {line} holds a test value that is not a finite number (nan)"


@pytest.mark.parametrize("spoil", [_foreign, _a_test_value_is_nan], ids=lambda spoil: spoil.__name__.strip("_"))
@pytest.mark.parametrize("command", ["compare", "report"])
def test_results_the_tables_cannot_read_are_one_sentence(spoil, command, tiny_run, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    expected = spoil(run)
    args = ["compare", str(tiny_run), str(run)] if command == "compare" else ["report", str(run), "--out", "report"]
    before = snapshot(tmp_path)
    code, _, err = cli(monkeypatch, capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert expected in err and "results.jsonl" in err, err
    assert snapshot(tmp_path) == before and not (tmp_path / "report").exists()
