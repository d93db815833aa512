"""FedP2EFT and BayesTune-LoRA as methods: what travels, one lambda per client, run outputs, `fedpeft personalize`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from entry_point import cli, report_in_a_fresh_process
from safetensors.torch import load_file
from test_per_architecture import two_architectures
from torch.optim.optimizer import register_optimizer_step_post_hook

from fedpeft.analysis.scales import ScaleRecord, language_distances, rank_structure, read_scales
from fedpeft.core.config import ExperimentConfig, load_config
from fedpeft.data.types import FederatedData
from fedpeft.runner import Experiment
from fedpeft.worker import Worker, build_method

SMALL = {"r_max": 4, "r_init": 8, "lr": 1e-2, "finetune_epochs": 1.0}
PSG_KEYS = {"hidden.weight", "hidden.bias", "output.weight", "output.bias"}


def test_a_federated_round_uploads_only_the_psg(toy_runtime, toy_clients):
    method = build_method({"name": "fedp2eft", **SMALL, "stage1_steps": 3, "psg_steps": 2, "psg_lr": 1e-2})
    state = method.init_server(toy_runtime, seed=0)
    assert set(state.tensors) == PSG_KEYS
    # L = 4 LoRA modules (query, value in 2 layers), r_init = 8: 2L -> 4L -> L * r_init.
    assert state.tensors["hidden.weight"].shape == (16, 8) and state.tensors["output.weight"].shape == (32, 16)
    updates = []
    for client in toy_clients[:2]:
        update, client_state = method.client_update(toy_runtime, client, method.payload(state, "x"), None, seed=1)
        assert set(update.tensors) == PSG_KEYS and update.weight == len(client.train)
        assert not torch.equal(update.tensors["output.bias"], state.tensors["output.bias"])
        assert client_state["statistics"].shape == (8,)
        updates.append(update)
    updates[1].weight = 3 * updates[0].weight
    new_state, _ = method.aggregate(state, iter(updates))
    for key in PSG_KEYS:
        expected = 0.25 * updates[0].tensors[key] + 0.75 * updates[1].tensors[key]
        torch.testing.assert_close(new_state.tensors[key], expected)


class OptimizerSteps:
    """Counts the optimizer steps taken inside the ``with`` block, by optimizer class name (AdamW: stage 1, the
    one training loop; Adam: stage 2, the PSG's regression)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def _count(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        name = type(optimizer).__name__
        self.counts[name] = self.counts.get(name, 0) + 1

    def __enter__(self) -> OptimizerSteps:
        self.handle = register_optimizer_step_post_hook(self._count)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def test_fedp2eft_defaults_follow_the_reference_protocol():
    cfg = build_method({"name": "fedp2eft"}).cfg
    assert (cfg.stage1_epochs, cfg.stage1_steps, cfg.psg_steps, cfg.psg_loss, cfg.r_init) == (2.0, None, 10, "sum", 32)


@pytest.mark.parametrize(
    ("settings", "stage1", "stage2"),
    [
        ({}, 2 * 5, 10),  # 48 examples at batch 10: ceil(48 / 10) = 5 steps per epoch, 2 epochs; 10 PSG steps
        ({"stage1_epochs": 1.0, "psg_steps": 3}, 5, 3),
        ({"stage1_steps": 4}, 4, 10),  # the cap ends stage 1 early
        ({"stage1_steps": 50}, 10, 10),  # a cap above 2 epochs changes nothing
    ],
)
def test_a_client_round_runs_stage1_for_epochs_and_stage2_for_psg_steps(
    settings, stage1, stage2, toy_runtime, toy_clients
):
    method = build_method({"name": "fedp2eft", **SMALL, "batch_size": 10, **settings})
    client = toy_clients[0]
    assert len(client.train) == 48
    state = method.init_server(toy_runtime, seed=0)
    with OptimizerSteps() as steps:
        update, _ = method.client_update(toy_runtime, client, method.payload(state, client.client_id), None, seed=1)
    assert steps.counts == {"AdamW": stage1, "Adam": stage2}
    assert update.metrics["steps"] == stage1


def test_psg_loss_sum_is_the_number_of_scales_times_the_mean(toy_runtime, toy_clients):
    metrics = {}
    for reduction in ("sum", "mean"):
        method = build_method(
            {"name": "fedp2eft", **SMALL, "stage1_steps": 2, "psg_steps": 1, "psg_loss": reduction, "psg_lr": 1e-2}
        )
        state = method.init_server(toy_runtime, seed=0)
        update, _ = method.client_update(toy_runtime, toy_clients[0], method.payload(state, "c0"), None, seed=1)
        metrics[reduction] = update.metrics
    assert metrics["sum"]["loss"] == metrics["mean"]["loss"]  # the same stage 1, so the same target
    # L * r_init = 4 * 8 = 32 scales.
    assert metrics["sum"]["psg_l1_before"] == pytest.approx(32 * metrics["mean"]["psg_l1_before"], rel=1e-5)
    assert metrics["mean"]["psg_l1_before"] > 0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: fedp2eft, bt_steps: 10}", "'bt_steps'"),  # replaced by stage1_epochs / stage1_steps
        ("{name: fedp2eft, rank_multiplier: 2}", "'rank_multiplier'"),  # replaced by r_init
        ("{name: bayestune_lora, epochs: 2}", "'epochs'"),  # replaced by stage1_epochs
        ("{name: fedp2eft, psg_loss: median}", "'psg_loss'"),
        ("{name: bayestune_lora, stage1_steps: 0}", "'stage1_steps'"),
        ("{name: fedp2eft, r_max: 16, r_init: 8}", "`r_init` (8) must be at least `r_max` (16)"),
    ],
)
def test_removed_and_invalid_stage_settings_exit_2(entry, message, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, _, stderr = cli(monkeypatch, capsys, "run", "smoke", "--set", f"methods=[{entry}]", "--out", str(out))
    assert code == 2
    assert message in stderr and "Traceback" not in stderr
    assert not out.exists()


def test_one_lambda_per_client_serves_every_budget(toy_runtime, toy_clients, tmp_path):
    data = FederatedData("toy", "classification", ["no", "yes"], ["g"], toy_clients)
    cfg = ExperimentConfig(methods=[{"name": "bayestune_lora", **SMALL, "stage1_epochs": 1.0}], budgets=[1, 2, 4])
    worker = Worker(cfg, tmp_path, data=data, runtime=toy_runtime)
    method = worker.methods["bayestune_lora"]
    trained, structures = [], []
    original_scales, original_personalize = method.client_scales, method.personalize

    def counting_scales(*args, **kwargs):
        trained.append(1)
        return original_scales(*args, **kwargs)

    def recording_personalize(*args, **kwargs):
        model = original_personalize(*args, **kwargs)
        structures.append(dict(model.lora.rank_pattern))
        return model

    method.client_scales, method.personalize = counting_scales, recording_personalize  # type: ignore[method-assign]
    records, seconds = worker.personalize("bayestune_lora", 0, "c1", method.init_server(toy_runtime, 0))
    assert len(trained) == 1 and seconds > 0
    assert [r["budget"] for r in records] == [1, 2, 4]
    assert [sum(s.values()) for s in structures] == [4, 8, 16]  # r * L with L = 4
    for smaller, larger in zip(structures, structures[1:], strict=False):
        assert all(rank <= larger.get(name, 0) for name, rank in smaller.items())
    [saved] = read_scales(tmp_path)
    assert (saved.method, saved.client, saved.seed, saved.r_max) == ("bayestune_lora", "c1", 0, 4)
    assert saved.scales.shape == (4, 8)


def test_budget_above_r_max_is_refused_before_training(tmp_path):
    from fedpeft.core.errors import UserError

    cfg = load_config("smoke", ["methods=[{name: fedp2eft}]", "budgets=[2, 32]", "base.kind=pretrained"])
    with pytest.raises(UserError, match=r"r=32 .*r_max=16"):
        Experiment(cfg, tmp_path / "run").run()
    assert not (tmp_path / "run" / "parts" / "fedp2eft-seed0.jsonl").exists()


def test_language_distance_matrix_by_hand():
    def record(client: str, group: str, values: list[float]) -> ScaleRecord:
        return ScaleRecord("m", 0, client, group, "seen", ["x"], 1, np.array([values], dtype=np.float32))

    records = [
        record("a1", "A", [1.0, 1.0]),
        record("a2", "A", [1.0, 3.0]),
        record("b1", "B", [4.0, 1.0]),
        record("b2", "B", [4.0, 5.0]),
        record("c1", "C", [0.0, 0.0]),  # a single client: its own distance is undefined
    ]
    groups, matrix = language_distances(records)
    assert groups == ["A", "B", "C"]
    d_ab = (3.0 + 5.0 + 2 * math.sqrt(13.0)) / 4  # |a1-b1|, |a1-b2|, |a2-b1|, |a2-b2|
    assert matrix[0][1] == pytest.approx(math.log(d_ab / math.sqrt(2.0 * 4.0)))
    assert matrix[1][0] == pytest.approx(matrix[0][1])
    assert matrix[0][0] == pytest.approx(0.0) and matrix[1][1] == pytest.approx(0.0)
    assert all(math.isnan(v) for v in matrix[2]) and math.isnan(matrix[0][2])


def test_rank_structure_counts_kept_ranks_per_layer_and_type():
    modules = ["enc.layer.0.q", "enc.layer.0.v", "enc.layer.1.q", "enc.layer.1.v"]
    first = np.array([[0.9, 0.8], [0.1, 0.1], [0.7, 0.2], [0.6, 0.3]], dtype=np.float32)
    second = np.array([[0.9, 0.1], [0.8, 0.1], [0.7, 0.1], [0.6, 0.1]], dtype=np.float32)
    records = [ScaleRecord("m", 0, c, "g", "seen", modules, 2, s) for c, s in (("x", first), ("y", second))]
    layers, kinds, matrix = rank_structure(records, 1)
    assert layers == [0, 1] and kinds == ["q", "v"]
    # Budget 1 keeps 4 ranks: x keeps (2, 0, 1, 1), y keeps (1, 1, 1, 1); the mean per (layer, type):
    assert matrix == [[1.5, 0.5], [1.0, 1.0]]


# ---------------------------------------------------------------------------------------------- end to end

RUN = [
    "data.groups=[lat1, lat4]",
    "budgets=[2, 4]",
    "methods=[{name: fedp2eft, rounds: 2, fraction: 0.5, r_max: 4, r_init: 8, stage1_steps: 3, psg_steps: 2, "
    "psg_lr: 0.01, lr: 0.005, finetune_epochs: 1}, "
    "{name: bayestune_lora, r_max: 4, r_init: 8, stage1_epochs: 1, lr: 0.005, finetune_epochs: 1}]",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fedp2eft") / "run"
    Experiment(load_config("smoke", RUN), out).run()
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_writes_results_psg_lambdas_and_plots(run_dir):
    records = read_jsonl(run_dir / "results.jsonl")
    clients = {r["client"] for r in records if r["method"] == "base"}
    for method in ("fedp2eft", "bayestune_lora"):
        mine = [r for r in records if r["method"] == method and r["split"] != "train"]
        assert {r["budget"] for r in mine} == {2, 4}
        assert {r["client"] for r in mine} == clients
        assert {r.client for r in read_scales(run_dir) if r.method == method} == clients
        assert (run_dir / "plots" / f"rank_structure_{method}.png").is_file()
        assert (run_dir / "plots" / f"lambda_distance_{method}.png").is_file()
    meta = json.loads((run_dir / "psg" / "fedp2eft" / "seed0.json").read_text())
    assert meta["rounds"] == 2 and meta["config"]["r_max"] == 4 and len(meta["modules"]) == 12
    assert set(load_file(run_dir / "psg" / "fedp2eft" / "seed0.safetensors")) == PSG_KEYS
    costs = read_jsonl(run_dir / "costs.jsonl")
    federated = {c["metric"]: c["value"] for c in costs if c["method"] == "fedp2eft" and c["phase"] == "federated"}
    psg_bytes = sum(t.numel() * 4 for t in load_file(run_dir / "psg" / "fedp2eft" / "seed0.safetensors").values())
    assert federated["bytes_up_per_client_round"] == psg_bytes  # only the PSG travels


def test_report_of_the_rank_scales_imports_no_torch(run_dir, tmp_path):
    # The BayesTune methods' declared report_plots hook is called without importing them.
    out = tmp_path / "report"
    assert report_in_a_fresh_process(run_dir, out) == []
    for method in ("fedp2eft", "bayestune_lora"):
        for plot in ("rank_structure", "lambda_distance"):
            drawn = out / "plots" / f"{plot}_{method}.png"
            assert drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_saved_fedp2eft_adapter_loads_with_plain_peft_and_reproduces_accuracy(run_dir):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    worker = Worker(load_config(str(run_dir / "config.yaml")), run_dir)
    client = worker.clients["lat4-unseen-00"]
    adapter_dir = run_dir / "adapters" / "fedp2eft" / "r2" / client.client_id
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == set(config["rank_pattern"])
    assert sum(config["rank_pattern"].values()) == 2 * 12
    base = AutoModelForSequenceClassification.from_pretrained(run_dir / "base_model")
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    logged = _logged(run_dir, client.client_id)
    assert _test_accuracy(model, worker, client.client_id) == pytest.approx(logged, abs=1e-9)


def _test_accuracy(model: torch.nn.Module, worker: Worker, client_id: str) -> float:
    batch = worker.runtime.encode(worker.clients[client_id].test)
    labels = batch.pop("labels")
    with torch.no_grad():
        return float((model(**batch).logits.argmax(-1) == labels).float().mean())


def _logged(run_dir: Path, client_id: str) -> float:
    """The run's accuracy record of FedP2EFT at r = 2 for ``client_id``."""
    return next(
        r["value"]
        for r in read_jsonl(run_dir / "results.jsonl")
        if r["method"] == "fedp2eft" and r["budget"] == 2 and r["client"] == client_id
    )


def test_saved_adapters_load_with_pefts_auto_class_and_the_umasks_mode(run_dir, monkeypatch):
    """The task type is saved, so AutoPeftModelForSequenceClassification finds the model class (from the adapter's
    directory, against which its base path is relative), and every file is as readable as the umask makes files."""
    from peft import AutoPeftModelForSequenceClassification

    from fedpeft.core.io import UMASK

    client = "lat4-unseen-00"
    adapter_dir = run_dir / "adapters" / "fedp2eft" / "r2" / client
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"
    monkeypatch.chdir(adapter_dir)
    auto = AutoPeftModelForSequenceClassification.from_pretrained(".").eval()
    worker = Worker(load_config(str(run_dir / "config.yaml")), run_dir)
    assert _test_accuracy(auto, worker, client) == pytest.approx(_logged(run_dir, client), abs=1e-9)
    files = [p for p in [*adapter_dir.iterdir(), *(run_dir / "base_model").iterdir()] if p.is_file()]
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {oct(0o666 & ~UMASK)}


def test_personalize_cli_reproduces_the_runs_adapter(run_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "adapter"
    code, stdout, stderr = cli(
        monkeypatch,
        capsys,
        "personalize",
        str(run_dir),
        "--budget",
        "2",
        "--client",
        "lat1-unseen-01",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    assert "lat1-unseen-01" in stdout
    expected = load_file(run_dir / "adapters" / "fedp2eft" / "r2" / "lat1-unseen-01" / "adapter_model.safetensors")
    written = load_file(out / "adapter_model.safetensors")
    assert set(written) == set(expected)
    for key, tensor in expected.items():
        torch.testing.assert_close(written[key], tensor, msg=key)


def test_personalize_cli_from_a_file_of_examples(run_dir, tmp_path, monkeypatch, capsys):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    worker = Worker(load_config(str(run_dir / "config.yaml")), run_dir)
    names = worker.data.label_names
    examples = worker.clients["lat4-seen-01"].train
    path = tmp_path / "mine.jsonl"
    path.write_text(
        "".join(
            json.dumps({"text": e["text"], "text_pair": e["text_pair"], "label": names[e["label"]]}) + "\n"
            for e in examples
        )  # fmt: skip
    )
    out = tmp_path / "adapter"
    code, _, stderr = cli(
        monkeypatch, capsys, "personalize", str(run_dir), "-r", "4", "--data", str(path), "--out", str(out)
    )
    assert code == 0, stderr
    config = json.loads((out / "adapter_config.json").read_text())
    assert sum(config["rank_pattern"].values()) == 4 * 12
    assert not Path(config["base_model_name_or_path"]).is_absolute()  # like a run's adapters: relative to out
    base = AutoModelForSequenceClassification.from_pretrained(out / config["base_model_name_or_path"])
    model = PeftModel.from_pretrained(base, out).eval()
    wrapped = {n.removeprefix("base_model.model.") for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == set(config["target_modules"])
    batch = worker.runtime.encode(examples)
    labels = batch.pop("labels")
    with torch.no_grad():
        accuracy = float((model(**batch).logits.argmax(-1) == labels).float().mean())
    assert accuracy > 0.5  # fitted to the file's (label-skewed) examples


MIXED = two_architectures([{"name": "fedp2eft", "rounds": 2, "fraction": 1.0, "lr": 1e-2, "batch_size": 8}])


def test_a_federation_of_two_architectures_keeps_a_psg_and_a_base_model_per_architecture(tmp_path, monkeypatch, capsys):
    """Each architecture's PSG and base model are saved; a client's adapter names its own architecture's base and
    loads onto it with PEFT's auto class (the accuracy the run logged), and `personalize` rebuilds it exactly."""
    from peft import AutoPeftModelForSequenceClassification

    from fedpeft.core.config import validate

    run_dir = tmp_path / "run"
    Experiment(validate(MIXED), run_dir).run()
    for architecture in ("llama", "qwen"):
        assert (run_dir / "psg" / "fedp2eft" / architecture / "seed0.safetensors").is_file()
        assert (run_dir / "base_model" / architecture / "model.safetensors").is_file()
    worker = Worker(load_config(str(run_dir / "config.yaml")), run_dir)
    for client, architecture in (("lat1-seen-01", "llama"), ("lat2-unseen-00", "qwen")):
        saved = run_dir / "adapters" / "fedp2eft" / "r2" / client
        base = json.loads((saved / "adapter_config.json").read_text())["base_model_name_or_path"]
        assert (saved / base).resolve() == (run_dir / "base_model" / architecture).resolve()
        monkeypatch.chdir(saved)
        model = AutoPeftModelForSequenceClassification.from_pretrained(".").eval()
        batch = worker.runtime_for(client).encode(worker.clients[client].test)
        labels = batch.pop("labels")
        with torch.no_grad():
            accuracy = float((model(**batch).logits.argmax(-1) == labels).float().mean())
        assert accuracy == pytest.approx(_logged(run_dir, client), abs=1e-6)  # float32 mean
        out = tmp_path / f"personalized-{client}"
        code, _, stderr = cli(
            monkeypatch, capsys, "personalize", str(run_dir), "-r", "2", "--client", client, "--out", str(out)
        )
        assert code == 0, stderr
        written, expected = load_file(out / "adapter_model.safetensors"), load_file(saved / "adapter_model.safetensors")
        assert set(written) == set(expected) and all(torch.equal(written[k], expected[k]) for k in expected)
    # A file of examples needs the architecture named; a client of the run has its own.
    examples = tmp_path / "mine.jsonl"
    examples.write_text(
        "".join(
            json.dumps({"text": e["text"], "text_pair": e["text_pair"], "label": e["label"]}) + "\n"
            for e in worker.clients["lat2-seen-00"].train
        )
    )
    for extra, message in (
        ([], "name the one to personalize with --architecture"),
        (["--architecture", "gpt"], "no architecture 'gpt'"),
    ):
        args = ["personalize", str(run_dir), "-r", "2", "--data", str(examples), "--out", str(tmp_path / "x"), *extra]
        code, _, stderr = cli(monkeypatch, capsys, *args)
        assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    args = ["personalize", str(run_dir), "-r", "2", "--client", "lat2-seen-00", "--architecture", "llama"]
    code, _, stderr = cli(monkeypatch, capsys, *args, "--out", str(tmp_path / "x"))
    assert code == 2 and "runs architecture 'qwen', not 'llama'" in stderr
    code, _, stderr = cli(monkeypatch, capsys, *args[:-1], "qwen", "--out", str(tmp_path / "y"))
    assert code == 0, stderr


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("budget", "r=8 is outside"),
        ("no_psg", "has no trained PSG"),
        ("labels", "are not the run's label set"),
        ("both", "exactly one of --data"),
    ],
)
def test_personalize_cli_bad_input_is_one_sentence_and_exit_2(case, message, run_dir, tmp_path, monkeypatch, capsys):
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"text": "a b", "label": "positive"}\n{"text": "c d", "label": "negative"}\n')
    empty_run = tmp_path / "empty"
    empty_run.mkdir()
    (empty_run / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    args = {
        "budget": [str(run_dir), "--budget", "8", "--client", "lat1-seen-00"],
        "no_psg": [str(empty_run), "--budget", "2", "--client", "lat1-seen-00"],
        "labels": [str(run_dir), "--budget", "2", "--data", str(labels)],
        "both": [str(run_dir), "--budget", "2", "--data", str(labels), "--client", "lat1-seen-00"],
    }[case]
    code, _, stderr = cli(monkeypatch, capsys, "personalize", *args, "--out", str(tmp_path / "out"))
    assert code == 2
    assert message in stderr and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "preset", ["fedp2eft-xnli", "fedp2eft-masakhanews", "fedp2eft-fedaya", "fedp2eft-xnli-cpu", "quickstart"]
)
def test_presets_validate_and_compare_fedp2eft_with_its_baselines(preset, tmp_path):
    cfg = load_config(preset)
    Experiment(cfg, tmp_path / "run")  # checks the methods across entries, loads nothing
    for entry in cfg.methods:
        method = build_method(entry)
        if method.uses_budget:
            method.check_budgets(list(cfg.budgets))
    names = {m.name for m in cfg.methods}
    assert {"lora", "bayestune_lora", "fedp2eft"} <= names
    if cfg.device == "cuda":  # the paper-scale presets carry all of the paper's baselines
        assert {"adalora", "fedl2p"} <= names
    assert len(cfg.seeds) == 3 and max(cfg.budgets) <= 16


def test_personalize_says_the_budget_is_a_mean_rank_over_the_modules(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import fedpeft.personalize
    from fedpeft.cli import app

    ranks = {"layer.0.query": 6, "layer.0.value": 2, "layer.1.query": 8, "layer.1.value": 0}
    adapter = fedpeft.personalize.PersonalizedAdapter(tmp_path / "adapter", "en-0", 4, ranks)
    monkeypatch.setattr(fedpeft.personalize, "personalize_client", lambda *args, **kwargs: adapter)
    args = ["personalize", str(tmp_path), "--budget", "4", "--client", "en-0", "--out", str(tmp_path / "adapter")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (
        "r is the mean rank over the modules, not each module's rank: these 4 sum to 16 (4 per module)."
        in result.stdout.splitlines()
    )
