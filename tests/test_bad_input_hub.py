"""The ``hub`` dataset's data errors: a hub id neither cached nor a directory while the hub is not asked, a missing
dataset directory, a column the data lacks, more clients than rows, a drawn partition that leaves a client without
examples. `fedpeft run` refuses each in one sentence naming the folder, cache directory or file searched, with exit
code 2, before torch is imported; all but the drawn partition from the data's metadata alone, before ``datasets``
is imported (fedpeft/data/hub_check.py).

The data is written into ``tmp_path`` in the layouts ``datasets`` reads offline: a directory of data files, a
``DatasetDict.save_to_disk`` folder, and a hub id's prepared copy in the ``datasets`` cache; the valid ones are
built through ``datasets`` itself, so the layouts are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pytest
import yaml
from entry_point import cli

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data import hub_check
from fedpeft.data.hub_check import check_hub_data

HUB_ID = "my-org/reviews"
CLIENTS = ("ana", "bo", "cy", "dee")


def rows() -> list[dict]:
    """Ten rows for each of four clients."""
    return [
        {"text": f"{client} review {i}", "label": "pos" if (i + c) % 3 else "neg", "client": client}
        for c, client in enumerate(CLIENTS)
        for i in range(10)
    ]


def splits() -> dict[str, list[dict]]:
    """32 training rows and 8 test rows, two of each client's rows in the test split."""
    return {"train": [r for i, r in enumerate(rows()) if i % 5], "test": [r for i, r in enumerate(rows()) if not i % 5]}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return empty_offline_cache(tmp_path, monkeypatch)


