"""The benchmarks' quick modes: each script still runs end to end on tiny sizes, so a benchmark cannot rot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """The module of ``benchmarks/<name>.py``, imported from its file."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_scale_quick_runs_two_sizes_with_clients_as_groups_and_writes_its_table(tmp_path, capsys):
    out = tmp_path / "scale.json"
    result = benchmark("scale").main(["--quick", "--groups", "clients", "--eval-every", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    rows = result["rows"]
    assert [row["clients"] for row in rows] == [4, 12]
    for row in rows:
        # one round of FedIT and a LoRA per client: every client has test records of both methods
        assert row["records"] >= 2 * row["clients"]
        assert row["run_bytes_per_client"] > 0 and row["report_s"] > 0 and row["run_peak_rss_mb"] > 0
        assert row["round_s"] > 0 and row["client_round_s"] > 0 and row["personalization_client_s"] > 0
    printed = capsys.readouterr().out
    assert "| N | run s |" in printed and "\n| 12 |" in printed


def test_scale_files_dataset_gives_each_client_its_rows(tmp_path):
    scale = benchmark("scale")
    rows = [json.loads(line) for line in scale.client_files(tmp_path / "c.jsonl", 3).read_text().splitlines()]
    assert len(rows) == 3 * (scale.ROWS_PER_CLIENT + scale.TEST_ROWS_PER_CLIENT)
    per_client = {c: [r["split"] for r in rows if r["client"] == c] for c in ("c00000", "c00001", "c00002")}
    for splits in per_client.values():
        assert splits.count("train") == scale.ROWS_PER_CLIENT and splits.count("test") == scale.TEST_ROWS_PER_CLIENT


@pytest.mark.slow
def test_model_memory_quick_measures_the_main_process_and_each_worker_process(tmp_path, capsys):
    out = tmp_path / "model_memory.json"
    result = benchmark("model_memory").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    one, two = result["rows"]
    assert (one["workers"], two["workers"]) == (1, 2)
    assert one["worker_peak_rss_mb"] == [] and len(two["worker_peak_rss_mb"]) == 2  # each worker process its own
    for row in (one, two):
        assert row["main_peak_rss_mb"] >= row["libraries_rss_mb"] > 0 and row["setup_rss_mb"] > 0
    assert all(peak > two["libraries_rss_mb"] for peak in two["worker_peak_rss_mb"])
    assert "| tiny-bert | 2 |" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_state_scale_quick_measures_the_evaluation_between_rounds_and_the_disk_store(tmp_path):
    out = tmp_path / "eval_state.json"
    result = benchmark("eval_state_scale").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    (evaluation,), (store,) = result["eval"], result["store"]
    assert evaluation["clients"] == 12 and evaluation["evaluation_wall_s"] > 0
    assert evaluation["cpu_s_with"] > 0 and evaluation["cpu_s_without"] > 0
    assert store["clients"] == 12 and min(store["put_round0_s"], store["put_round1_s"], store["get_s"]) > 0


def test_report_scale_quick_reports_runs_of_client_groups_in_bounded_size(tmp_path):
    out = tmp_path / "report_scale.json"
    rows = benchmark("report_scale").main(["--quick", "--no-plots", "--out", str(out)])
    assert json.loads(out.read_text()) == rows
    assert [row["clients"] for row in rows] == [10, 40]
    assert all(row["report_s"] > 0 and row["report_peak_rss_mb"] > 0 for row in rows)
    # 10 clients print a column each; 40 (above the 16-column threshold) a summary of the same width
    assert rows[1]["summary_longest_line"] <= rows[0]["summary_longest_line"] < 1000


@pytest.mark.slow
def test_parallel_quick_runs_the_default_and_one_process_with_the_same_records(tmp_path):
    """The default (`engine.workers: auto`, without the suite's FEDPEFT_WORKERS) as a user gets it, beside one
    process: one worker process per core, no more than the 4 clients, with the records of one process."""
    import os

    out = tmp_path / "parallel.json"
    result = benchmark("parallel").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    one, default = result["rows"]
    assert (one["workers"], default["workers"]) == (1, "default")
    assert one["ran_on"].startswith("Running in one process (1 torch thread;")
    processes = min(len(os.sched_getaffinity(0)), 4)
    expected = f"Running on {processes} worker processes" if processes >= 2 else "Running in one process"
    assert default["ran_on"].startswith(expected), default["ran_on"]
    assert default["records"] > 0 and default["identical_to_first"]
