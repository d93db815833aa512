"""Data errors of the real benchmarks: a ``data.path`` that names nothing, a folder or file missing from the layout
the loader reads, a language or task of the config that the local copy lacks, a renamed column, a hub id the
``datasets`` cache lacks offline. `fedpeft run` refuses each in one sentence naming the folder, file or cache
searched, with exit code 2, before ``datasets`` and torch are imported (fedpeft/data/real/early.py).

The valid layouts are the rehearsal's stand-ins (fedpeft/rehearsal/standin_data.py: every paper dataset in its real
local layout, at a cut size), each copied and then broken; tests/test_rehearsal_data.py builds them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from test_bad_input_hub import (  # a fresh `fedpeft run`; a hub id's cached copy
    empty_offline_cache,
    refused,
    run_fresh,
    write_cached,
)

from fedpeft.cli import _read_data_early
from fedpeft.core.config import DataConfig, load_config
from fedpeft.core.errors import UserError
from fedpeft.data.real.early import EARLY_CHECKS, check_real_data
from fedpeft.data.real.readers import quick_columns
from fedpeft.data.real.sources import check_file_columns
from fedpeft.rehearsal.standin_data import STANDIN_DATASETS, write_standin

# dataset -> (the paper preset, overrides that cut it small, the share of its published sizes written)
STANDINS: dict[str, tuple[str, list[str], float]] = {
    "xnli": ("fedp2eft-xnli", ["data.groups=[en,ar]", "data.train_per_group=20", "data.test_per_group=10"], 1.0),
    "masakhanews": ("fedp2eft-masakhanews", ["data.groups=[hau,eng]"], 0.05),
    "fedaya": ("fedp2eft-fedaya", [], 0.05),
    "sni": ("guidance-sni", ["data.options.train_per_client=20", "data.options.test_per_client=5"], 1.0),
    "dolly": ("flame-dolly", [], 0.01),
    "alpagasus": ("flame-alpagasus", [], 0.01),
    "commonsense": ("potara-commonsense", [], 0.01),
    "flan": ("potara-flan", ["data.train_per_group=20", "data.test_per_group=10"], 1.0),
    "cifar100": ("potara-cifar100", [], 0.01),
    "drake": ("fedmosaic-drake", [], 0.01),
    "hflb": ("fedmosaic-hflb", [], 0.01),
    "fedscope": ("fedmosaic-fedscope", [], 0.01),
}


@pytest.fixture(scope="module")
def standins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DataConfig]:
    """Every paper dataset's stand-in, written once: its data config, read as the real copy would be."""
    root = tmp_path_factory.mktemp("standins")
    written = {}
    for name, (preset, overrides, scale) in STANDINS.items():
        cfg = load_config(preset, overrides)
        standin = write_standin(cfg, root / name, scale=scale)
        written[name] = DataConfig.model_validate({**cfg.data.model_dump(exclude_unset=True), **standin.data_updates})
    return written


