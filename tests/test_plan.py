"""``fedpeft plan``: golden numbers of a small config computed by hand, every shipped preset planned, the paper
federations' true shapes, one-sentence refusals, and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.core.config import load_config, preset_names
from fedpeft.models.paper_configs import model_config
from fedpeft.planning import plan as planning
from fedpeft.planning.architecture import activation_bytes, from_config, parameters
from fedpeft.planning.devices import ASSUMED_MFU, CUDA_CONTEXT_BYTES, gpu
from fedpeft.planning.plan import make_plan
from fedpeft.planning.render import gpu_hours, plan_json, plan_tables

SMALL = """
name: small
seeds: [0]
data: {name: sni, unseen_pool: false, options: {num_tasks: 2, train_per_client: 10, test_per_client: 5}}
model: {name: tiny-llama, max_length: 16}
budgets: []
methods:
  - {name: fedit, rounds: 2, fraction: 1.0, local_steps: 3, batch_size: 4, rank: 2, targets: [q_proj, v_proj]}
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return make_plan(load_config(str(path)))


def test_a_small_config_has_its_hand_computed_numbers(small):
    # tiny-llama: h 64, 2 layers, 4 heads of 16 (q 64), 2 kv heads (kv 32), MLP 128, vocabulary 2000, untied.
    base, federated, final = small.phases  # no base stage, and fedit personalizes nothing (finetune_epochs 0)
    assert (base.method, federated.phase, final.phase) == ("base model", "federated", "evaluation")
    # LoRA r 2 on q (64 -> 64) and v (64 -> 32): A 2 x 64 + 2 x 64, B 2 x 64 + 2 x 32 per layer, 2 layers.
    lora = 2 * (2 * 64 + 2 * 64) + 2 * (2 * 64 + 2 * 32)
    assert lora == 896
    assert federated.bytes_up_per_round == federated.bytes_down_per_round == 2 * lora * 4  # 2 clients, float32
    # Active parameters: per layer 4096 + 2 x 2048 + 4096 (attention) + 3 x 64 x 128 (MLP); lm_head 2000 x 64.
    active = 2 * (4096 + 4096 + 4096 + 3 * 64 * 128) + 2000 * 64
    assert active == 201_728
    # 2 rounds x 2 clients x 3 steps x batch 4 = 48 examples of 16 tokens; LoRA training 4 N + 6 N_LoRA a token.
    assert (federated.client_trainings, federated.examples, federated.tokens, federated.steps) == (4, 48, 768, 12)
    assert federated.flops == 768 * (4 * active + 6 * lora)
    # Memory: float32 weights (linear 73,728 + embeddings and lm_head 2 x 128,000 + norms 320), LoRA weights, grads
    # and two moments, activations of 4 x 16 tokens (4,096 bytes a token and layer, logits 8 bytes a vocabulary
    # entry), the CUDA context.
    weights = (73_728 + 2 * 128_000 + 2 * 2 * 64 + 64) * 4
    activations = 64 * 2 * 4096 + 64 * 2000 * 8
    assert federated.peak_memory == weights + lora * 16 + activations + CUDA_CONTEXT_BYTES
    # Disk: the server's adapter and one adapter per seen client.
    assert federated.disk == lora * 4 * 3
    # Evaluation: 2 clients x 5 test examples of 16 prompt + 32 generated tokens, forward 2 N a token.
    assert (final.examples, final.tokens, final.flops) == (10, 480, 480 * 2 * active)
    hours = gpu_hours(federated, gpu("H100"), 1, weights)
    assert hours == pytest.approx(federated.flops / (989e12 * ASSUMED_MFU) / 3600)
    assert gpu_hours(federated, gpu("H100"), 8, weights) == pytest.approx(hours / 2)  # 2 clients run at once at most


def test_parameter_counts_match_the_published_sizes():
    published = {"meta-llama/Llama-3.2-1B": 1_235_814_400, "allenai/OLMoE-1B-7B-0924": 6_919_161_856,
                 "Qwen/Qwen3-4B-Instruct-2507": 4_022_468_096, "google-bert/bert-base-multilingual-cased": 177_853_440,
                 "checkpoints/llava-llama3.2-1b": 1_545_619_456}  # fmt: skip
    for name, count in published.items():
        assert parameters(from_config(model_config(name)))["total"] == pytest.approx(count, rel=1e-3), name


@pytest.mark.parametrize("preset", preset_names())
def test_every_shipped_preset_plans(preset):
    cfg = load_config(preset)
    data = plan_json(make_plan(cfg), gpu("H100"), 1, None)
    phases = {p["phase"] for p in data["phases"]}
    assert {"evaluation"} <= phases and phases & {"federated", "personalization"}
    assert data["total"]["flops"] > 0 and data["total"]["gpu_hours"] > 0 and data["total"]["peak_memory"] > 0
    assert data["federation"]["total_clients"] > 0
    assert len([p for p in data["phases"] if p["method"] != "base model" and p["phase"] == "evaluation"]) == len(
        cfg.methods
    )


