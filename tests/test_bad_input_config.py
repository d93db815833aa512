"""Bad input that ends in one sentence and exit code 2, touching nothing: config files that are not UTF-8 or hold
nothing, mistakes in a config's keys and values (every one of them at once, one line each, with a "did you mean"),
`--set` values that are not YAML, faults aimed at no method or no client, an unknown model without the hub; and the
resume line an interrupted run prints, which pastes into a shell as it is."""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from entry_point import cli
from test_run_dirs import TINY

from fedpeft.core.config import apply_override, load_config, load_raw, method_config, validate
from fedpeft.core.errors import UserError
from fedpeft.core.faults import FaultConfig, check_fault_clients

# TINY's clients: lat1-seen-00, lat1-seen-01 (seen) and lat1-unseen-00, lat1-unseen-01


def smoke_args(out: Path, *overrides: str) -> list[str]:
    """``run smoke`` on the tiny federation into ``out``, with more ``--set`` overrides."""
    args = ["run", "smoke", "--out", str(out)]
    for item in [*TINY, *overrides]:
        args += ["--set", item]
    return args


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(monkeypatch, capsys, tmp_path: Path, args: list[str], lines: int = 1) -> str:
    """Run ``args`` in ``tmp_path`` and check the refusal: exit 2, ``lines`` lines, no traceback, every file as it
    was, no output directory; returns the text."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, _, err = cli(monkeypatch, capsys, *args)
    assert code == 2, err
    assert len(err.strip().splitlines()) == lines and "Traceback" not in err, err
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()
    return err.strip()


# ---------------------------------------------------------------------------------------------- config files
def _latin1(tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "exp.yaml"
    path.write_bytes("seeds: [0]\nname: caf\u00e9\n".encode("latin-1"))
    return path, ["line 2", "0xe9 at byte offset 20", "must be UTF-8", "byte order mark is accepted"]


def _latin1_after_a_bom(tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "exp.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + "name: \u00e9t\u00e9\n".encode("latin-1"))
    return path, ["line 1", "0xe9 at byte offset 9", "must be UTF-8"]  # offsets count the mark's 3 bytes


def _utf16(tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "exp.yaml"
    path.write_bytes("name: exp\n".encode("utf-16"))
    return path, ["line 1", "byte offset 0", "must be UTF-8"]


def _empty(tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "exp.yaml"
    path.write_bytes(b"")
    return path, ["is empty", "methods: [{name: lora}]"]


def _only_comments(tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "exp.yml"
    path.write_text("# an experiment, to be written\n\n   \n# methods: [{name: lora}]\n")
    return path, ["is empty", "preset"]


@pytest.mark.parametrize(
    "case", [_latin1, _latin1_after_a_bom, _utf16, _empty, _only_comments], ids=lambda c: c.__name__.strip("_")
)
def test_a_config_file_that_is_not_utf8_or_holds_nothing_is_one_sentence(case, tmp_path, monkeypatch, capsys):
    path, fragments = case(tmp_path)
    line = refused(monkeypatch, capsys, tmp_path, ["run", str(path), "--out", str(tmp_path / "run")])
    assert line.startswith(f"error: {path} "), line
    for fragment in fragments:
        assert fragment in line, line


def test_a_utf8_config_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + "name: caf\u00e9\nseeds: [3]\n".encode())
    cfg = load_config(str(path))
    assert cfg.name == "caf\u00e9" and cfg.seeds == [3]


# ---------------------------------------------------------------------------------------------- config keys and values
@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if a run gets as far as building its data (where the run and a worker build it)."""
    from fedpeft.runner import experiment
    from fedpeft.worker import worker

    def never(*_args, **_kwargs):
        raise AssertionError("the data was built")

    monkeypatch.setattr(experiment, "build_data", never)
    monkeypatch.setattr(worker, "build_data", never)