@pytest.fixture(autouse=True)
def offline_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``datasets`` cache, offline, for this process and the processes it starts."""
    return empty_offline_cache(tmp_path, monkeypatch)


def copied(standins: dict[str, DataConfig], name: str, tmp_path: Path, **updates: Any) -> tuple[DataConfig, Path]:
    """A copy of ``name``'s stand-in in ``tmp_path`` (to break), its config pointing at it, and the copy's folder."""
    original = Path(str(standins[name].path))
    top = next(parent for parent in (original, *original.parents) if parent.name == name)
    copy = tmp_path / name
    shutil.copytree(top, copy)
    path = copy / original.relative_to(top)
    return standins[name].model_copy(update={"path": str(path), **updates}), path


def config_file(tmp_path: Path, data: DataConfig) -> Path:
    path = tmp_path / "my.yaml"
    content = {"name": "bad", "data": data.model_dump(mode="json", exclude_unset=True), "model": {"name": "tiny-bert"}}
    path.write_text(yaml.safe_dump(content))
    return path


def rename_parquet_column(path: Path, old: str, new: str) -> None:
    table = pq.read_table(path)
    pq.write_table(table.rename_columns([new if name == old else name for name in table.column_names]), path)


def rename_json_key(path: Path, old: str, new: str) -> None:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    text = "".join(json.dumps({new if k == old else k: v for k, v in row.items()}) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8")


# ----------------------------------------------------------------------------------------------- the valid ones


def test_every_standin_dataset_has_an_early_check() -> None:
    assert set(EARLY_CHECKS) == STANDIN_DATASETS - {"super-natural-instructions"}
    check_real_data(DataConfig(name="synthetic-xnli"))  # synthetic data has nothing to check


def test_the_valid_layouts_pass_without_datasets_or_torch(standins: dict[str, DataConfig], tmp_path: Path) -> None:
    """Every stand-in passes its check in a fresh process that imports neither ``datasets`` nor torch (the stand-ins
    build with the real loaders in tests/test_rehearsal_data.py)."""
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps([cfg.model_dump(mode="json", exclude_unset=True) for cfg in standins.values()]))
    program = (
        "import json, sys\n"
        "from fedpeft.core.config import DataConfig\n"
        "from fedpeft.data.real.early import check_real_data\n"
        f"for data in json.loads(open({str(configs)!r}).read()):\n"
        "    check_real_data(DataConfig.model_validate(data))\n"
        "print('datasets' in sys.modules, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_the_alias_and_a_cached_hub_copy_pass(standins: dict[str, DataConfig], offline_empty_cache: Path) -> None:
    check_real_data(standins["sni"].model_copy(update={"name": "super-natural-instructions"}))
    rows = [{"instruction": f"q{i}", "context": "", "response": f"a{i}", "category": "open_qa"} for i in range(20)]
    write_cached(offline_empty_cache, "databricks/databricks-dolly-15k", {"train": rows})
    check_real_data(DataConfig(name="dolly"))


def test_the_columns_are_told_from_the_files_start(tmp_path: Path) -> None:
    """A Parquet schema, a CSV or TSV header, the first record of JSON Lines or a JSON list; a column that only later
    records hold is found by reading the file, as the loader does, and is not refused."""
    rows = [{"premise": "p", "hypothesis": "h"}, {"premise": "p", "hypothesis": "h", "label": 1}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=2))
    (tmp_path / "a.csv").write_text("premise,hypothesis,label\np,h,1\n")
    (tmp_path / "a.tsv").write_text("premise\thypothesis\np\th\n")
    pq.write_table(pa.table({"premise": ["p"], "label": [0]}), tmp_path / "a.parquet")
    assert [quick_columns(tmp_path / f"a.{ext}") for ext in ("jsonl", "json", "csv", "tsv", "parquet")] == [
        ["premise", "hypothesis"],
        ["premise", "hypothesis"],
        ["premise", "hypothesis", "label"],
        ["premise", "hypothesis"],
        ["premise", "label"],
    ]
    schema = tuple((column,) for column in ("premise", "hypothesis", "label"))
    for ext in ("jsonl", "json", "csv"):
        check_file_columns([tmp_path / f"a.{ext}"], [schema], "XNLI en train split", "premise, hypothesis, label")
    with pytest.raises(UserError, match=r"a.tsv \(XNLI en train split\) lacks column\(s\) label \(it has premise, hy"):
        check_file_columns([tmp_path / "a.tsv"], [schema], "XNLI en train split", "premise, hypothesis, label")


def test_a_rehearsal_leaves_data_it_stands_in_for_alone() -> None:
    cfg = load_config("fedp2eft-xnli", ["rehearse.measure_steps=false"])
    assert cfg.rehearse is not None and cfg.data.path is None
    assert _read_data_early(cfg) is None  # facebook/xnli is not cached: the rehearsal writes a stand-in
    missing = cfg.model_copy(update={"rehearse": None})
    with pytest.raises(UserError, match="facebook/xnli"):
        _read_data_early(missing)


# ------------------------------------------------------------------------------------------------- refusals


def _missing_language(path: Path) -> None:
    shutil.rmtree(path / "ar")


def _xnli_label_renamed(path: Path) -> None:
    rename_parquet_column(path / "en" / "train.parquet", "label", "gold")


def _masakhanews_test_file_removed(path: Path) -> None:
    (path / "hau" / "test.parquet").unlink()


def _masakhanews_text_renamed(path: Path) -> None:
    rename_parquet_column(path / "eng" / "test.parquet", "headline_text", "body")  # the preset's text_field


def _fedaya_file_removed(path: Path) -> None:
    (path / "aya_38c_25k.json").unlink()


def _flan_task_removed(path: Path) -> None:
    shutil.rmtree(path / "sst2")


def _flan_inputs_renamed(path: Path) -> None:
    rename_json_key(path / "mnli" / "test.jsonl", "inputs", "question")


def _commonsense_task_removed(path: Path) -> None:
    shutil.rmtree(path / "piqa")


def _commonsense_answer_renamed(path: Path) -> None:
    rename_json_key(path / "boolq" / "train.jsonl", "answer", "label")


def _cifar_image_renamed(path: Path) -> None:
    rename_parquet_column(path / "train.parquet", "img", "picture")


def _cifar_test_removed(path: Path) -> None:
    (path / "test.parquet").unlink()


def _dolly_category_renamed(path: Path) -> None:
    rename_json_key(path, "category", "kind")


def _alpagasus_output_renamed(path: Path) -> None:
    records = json.loads(path.read_text(encoding="utf-8"))
    renamed = [{"instruction": r["instruction"], "input": r["input"], "answer": r["output"]} for r in records]
    path.write_text(json.dumps(renamed))


def _mosaic_test_file_removed(path: Path) -> None:
    task = next(iter(json.loads((path / "clients.json").read_text()).values()))[0]
    (path / "tasks" / task / "test.jsonl").unlink()


def _mosaic_manifest_removed(path: Path) -> None:
    (path / "clients.json").unlink()


def _mosaic_images_removed(path: Path) -> None:
    shutil.rmtree(path / "images")


def _nothing(path: Path) -> None:
    pass


# (dataset, config updates, how the copy is broken, what the sentence says; "{path}" is the copy's data.path)
BROKEN: list[tuple[str, dict[str, Any], Callable[[Path], None], str]] = [
    ("xnli", {}, _missing_language, "{path} has no directory for language(s) ar; expected <path>/<lang>/"),
    ("xnli", {}, _xnli_label_renamed, "{path}/en/train.parquet (XNLI en train split) lacks column(s) label"),
    ("xnli", {"path": "{path}/elsewhere"}, _nothing, "data.path {path}/elsewhere does not exist (searched"),
    ("xnli", {"groups": ["en", "xx"]}, _nothing, "Unknown XNLI language(s) xx in data.groups"),
    ("masakhanews", {}, _masakhanews_test_file_removed, "{path}/hau has no test file; expected"),
    ("masakhanews", {}, _masakhanews_text_renamed, "(MasakhaNEWS eng test split) lacks column(s) headline_text"),
    ("masakhanews", {"groups": ["hau", "yor"]}, _nothing, "{path} has no directory for language(s) yor"),
    ("fedaya", {"groups": ["de"]}, _nothing, "names language(s) de that {path}/aya_38c_25k.json does not contain"),
    ("fedaya", {}, _fedaya_file_removed, "{path} holds no JSON file and no aya_38c_25k.json"),
    ("sni", {"options": {"tasks": ["task9999_missing"]}}, _nothing, "task9999_missing that {path}/tasks does not"),
    ("sni", {"options": {"num_tasks": 40}}, _nothing, "{path}/tasks holds 16 tasks, fewer than the 40 + 0"),
    ("dolly", {}, _dolly_category_renamed, "databricks-dolly-15k.jsonl (Dolly-15k records) lacks column(s) category"),
    ("dolly", {"path": "{path}.missing"}, _nothing, "data.path {path}.missing does not exist (searched"),
    ("alpagasus", {}, _alpagasus_output_renamed, "alpaca_t45.json (AlpaGasus records) lacks column(s) output"),
    ("commonsense", {}, _commonsense_task_removed, "{path} has no directory for piqa"),
    ("commonsense", {}, _commonsense_answer_renamed, "{path}/boolq/train.jsonl (commonsense boolq train split) lacks"),
    ("flan", {}, _flan_task_removed, "{path} has no directory sst2/"),
    ("flan", {}, _flan_inputs_renamed, "{path}/mnli/test.jsonl (FLAN mnli test split) lacks column(s) inputs"),
    ("cifar100", {}, _cifar_image_renamed, "{path}/train.parquet (CIFAR-100 train split) lacks column(s) img"),
    ("cifar100", {}, _cifar_test_removed, "{path} has no test file"),
    ("drake", {}, _mosaic_test_file_removed, "test.jsonl is missing; every task directory needs"),
    ("hflb", {}, _mosaic_manifest_removed, "hflb: {path}/clients.json is missing"),
    ("drake", {}, _mosaic_images_removed, "does not exist under {path}"),
    ("fedscope", {"path": "{path}/elsewhere"}, _nothing, "data.path {path}/elsewhere does not exist (searched"),
]


@pytest.mark.parametrize("case", BROKEN, ids=[f"{c[0]}-{c[2].__name__.strip('_')}-{i}" for i, c in enumerate(BROKEN)])
def test_a_broken_layout_ends_the_run_in_one_sentence(case, standins, tmp_path, monkeypatch, capsys) -> None:
    name, updates, damage, expected = case
    data, path = copied(standins, name, tmp_path)
    damage(path)
    filled = {key: value.format(path=path) if isinstance(value, str) else value for key, value in updates.items()}
    refused(monkeypatch, capsys, config_file(tmp_path, data.model_copy(update=filled)), expected.format(path=path))


HUB_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"name": "xnli", "groups": ["en"]}, "facebook/xnli (config en) is not in the datasets cache (searched {cache}/"),
    ({"name": "commonsense", "groups": ["arc-c"]}, "allenai/ai2_arc (config ARC-Challenge) is not in the datasets"),
    ({"name": "alpagasus"}, "mlabonne/alpagasus is not in the datasets cache (searched {cache}/mlabonne___alpagasus)"),
    ({"name": "flan"}, "Muennighoff/flan is not in the datasets cache"),
    ({"name": "sni"}, "Muennighoff/natural-instructions is not in the datasets cache"),
    (
        {"name": "cifar100", "hub_id": "/no/such/copy"},
        "data.hub_id /no/such/copy is no directory (searched /no/such/copy",
    ),
]


@pytest.mark.parametrize("case", HUB_REFUSALS, ids=[c[0]["name"] for c in HUB_REFUSALS])
def test_a_hub_id_the_cache_lacks_offline(case, tmp_path, offline_empty_cache, monkeypatch, capsys) -> None:
    data, expected = case
    config = config_file(tmp_path, DataConfig.model_validate(data))
    err = refused(monkeypatch, capsys, config, expected.format(cache=offline_empty_cache))
    if "cache" in expected:
        assert "HF_HUB_OFFLINE is set" in err and "or set data.path to a local copy" in err


def test_a_cached_copy_without_a_configuration_split_or_column(tmp_path, offline_empty_cache, monkeypatch, capsys):
    def run(data: DataConfig, *expected: str) -> None:
        refused(monkeypatch, capsys, config_file(tmp_path, data), *expected)

    rows = [{"premise": "p", "hypothesis": "h", "label": 0}] * 4
    write_cached(offline_empty_cache, "facebook/xnli", {"train": rows, "test": rows}, config="en")
    check_real_data(DataConfig(name="xnli", groups=["en"]))
    run(DataConfig(name="xnli", groups=["en", "fr"]), "(config fr) is not in", "holds only the configuration(s) en")
    write_cached(offline_empty_cache, "facebook/xnli", {"train": rows}, config="sw")
    run(DataConfig(name="xnli", groups=["sw"]), "facebook/xnli (config sw) has no test split in the datasets cache")
    write_cached(offline_empty_cache, "databricks/databricks-dolly-15k", {"train": [{"instruction": "q"}] * 4})
    run(
        DataConfig(name="dolly"),
        "The cached copy of databricks/databricks-dolly-15k",
        "lacks column(s) context, response",
    )


# ------------------------------------------------------------------------------------- before torch is imported

EARLY = [BROKEN[0], BROKEN[5], BROKEN[9], BROKEN[18], BROKEN[20], BROKEN[7]]


@pytest.mark.parametrize("case", EARLY, ids=[f"{c[0]}-{c[2].__name__.strip('_')}" for c in EARLY])
def test_benchmark_data_errors_end_the_run_before_torch_is_imported(case, standins, tmp_path: Path) -> None:
    """Exit 2 with neither torch nor ``datasets`` imported."""
    name, updates, damage, expected = case
    data, path = copied(standins, name, tmp_path)
    damage(path)
    data = data.model_copy(update={k: v.format(path=path) if isinstance(v, str) else v for k, v in updates.items()})
    said, stderr = run_fresh(config_file(tmp_path, data), tmp_path)
    assert said == ["exit", "2", "False", "False"], stderr
    assert expected.format(path=path) in stderr
