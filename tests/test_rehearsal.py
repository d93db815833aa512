"""The rehearsal (docs/rehearsal.md): the compute cut, the random-weight stand-ins at true width, the per-depth
step measurements, and a whole preset rehearsed end to end."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from fedpeft.core.config import ExperimentConfig, ModelConfig, RehearseConfig, dump_config, load_config, same_run
from fedpeft.methods.base import lora_spec
from fedpeft.models.paper_configs import cut_depth, true_depth
from fedpeft.rehearsal.config import ALIGNMENT_ROWS, cut_method, is_round_count, rehearsal_config
from fedpeft.rehearsal.steps import MEASURED_STEPS, extrapolate
from fedpeft.training import TrainArgs

# ------------------------------------------------------------------------------------------------ the cut knobs


def test_max_steps_caps_every_training_call(toy_runtime, toy_clients):
    rt = toy_runtime
    rt.activate(lora_spec(rt, 4))
    taken: list[int] = []
    rt.trainer.max_steps = 3
    rt.reset_adapter(seed=0)
    rt.train(
        toy_clients[0].train,
        TrainArgs(lr=1e-2, batch_size=8, seed=0, epochs=4.0, after_step=lambda *a: taken.append(1)),
    )
    capped = rt.adapter_state()
    assert len(taken) == 3 and rt.steps_for(48, 8, 4.0, None) == 3 and rt.steps_for(48, 8, None, 10) == 3
    rt.trainer.max_steps = None
    assert rt.steps_for(48, 8, 4.0, None) == 24
    rt.reset_adapter(seed=0)
    rt.train(toy_clients[0].train, TrainArgs(lr=1e-2, batch_size=8, seed=0, steps=3))
    for key, tensor in rt.adapter_state().items():  # the cut run is the first three steps of the long one
        torch.testing.assert_close(tensor, capped[key], msg=key)


def test_max_batches_cuts_every_evaluation(toy_runtime, toy_clients):
    rt = toy_runtime
    rt.eval_batch_size = 8
    examples = toy_clients[0].test
    first_batch = rt.evaluate(examples[:8])
    rt.evaluator.max_batches = 1
    assert rt.evaluate(examples) == first_batch
    rt.evaluator.max_batches = None


def test_max_statistics_batches_cuts_every_clients_statistics(toy_runtime, toy_clients):
    from fedpeft.adapters import feature_statistics

    examples = toy_clients[0].train
    first_batches = feature_statistics(toy_runtime, examples[:6], batch_size=3)
    assert not torch.equal(feature_statistics(toy_runtime, examples, batch_size=3), first_batches)
    toy_runtime.statistics_max_batches = 2
    try:
        assert torch.equal(feature_statistics(toy_runtime, examples, batch_size=3), first_batches)
    finally:
        toy_runtime.statistics_max_batches = None


def test_a_run_written_before_a_key_existed_is_the_same_run():
    cfg = ExperimentConfig()
    text = dump_config(cfg)
    older = text.replace("  max_steps: null\n", "").replace("rehearse: null\n", "")
    assert older != text and same_run(text, older)
    assert not same_run(text, dump_config(cfg.model_copy(update={"seeds": [1]})))


# ------------------------------------------------------------------------------------------------ the config


def test_the_cut_keeps_the_shape_and_cuts_the_compute():
    cfg = load_config("fedp2eft-xnli", [])
    notes: list[str] = []
    cut = rehearsal_config(cfg, RehearseConfig(rounds=2, steps=1, eval_batches=1, seeds=1), notes)
    assert cut.seeds == [0] and cut.device == "cpu" and notes == []
    assert cut.train.max_steps == 1 and cut.eval.max_batches == 1 and cut.train.max_statistics_batches == 1
    # No method computes feature statistics: the key stays unset (a rehearsal from before it resumes as it was).
    assert (
        rehearsal_config(load_config("fedmosaic-hflb", []), RehearseConfig(), []).train.max_statistics_batches is None
    )
    assert cut.base.method.rounds == 2 and cut.base.method.fraction == cfg.base.method.fraction
    by_name = {entry.name: entry for entry in cut.methods}
    assert by_name["fedp2eft"].rounds == 2 and by_name["fedl2p"].rounds == 2
    lora = next(e for e in cfg.methods if e.name == "lora")
    assert by_name["lora"] == lora.model_copy(update={"batch_size": 4})  # no rounds to cut; its batch only
    assert cut.eval.batch_size == 4 and cut.base.method.batch_size == 4
    assert by_name["fedl2p"].outer_batch_size == 4  # every training batch of a method
    assert by_name["fedp2eft"].stats_batch_size == next(e for e in cfg.methods if e.name == "fedp2eft").stats_batch_size
    assert cut.data == cfg.data and cut.budgets == cfg.budgets and cut.engine == cfg.engine
    assert cfg.model.max_length == 128 and cut.model.max_length == 32  # a client's tokens, not its shapes
    kept = rehearsal_config(cfg, RehearseConfig(batch_size=None, max_length=None), [])
    assert [e.batch_size for e in kept.methods] == [e.batch_size for e in cfg.methods]
    assert kept.model.max_length == 128
    mosaic = load_config("fedmosaic-fedscope", [])
    cut = rehearsal_config(mosaic, RehearseConfig(), [])
    assert {m.max_length for m in cut.models.values()} == {32}
    assert ExperimentConfig.model_validate(cut.model_dump()).model == mosaic.model  # `models` alone, still valid


def test_round_counts_are_found_by_name():
    assert is_round_count("rounds", 600) and is_round_count("local_rounds", 300)
    assert is_round_count("svd_warmup_rounds", 5)
    assert not is_round_count("rounds", True) and not is_round_count("local_steps", 5)
    cfg = load_config("potara-cifar100", [])
    potara = next(e for e in cfg.methods if e.name == "potara")
    cut = cut_method(potara, 2)
    assert (cut.rounds, cut.local_rounds, cut.rank, cut.batch_size) == (2, 2, potara.rank, potara.batch_size)


def test_distillation_answers_one_evaluations_worth_of_public_examples_a_round():
    cfg = load_config("fedmosaic-hflb", [])
    cut = rehearsal_config(cfg, RehearseConfig(), [])
    for entry, whole in zip(cut.methods, cfg.methods, strict=True):
        if whole.name in ("perada", "takfl", "fedmkt"):  # 32 a round as shipped; one batch of 4 rehearsed
            assert (whole.kd_samples, entry.kd_samples, entry.kd_steps) == (32, 4, whole.kd_steps), whole.name
        else:
            assert "kd_samples" not in type(entry).model_fields, whole.name
    wider = rehearsal_config(cfg, RehearseConfig(eval_batches=2, batch_size=None), [])
    assert {e.kd_samples for e in wider.methods if e.name == "perada"} == {32}  # 2 batches of 64 hold them all


def test_fedmosaics_alignment_reads_the_fewest_public_examples_that_fill_its_draw_of_rows():
    from fedpeft.adapters.alignment import AlignmentSettings

    assert ALIGNMENT_ROWS == AlignmentSettings().max_rows == 20_000
    # 5,000 as shipped; Fed-Scope's text at 32 tokens: 625 examples hold the 20,000 rows the alignment draws; a
    # LLaVA example holds one image's 576 patches besides (CLIP ViT-L/14 at 336 pixels): 33 of them
    for preset, examples in (("fedmosaic-fedscope", 625), ("fedmosaic-hflb", 33), ("fedmosaic-drake", 33)):
        cfg = load_config(preset, [])
        (whole,) = (e for e in cfg.methods if e.name == "fedmosaic")
        cut = rehearsal_config(cfg, RehearseConfig(), [])
        (entry,) = (e for e in cut.methods if e.name == "fedmosaic")
        assert (whole.align_samples, entry.align_samples) == (5000, examples), preset
        assert all("align_samples" not in type(e).model_fields for e in cut.methods if e.name != "fedmosaic")
    # at the models' own length (the cut kept off) fewer fill it: 1,024 tokens, 2,048 tokens and an image
    for preset, examples in (("fedmosaic-fedscope", 20), ("fedmosaic-hflb", 8)):
        uncut = rehearsal_config(load_config(preset, []), RehearseConfig(max_length=None), [])
        assert {e.align_samples for e in uncut.methods if e.name == "fedmosaic"} == {examples}, preset
    # never more than the config's
    (entry,) = (e for e in load_config("fedmosaic-fedscope", []).methods if e.name == "fedmosaic")
    assert cut_method(entry.model_copy(update={"align_samples": 100}), 2, 4, 4, aligned=625).align_samples == 100


def test_float16_and_quantization_become_what_the_cpu_runs():
    cfg = load_config("smoke", ["model.dtype=float16"])
    notes: list[str] = []
    cut = rehearsal_config(cfg, RehearseConfig(), notes)
    assert cut.model.dtype == "bfloat16" and len(notes) == 1 and "float16" in notes[0]


# ------------------------------------------------------------------------------------------------ the stand-in model


def test_depth_is_cut_in_text_model_and_vision_tower():
    from fedpeft.models.paper_configs import model_config

    llava = model_config("checkpoints/llava-llama3.2-1b")
    assert llava is not None
    cut = cut_depth(llava, 2)
    assert cut["text_config"]["num_hidden_layers"] == 2 and cut["vision_config"]["num_hidden_layers"] == 2
    assert true_depth(llava) == 16 and true_depth(cut) == 2
    qwen = model_config("Qwen/Qwen3-4B-Instruct-2507")
    assert qwen is not None
    cut = cut_depth(qwen, 3)
    assert cut["num_hidden_layers"] == 3 and cut["max_window_layers"] <= 3
    assert len(cut.get("layer_types", [None] * 3)) == 3
    assert cut_depth(qwen, None) == qwen and qwen["num_hidden_layers"] == 36  # the original is left alone


def test_standin_checkpoint_loads_at_true_width(tmp_path, monkeypatch):
    """mBERT cut to one layer: the real loader reads it (a fresh classification head), every width and the
    vocabulary as the real model's."""
    from fedpeft.core.config import ModelConfig
    from fedpeft.models.paper_configs import model_config
    from fedpeft.models.table import load_model
    from fedpeft.rehearsal.standin_model import standin_checkpoint

    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path))
    config = model_config("google-bert/bert-base-multilingual-cased")
    assert config is not None
    texts = [f"premise number {i} about things and hypothesis {i % 7}" for i in range(200)]
    path = standin_checkpoint("google-bert/bert-base-multilingual-cased", config, layers=1, texts=texts)
    assert path == standin_checkpoint("google-bert/bert-base-multilingual-cased", config, layers=1, texts=texts)
    loaded = load_model(ModelConfig(name=str(path), max_length=128), task="classification", num_labels=3)
    model = loaded.model
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == config["hidden_size"]
    assert model.bert.embeddings.word_embeddings.weight.shape == (config["vocab_size"], config["hidden_size"])
    assert len(loaded.tokenizer) == config["vocab_size"]
    encoded = loaded.tokenizer("premise number 3", "hypothesis 2")
    assert encoded["input_ids"][0] == loaded.tokenizer.cls_token_id and 0 < len(encoded["input_ids"]) < 16
    assert torch.isfinite(model(**loaded.tokenizer("premise", return_tensors="pt")).logits).all()