def test_every_mistake_of_a_config_is_told_at_once_with_its_key_and_a_suggestion(
    tmp_path, monkeypatch, capsys, nothing_built
):
    mistakes = ["budget=4", "data.clients_per_grop=3", "methods.0.epoch=2", "methods.0.lr=-1"]
    text = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", *mistakes), lines=5)
    assert text.splitlines() == [
        "error: The config has 4 problems:",
        "  - Invalid config at data.clients_per_grop: `data` has no such key; did you mean `clients_per_group`?",
        "  - Invalid setting 'lr' of method 'lora' (methods.0.lr): `lr` must be above 0, not -1.0.",
        "  - Invalid setting 'epoch' of method 'lora' (methods.0.epoch): method 'lora' has no such key; did you mean "
        "`epochs`?",
        "  - Invalid config at budget: the config has no such key; did you mean `budgets`?",
    ]


def test_a_bad_method_setting_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, nothing_built):
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", "methods.0.lr=-1"))
    assert line == "error: Invalid setting 'lr' of method 'lora' (methods.0.lr): `lr` must be above 0, not -1.0."


def test_a_zero_size_of_the_data_is_refused_as_one(tmp_path, monkeypatch, capsys, nothing_built):
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", "data.clients_per_group=0"))
    assert line == "error: Invalid config at data.clients_per_group: must be at least 1, not 0."


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            "seeds=[0,1",
            "`--set seeds=[0,1` is a YAML syntax error (expected ',' or ']', but got '<stream end>'); did you mean "
            '`--set "seeds=[0,1]"`?',
        ),
        (
            "methods=[{name: lora, lr: 0.1]",
            "`--set methods=[{name: lora, lr: 0.1]` is a YAML syntax error (expected ',' or '}', but got ']'); check "
            "its brackets and quotes.",
        ),
        (
            "budgets=4",
            'Invalid config at budgets: expected a list, not 4; e.g. `--set "budgets=[4]"` '
            "(in a file: `budgets: [4]`).",
        ),
        (  # [zero] is no list of seeds either: the example is the key's default
            "seeds=zero",
            "Invalid config at seeds: expected a list, not 'zero'; e.g. `--set \"seeds=[0]\"` "
            "(in a file: `seeds: [0]`).",
        ),
    ],
)
def test_a_set_value_that_is_not_yaml_or_not_a_list_says_so(item, message, tmp_path, monkeypatch, capsys):
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", item))
    assert line == f"error: {message}"


def test_a_set_value_yaml_cannot_read_is_a_string_unless_it_opens_as_yaml():
    raw: dict = {}
    apply_override(raw, "data.path=*.csv")
    apply_override(raw, "name=it's $HOME *; no")
    assert raw == {"data": {"path": "*.csv"}, "name": "it's $HOME *; no"}
    with pytest.raises(UserError) as refusal:
        apply_override(raw, 'name="a b')
    assert str(refusal.value) == (
        '`--set name="a b` is a YAML syntax error (found unexpected end of stream); did you mean '
        "`--set 'name=\"a b\"'`?"
    )


def smoke_raw(*overrides: str) -> dict:
    raw = load_raw("smoke")
    for item in [*TINY, *overrides]:
        apply_override(raw, item)
    return raw


