"""Output directories: where `run`, `report` and `personalize` may write, atomic outputs, failed start-ups that
leave nothing in the way, `--resume` rebuilding derived outputs, adapters that survive moving the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from entry_point import cli

from fedpeft.core.config import load_config
from fedpeft.core.errors import UserError
from fedpeft.core.io import RUN_MARKER, path_component, staged_dir, staged_files, write_text_atomic
from fedpeft.runner import Experiment

TINY = [
    "data.groups=[lat1]",
    "data.train_per_group=40",
    "data.test_per_group=20",
    "data.base_samples=200",
    "budgets=[2]",
    "methods=[{name: lora, lr: 0.005, epochs: 1}]",
]


def run_args(out: Path | None, *extra: str) -> list[str]:
    args = ["run", "smoke", *(["--out", str(out)] if out is not None else [])]
    for item in TINY:
        args += ["--set", item]
    return [*args, *extra]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "run"
    Experiment(load_config("smoke", TINY), out).run()
    return out


# ---------------------------------------------------------------------------------------------- bad outputs
def _not_ours(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    mine = tmp / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    return run_args(mine), mine, tmp


def _a_file(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    (tmp / "file.txt").write_text("keep me\n")
    return run_args(tmp / "file.txt"), tmp / "file.txt", tmp


def _proc(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    (tmp / "untouched.txt").write_text("x\n")
    return run_args(Path("/proc/x")), Path("/proc/x"), tmp


def _name_escapes(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    # `name: ../victim` is the directory runs/victim (one component below runs/), here a user's own directory.
    victim = tmp / "runs" / "victim"
    victim.mkdir(parents=True)
    (victim / "data.csv").write_text("a,b\n1,2\n")
    (tmp / "victim").mkdir()
    (tmp / "victim" / "keep.txt").write_text("outside runs/\n")
    return [*run_args(None), "--set", "name=../victim"], Path("runs") / "victim", tmp


def _report_out(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    mine = tmp / "mine"
    mine.mkdir()
    (mine / "summary.md").write_text("my own summary\n")
    (mine / "thesis.tex").write_text("\\section{x}\n")
    return ["report", str(run), "--out", str(mine)], mine, tmp


def _personalize_out(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    mine = tmp / "mine"
    mine.mkdir()
    (mine / "model.bin").write_bytes(b"\x00\x01")
    return ["personalize", str(run), "--budget", "2", "--client", "lat1-seen-00", "--out", str(mine)], mine, tmp


def _personalize_at_file(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    (tmp / "adapter").write_text("not a directory\n")
    args = ["personalize", str(run), "--budget", "2", "--client", "lat1-seen-00", "--out", str(tmp / "adapter")]
    return args, tmp / "adapter", tmp


def _report_at_proc(tmp: Path, run: Path) -> tuple[list[str], Path, Path]:
    (tmp / "untouched.txt").write_text("x\n")
    return ["report", str(run), "--out", "/proc/x/report"], Path("/proc/x/report"), tmp


@pytest.mark.parametrize(
    "case",
    [_not_ours, _a_file, _proc, _name_escapes, _report_out, _personalize_out, _personalize_at_file, _report_at_proc],
    ids=lambda case: case.__name__.strip("_"),
)
def test_a_bad_output_is_one_line_naming_it_exit_2_and_touches_nothing(case, tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args, named, root = case(tmp_path, tiny_run)
    before, run_before = snapshot(root), snapshot(tiny_run)
    code, _, err = cli(monkeypatch, capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(named) in err
    assert snapshot(root) == before
    assert snapshot(tiny_run) == run_before
    assert not Path("/proc/x").exists()


def test_run_names_become_one_path_component():
    assert path_component("../victim") == "victim"
    assert path_component("a/../x") == "a-..-x"
    assert path_component("..") == "run" and path_component("") == "run"
    assert path_component("a\\b") == "a-b" and path_component(".hidden") == "hidden"
    assert path_component("quickstart") == "quickstart"


def test_min_clients_above_the_clients_fails_before_the_output_exists(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, _, err = cli(monkeypatch, capsys, *run_args(out, "--set", "methods=[{name: fedit, min_clients: 100}]"))
    assert code == 2 and "min_clients" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_dataset_too_large_for_memory_is_refused_before_generating_it(tmp_path, monkeypatch, capsys):
    from fedpeft.data import synthetic  # noqa: F401  (registers the builders)
    from fedpeft.data.synthetic import xnli

    def never(*_args, **_kwargs):
        raise AssertionError("the dataset was generated")

    monkeypatch.setattr(xnli, "classification_pools", never)
    out = tmp_path / "run"
    code, _, err = cli(monkeypatch, capsys, *run_args(out, "--set", "data.train_per_group=10000000000"))
    assert code == 2, err
    assert "data.train_per_group" in err and "memory" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_the_memory_estimate_leaves_the_presets_alone():
    from fedpeft.core.config import preset_names
    from fedpeft.data.memory import check_fits_in_memory

    for name in preset_names():
        check_fits_in_memory(load_config(name).data, available=1024**3)  # 1 GiB is plenty for every preset
    with pytest.raises(UserError, match="data.clients_per_group"):
        check_fits_in_memory(load_config("smoke", ["data.clients_per_group=10000000000"]).data, available=1024**3)


# ---------------------------------------------------------------------------------------------- existing runs
def test_an_existing_run_needs_resume_and_the_same_config(tiny_run, monkeypatch, capsys):
    before = snapshot(tiny_run)
    code, _, err = cli(monkeypatch, capsys, *run_args(tiny_run))
    assert code == 2 and "holds a finished run" in err
    code, _, err = cli(monkeypatch, capsys, *run_args(tiny_run, "--resume", "--set", "seeds=[5]"))
    assert code == 2 and "config differs" in err
    code, _, err = cli(monkeypatch, capsys, *run_args(tiny_run, "--force"))  # --force never mixes two runs
    assert code == 2 and "holds a finished run" in err
    assert snapshot(tiny_run) == before
    marker = json.loads((tiny_run / RUN_MARKER).read_text())
    assert marker["format"] == 1 and marker["kind"] == "run" and len(marker["config_sha256"]) == 64


def test_a_finished_run_started_again_is_named_finished_before_torch_is_imported(tiny_run):
    """Without --resume, a finished run's directory is refused at once: the message names its summary, and the
    command never got as far as importing torch (nor validating the config)."""
    before = snapshot(tiny_run)
    probe = (
        "import sys\n"
        "from fedpeft.cli import main\n"
        f"sys.argv = ['fedpeft', *{run_args(tiny_run, '--set', 'methods.0.epoch=1')!r}]\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    print(exit.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert f"{tiny_run} holds a finished run (its summary: {tiny_run / 'summary.md'})" in done.stderr
    assert snapshot(tiny_run) == before


def test_force_writes_into_a_foreign_directory_and_keeps_its_files(tmp_path, monkeypatch, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    code, _, err = cli(monkeypatch, capsys, *run_args(out, "--force"))
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "my notes\n"
    assert (out / RUN_MARKER).is_file() and (out / "summary.md").is_file()
    # Now a fedpeft run: --resume continues it without --force.
    code, _, err = cli(monkeypatch, capsys, *run_args(out, "--resume"))
    assert code == 0, err


def _users_project(tmp: Path) -> Path:
    """A user's own folder: a config of theirs, weights of their own, notes."""
    mine = tmp / "project"
    (mine / "base_model").mkdir(parents=True)
    (mine / "config.yaml").write_text("name: my own experiment\n")
    (mine / "base_model" / "pytorch_model.bin").write_bytes(b"\x00weights\xff")
    (mine / "notes.txt").write_text("my notes\n")
    return mine