# ------------------------------------------------------------------------------------------------ steps


def test_extrapolation_from_two_depths():
    measured = [
        {"layers": 1, "step_s": 1.0, "peak_rss_mb": 500.0},
        {"layers": 2, "step_s": 1.5, "peak_rss_mb": 600.0},
        {"layers": 12, "step_s": 6.0, "peak_rss_mb": 1800.0},
    ]
    entry = extrapolate("m", measured, 12, 32, 128)
    assert entry["per_layer_s"] == pytest.approx(0.5) and entry["per_layer_mb"] == pytest.approx(100.0)
    assert entry["full_step_s"] == pytest.approx(6.5) and entry["full_peak_mb"] == pytest.approx(1600.0)
    assert entry["full_step_error"] == pytest.approx(6.5 / 6.0 - 1)
    assert extrapolate("m", measured[:1], 12, 32, 128)["per_layer_s"] is None
    json.dumps(entry)  # written to rehearsal.json as it is


def test_the_plan_of_a_rehearsal_counts_its_cut():
    """Planned as it runs: one step per training call, one batch per client's evaluation, two rounds."""
    from fedpeft.planning.plan import make_plan

    cfg = load_config("fedp2eft-xnli", [])
    cut = rehearsal_config(cfg, RehearseConfig(rounds=2, steps=1, eval_batches=1, seeds=1), [])
    phases = {(p.method, p.phase): p for p in make_plan(cut).phases}
    base = phases[("base: fedavg_full", "base stage")]
    assert base.rounds == 2 and base.clients_per_round == 30 and base.steps == pytest.approx(2 * 30)
    lora = phases[("lora", "personalization")]
    assert lora.steps == pytest.approx(600 * 4)  # 600 clients, one step per budget
    evaluation = phases[("base model", "evaluation")]
    assert evaluation.examples <= 600 * cut.eval.batch_size
    full = {(p.method, p.phase): p for p in make_plan(cfg).phases}
    assert full[("lora", "personalization")].steps > 5 * lora.steps