def refusal_of(*overrides: str) -> str:
    with pytest.raises(UserError) as refusal:
        validate(smoke_raw(*overrides))
    return str(refusal.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: fedit, rounds: -1}", "`rounds` must be 0 or more (0: no federated training), not -1"),
        ("{name: fedit, fraction: 0}", "`fraction` must be in (0, 1], not 0.0"),
        ("{name: fedit, min_clients: 0}", "`min_clients` must be at least 1, not 0"),
        ("{name: fedit, batch_size: 0}", "`batch_size` must be at least 1, not 0"),
        ("{name: fedit, local_steps: 0}", "`local_steps` must be at least 1, not 0"),
        ("{name: fedit, local_epochs: 0}", "`local_epochs` must be above 0, not 0.0"),
        ("{name: fedit, lr: 0}", "`lr` must be above 0, not 0.0"),
        ("{name: fedit, weight_decay: -0.1}", "`weight_decay` must be 0 or more, not -0.1"),
        ("{name: fedit, rank: 0}", "`rank` must be at least 1, not 0"),
        ("{name: fedit, alpha: 0}", "`alpha` must be above 0, not 0.0"),
        ("{name: fedit, dropout: 1}", "`dropout` must be in [0, 1), not 1.0"),
        ("{name: fedit, finetune_epochs: -1}", "`finetune_epochs` must be 0 or more (0: no fine-tuning), not -1.0"),
        ("{name: fedit, finetune_lr: 0}", "`finetune_lr` must be above 0 (or left out, to fine-tune at `lr`), not 0.0"),
        ("{name: lora, epochs: 0}", "`epochs` must be above 0, not 0.0"),
        ("{name: lora, alpha_multiplier: -2}", "`alpha_multiplier` must be above 0, not -2.0"),
        ("{name: ditto, lam: -1}", "`lam` must be 0 or more, not -1.0"),
    ],
)
def test_the_common_method_settings_are_range_checked_at_validation(entry, message):
    name = entry.split(",")[0].removeprefix("{name: ")
    key = message.split("`")[1]
    expected = f"Invalid setting {key!r} of method {name!r} (methods.0.{key}): {message}."
    assert refusal_of(f"methods=[{entry}]") == expected


def test_a_method_entry_with_several_problems_names_them_all():
    with pytest.raises(UserError) as refusal:
        method_config({"name": "lora", "epoch": 1, "lr": 0, "batch_size": 0})
    assert str(refusal.value) == (
        "Method 'lora' has 3 problems:\n"
        "  - Invalid setting 'lr' of method 'lora': `lr` must be above 0, not 0.0.\n"
        "  - Invalid setting 'batch_size' of method 'lora': `batch_size` must be at least 1, not 0.\n"
        "  - Invalid setting 'epoch' of method 'lora': method 'lora' has no such key; did you mean `epochs`?"
    )


def test_the_problems_of_every_section_and_method_entry_come_together():
    message = refusal_of(
        "methods=[{name: fedit, lr: 0}, {name: lora, batch_size: 0}]",
        "base.method={name: fedavg_full, rounds: -1}",
        "eval.batch_size=0",
        "device=gpu",
        "seeds=[]",
    )
    assert message.splitlines() == [
        "The config has 6 problems:",
        "  - `seeds` must list at least one seed; e.g. `seeds: [0]`.",
        "  - Invalid setting 'rounds' of method 'fedavg_full' (base.method.rounds): `rounds` must be 0 or more (0: no "
        "federated training), not -1.",
        "  - Invalid setting 'lr' of method 'fedit' (methods.0.lr): `lr` must be above 0, not 0.0.",
        "  - Invalid setting 'batch_size' of method 'lora' (methods.1.batch_size): `batch_size` must be at least 1, "
        "not 0.",
        "  - Invalid config at eval.batch_size: must be at least 1, not 0.",
        "  - `device` must be cpu, cuda, cuda:N, mps or auto, not 'gpu'.",
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("log.tensorbord=x", "Invalid config at log.tensorbord: `log` has no such key; did you mean `tensorboard`?"),
        ("log.other=x", "Invalid config at log.other: `log` has no such key; its keys are tensorboard, wandb."),
        ("nonsense=1", "Invalid config at nonsense: the config has no such key."),
        (
            "methods=[{name: fedit, aggregation: {robust: median, clip_nrom: 1}}]",
            "Invalid setting 'aggregation.clip_nrom' of method 'fedit' (methods.0.aggregation.clip_nrom): "
            "`methods.0.aggregation` has no such key; did you mean `clip_norm`?",
        ),
        (
            "methods.0.aggregation={robust: median}",
            "Invalid setting 'aggregation' of method 'lora' (methods.0.aggregation): method 'lora' has no such key; "
            "its keys are name, label, epochs, lr, batch_size, alpha_multiplier, dropout.",
        ),
        ("data.train_per_group=-1", "Invalid config at data.train_per_group: must be at least 1, not -1."),
        ("data.test_per_group=0", "Invalid config at data.test_per_group: must be at least 1, not 0."),
        ("data.dirichlet_alpha=0", "Invalid config at data.dirichlet_alpha: must be above 0, not 0."),
        ("data.base_samples=-1", "Invalid config at data.base_samples: must be at least 0, not -1."),
        (  # a value that fails both members of a union (int | float) is one problem
            "engine.secagg={num_shares: many}",
            "Invalid config at engine.secagg.num_shares: Input should be a valid integer, unable to parse string as "
            "an integer.",
        ),
        ("faults=[{clients: [a]}]", "Invalid config at faults.0.kind: required, and not given."),
        (
            "faults=[{kind: nan}, {kind: raise, rounds: [2, -1]}]",
            "Invalid config at faults.1.rounds: fault rounds count from 1, as the log does, so -1 names no round; "
            "write 1 for the first.",
        ),
    ],
)
def test_each_config_problem_names_its_key_path(override, message):
    assert refusal_of(override) == message