def empty_offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``datasets`` cache, offline, for this process and the processes it starts."""
    folder = tmp_path / "datasets-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_DATASETS_CACHE", str(folder))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return folder


def write_cached(cache: Path, hub_id: str, tables: dict[str, list[dict]], config: str = "default") -> Path:
    """``hub_id``'s prepared copy as ``load_dataset`` leaves it in the cache: one Arrow stream per split beside
    ``dataset_info.json``, in ``<cache>/<org>___<name>/<config>/<version>/<hash>/``."""
    org, name = hub_id.split("/")
    folder = cache / f"{org}___{name}" / config / "0.0.0" / "0123456789abcdef"
    folder.mkdir(parents=True)
    split_infos = datasets.SplitDict(dataset_name=name)
    features = None
    for split, records in tables.items():
        table = datasets.Dataset.from_list(records)
        features = table.features
        with pa.OSFile(str(folder / f"{name}-{split}.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.data.schema) as writer:
                writer.write_table(table.data.table)
        split_infos.add(datasets.SplitInfo(name=split, num_examples=len(records), dataset_name=name))
    info = datasets.DatasetInfo(features=features, config_name=config, dataset_name=name, splits=split_infos)
    info.write_to_directory(str(folder))
    return folder


def write_files(folder: Path, tables: dict[str, list[dict]], suffix: str = ".jsonl") -> Path:
    """A dataset directory of one data file per split (``train.jsonl``, ``test.jsonl``)."""
    folder.mkdir(parents=True)
    for split, records in tables.items():
        path = folder / f"{split}{suffix}"
        if suffix == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        else:
            datasets.Dataset.from_list(records).to_parquet(str(path))
    return folder


def config_file(tmp_path: Path, **data: object) -> Path:
    path = tmp_path / "my.yaml"
    content = {"name": "bad", "data": {"name": "hub", **data}, "model": {"name": "tiny-bert"}}
    path.write_text(yaml.safe_dump(content))
    return path


def refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], config: Path, *expected: str) -> str:
    capsys.readouterr()  # the progress bars of writing the data
    code, _, err = cli(monkeypatch, capsys, "run", str(config), "--out", str(config.parent / "run"))
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for part in expected:
        assert part in err, (part, err)
    assert not (config.parent / "run").exists()
    return err


# ------------------------------------------------------------------------------------------ the layouts read


def test_the_layouts_checked_are_those_datasets_reads(tmp_path: Path, cache: Path) -> None:
    """A cached hub id, a directory of data files and a save_to_disk folder pass the check and build."""
    write_cached(cache, HUB_ID, splits())
    write_files(tmp_path / "files", splits(), ".parquet")
    saved = tmp_path / "saved"
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in splits().items()}).save_to_disk(str(saved))
    for hub_id in (HUB_ID, str(tmp_path / "files"), str(saved)):
        cfg = DataConfig(name="hub", hub_id=hub_id)
        layout = hub_check.find_layout(hub_id, None)
        assert layout is not None and sum(p.rows for p in layout.parts) == 40
        check_hub_data(cfg)
        built = DATASETS.get("hub")(cfg)
        assert [(len(c.train), len(c.test)) for c in built.clients] == [(8, 2)] * 4, hub_id
        assert built.info["test_sets"] == "hub test split"


def test_a_hub_id_is_left_to_datasets_while_the_hub_answers(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub_check, "offline_reason", lambda: None)
    assert hub_check.find_layout("org/not-here", None) is None
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # read by load_dataset before HF_HUB_OFFLINE
    with pytest.raises(UserError, match="HF_DATASETS_OFFLINE is set"):
        hub_check.find_layout("org/not-here", None)


def test_a_layout_read_otherwise_is_left_to_datasets(tmp_path: Path, cache: Path) -> None:
    folder = write_files(tmp_path / "mixed", splits())
    (folder / "notes.txt").write_text("read by the text builder\n")
    assert hub_check.find_layout(str(folder), None) is None
    carded = write_files(tmp_path / "carded", splits())
    (carded / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files: train.jsonl\n---\n")
    assert hub_check.find_layout(str(carded), None) is None


# ------------------------------------------------------------------------------------------------- refusals


def test_a_hub_id_neither_cached_nor_a_directory(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    err = refused(monkeypatch, capsys, config_file(tmp_path, hub_id="org/not-here"), "HF_HUB_OFFLINE is set")
    assert f"Dataset org/not-here is neither a directory (searched {tmp_path.resolve() / 'org' / 'not-here'}" in err
    assert f"nor in the datasets cache (searched {cache / 'org___not-here'})" in err


def test_a_missing_dataset_directory(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    missing = tmp_path / "nope" / "reviews"
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=str(missing)),
        f"data.hub_id {missing} is no directory (searched {missing}: {tmp_path} holds no nope) and no hub id",
    )


def test_a_file_for_a_dataset_directory(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    file = write_files(tmp_path / "ds", splits()) / "train.jsonl"
    refused(
        monkeypatch, capsys, config_file(tmp_path, hub_id=str(file)), f"data.hub_id {file} is a file", "data.name=files"
    )


def test_an_empty_dataset_directory(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    (tmp_path / "ds" / ".hidden").mkdir(parents=True)
    (tmp_path / "ds" / "README.md").write_text("# reviews\n")
    refused(monkeypatch, capsys, config_file(tmp_path, hub_id=str(tmp_path / "ds")), "holds no data files")


def test_a_text_column_the_files_lack(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    folder = write_files(tmp_path / "ds", splits())
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=str(folder), columns={"text": "review"}),
        f"{folder / 'test.jsonl'} has no column 'review' (data.columns.text); its columns are text, label, client",
    )


def test_a_label_column_the_cached_copy_lacks(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    copy = write_cached(cache, HUB_ID, splits())
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=HUB_ID, task="classification", columns={"label": "stars"}),
        f"hub:{HUB_ID} split train (cached in {copy}) has no column 'stars' (data.columns.label)",
    )


def test_a_column_a_saved_split_lacks(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    saved = tmp_path / "saved"
    tables = splits()
    tables["test"] = [{k: v for k, v in r.items() if k != "client"} for r in tables["test"]]
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in tables.items()}).save_to_disk(str(saved))
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=str(saved)),
        f"{saved / 'test'} (split test) has no column 'client' (data.columns.client)",
    )


def test_more_clients_than_rows(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    folder = write_files(tmp_path / "ds", splits(), ".parquet")
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=str(folder), partition="iid", num_clients=21),
        f"The dataset directory {folder} holds 40 rows, too few for data.num_clients=21 clients",
    )
    copy = write_cached(cache, HUB_ID, {**splits(), "validation": rows()})
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=HUB_ID, num_clients=21),
        f"hub:{HUB_ID} (cached in {copy}) holds 40 rows outside its validation split, too few",
    )


def test_a_subset_the_cache_lacks_and_several_cached(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    write_cached(cache, HUB_ID, splits(), config="en")
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=HUB_ID, subset="fr"),
        f"Dataset {HUB_ID} is in the datasets cache ({cache / 'my-org___reviews'}) without the subset 'fr', only en",
    )
    write_cached(cache, HUB_ID, splits(), config="sw")
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=HUB_ID),
        f"Dataset {HUB_ID} has several configurations in the datasets cache ({cache / 'my-org___reviews'}): en, sw",
    )


def test_a_drawn_partition_that_leaves_a_client_without_examples(tmp_path: Path, cache: Path, monkeypatch, capsys):
    """Decided by the draw, not by the metadata: the federation is built before torch is imported."""
    folder = write_files(tmp_path / "ds", splits())
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=str(folder), partition="dirichlet", num_clients=15, dirichlet_alpha=0.05),
        "40 rows could not be split over data.num_clients=15 clients",
    )
    refused(
        monkeypatch,
        capsys,
        config_file(tmp_path, hub_id=str(folder), partition="iid", num_clients=16),
        "has no test examples; lower data.num_clients.",
    )


# ------------------------------------------------------------------------------------- before torch is imported

FRESH_PROCESS_RUN = """
import sys
from fedpeft.cli import main
sys.argv = ["fedpeft", "run", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    print("exit", stop.code, "torch" in sys.modules, "datasets" in sys.modules)
"""


def run_fresh(config: Path, tmp_path: Path) -> tuple[list[str], str]:
    """``fedpeft run CONFIG`` in a fresh interpreter (cwd ``tmp_path``): its exit code and whether torch and
    ``datasets`` were imported by then, and what it wrote to stderr."""
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS_RUN, str(config), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        cwd=tmp_path,
        timeout=120,
    )
    return done.stdout.split(), done.stderr


EARLY = [
    ({"hub_id": "org/not-here"}, "nor in the datasets cache", False),
    ({"hub_id": "{tmp}/nope"}, "is no directory", False),
    ({"hub_id": "{tmp}/ds", "columns": {"text": "review"}}, "has no column 'review'", False),
    ({"hub_id": HUB_ID, "task": "classification", "columns": {"label": "stars"}}, "has no column 'stars'", False),
    ({"hub_id": HUB_ID, "partition": "iid", "num_clients": 21}, "holds 40 rows, too few", False),
    ({"hub_id": "{tmp}/ds", "num_clients": 15, "dirichlet_alpha": 0.05}, "could not be split", True),
]


@pytest.mark.parametrize("case", EARLY, ids=[case[1][:24] for case in EARLY])
def test_hub_data_errors_end_the_run_before_torch_is_imported(case, tmp_path: Path, cache: Path) -> None:
    """Exit 2 with torch never imported, and ``datasets`` neither where the metadata tells."""
    data, message, needs_datasets = case
    write_cached(cache, HUB_ID, splits())
    write_files(tmp_path / "ds", splits())
    data = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in data.items()}
    said, stderr = run_fresh(config_file(tmp_path, **data), tmp_path)
    assert said == ["exit", "2", "False", str(needs_datasets)], stderr
    assert message in stderr