# ------------------------------------------------------------------------------------------------ its outputs


def _run_dir(path, rehearse: dict | None):
    from fedpeft.core.records import result_record

    path.mkdir()
    records = [
        result_record(method, None, pool="seen", client=f"c{i}", group="g", seed=0, round_=None, split="test",
                      metric="accuracy", value=value + 0.1 * i)
        for method, value in (("base", 0.3), ("lora", 0.9))
        for i in range(4)
    ]  # fmt: skip
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "config.yaml").write_text(yaml.safe_dump({"name": "x", "rehearse": rehearse}))
    return path


def test_a_rehearsal_summary_says_so_and_has_no_headline(tmp_path):
    from fedpeft.report.records import REHEARSAL_NOTE
    from fedpeft.report.summary import write_summary

    real = write_summary([_run_dir(tmp_path / "real", None)], tmp_path / "real")
    assert "## Headline" in real and REHEARSAL_NOTE not in real
    text = write_summary([_run_dir(tmp_path / "reh", {"layers": 2})], tmp_path / "reh")
    assert REHEARSAL_NOTE in text and "## Headline" not in text


def test_a_rehearsal_is_never_compared_as_a_result(tmp_path):
    from fedpeft.core.errors import UserError
    from fedpeft.report.reproduction import COMPARISON_HEADING, compare_runs

    real, rehearsal = _run_dir(tmp_path / "real", None), _run_dir(tmp_path / "reh", {"layers": 2})
    assert compare_runs(real, _run_dir(tmp_path / "again", None)).startswith(COMPARISON_HEADING)
    with pytest.raises(UserError, match="is a rehearsal, whose numbers are not results"):
        compare_runs(real, rehearsal / "results.jsonl")