def test_the_paper_federations_have_their_true_shape():
    xnli = make_plan(load_config("fedp2eft-xnli")).federation
    assert xnli.clients == {"seen": 300, "unseen": 300}  # 15 languages x 20 clients x 2 pools
    assert xnli.train_per_client("seen") == 100  # 2,000 a language and pool over 20 clients
    news = make_plan(load_config("fedp2eft-masakhanews")).federation
    assert news.clients == {"seen": 160, "unseen": 160}
    assert news.train_rows["seen"] == sum(n // 2 for n, _ in planning_sizes().values())
    drake = make_plan(load_config("fedmosaic-drake")).federation
    assert drake.total_clients == 10 and drake.train_rows["seen"] is None  # its directory is not here: unknown


def planning_sizes():
    from fedpeft.planning.federation import MASAKHANEWS_SIZES

    return MASAKHANEWS_SIZES


def test_the_method_facts_match_the_method_classes():
    from fedpeft.core.registry import METHODS
    from fedpeft.methods.base import method_class

    for name in METHODS.names():
        cls = method_class(name)
        assert (name not in planning.NOT_FEDERATED) == cls.federated, name
        assert (name in planning.USES_BUDGET) == cls.uses_budget, name
        assert (name in planning.FEDERATED_PER_BUDGET) == cls.federated_per_budget, name
        assert (name in planning.TRAINS_BASE_WEIGHTS) == cls.trains_base_weights, name
        assert (name not in planning.NOT_COMMUNICATING) == cls.communicates, name
        assert (2 if name in planning.TRAINS_TWICE else 1) == cls.trainings_per_round, name


def test_the_workers_that_fit_and_the_json_output():
    result = CliRunner().invoke(app, ["plan", "fedp2eft-xnli", "--json", "--gpus", "8", "--no-measure-cpu"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    peak = data["total"]["peak_memory"]
    assert data["fits"]["workers_per_gpu_that_fit"]["24"] == int(24 * 2**30 // peak)
    assert data["total"]["cpu_hours"] is None and data["device"]["gpus"] == 8


def test_the_text_table_names_the_phases_and_the_memory_rows():
    result = CliRunner().invoke(app, ["plan", "smoke", "--no-measure-cpu"])
    assert result.exit_code == 0, result.output
    for text in ("evaluation", "total", "24 GB GPU", "80 GB GPU", "not measured"):
        assert text in result.output


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_plan_tables_print_whole_cells_at_any_width_and_name_the_columns_left_out(width):
    from rich.console import Console

    data = plan_json(make_plan(load_config("fedp2eft-xnli")), gpu("H100"), 1, 1e11)
    console = Console(width=width, record=True)
    for table in plan_tables(data, width=width):
        console.print(table)
    text = console.export_text()
    assert "…" not in text and all(len(line) <= width for line in text.splitlines())
    for phase in ("personalization", "federated", "evaluation", "base stage", "bayestune_lora"):
        assert phase in text  # method and phase cells whole, never folded
    left_out = [line for line in text.splitlines() if "left out to fit" in line]
    assert bool(left_out) == (width < 200)
    if width == 200:
        assert "up / down per round" in text and "CPU" in text


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["plan", "smoke", "--gpu", "TPU"], "Unknown GPU"),
        (["plan", "smoke", "--gpus", "0"], "--gpus"),
        (["plan", "smoke", "--set", "model.name=/nowhere/model"], "config.json"),
        (["plan", "no-such-preset"], "no-such-preset"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args, words):
    done = subprocess.run([sys.executable, "-m", "fedpeft.cli", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr


def test_plan_imports_no_torch():
    code = (
        "import sys\nfrom fedpeft.cli import main\nsys.argv = ['fedpeft', 'plan', 'fedp2eft-fedaya', '--json']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    pass\nprint('torch' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr
    assert json.loads(done.stdout)["name"] == "fedp2eft-fedaya"


def test_the_plan_json_shapes_name_exactly_the_fields_of_what_they_hold():
    """The typed dicts of a plan's JSON keep to the dataclasses they are written from (a field added to one and not
    the other is a type error nowhere else), and a plan's JSON has exactly those keys."""
    from dataclasses import fields, is_dataclass

    from fedpeft.planning.architecture import Architecture
    from fedpeft.planning.federation import Federation
    from fedpeft.planning.shapes import ArchitectureData, FederationData

    assert is_dataclass(Architecture) and is_dataclass(Federation)
    assert set(ArchitectureData.__annotations__) == {f.name for f in fields(Architecture)}
    assert set(FederationData.__annotations__) == {f.name for f in fields(Federation)} | {"total_clients"}
    shown = plan_json(make_plan(load_config("smoke")), gpu("H100"), 1, None)
    for model in shown["models"]:
        assert set(model["architecture"]) == set(ArchitectureData.__annotations__)
    assert set(shown["federation"]) == set(FederationData.__annotations__)


def test_a_llava_sequence_is_never_shorter_than_its_image_tokens():
    """The prompt keeps every image token however short ``max_length`` is (fedpeft.models.multimodal), so the plan
    counts them: a rehearsal cut to 32 tokens still runs LLaVA over its 577 image positions, but computes logits at
    the text's positions only (fedpeft.training.labelled_tail)."""
    cfg = load_config("fedmosaic-drake")
    cut = cfg.model_copy(update={"models": {k: m.model_copy(update={"max_length": 32}) for k, m in cfg.models.items()}})
    for model in planning.models_of(cut):
        a = model.architecture
        assert a.extra_tokens == 577  # CLIP-L/14 at 336 pixels: 24 x 24 patches and the class token
        assert model.max_length == 579 and model.tokens_per_example == 579
        logits = activation_bytes(a, 4, 579, 2, False)["logits"]
        assert logits == 4 * 2 * a.vocab * (2 + 4 + 4)  # bfloat16 logits, their float32 copy and log-probabilities
    assert [m.max_length for m in planning.models_of(cfg)] == [2048, 2048]  # a longer limit stands


def test_image_counts_give_an_image_text_example_its_padded_positions_and_its_tower_its_pictures():
    """A batch pads to its longest row, and a row holds at least its images' positions: drawn from a client whose
    examples hold 1 picture (3 in 4) or 3 (1 in 4), a batch of 4 holds a 3-picture one with probability
    1 - 0.75^4, and then every row is 3 x 577 + 2 positions long; the vision tower encodes only the pictures there
    are (1.5 an example there, 1 at a one-picture client)."""
    one, mixed = [0.0, 8.0], [0.0, 6.0, 0.0, 2.0]
    p3 = 1 - 0.75**4
    positions, most = planning.padded_positions([one, mixed], 4, 32, 577)
    assert positions == pytest.approx((579 + (1 - p3) * 579 + p3 * 1733) / 2)
    assert most == pytest.approx((1 + (1 - p3) + 3 * p3) / 2)
    assert planning.images_per_example([one, mixed]) == pytest.approx((1 + 1.5) / 2)
    # at the preset's length, only a row whose pictures outgrow it is longer
    assert planning.padded_positions([one], 4, 2048, 577) == (2048, 1.0)
    assert planning.padded_positions([[0.0, 0.0, 0.0, 0.0, 1.0]], 4, 2048, 577)[0] == 4 * 577 + 2
    assert planning.padded_positions([], 4, 32, 577) == (579, 1.0) and planning.images_per_example([]) == 1.0


def test_a_local_image_text_benchmark_is_counted_by_pictures_and_planned_with_them(tmp_path):
    """FedMosaic's benchmarks in a local directory: the plan counts each client's training rows by their pictures
    (a capped task keeps its shares), and plans each LLaVA example at its padded positions, its vision tower at
    the mean pictures and its output layer at the text's positions."""
    from fedpeft.planning.architecture import extra_forward_flops
    from fedpeft.planning.cpu_time import logit_positions
    from fedpeft.planning.federation import federation_of

    cfg = drake_with_pictures(tmp_path)
    federation = federation_of(cfg)
    assert federation.images == [[0.0, 6.0], [0.0, 6.0, 2.0, 2.0]]
    capped = cfg.model_copy(update={"data": cfg.data.model_copy(update={"options": {"train_per_task": 3}})})
    assert federation_of(capped).images == [[0.0, 3.0], [0.0, 3.0, 1.5, 1.5]]
    (model, *_) = planning.models_of(cfg, federation)
    a = model.architecture
    positions, most = planning.padded_positions(federation.images, 4, 32, 577)  # SFT's batch of 4, the first method's
    assert (model.tokens_per_example, a.padded_images) == (pytest.approx(positions), pytest.approx(most))
    assert a.images == pytest.approx((1 + (6 + 2 * 2 + 2 * 3) / 10) / 2)
    one = planning.models_of(cfg)[0].architecture  # nothing counted: one picture an example
    assert extra_forward_flops(a) == pytest.approx(extra_forward_flops(one) * a.images)
    assert logit_positions(a, model.tokens_per_example) == pytest.approx(positions - 577 * most)


def drake_with_pictures(tmp_path):
    """fedmosaic-drake cut to 32 tokens on a local directory of two clients: one whose 6 questions hold a picture
    each, one with those and a multi-image task (2 questions of 3 pictures, 2 of 2)."""
    root = tmp_path / "drake"
    listing = {"client-01": ["vqa"], "client-02": ["vqa", "multi"]}
    rows = {"vqa": [{"image": "a.png"}] * 6, "multi": [{"image": ["a.png"] * 3}] * 2 + [{"image": ["a.png"] * 2}] * 2}
    for task, items in rows.items():
        (root / "tasks" / task).mkdir(parents=True)
        for split in ("train", "test"):
            lines = [json.dumps({"question": "q", "answer": "a", **item}) for item in items]
            (root / "tasks" / task / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    (root / "clients.json").write_text(json.dumps(listing))
    cfg = load_config("fedmosaic-drake")
    models = {k: m.model_copy(update={"max_length": 32}) for k, m in cfg.models.items()}
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": str(root)}), "models": models})


def test_a_measured_image_text_step_is_scaled_to_the_planned_examples_pictures_and_positions(tmp_path):
    """The step a rehearsal timed drew its own batches: an image-text model's seconds per example are scaled from
    the timed batches' positions and pictures a row to the plan's by the step's FLOPs; a text model's are taken as
    measured (its step drew examples like the plan's), as is a step measured before those were recorded."""
    from fedpeft.planning.architecture import Architecture
    from fedpeft.planning.cpu_time import STEP_FIXED_EXAMPLES, step_fixed_s, step_flops
    from fedpeft.planning.rehearsed import seconds_per_example

    data = plan_json(make_plan(drake_with_pictures(tmp_path)), gpu("H100"), 1, None)
    model = data["models"][0]
    a = Architecture(**model["architecture"])
    depths = [{"layers": a.layers, "step_s": 6.0, "peak_rss_mb": 1.0, "positions": 579.0, "images": 1.0}]
    step = {"model": model["name"], "true_layers": 16, "timed_steps": 2, "batch_size": 4, "depths": depths}
    seconds, how = seconds_per_example(model, step, {"rehearse": {"steps": 2}})
    as_timed = (6.0 - step_fixed_s(a)) / (4 + STEP_FIXED_EXAMPLES)
    timed = replace(a, images=1.0, padded_images=1.0)
    factor = step_flops(a, model["tokens_per_example"]) / step_flops(timed, 579.0)
    assert seconds == pytest.approx(as_timed * factor) and how == f"measured at {a.layers} layer(s)"
    assert factor > 1.5  # a quarter of one client's questions hold 2 or 3 pictures: most batches pad to them
    old = {**step, "depths": [{k: v for k, v in depths[0].items() if k not in ("positions", "images")}]}
    assert seconds_per_example(model, old, {"rehearse": {"steps": 2}})[0] == pytest.approx(as_timed)
    text = plan_json(make_plan(load_config("guidance-sni")), gpu("H100"), 1, None)["models"][0]
    t = Architecture(**text["architecture"])
    text_step = {**step, "model": text["name"], "depths": [{**depths[0], "layers": t.layers, "positions": 100.0}]}
    assert seconds_per_example(text, text_step, {"rehearse": {"steps": 2}})[0] == pytest.approx(
        (6.0 - step_fixed_s(t)) / (4 + STEP_FIXED_EXAMPLES)
    )


def test_distillation_counts_the_public_answers_and_the_server_and_ditto_style_methods_train_twice(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(
        SMALL + "  - {name: perada, rounds: 2, fraction: 1.0, local_steps: 3, batch_size: 4, rank: 2, "
        "targets: [q_proj, v_proj], kd_samples: 6, kd_steps: 2, kd_batch_size: 2, compute_scale: 1.0}\n"
        + "  - {name: ditto, rounds: 2, fraction: 1.0, local_steps: 3, batch_size: 4, rank: 2, "
        "targets: [q_proj, v_proj], compute_scale: 1.0}\n"
    )  # compute matching off: each training call takes its local_steps
    plan = make_plan(load_config(str(path)))
    fedit, perada, ditto = (p for p in plan.phases if p.phase == "federated")
    # Ditto: the global and the personal adapter, 2 x 3 steps of 4 a client round, 2 clients, 2 rounds.
    assert (ditto.examples, ditto.steps, ditto.public_examples, ditto.decode_steps) == (96, 24, 0, 0)
    # PerAda trains twice as well, and each of its 4 client rounds answers the round's 6 public examples (one
    # batch of generation, eval.batch_size 64, 32 new tokens; one batch of losses) and the server distils the
    # global adapter every round: 2 steps of 2.
    assert (perada.public_examples, perada.public_batches, perada.decode_steps, perada.decode_batch) == (24, 8, 128, 6)
    assert (perada.examples, perada.steps) == (96 + 2 * 2 * 2, 24 + 2 * 2)
    assert perada.flops > ditto.flops  # the public passes' forward FLOPs
    assert fedit.public_examples == 0 and fedit.examples == 48


def test_compute_matched_methods_plan_their_matched_steps_feddat_its_teacher_and_fedmosaic_its_gradients(tmp_path):
    """FedMosaic and its baselines train ``round(local_steps / compute_scale)`` steps a call (the paper's ratios
    by default); FedDAT's teacher predicts every example it trains on (a forward pass each), FedMosaic takes the
    smallest model's gradient at steps 0, m, 2m, ... of each call: one batch's forward pass each."""
    from fedpeft.methods.families.branched import matched_steps
    from fedpeft.methods.feddat_config import FedDATConfig
    from fedpeft.methods.fedmosaic_config import FedMosaicConfig
    from fedpeft.planning.architecture import active_parameters

    path = tmp_path / "small.yaml"
    path.write_text(
        SMALL + "  - {name: feddat, rounds: 2, fraction: 1.0, local_steps: 10, batch_size: 4, rank: 2, "
        "targets: [q_proj, v_proj]}\n"
        + "  - {name: fedmosaic, rounds: 2, fraction: 1.0, local_steps: 10, batch_size: 4, rank: 2, grad_every: 3, "
        "targets: [q_proj, v_proj]}\n"
    )
    cfg = load_config(str(path))
    plan = make_plan(cfg)
    fedit, feddat, fedmosaic = (p for p in plan.phases if p.phase == "federated")
    dat, mosaic = (m for m in cfg.methods if m.name != "fedit")
    assert isinstance(dat, FedDATConfig) and isinstance(mosaic, FedMosaicConfig)
    # FedDAT: round(10 / 2.564) = 4 steps of 4, trained twice (the client-specific adapter, then the student), by
    # 2 clients in each of 2 rounds; FedMosaic: round(10 / 1.098) = 9 steps, gradients at steps 0, 3 and 6.
    assert planning.matched_steps(dat, 10) == matched_steps(dat) == 4
    assert planning.matched_steps(mosaic, 10) == matched_steps(mosaic) == 9
    assert (feddat.examples, feddat.steps, feddat.teacher_examples) == (4 * 4 * 2 * 2 * 2, 4 * 2 * 2 * 2, 128)
    assert (fedmosaic.examples, fedmosaic.steps, fedmosaic.teacher_examples) == (9 * 4 * 2 * 2, 9 * 2 * 2, 0)
    assert (fedmosaic.pivot_batches, fedmosaic.pivot_examples) == (3 * 2 * 2, 3 * 4 * 2 * 2)
    assert fedit.teacher_examples == fedit.pivot_batches == 0 and fedit.examples == 3 * 4 * 2 * 2
    model = plan.models[0]
    n, lora = active_parameters(model.architecture), sum(planning.adapter_split(model, dat, [], None))
    # 4 N + 6 N_LoRA a token trained, and 2 N a token the teacher predicts
    assert feddat.flops == pytest.approx(128 * model.tokens_per_example * ((4 * n + 6 * lora) + 2 * n))
    # Their time on this CPU: FedDAT's teacher a forward pass an example, FedMosaic's gradients a forward pass and
    # the output layer's backward a batch (each batch with the step's fixed examples).
    from fedpeft.planning.cpu_time import (
        STEP_FIXED_EXAMPLES,
        Machine,
        ModelRate,
        forward_share,
        head_share,
        phase_seconds,
        tokens_of,
    )

    data = plan_json(plan, gpu("H100"), 1, None)
    models = [{**m, "tokens_per_example": tokens_of(m)} for m in data["models"]]
    rates = [ModelRate("tiny", 0.25, "rehearsal", 2)]
    machine = Machine(processes=1, threads=2, cores=2, bandwidth=10e9)
    a, tokens = model.architecture, model.tokens_per_example
    rows = {p["method"]: p for p in data["phases"] if p["phase"] == "federated"}

    def forward_s(method: str, **change: float) -> float:
        return phase_seconds({**rows[method], **change}, models, rates, machine, True)["forward"]

    assert forward_s("feddat") - forward_s("feddat", teacher_examples=0.0) == pytest.approx(
        128 * 0.25 * forward_share(a, tokens)
    )
    gradients = (48 + STEP_FIXED_EXAMPLES * 12) * 0.25 * forward_share(a, tokens) * (1 + head_share(a, tokens))
    assert forward_s("fedmosaic") - forward_s("fedmosaic", pivot_batches=0.0) == pytest.approx(gradients)


def test_fedl2p_plans_its_meta_steps_fine_tunings_and_hypergradients(tmp_path):
    """A FedL2P client round is ``outer_steps`` meta-steps, each a fresh LoRA fine-tuned for the local schedule on
    the training split less the validation, then a hypergradient on a batch of ``outer_batch_size`` (at most the
    validation split): its passes and Neumann steps counted in training steps of that batch."""
    from fedpeft.planning.cpu_time import STEP_FIXED_EXAMPLES, Machine, ModelRate, phase_seconds, step_fixed_s
    from fedpeft.planning.cpu_time import tokens_of as tokens_in

    path = tmp_path / "l2p.yaml"
    path.write_text(
        SMALL.replace("budgets: []", "budgets: [2, 4]")
        + "  - {name: fedl2p, rounds: 2, fraction: 1.0, local_steps: 3, batch_size: 4, outer_steps: 3, "
        "outer_batch_size: 4, neumann_steps: 3, val_fraction: 0.2, default_rank: 2}\n"
    )
    plan = make_plan(load_config(str(path)))
    fedit, l2p = (p for p in plan.phases if p.phase == "federated")
    # 2 clients a round, 2 rounds, one federation per budget (2), 3 meta-steps a client round, each fine-tuning
    # 3 steps of 4; the hypergradient's batch: the 2 validation examples of a client's 10 (8 train on).
    assert (l2p.client_trainings, l2p.rounds) == (2 * 2 * 2, 4)
    assert (l2p.examples, l2p.steps) == (3 * 4 * 3 * 2 * 2 * 2, 3 * 3 * 2 * 2 * 2)
    per_meta_step = planning.HYPERGRADIENT_PASSES + 3 * planning.HYPERGRADIENT_PER_NEUMANN
    assert l2p.hypergradient_batches == pytest.approx(3 * 2 * 2 * 2 * per_meta_step)
    assert l2p.hypergradient_examples == pytest.approx(2 * l2p.hypergradient_batches)
    assert l2p.forward_examples == 2 * 2 * 2 * 8  # statistics over the training split at every client round
    assert fedit.hypergradient_batches == fedit.hypergradient_examples == 0
    model = plan.models[0]
    per_token = planning.train_flops_per_token(
        model, False, sum(planning.adapter_split(model, plan_method(path), [2, 4], None))
    )
    assert l2p.flops == pytest.approx(
        (l2p.examples + l2p.hypergradient_examples) * model.tokens_per_example * per_token
    )
    # On this CPU: the hypergradients' steps at the step's fixed part, their examples at the training rate.
    data = plan_json(plan, gpu("H100"), 1, None)
    models = [{**m, "tokens_per_example": tokens_in(m)} for m in data["models"]]
    row = next(p for p in data["phases"] if p["method"] == "fedl2p" and p["phase"] == "federated")
    machine = Machine(processes=1, threads=2, cores=2, bandwidth=10e9)
    rates = [ModelRate("tiny", 0.25, "rehearsal", 2, None, l2p.lora_params[0])]  # timed with FedL2P's own adapter

    def training_s(**change: float) -> float:
        return phase_seconds({**row, **change}, models, rates, machine, True)["training"]

    hyper = training_s() - training_s(hypergradient_examples=0.0, hypergradient_batches=0.0)
    steps = l2p.hypergradient_batches
    expected = steps * step_fixed_s(model.architecture) + (2 * steps + STEP_FIXED_EXAMPLES * steps) * 0.25
    assert hyper == pytest.approx(expected)


def test_a_methods_adapter_is_timed_against_the_one_its_rate_was_measured_with(tmp_path):
    """The seconds of a training example come from a step with its own adapter (a rehearsal's: rank 8 on every
    linear layer): a method's larger or smaller adapter costs the difference in the step's FLOPs, 6 x its
    parameters a token."""
    from fedpeft.planning.architecture import lora_parameters
    from fedpeft.planning.cpu_time import Machine, ModelRate, adapter_factor, phase_seconds, step_fixed_s, step_flops
    from fedpeft.planning.cpu_time import tokens_of as tokens_in

    path = tmp_path / "ranks.yaml"
    path.write_text(
        SMALL + "  - {name: fedit, label: wide, rounds: 2, fraction: 1.0, local_steps: 3, batch_size: 4, rank: 64}\n"
    )
    plan = make_plan(load_config(str(path)))
    narrow, wide = (p for p in plan.phases if p.phase == "federated")
    a = plan.models[0].architecture
    assert narrow.lora_params == [896.0] and wide.lora_params == [float(lora_parameters(a, 64))]
    data = plan_json(plan, gpu("H100"), 1, None)
    models = [{**m, "tokens_per_example": tokens_in(m)} for m in data["models"]]
    rows = {p["method"]: p for p in data["phases"] if p["phase"] == "federated"}
    machine = Machine(processes=1, threads=2, cores=2, bandwidth=10e9)
    timed = float(lora_parameters(a, 8))
    rates = [ModelRate("tiny", 0.25, "rehearsal", 2, None, timed)]
    tokens = models[0]["tokens_per_example"]

    def training_s(method: str, **change: object) -> float:
        return phase_seconds({**rows[method], **change}, models, rates, machine, True)["training"]

    for method, adapter in (("fedit", 896.0), ("wide", float(lora_parameters(a, 64)))):
        factor = adapter_factor(a, tokens, None, adapter, timed)
        assert factor == pytest.approx(
            (step_flops(a, tokens) + 6 * adapter * tokens) / (step_flops(a, tokens) + 6 * timed * tokens)
        )
        fixed = rows[method]["steps"] * step_fixed_s(a)  # the steps' fixed part does not grow with the adapter
        assert training_s(method) - fixed == pytest.approx(factor * (training_s(method, lora_params=[]) - fixed))
    assert (
        adapter_factor(a, tokens, None, 896.0, timed)
        < 1
        < adapter_factor(a, tokens, None, lora_parameters(a, 64), timed)
    )


def plan_method(path):
    return next(m for m in load_config(str(path)).methods if m.name == "fedl2p")


def test_a_rehearsal_whose_stand_in_model_is_gone_plans_from_the_model_it_stood_for(tmp_path):
    """A rehearsal's run folder names its stand-in checkpoint; once that directory is cleared, the plan reads the
    configuration of the model it stood for (``rehearse.models``), cut to ``rehearse.layers``."""
    gone = tmp_path / "stand-in"
    path = tmp_path / "rehearsed.yaml"
    path.write_text(
        SMALL.replace("{name: tiny-llama, max_length: 16}", f"{{name: {gone}, max_length: 16}}")
        + f"rehearse: {{layers: 2, models: {{{gone}: meta-llama/Llama-3.2-1B}}}}\n"
    )
    cfg = load_config(str(path))
    architecture = make_plan(cfg).models[0].architecture
    true = from_config(model_config("meta-llama/Llama-3.2-1B"), "shipped")
    assert (architecture.layers, architecture.hidden, architecture.vocab) == (2, true.hidden, true.vocab)
    assert true.layers == 16
    unknown = cfg.model_copy(update={"rehearse": cfg.rehearse.model_copy(update={"models": {}})})
    with pytest.raises(planning.UserError, match="No config.json is known"):
        make_plan(unknown)


@pytest.mark.parametrize(
    ("every", "others_clients", "max_batches", "passes", "others", "batches"),
    [
        # no round evaluations: the final pass over the 2 clients' 5 test examples, one batch each
        (None, 32, None, 1, 0, 2),
        # every 5 of 2 rounds: none is due, but the last round is evaluated; each client also scores 3 examples
        # of the other client (eval.others_per_client), one more batch each
        (5, 32, None, 2, 2 * 3, 2 * 2 + 2),
        # every round: 2 round evaluations
        (1, 32, None, 3, 2 * 2 * 3, 2 * 3 + 2 * 2),
        # a rehearsal's cut to 1 batch of 2: own and others' at most 2 examples each
        (1, 32, 1, 3, 2 * 2 * 2, 2 * 3 + 2 * 2),
    ],
)
def test_round_evaluations_count_the_last_round_and_the_others_sample(
    tmp_path, every, others_clients, max_batches, passes, others, batches
):
    path = tmp_path / "small.yaml"
    cut = {} if max_batches is None else {"max_batches": max_batches, "batch_size": 2}
    evaluation = {"every": every, "others_per_client": 3, "others_clients": others_clients, **cut}
    path.write_text(SMALL + f"eval: {json.dumps(evaluation)}\n")
    final = make_plan(load_config(str(path))).phases[-1]
    own = 2 * 5 * passes if max_batches is None else 2 * 2 * passes
    assert (final.phase, final.examples, final.eval_batches) == ("evaluation", own + others, batches)
    assert final.decode_steps == batches * 32  # eval.max_new_tokens, every batch generating
    assert final.client_units == 2 * passes


def test_a_llava_steps_logits_are_its_texts_so_an_evaluation_keeps_most_of_its_forward_pass():
    """A training step computes a causal LM's logits where its loss reads them (fedpeft.training.labelled_tail):
    for a text model the plan takes every position (the output layer's share of the active parameters), for LLaVA
    its text's only (its image tokens and vision tower compute none). The evaluation's prompt pass keeps the
    forward pass less the output layer at all but the last of those positions, and all of the vision tower's."""
    from fedpeft.planning.architecture import active_parameters, extra_forward_flops
    from fedpeft.planning.cpu_time import FORWARD_SHARE, forward_share, head_share, logit_positions

    text = planning.models_of(load_config("guidance-sni"))[0].architecture
    assert logit_positions(text, 512) == 512
    assert head_share(text, 512) == pytest.approx(text.vocab * text.hidden / active_parameters(text))
    cfg = load_config("fedmosaic-drake")
    cut = cfg.model_copy(update={"models": {k: m.model_copy(update={"max_length": 32}) for k, m in cfg.models.items()}})
    llava = planning.models_of(cut)[0].architecture
    head = llava.vocab * llava.hidden
    assert logit_positions(llava, 579) == 2  # 579 positions, 577 of them the image's
    body = 2 * (active_parameters(llava) - head) * 579 + extra_forward_flops(llava)
    assert head_share(llava, 579) == pytest.approx(2 * head * 2 / (body + 2 * head * 2))
    assert head_share(llava, 579) < 0.01 < 0.1 < head_share(text, 512)  # Llama-3.2-1B: 0.21
    # A forward pass's share of a step: the measured FORWARD_SHARE of the language model's part, all of the frozen
    # vision tower's (forward only in training too), the parts' times as their FLOPs
    assert forward_share(text, 512) == FORWARD_SHARE
    language = 2 * ((active_parameters(llava) - head) * 579 + head * 2)
    vision = extra_forward_flops(llava) / (extra_forward_flops(llava) + language / FORWARD_SHARE)
    assert forward_share(llava, 579) == pytest.approx(vision + (1 - vision) * FORWARD_SHARE)
    assert FORWARD_SHARE < forward_share(llava, 579) < 1


def test_a_measured_logit_share_keeps_a_text_models_output_layer_out_of_its_step_and_in_each_decoded_token():
    """Where a rehearsal measured the share of its step's positions with logits (a causal LM's loss reads its
    answers only, and computes their logits only once the whole logits would be large), the output layer's part
    of the step is at that share, an evaluation's prompt pass keeps the rest of the step's forward pass, and a
    decoded token costs one position through the blocks and the output layer over the whole vocabulary, at the
    forward pass's FLOPs rate."""
    from fedpeft.planning.architecture import active_parameters
    from fedpeft.planning.cpu_time import (
        FORWARD_SHARE,
        STEP_FIXED_EXAMPLES,
        Machine,
        ModelRate,
        head_share,
        logit_positions,
        phase_seconds,
        token_seconds,
        tokens_of,
    )

    cfg = load_config("guidance-sni")
    text = planning.models_of(cfg)[0].architecture
    head, n = text.vocab * text.hidden, active_parameters(text)
    blocks, logits = 2 * (n - head) * 512, 2 * head * 51.2
    assert logit_positions(text, 512, 0.1) == pytest.approx(51.2)
    assert head_share(text, 512, 0.1) == pytest.approx(logits / (blocks + logits))
    assert head_share(text, 512, 0.1) < head_share(text, 512) / 5  # every position's: the upper bound
    seconds_per_flop = 2.0 * FORWARD_SHARE / (blocks + logits)
    assert token_seconds(text, 512, 2.0, 0.1) == pytest.approx(seconds_per_flop * (2 * (n - head) + 2 * head))

    data = plan_json(make_plan(cfg), gpu("H100"), 1, None)
    phase = next(p for p in data["phases"] if p["phase"] == "evaluation")
    phase = {**phase, "examples": 40.0, "eval_batches": 10.0, "decode_steps": 40.0}
    models = [{**m, "tokens_per_example": tokens_of(m)} for m in data["models"]]
    machine = Machine(processes=1, threads=2, cores=2, bandwidth=10e9)
    parts = phase_seconds(phase, models, [ModelRate("1B", 2.0, "rehearsal", 16, 0.1)], machine, True)
    passes = (40 + STEP_FIXED_EXAMPLES * 10) * 2.0 * FORWARD_SHARE
    tokens = tokens_of(data["models"][0])
    share = head_share(text, tokens, 0.1)
    assert parts["forward"] == pytest.approx(passes * (1 - share * (1 - 1 / logit_positions(text, tokens, 0.1))))
    token = token_seconds(text, tokens, 2.0, 0.1)
    assert parts["generation"] == pytest.approx(40 * (models[0]["weights_bytes"] / 10e9 + 4 * token))


def test_an_evaluation_of_two_models_costs_the_mean_of_theirs():
    """Each model of a federation times its share of a phase at its own rate, whatever the model before it."""
    from fedpeft.planning.cpu_time import Machine, ModelRate, phase_seconds, tokens_of

    cfg = load_config("fedmosaic-drake")
    cut = cfg.model_copy(update={"models": {k: m.model_copy(update={"max_length": 32}) for k, m in cfg.models.items()}})
    data = plan_json(make_plan(cut), gpu("H100"), 1, None)
    phase = next(p for p in data["phases"] if p["phase"] == "evaluation")
    phase = {**phase, "examples": 40.0, "eval_batches": 10.0, "decode_steps": 40.0}
    models = [{**m, "tokens_per_example": tokens_of(m)} for m in data["models"]]
    rates = [ModelRate(m["name"], 0.5 + i, "rehearsal", 2) for i, m in enumerate(models)]
    machine = Machine(processes=1, threads=2, cores=2, bandwidth=10e9)

    def alone(i: int) -> float:
        parts = phase_seconds(phase, [{**models[i], "share": 1.0}], [rates[i]], machine, True)
        return sum(parts.values())

    both = phase_seconds(phase, [{**m, "share": 0.5} for m in models], rates, machine, True)
    assert sum(both.values()) == pytest.approx((alone(0) + alone(1)) / 2)


def test_a_lora_on_fused_experts_costs_every_forward_pass_outside_training_its_adapted_weights():
    """FLAME's OLMoE: a method's LoRA adapts every expert of every layer (PEFT's ``target_parameters``), whose
    adapted weights each forward pass forms whatever its batch: each client's prediction pays EXPERT_LORA_S per
    expert weight once (it forms them at its first pass and holds them: their bytes in its peak), every other
    forward batch outside training each time (on all the cores; twice that on half of them). The base model's
    evaluation, and a LoRA on the attention only, pay nothing."""
    from fedpeft.planning.cpu_time import EXPERT_LORA_S, Machine, ModelRate, phase_seconds, tokens_of

    cfg = load_config("flame-dolly")
    experts = 16 * 64 * (2048 * 2 * 1024 + 1024 * 2048)  # layers x experts x (gate_up + down)
    plan = make_plan(cfg)
    by_phase = {(p.method, p.phase): p for p in plan.phases}
    assert by_phase[("base model", "evaluation")].expert_weights == [0.0]
    for name in ("flame", "hetlora", "flexlora"):
        assert by_phase[(name, "evaluation")].expert_weights == [float(experts)], name
    assert by_phase[("flame", "federated")].expert_weights == [float(experts)]
    attention = cfg.model_copy(
        update={"methods": [m.model_copy(update={"targets": ["q_proj", "v_proj"]}) for m in cfg.methods[:2]]}
    )
    assert {p.method: p.expert_weights for p in make_plan(attention).phases if p.phase == "evaluation"} == {
        "base model": [0.0],
        "base-at-tier": [0.0],
        "flame": [0.0],
    }

    data = plan_json(plan, gpu("H100"), 1, None)
    models = [{**m, "tokens_per_example": tokens_of(m)} for m in data["models"]]
    machine = Machine(processes=1, threads=2, cores=2, bandwidth=10e9)
    rates = [ModelRate("OLMoE", 2.0, "rehearsal", 16, 0.1)]
    for method, expected in (("flame", experts), ("base model", 0)):
        row = next(p for p in data["phases"] if p["method"] == method and p["phase"] == "evaluation")
        row = {**row, "examples": 40.0, "eval_batches": 10.0, "decode_steps": 40.0, "client_units": 4}
        parts = phase_seconds(row, models, rates, machine, True)
        assert parts["experts"] == pytest.approx(4 * expected * EXPERT_LORA_S)  # once a client, not a batch or token
    # the formed weights held through a prediction, in bfloat16
    assert by_phase[("flame", "evaluation")].peak_memory - by_phase[("base model", "evaluation")].peak_memory == (
        2 * experts
    )
    # A training phase's forward batches outside its steps (here, statistics) pay it too; its steps do not.
    federated = next(p for p in data["phases"] if p["method"] == "flame" and p["phase"] == "federated")
    quiet = {**federated, "forward_batches": 0.0, "public_batches": 0.0, "decode_steps": 0.0}
    assert phase_seconds(quiet, models, rates, machine, True)["experts"] == 0.0
    busy = {**quiet, "forward_batches": 3.0}
    assert phase_seconds(busy, models, rates, machine, True)["experts"] == pytest.approx(3 * experts * EXPERT_LORA_S)
    one_thread = Machine(processes=2, threads=1, cores=2, bandwidth=10e9)
    assert phase_seconds(busy, models, rates, one_thread, True)["experts"] == pytest.approx(
        2 * 3 * experts * EXPERT_LORA_S
    )


def test_a_merge_from_sample_gradients_counts_them_and_evaluates_its_parts():
    """Potara and Fisher merging: each client's personalization takes per-sample gradients of ``merge_samples``
    examples at its FedIT and its local adapter (two vectorized calls), counted in its FLOPs and CPU time; the
    evaluation scores the merge and, with ``parts``, each of the two beside it (a grid search: its choice and every
    weight of its grid too)."""
    from fedpeft.planning.cpu_time import SAMPLE_GRADIENT_PASSES, Machine, ModelRate, phase_seconds, tokens_of

    cfg = load_config("potara-cifar100")
    plan = make_plan(cfg)
    by_phase = {(p.method, p.phase): p for p in plan.phases}
    clients = plan.federation.total_clients
    for name in ("potara", "fisher_merge"):
        personal = by_phase[(name, "personalization")]
        assert personal.sample_gradient_examples == 2 * 30 * clients and personal.sample_gradient_calls == 2 * clients
        assert by_phase[(name, "evaluation")].notes[0].startswith("3 pass(es)")
    assert by_phase[("local", "personalization")].sample_gradient_examples == 0.0
    assert by_phase[("fedit", "evaluation")].notes[0].startswith("1 pass(es)")
    potara = next(m for m in cfg.methods if m.name == "potara")
    fewer = potara.model_copy(update={"merge_samples": 8, "parts": False, "grid_search": True, "grid": [0.0, 0.5, 1.0]})
    phases = {p.phase: p for p in make_plan(cfg.model_copy(update={"methods": [fewer]})).phases if p.method == "potara"}
    assert phases["personalization"].sample_gradient_examples == 2 * 8 * clients
    assert phases["evaluation"].notes[0].startswith("5 pass(es)")  # the merge, the grid's choice, its 3 weights
    # The FLOPs: a training example's forward and backward each, beyond the local training's.
    without = make_plan(cfg.model_copy(update={"methods": [fewer.model_copy(update={"name": "local"})]}))
    local = next(p for p in without.phases if p.phase == "personalization")
    gradient_flops = phases["personalization"].flops - local.flops * phases["personalization"].examples / local.examples
    assert gradient_flops == pytest.approx(local.flops / local.examples * 2 * 8 * clients, rel=1e-6)

    data = plan_json(plan, gpu("H100"), 1, None)
    models = [{**m, "tokens_per_example": tokens_of(m)} for m in data["models"]]
    machine = Machine(processes=1, threads=2, cores=2, bandwidth=10e9)
    rates = [ModelRate("ViT", 0.5, "rehearsal", 12)]
    row = next(p for p in data["phases"] if p["method"] == "potara" and p["phase"] == "personalization")
    with_gradients = phase_seconds(row, models, rates, machine, False)["training"]
    without_gradients = phase_seconds({**row, "sample_gradient_examples": 0.0, "sample_gradient_calls": 0.0},
                                      models, rates, machine, False)["training"]  # fmt: skip
    fixed = 0.003 + 0.003 * 12  # step_fixed_s at 12 layers
    trained = (without_gradients - row["steps"] * fixed) / (row["examples"] + row["steps"])  # a training example's
    calls, samples = 2 * clients, 2 * 30 * clients
    assert with_gradients - without_gradients == pytest.approx(
        calls * fixed + (samples * SAMPLE_GRADIENT_PASSES + calls) * trained, rel=1e-6
    )
