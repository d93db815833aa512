"""The benchmarks' quick modes: each script still runs end to end on tiny sizes, so a benchmark cannot rot."""

from __future__ import annotations

import importlib.util
import inspect
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


def test_engine_overhead_quick_measures_the_local_engines_loops_against_the_clients_work(tmp_path, monkeypatch):
    from fedpeft.apps.flower import run_flower_simulation
    from fedpeft.worker import Worker

    monkeypatch.delenv("FEDPEFT_WORKERS")  # as a user runs it: the benchmark keeps the clients' work in its process
    module = benchmark("engine_overhead")
    for op in module.WORK_OPS:  # the benchmark times the worker's operations by wrapping them: put them back after
        monkeypatch.setattr(Worker, op, getattr(Worker, op))
    out = tmp_path / "engine_overhead.json"
    (row,) = module.main(["--quick", "--engines", "local", "--out", str(out)])
    assert json.loads(out.read_text()) == [row] and row["engine"] == "local"
    # the loops include the clients' work, and the base model's evaluation is timed from its first client to its last
    assert row["loops_s"] >= row["client_work_s"] > 0 and row["federated_wall_s"] >= row["federated_client_work_s"] > 0
    assert row["ratio"] == row["loops_s"] / row["client_work_s"] and row["whole_run_s"] > row["loops_s"]
    assert module.clock.base_span[1] > module.clock.base_span[0]
    # the Flower engine's path (Ray, tens of seconds) is not run here: the function it calls still takes its arguments
    assert list(inspect.signature(run_flower_simulation).parameters)[:3] == ["cfg", "out", "resume"]


def test_bayestune_step_quick_times_both_steps_and_the_three_personalizations(tmp_path):
    out = tmp_path / "bayestune.json"
    result = benchmark("bayestune_step").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    row = result["models"]["tiny-bert"]
    assert row["steps"] == [1, 2] and row["lora_modules"] > 0
    assert row["lora_step_cpu_s"] > 0 and row["ratio_cpu"] == row["bayestune_step_cpu_s"] / row["lora_step_cpu_s"]
    assert set(row["personalization_r16"]) == {"lora", "fedp2eft", "bayestune_lora"}
    assert all(entry["cpu_s"] > 0 for entry in row["personalization_r16"].values())


@pytest.mark.slow
def test_client_memory_quick_measures_two_sizes_in_processes_of_their_own(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDPEFT_WORKERS")  # as a user runs it: the run in the process whose memory is measured
    out = tmp_path / "client_memory.json"
    result = benchmark("client_memory").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    small, large = result["runs"]
    assert large["clients"] == 2 * small["clients"] > 0
    assert large["client_data_pickle_mb"] > small["client_data_pickle_mb"] > 0
    assert small["peak_rss_mb"] > 0 and result["extra_client_data_mb"] > 0


@pytest.mark.slow
def test_fedp2eft_protocols_quick_runs_every_probe_on_a_tiny_run(capsys):
    benchmark("fedp2eft_protocols").main(["--quick"])
    printed = capsys.readouterr().out
    assert printed.count("| seen | 16 |") == 3 and printed.count("| unseen | 2 |") == 3  # the three tables
    assert "seeds both runs completed: [0]" in printed
    assert "r = 16:" in printed and "distinct structures" in printed  # scales
    assert "hidden units active for at least one of" in printed  # the PSGs on the seen clients' statistics
    assert printed.count("median |gradient|") == 8  # adam-eps: 4 tensors, mean and summed loss


@pytest.mark.slow
def test_flexlora_update_scale_quick_runs_both_probes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports moe_topk_sensitivity, a benchmark beside it
    result = benchmark("flexlora_update_scale").main(["--quick"])
    assert set(result["scale"]) == {"0.0", "1.0"} and result["a_norm"]
    assert all(0 <= value <= 100 for part in result.values() for value in part.values())


def test_merge_cost_quick_times_the_knots_merges_against_a_local_epoch(tmp_path):
    out = tmp_path / "merge_cost.json"
    results = benchmark("merge_cost").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == results
    tiny, paper = results["tiny"], results["paper_shapes"]
    assert tiny["clients"] == 3 and tiny["lora_modules"] == 14 and tiny["local_epoch_s_median"] > 0
    assert set(tiny["merge_over_epoch"]) == {"mean", "ties", "iso_c"} and paper["lora_modules"] == 4
    assert all(seconds > 0 for seconds in [*tiny["knots_merge_s"].values(), *paper["knots_merge_s"].values()])