def _step(batch: int, depths: dict[int, float]) -> dict:
    """A step measured as a rehearsal.json written before its measurement recorded the steps it timed (its timed
    call then took ``rehearse.steps`` of them)."""
    measured = [{"layers": d, "step_s": t, "peak_rss_mb": 100.0} for d, t in depths.items()]
    entry = extrapolate("tiny-bert", measured, 2, batch, 48)
    assert entry.pop("timed_steps") == MEASURED_STEPS  # a measurement now says how many steps it timed
    return entry


def _plan(tmp_path, rehearsal: dict, *more: str) -> dict:
    from typer.testing import CliRunner

    from fedpeft.cli import app

    (tmp_path / "rehearsal.json").write_text(json.dumps(rehearsal))
    args = ["plan", "smoke", "--json", "--no-measure-cpu", "--rehearsal", str(tmp_path), "--set", "engine.workers=1",
            "--set", "threads=null", *more]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_plan_times_this_cpu_from_the_measured_step(tmp_path):
    """``fedpeft plan --rehearsal``: a training example costs the step measured at the depth the config runs, less
    its fixed part, over its batch and the fixed part's examples (the timed call took ``rehearse.steps`` of the
    steps it divided by); each phase counts its steps, examples, forward passes and client units from it."""
    from fedpeft.engine.resources import WORKERS_VARIABLE
    from fedpeft.planning import cpu_time
    from fedpeft.planning.architecture import from_config, lora_parameters
    from fedpeft.planning.plan import REGISTERED_SHAPES
    from fedpeft.planning.rehearsed import MEASURED_STEPS as PLANNED_STEPS
    from fedpeft.planning.rehearsed import STEP_RANK
    from fedpeft.rehearsal import steps

    assert PLANNED_STEPS == steps.MEASURED_STEPS and cpu_time.WORKERS_VARIABLE == WORKERS_VARIABLE
    assert STEP_RANK == steps.STEP_RANK
    a = from_config({**REGISTERED_SHAPES["tiny-bert"], "vocab_size": 1000})
    rehearsal = {"config": "smoke", "rehearse": {"steps": 1}, "steps": [_step(8, {1: 0.3, 2: 0.5})], "wall_s": 1.0}
    data = _plan(tmp_path, rehearsal)
    # tiny-bert runs at its 2 layers, measured there; one step timed, divided by two.
    per_example = (0.5 * 2 - cpu_time.step_fixed_s(a)) / (8 + cpu_time.STEP_FIXED_EXAMPLES)
    (model,) = data["rehearsed"]["models"]
    assert model["seconds_per_example"] == pytest.approx(per_example) and model["how"] == "measured at 2 layer(s)"

    rows = zip(data["phases"], data["rehearsed"]["phases"], strict=True)
    phases = {(p["method"], p["phase"]): (p, s) for p, s in rows}
    lora, seconds = phases[("lora", "personalization")]
    # LoRA's adapter (its largest budget, on the smoke's targets) against the step's rank 8 on every linear layer
    timed_adapter = lora_parameters(a, STEP_RANK)
    tokens = data["models"][0]["tokens_per_example"]
    adapter = cpu_time.adapter_factor(a, tokens, None, lora["lora_params"][0], timed_adapter)
    assert adapter < 1 and lora["lora_params"][0] < timed_adapter
    training = lora["steps"] * cpu_time.step_fixed_s(a)
    training += (lora["examples"] + cpu_time.STEP_FIXED_EXAMPLES * lora["steps"]) * per_example * adapter
    assert seconds == pytest.approx(training + lora["client_units"] * cpu_time.CLIENT_FIXED_S)
    evaluation, seconds = phases[("lora", "evaluation")]
    forward = (evaluation["examples"] + cpu_time.STEP_FIXED_EXAMPLES * evaluation["eval_batches"]) * per_example
    fixed = evaluation["eval_batches"] * cpu_time.EVAL_BATCH_FIXED_S
    fixed += evaluation["client_units"] * cpu_time.CLIENT_FIXED_S
    assert seconds == pytest.approx(forward * cpu_time.FORWARD_SHARE + fixed)
    fedp2eft, seconds = phases[("fedp2eft", "personalization")]
    assert fedp2eft["forward_examples"] > 0  # the clients' statistics its rounds did not compute
    # A rehearsal's cut of every client's statistics to its first batch (of 8 here; the smoke's clients hold 60).
    small = [
        "--set",
        f"methods.{[m.name for m in load_config('smoke', []).methods].index('fedp2eft')}.stats_batch_size=8",
    ]
    whole, cut = (
        next(
            p
            for p in _plan(tmp_path, rehearsal, *small, *more)["phases"]
            if p["method"] == "fedp2eft" and p["phase"] == "personalization"
        )
        for more in ([], ["--set", "train.max_statistics_batches=1"])
    )
    assert cut["forward_examples"] == pytest.approx(8 * cut["forward_batches"])
    assert whole["forward_batches"] == pytest.approx(8 * cut["forward_batches"])  # ceil(60 / 8) batches a client
    statistics = fedp2eft["forward_examples"] + cpu_time.STEP_FIXED_EXAMPLES * fedp2eft["forward_batches"]
    assert data["rehearsed"]["parts"][list(phases).index(("fedp2eft", "personalization"))]["forward"] == (
        pytest.approx(statistics * per_example * cpu_time.FORWARD_SHARE)
    )
    total = sum(s * p["times"] for p, s in phases.values()) + data["rehearsed"]["start_s"]
    assert data["rehearsed"]["total_s"] == pytest.approx(total + data["rehearsed"]["report_s"])

    # A measurement that says it timed all its steps: the time as measured, whatever rehearse.steps was.
    recorded = {**rehearsal, "steps": [{**rehearsal["steps"][0], "timed_steps": MEASURED_STEPS}]}
    (model,) = _plan(tmp_path, recorded)["rehearsed"]["models"]
    assert model["seconds_per_example"] == pytest.approx((0.5 - cpu_time.step_fixed_s(a)) / (8 + 1))

    # Two timed steps: the time as measured. A depth not measured: scaled from the measured ones by the FLOPs.
    rehearsal["rehearse"]["steps"] = 2
    data = _plan(tmp_path, rehearsal, "--set", "model.overrides={num_hidden_layers: 4}")
    deep = cpu_time.at_depth(a, 4)
    flops = {d: cpu_time.lora_train_flops_per_example(cpu_time.at_depth(a, d), 48) for d in (1, 2)}
    measured = {1: 0.3 - cpu_time.step_fixed_s(cpu_time.at_depth(a, 1)), 2: 0.5 - cpu_time.step_fixed_s(a)}
    rate = sum(flops.values()) * (8 + cpu_time.STEP_FIXED_EXAMPLES) / sum(measured.values())
    (model,) = data["rehearsed"]["models"]
    assert model["seconds_per_example"] == pytest.approx(cpu_time.lora_train_flops_per_example(deep, 48) / rate)
    assert model["layers"] == 4 and "scaled by FLOPs" in model["how"]