def test_misspelt_names_are_told_together_with_a_suggestion():
    message = refusal_of("methods=[{name: lroa}, {name: fedit}]", "data.name=synthetic-xnlii")
    first, *problems = message.splitlines()
    assert first == "The config has 2 problems:" and len(problems) == 2
    assert problems[0].startswith("  - Unknown method 'lroa'; choose one of: ") and problems[0].endswith(
        "; did you mean 'lora' at methods.0.name?"
    )
    assert problems[1].startswith("  - Unknown dataset 'synthetic-xnlii'; choose one of: ") and problems[1].endswith(
        "; did you mean 'synthetic-xnli' at data.name?"
    )


# ---------------------------------------------------------------------------------------------- faults
def test_a_fault_aimed_at_no_method_is_refused_before_the_data_is_built(tmp_path, monkeypatch, capsys):
    from fedpeft.runner import experiment
    from fedpeft.worker import worker

    def never(*_args, **_kwargs):
        raise AssertionError("the data was built")

    monkeypatch.setattr(experiment, "build_data", never)
    monkeypatch.setattr(worker, "build_data", never)
    faults = "faults=[{kind: nan, clients: [lat1-seen-00]}, {kind: raise, methods: [lora, fedtypo]}]"
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", faults))
    assert "faults.1.methods" in line and "'fedtypo'" in line and "name one of: lora." in line, line


def test_a_fault_in_round_0_is_refused_because_rounds_count_from_1(tmp_path, monkeypatch, capsys):
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", "faults=[{kind: raise, rounds: [0]}]"))
    assert line.endswith(
        "Invalid config at faults.0.rounds: fault rounds count from 1, as the log does, so 0 names no round; write 1 "
        "for the first."
    ), line


def test_the_base_stage_is_a_fault_target_only_when_it_is_federated(tmp_path, monkeypatch, capsys):
    faults = "faults=[{kind: nan, methods: [base-stage]}]"
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", faults))  # smoke: centralized
    assert "faults.0.methods" in line and "'base-stage'" in line and "name one of: lora." in line, line
    assert "(base-stage: the rounds of a federated base stage, and base.kind is centralized)" in line, line
    cfg = load_config("smoke", [*TINY, "base.kind=federated", faults])
    assert cfg.faults[0].methods == ["base-stage"]
    labelled = load_config("smoke", [*TINY, "methods.0.label=mine", "faults=[{kind: nan, methods: [mine]}]"])
    assert labelled.faults[0].methods == ["mine"]