def _project(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    return run_args(_users_project(tmp)), tmp, "no .fedpeft-run marker"


def _project_as_cwd(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    os.chdir(_users_project(tmp))  # `fedpeft run config.yaml --out .` in a project folder
    return run_args(Path(".")), tmp, "no .fedpeft-run marker"


def _project_forced(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    return run_args(_users_project(tmp), "--force"), tmp, "holds config.yaml, base_model/ of its own"


def _project_with_results(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    mine = _users_project(tmp)
    (mine / "results.jsonl").write_text('{"mine": 1}\n')
    return run_args(mine), tmp, f"fedpeft adopt {mine}"


def _project_with_results_forced(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    args, root, message = _project_with_results(tmp, run)
    return [*args, "--force"], root, message


def _project_resumed(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("x\n")
    return run_args(tmp / "mine", "--resume"), tmp, "no fedpeft run to resume"


def _forced_over_weights(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    (tmp / "mine" / "base_model").mkdir(parents=True)
    (tmp / "mine" / "base_model" / "my_weights.bin").write_bytes(b"\x01\x02")
    return run_args(tmp / "mine", "--force"), tmp, "holds base_model/ of its own"


def _forced_over_outputs(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    (tmp / "mine").mkdir()
    for name in ("results.jsonl", "summary.md", "env.json", "notes.txt"):
        (tmp / "mine" / name).write_text(f"my {name}\n")
    return run_args(tmp / "mine", "--force"), tmp, "holds env.json, results.jsonl, summary.md of its own"


def _report_forced_over_summary(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    (tmp / "mine" / "plots").mkdir(parents=True)
    (tmp / "mine" / "summary.md").write_text("my own summary\n")
    (tmp / "mine" / "plots" / "figure.png").write_bytes(b"\x89PNG")
    return ["report", str(run), "--out", str(tmp / "mine"), "--force"], tmp, "holds summary.md, plots/ of its own"


def _personalize_forced_over_adapter(tmp: Path, run: Path) -> tuple[list[str], Path, str]:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "adapter_config.json").write_text("{}\n")
    args = ["personalize", str(run), "--budget", "2", "--client", "lat1-seen-00", "--out", str(tmp / "mine")]
    return [*args, "--force"], tmp, "holds adapter_config.json of its own"


@pytest.mark.parametrize(
    "case",
    [
        _project,
        _project_as_cwd,
        _project_forced,
        _project_with_results,
        _project_with_results_forced,
        _project_resumed,
        _forced_over_weights,
        _forced_over_outputs,
        _report_forced_over_summary,
        _personalize_forced_over_adapter,
    ],
    ids=lambda case: case.__name__.strip("_"),
)
def test_a_folder_without_the_marker_is_never_taken_for_a_run_nor_overwritten(
    case, tiny_run, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    args, root, message = case(tmp_path, tiny_run)
    before, run_before = snapshot(root), snapshot(tiny_run)
    code, _, err = cli(monkeypatch, capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert message in err
    assert snapshot(root) == before
    assert snapshot(tiny_run) == run_before


def test_a_failed_start_with_force_removes_only_what_it_created(tmp_path):
    mine = tmp_path / "mine"
    (mine / "figures").mkdir(parents=True)
    (mine / "notes.txt").write_text("my notes\n")
    (mine / "figures" / "a.png").write_bytes(b"\x89PNG")
    before = snapshot(mine)

    def broken(worker):
        raise RuntimeError("no engine")

    with pytest.raises(RuntimeError, match="no engine"):
        Experiment(load_config("smoke", TINY), mine).run(force=True, engine_factory=broken)
    assert snapshot(mine) == before and sorted(p.name for p in mine.iterdir()) == ["figures", "notes.txt"]


def test_adopt_marks_a_run_of_an_earlier_version_and_nothing_else(tiny_run, tmp_path, monkeypatch, capsys):
    old = Path(shutil.copytree(tiny_run, tmp_path / "old"))
    (old / RUN_MARKER).unlink()  # as written before runs carried a marker
    before = snapshot(old)
    code, _, err = cli(monkeypatch, capsys, *run_args(old, "--resume"))
    assert code == 2 and "fedpeft adopt" in err and snapshot(old) == before
    code, out, err = cli(monkeypatch, capsys, "adopt", str(old))
    assert code == 0, err
    assert "marked as a fedpeft run" in out
    after = snapshot(old)
    marker = json.loads(after.pop(RUN_MARKER))
    assert after == before and marker["kind"] == "run" and marker["adopted"] is True
    code, out, err = cli(monkeypatch, capsys, "adopt", str(old))
    assert code == 0 and "already" in out
    code, _, err = cli(monkeypatch, capsys, *run_args(old, "--resume"))
    assert code == 0, err
    assert (old / "results.jsonl").read_bytes() == (tiny_run / "results.jsonl").read_bytes()
    # A folder that holds no run is not adopted.
    project = _users_project(tmp_path)
    before = snapshot(project)
    code, _, err = cli(monkeypatch, capsys, "adopt", str(project))
    assert code == 2 and "nothing to adopt" in err and snapshot(project) == before


def test_report_and_personalize_rewrite_their_own_directories(tiny_run, tmp_path, monkeypatch, capsys):
    report = tmp_path / "report"
    for _ in range(2):  # the second time into a directory it wrote
        code, _, err = cli(monkeypatch, capsys, "report", str(tiny_run), "--out", str(report))
        assert code == 0, err
    assert (report / ".fedpeft-report").is_file() and list((report / "plots").glob("*.png"))
    assert not [p for p in report.rglob("*") if p.name.endswith(".tmp")]
    # A run's own directory may receive its report again; a foreign one with --force.
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    code, _, err = cli(monkeypatch, capsys, "report", str(run), "--out", str(run))
    assert code == 0, err
    assert not (run / ".fedpeft-report").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x\n")
    code, _, err = cli(monkeypatch, capsys, "report", str(tiny_run), "--out", str(mine), "--force")
    assert code == 0, err
    assert (mine / "thesis.tex").read_text() == "x\n" and (mine / "summary.md").is_file()


# ---------------------------------------------------------------------------------------------- failed start-ups
def test_a_start_up_failure_leaves_nothing_in_the_way(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    # Fails while loading the data: the output directory is never created.
    code, _, err = cli(monkeypatch, capsys, *run_args(out, "--set", "data.name=nope"))
    assert code == 2 and "nope" in err and not out.exists()

    # Fails after the directory was created, before any result: what it wrote is removed again.
    def broken(worker):
        raise RuntimeError("no engine")

    with pytest.raises(RuntimeError, match="no engine"):
        Experiment(load_config("smoke", TINY), out).run(engine_factory=broken)
    assert not out.exists()

    # Killed before its first result (nothing could clean up): the same or a corrected config starts over,
    # with or without --resume, and a stale base model of the other config is not reused.
    out.mkdir()
    (out / RUN_MARKER).write_text(json.dumps({"format": 1, "kind": "run", "config_sha256": "0" * 64}))
    (out / "config.yaml").write_text("name: something else\n")
    (out / "parts").mkdir()
    (out / "base_model").mkdir()
    (out / "base_model" / "config.json").write_text("{}")
    code, _, err = cli(monkeypatch, capsys, *run_args(out))
    assert code == 0, err
    assert load_config(str(out / "config.yaml")).name == "smoke"
    assert (out / "base_model" / "model.safetensors").is_file()
    assert json.loads((out / "base_model" / "config.json").read_text())


def test_a_start_up_failure_in_an_empty_directory_keeps_the_directory(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()

    def broken(worker):
        raise RuntimeError("no engine")

    with pytest.raises(RuntimeError):
        Experiment(load_config("smoke", TINY), out).run(engine_factory=broken)
    assert out.is_dir() and not any(out.iterdir())


# ---------------------------------------------------------------------------------------------- resume, move
def test_resume_rebuilds_base_model_summary_and_plots(tiny_run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "copy"
    shutil.copytree(tiny_run, out)
    results = (out / "results.jsonl").read_bytes()
    base = (out / "base_model" / "model.safetensors").read_bytes()
    summary = (out / "summary.md").read_text()
    shutil.rmtree(out / "base_model")
    shutil.rmtree(out / "plots")
    (out / "summary.md").unlink()
    code, _, err = cli(monkeypatch, capsys, *run_args(out, "--resume"))
    assert code == 0, err
    assert (out / "base_model" / "model.safetensors").read_bytes() == base
    assert (out / "base_model" / "config.json").is_file()
    assert list((out / "plots").glob("*.png"))
    assert (out / "summary.md").read_text().replace(str(out), "") == summary.replace(str(tiny_run), "")
    assert (out / "results.jsonl").read_bytes() == results
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_adapters_load_with_plain_peft_after_the_run_is_moved(tiny_run, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(str(shutil.copytree(tiny_run, tmp_path / "original")), str(moved))
    assert not (tmp_path / "original").exists()
    adapter = moved / "adapters" / "lora" / "r2" / "lat1-seen-00"
    named = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not os.path.isabs(named)
    base_dir = (adapter / named).resolve()
    assert base_dir == (moved / "base_model").resolve() and (base_dir / "model.safetensors").is_file()
    model = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base_dir), adapter)
    original = PeftModel.from_pretrained(
        AutoModelForSequenceClassification.from_pretrained(tiny_run / "base_model"),
        tiny_run / "adapters" / "lora" / "r2" / "lat1-seen-00",
    )
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        assert torch.equal(model.eval()(input_ids=ids).logits, original.eval()(input_ids=ids).logits)


# ---------------------------------------------------------------------------------------------- atomic writes
def test_atomic_writes_leave_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "a.txt"
    write_text_atomic(path, "old\n")

    class BoomError(Exception):
        pass

    from fedpeft.core.io import write_atomic

    def half(handle):
        handle.write(b"ne")
        raise BoomError

    with pytest.raises(BoomError):
        write_atomic(path, half)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]

    target = tmp_path / "whole"
    with pytest.raises(BoomError), staged_dir(target) as staging:
        (staging / "x").write_text("1")
        raise BoomError
    assert not target.exists()
    with staged_dir(target) as staging:
        (staging / "x").write_text("2")
    assert (target / "x").read_text() == "2"
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "mine").write_text("keep")
    with staged_files(shared) as staging:
        (staging / "new").write_text("3")
    assert sorted(p.name for p in shared.iterdir()) == ["mine", "new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "shared", "whole"]