def test_the_plan_of_a_rehearsal_config_takes_the_step_at_its_cut_batch(tmp_path):
    """A rehearsal also times its step at its own (cut) batch: the plan of the rehearsal config, whose model is a
    stand-in, counts that one; the plan of the preset, the step at the preset's batch."""
    from fedpeft.planning import cpu_time
    from fedpeft.planning.architecture import from_config
    from fedpeft.planning.plan import REGISTERED_SHAPES

    a = from_config({**REGISTERED_SHAPES["tiny-bert"], "vocab_size": 1000})
    step = {**_step(8, {1: 0.3, 2: 0.5}), "timed_steps": MEASURED_STEPS}
    step["cut"] = {"batch_size": 1, "depths": [{"layers": 2, "step_s": 0.2, "peak_rss_mb": 90.0}]}
    rehearsal = {"config": "smoke", "rehearse": {"models": {"tiny-bert": "tiny-bert"}}, "steps": [step]}
    (model,) = _plan(tmp_path, rehearsal)["rehearsed"]["models"]  # tiny-bert stands in for itself here
    assert model["seconds_per_example"] == pytest.approx((0.2 - cpu_time.step_fixed_s(a)) / (1 + 1))
    rehearsal["rehearse"]["models"] = {"elsewhere": "tiny-bert"}  # the preset's own model: its batch of 8
    (model,) = _plan(tmp_path, rehearsal)["rehearsed"]["models"]
    assert model["seconds_per_example"] == pytest.approx((0.5 - cpu_time.step_fixed_s(a)) / (8 + 1))