@pytest.mark.parametrize(
    ("client", "what"),
    [
        ("no-such-client", "which is no client of the data"),
        ("lat1-unseen-00", "a client of the unseen pool, which never trains"),
    ],
)
def test_a_fault_aimed_at_a_client_that_never_trains_is_refused_before_the_output_exists(
    client, what, tmp_path, monkeypatch, capsys
):
    faults = f"faults=[{{kind: nan, clients: [lat1-seen-00]}}, {{kind: drop, clients: [{client}]}}]"
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", faults))
    assert f"faults.1.clients names '{client}', {what}" in line, line
    assert line.endswith("name clients of the seen pool: lat1-seen-00, lat1-seen-01."), line


def test_a_long_list_of_clients_is_abbreviated():
    pools = {f"c{i:02d}": "seen" for i in range(30)}
    with pytest.raises(UserError) as refusal:
        check_fault_clients([FaultConfig(kind="nan", clients=["c01", "c99"])], pools)
    assert str(refusal.value) == (
        "faults.0.clients names 'c99', which is no client of the data; name clients of the seen pool: c00, c01, c02, "
        "c03, c04, c05, ... (30 in all)."
    )
    check_fault_clients([FaultConfig(kind="nan", clients=["c00", "c29"])], pools)  # all known: no error


# ---------------------------------------------------------------------------------------------- resume line
AWKWARD = [
    "run",
    "my configs/exp one.yaml",
    "--set",
    "methods=[{name: fedit, rounds: 300}]",
    "--set",
    'name=it\'s "quoted" $HOME `date` *; echo no',
    "--out",
    "runs/a b",
]


def test_the_resume_line_pastes_into_a_shell_with_every_argument_intact(tmp_path):
    from fedpeft.cli import resume_command

    line = resume_command(AWKWARD)
    assert line is not None and line.startswith("fedpeft run ")
    assert shlex.split(line) == ["fedpeft", *AWKWARD, "--resume"]
    # The line as a user pastes it, with `fedpeft` standing for a program that prints the arguments it receives.
    echo = f"{shlex.quote(sys.executable)} -c 'import json, sys; print(json.dumps(sys.argv[1:]))'"
    shell = subprocess.run(
        ["bash", "-c", f'fedpeft() {{ {echo} "$@"; }}\n{line}'],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=True,
    )
    assert json.loads(shell.stdout) == [*AWKWARD, "--resume"]
    assert not list(tmp_path.iterdir())  # nothing in the line ran but the stand-in


def test_the_resume_line_keeps_one_resume_and_only_follows_run():
    from fedpeft.cli import resume_command

    assert resume_command(["run", "smoke", "--resume", "--out", "a b"]) == "fedpeft run smoke --resume --out 'a b'"
    assert resume_command(["report", "runs/x"]) is None and resume_command([]) is None


def test_an_interrupted_run_prints_the_quoted_resume_line(tmp_path, monkeypatch, capsys):
    import fedpeft.core.config
    from fedpeft.cli import resume_command

    def interrupt(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fedpeft.core.config, "load_raw", interrupt)
    monkeypatch.setattr("os._exit", lambda code: sys.exit(code))  # never end the test process itself
    code, _, err = cli(monkeypatch, capsys, *AWKWARD)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == f"interrupted; continue it with `{resume_command(AWKWARD)}`."


# A command run as `python -m`, interrupted while a library evaluates a string (dataclasses, namedtuple and the like
# exec generated source): CPython remembers that Ctrl-C as unhandled even once it is caught.
INTERRUPTED_IN_EXEC = """
import sys
from fedpeft.cli import main
import fedpeft.core.config

def interrupt(*_args, **_kwargs):
    exec("raise KeyboardInterrupt", {})

fedpeft.core.config.load_raw = interrupt
sys.argv = ["fedpeft", "run", "smoke", "--out", "x"]
main()
"""