def test_the_plan_of_a_rehearsal_sets_its_phases_beside_the_measured_ones(tmp_path):
    from typer.testing import CliRunner

    from fedpeft.cli import app
    from fedpeft.core.errors import UserError

    measured = [{"method": "base", "seed": 0, "phase": "base", "wall_s": 2.0},
                {"method": "lora", "seed": 0, "phase": "personalization", "wall_s": 4.0},
                {"method": "fedit", "seed": 0, "phase": "federated", "wall_s": 5.0},
                {"method": "fedit", "seed": 0, "phase": "round_evaluation", "wall_s": 1.5},
                {"method": "fedit", "seed": 0, "phase": "personalization", "wall_s": 0.5},
                {"method": "fedit", "seed": 1, "phase": "round_evaluation", "wall_s": 9.0}]  # fmt: skip
    rehearsal = {"config": "smoke", "rehearse": {"steps": 1}, "steps": [_step(8, {1: 0.3, 2: 0.5})],
                 "phases": measured}  # fmt: skip
    data = _plan(tmp_path, rehearsal, "--set", "rehearse.layers=2")  # the smoke's own rehearsal config
    rows = {(r["method"], r["phase"]): r for r in data["rehearsed"]["against"]}
    seconds = dict(zip([(p["method"], p["phase"]) for p in data["phases"]], data["rehearsed"]["phases"], strict=True))
    lora = rows[("lora", "personalization")]
    assert lora["measured_s"] == 4.0
    assert lora["planned_s"] == pytest.approx(seconds[("lora", "personalization")] + seconds[("lora", "evaluation")])
    assert rows[("base", "base")]["planned_s"] == pytest.approx(seconds[("base: centralized", "base stage")])
    # the evaluations between rounds are the plan's evaluation too, outside the federated phase's time (seed 0's)
    assert (rows[("fedit", "federated")]["measured_s"], rows[("fedit", "personalization")]["measured_s"]) == (5.0, 2.0)
    assert rows[("fedit", "personalization")]["planned_s"] == pytest.approx(seconds[("fedit", "evaluation")])
    assert not _plan(tmp_path, rehearsal)["rehearsed"]["against"]  # the uncut preset is another run

    text = CliRunner().invoke(app, ["plan", "smoke", "--no-measure-cpu", "--rehearsal", str(tmp_path), "--set",
                                    "rehearse.layers=2"]).output  # fmt: skip
    assert "This CPU from the rehearsal" in text and "the rehearsal measured 4.0 s" in text
    assert "CPU (rehearsed)" in text
    for workers, side_by_side in (("1", False), ("2", True)):  # several processes: each phase waits for others
        text = CliRunner().invoke(app, ["plan", "smoke", "--no-measure-cpu", "--rehearsal", str(tmp_path), "--set",
                                        "rehearse.layers=2", "--set", f"engine.workers={workers}"]).output  # fmt: skip
        assert "the rehearsal measured 4.0 s" in text
        assert ("on 2 worker processes a run's methods take turns" in text) == side_by_side
    missing = CliRunner().invoke(app, ["plan", "smoke", "--no-measure-cpu", "--rehearsal", str(tmp_path / "none")])
    assert isinstance(missing.exception, UserError) and "does not exist" in str(missing.exception)  # exit 2