def test_ctrl_c_inside_a_string_exec_still_ends_with_130_under_python_m(tmp_path):
    (tmp_path / "interrupted_in_exec.py").write_text(INTERRUPTED_IN_EXEC)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "interrupted_in_exec"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 130, result.stderr  # not -2: killed by SIGINT after printing the line
    assert result.stderr.strip().splitlines()[-1].startswith("interrupted; continue it with `fedpeft run smoke")


# ---------------------------------------------------------------------------------------------- unknown model
UNKNOWN_MODEL = "model.name=no-such-org/no-such-model"


@pytest.fixture
def probes(monkeypatch) -> list[str]:
    """The endpoints the hub probe is asked about (it still asks them)."""
    from fedpeft.core import hub

    asked: list[str] = []
    real: Callable[..., bool] = hub.hub_answers

    def counted(endpoint: str, *args, **kwargs) -> bool:
        asked.append(endpoint)
        return real(endpoint, *args, **kwargs)

    monkeypatch.setattr(hub, "hub_answers", counted)
    return asked


def hub_requests(caplog) -> list[str]:
    """What huggingface_hub logged: a request it retried, or one that failed."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")]


@pytest.fixture
def hub_unreachable(monkeypatch) -> str:
    """No offline setting, and the hub at a local port where nothing listens; returns that endpoint."""
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    return endpoint


def test_an_unknown_model_with_hf_hub_offline_is_refused_at_once(tmp_path, monkeypatch, capsys, caplog, probes):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", UNKNOWN_MODEL))
    assert line.startswith("error: Model no-such-org/no-such-model is neither a registered name"), line
    assert "in the Hugging Face cache, and HF_HUB_OFFLINE is set; choose one of " in line, line
    assert probes == [] and hub_requests(caplog) == []  # the hub was never asked


def test_an_unknown_model_without_the_hub_is_refused_after_one_probe(
    tmp_path, monkeypatch, capsys, caplog, probes, hub_unreachable
):
    caplog.set_level(logging.DEBUG)
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", UNKNOWN_MODEL))
    assert f"in the Hugging Face cache, and the hub ({hub_unreachable}) cannot be reached; choose" in line, line
    assert probes == [hub_unreachable] and hub_requests(caplog) == []  # one probe, no request retried


def test_a_cached_hub_model_loads_when_the_hub_cannot_be_reached(
    tmp_path, monkeypatch, caplog, probes, hub_unreachable
):
    from huggingface_hub import constants
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    from fedpeft.core.config import ModelConfig
    from fedpeft.models.checkpoints import load_external

    # The layout of the hub cache: models--<org>--<name>/snapshots/<commit>/ and refs/main naming the commit.
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--test-org--tiny-bert"
    snapshot_dir = repo / "snapshots" / commit
    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=3
    )
    BertForSequenceClassification(config).save_pretrained(snapshot_dir)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]) + "\n")
    BertTokenizer(vocab_file=str(vocab)).save_pretrained(snapshot_dir)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    model, tokenizer = load_external(ModelConfig(name="test-org/tiny-bert"), "classification", 3)
    assert model.config.num_labels == 3 and tokenizer is not None
    assert probes == [hub_unreachable]
    assert hub_requests(caplog) == []  # nothing asked the hub afterwards (an adapter_config.json look-up once did)


def test_a_misspelt_preset_gets_the_closest_name_not_the_list(tmp_path, monkeypatch, capsys):
    line = refused(monkeypatch, capsys, tmp_path, ["run", "quickstrat", "--out", str(tmp_path / "run")])
    assert (
        line
        == "error: Unknown preset 'quickstrat'; did you mean 'quickstart' (`fedpeft list presets` lists every preset)?"
    )
    line = refused(monkeypatch, capsys, tmp_path, ["run", "zzzz", "--out", str(tmp_path / "run")])
    assert line.startswith("error: Unknown preset 'zzzz'; choose one of: ") and "quickstart" in line