def test_a_step_measures_its_own_peak_after_loading():
    """The step's peak resident memory starts from the memory after loading (a shallow model's load can pass the
    step's peak and hide the layers' memory from the per-layer difference)."""
    from fedpeft.rehearsal import steps

    def touched(mb: int) -> bytearray:
        block = bytearray(mb * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # every page resident
        return block

    block = touched(300)  # a load's peak, freed before the step
    loading = steps._high_water_mb()
    del block
    assert steps._reset_peak()
    low = steps._high_water_mb()
    assert low < loading - 200
    touched(100)  # freed at once: the peak stays
    assert steps._high_water_mb() > low + 90


def test_a_step_measures_the_share_of_its_positions_with_logits():
    """A causal LM's step computes logits from its answers on once a batch's whole logits would pass
    LOGITS_CUT_BYTES (Llama 3's vocabulary from about 260 positions): the measurement says which share of its
    batches' positions had them, for the plan's output layer (fedpeft/planning/cpu_time.py)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fedpeft.rehearsal.steps import logit_share, timed_shape

    config = LlamaConfig(vocab_size=128_256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(config)
    prompt_then_answer = torch.full((4, 300), -100)
    prompt_then_answer[:, 250:] = 7  # 4 x 300 positions: 154 MB of float32 logits, cut from position 249 on
    short = torch.full((1, 200), -100)
    short[:, 150:] = 7  # 103 MB: every position's logits
    assert logit_share(model, [prompt_then_answer]) == pytest.approx(51 / 300)
    assert logit_share(model, [short]) == 1.0
    assert logit_share(model, [prompt_then_answer, short]) == pytest.approx((4 * 51 + 200) / (4 * 300 + 200))
    # with the batches' positions a row (each padded to its longest) and, where they hold pictures, pictures a row
    batches = [{"input_ids": torch.zeros(4, 300, dtype=torch.long), "labels": prompt_then_answer,
                "pixel_values": torch.zeros(6, 3, 8, 8)},
               {"input_ids": torch.zeros(1, 200, dtype=torch.long), "labels": short}]  # fmt: skip
    shape = timed_shape(model, batches)
    assert shape["positions"] == pytest.approx((4 * 300 + 200) / 5) and shape["images"] == pytest.approx(6 / 5)
    assert shape["logit_share"] == logit_share(model, [prompt_then_answer, short])
    assert "images" not in timed_shape(model, batches[1:])
    # an image classifier's batches hold pixels and one label an image: no positions, one picture a row
    pictures = [{"pixel_values": torch.zeros(3, 3, 8, 8), "labels": torch.tensor([0, 1, 2])}]
    assert timed_shape(model, pictures) == {"logit_share": 1.0, "images": 1.0}


def test_the_measured_step_adapts_a_mixture_of_experts_experts_as_its_methods_do():
    """The step a rehearsal times trains rank-8 LoRA on the model's targets and, for OLMoE, on its fused experts
    (every FLAME-family method puts LoRA there, and PEFT forms each expert's update at every forward pass), so that
    the plan's rate has that cost and its adapter is the plan's (fedpeft.planning.architecture.lora_parameters:
    the attention projections and the experts)."""
    from fedpeft.models.runtime import ModelRuntime
    from fedpeft.models.table import load_model
    from fedpeft.planning.architecture import from_config, lora_parameters
    from fedpeft.planning.plan import REGISTERED_SHAPES
    from fedpeft.rehearsal.steps import STEP_RANK

    loaded = load_model(ModelConfig(name="tiny-olmoe"), task="generation", corpus=lambda: ["a b c d"] * 20)
    runtime = ModelRuntime(loaded)
    spec = lora_spec(runtime, STEP_RANK)  # the step's adapter (fedpeft/rehearsal/steps.py)
    assert spec.rank == STEP_RANK and spec.targets == tuple(loaded.lora_targets)
    assert spec.target_parameters == tuple(loaded.lora_parameters) and spec.target_parameters
    runtime.activate(spec)
    trained = sum(p.numel() for p in runtime.adapter_parameters().values())
    assert trained == lora_parameters(from_config(REGISTERED_SHAPES["tiny-olmoe"] | {"vocab_size": 2000}), STEP_RANK)
    text = load_model(ModelConfig(name="tiny-llama"), task="generation", corpus=lambda: ["a b c d"] * 20)
    assert lora_spec(ModelRuntime(text), STEP_RANK).target_parameters == ()


def test_a_full_depth_check_that_failed_is_said_and_the_rest_kept():
    from fedpeft.rehearsal.driver import step_line

    measured = [{"layers": d, "step_s": t, "peak_rss_mb": m} for d, t, m in ((1, 1.0, 100.0), (2, 1.5, 150.0))]
    entry = extrapolate("bert-base-multilingual-cased", measured, 12, 32, 256)
    assert entry["full_step_s"] == pytest.approx(1.0 + 0.5 * 11) and entry["full_peak_mb"] == pytest.approx(650.0)
    entry["full_depth_failed"] = "the step at depth 12 was killed by signal 9 (SIGKILL: most often the kernel's ..."
    line = step_line(entry)
    assert "about 6.50 s / 650 MB" in line and "at its true depth: the step at depth 12 was killed" in line
    checked = extrapolate("m", [*measured, {"layers": 12, "step_s": 5.0, "peak_rss_mb": 1300.0}], 12, 32, 256)
    assert "(against the measured: +30% / -50%)" in step_line(checked)


def test_the_summary_gives_the_main_and_the_worker_processes_peaks(tmp_path):
    from fedpeft.rehearsal.driver import summarize, summary_lines

    cfg = rehearsal_config(load_config("smoke"), RehearseConfig(layers=1), [])

    def costs(rows: list[tuple[str, str, float]]) -> None:
        lines = [json.dumps({"method": "fedit", "seed": 0, "phase": p, "metric": m, "value": v}) for p, m, v in rows]
        (tmp_path / "costs.jsonl").write_text("\n".join(lines) + "\n")

    costs(
        [
            ("federated", "wall_s", 2.0),
            ("federated", "peak_rss_mb", 900.0),
            ("federated", "workers_peak_rss_mb", 1500.0),
            ("personalization", "peak_rss_mb", 950.0),
            ("personalization", "workers_peak_rss_mb", 2100.0),
        ]
    )
    summary = summarize(tmp_path, cfg, [], [], 10.0)
    assert (summary["peak_rss_mb"], summary["workers_peak_rss_mb"]) == (950.0, 2100.0)
    assert json.loads((tmp_path / "rehearsal.json").read_text())["workers_peak_rss_mb"] == 2100.0
    assert "peak 950 MB in the main process, 2100 MB in a worker process" in "\n".join(summary_lines(summary))
    costs([("federated", "wall_s", 2.0), ("federated", "peak_rss_mb", 900.0)])  # every client in the main process
    summary = summarize(tmp_path, cfg, [], [], 10.0)
    assert summary["workers_peak_rss_mb"] is None
    assert "peak 900 MB in the main process\n" in "\n".join(summary_lines(summary)) + "\n"


def test_a_resumed_rehearsal_counts_its_earlier_sittings_in_all(tmp_path):
    """Its seconds in all are every sitting's (each summarized), not the last's alone: a finished rehearsal resumed
    took a few seconds, while its phases, read from the run's costs, took the first sitting's."""
    from fedpeft.rehearsal.driver import summarize, summary_lines

    cfg = rehearsal_config(load_config("smoke"), RehearseConfig(layers=1), [])
    row = {"method": "fedit", "seed": 0, "phase": "federated", "metric": "wall_s", "value": 50.0}
    (tmp_path / "costs.jsonl").write_text(json.dumps(row) + "\n")
    first = summarize(tmp_path, cfg, [], [], 60.0)
    assert (first["total_s"], first["sittings"]) == (60.0, 1)
    assert "measured: 60 s in all, 50.0 s of them" in "\n".join(summary_lines(first))
    again = summarize(tmp_path, cfg, [], [], 7.0)
    assert (again["total_s"], again["sittings"]) == (67.0, 2)
    assert "measured: 67 s in all over 2 sittings, 50.0 s of them" in "\n".join(summary_lines(again))
    assert json.loads((tmp_path / "rehearsal.json").read_text())["sittings"] == 2
