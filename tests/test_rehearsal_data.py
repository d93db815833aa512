"""Stand-in data of a rehearsal: every paper preset's real dataset written in its real layout, read back by the real
loader at the federation's true shape (fedpeft.planning.federation's numbers), with the true schema, label set,
languages or tasks, and deterministic. Full-size stand-ins that take more than a few seconds are checked at a cut
size here and at full size under the slow marker."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import fedpeft.data.catalog  # noqa: F401  (registers the builders)
from fedpeft.core.config import ExperimentConfig, load_config
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.types import FederatedData
from fedpeft.planning.federation import COMMONSENSE_SIZES, MASAKHANEWS_SIZES, Federation, federation_of
from fedpeft.rehearsal import standin_data
from fedpeft.rehearsal.standin_data import (
    STANDIN_DATASETS,
    StandIn,
    hub_dataset_cached,
    real_data_available,
    write_standin,
)

PAPER_PRESETS = [
    "fedp2eft-xnli", "fedp2eft-masakhanews", "fedp2eft-fedaya", "potara-flan", "potara-commonsense",
    "potara-cifar100", "flame-alpagasus", "flame-alpagasus-dense", "flame-dolly", "flame-dolly-dense",
    "guidance-sni", "fedmosaic-drake", "fedmosaic-hflb", "fedmosaic-fedscope",
]  # fmt: skip
# Stand-ins written and read in a few seconds at full size; the others are checked at a cut size (and, slow, full).
QUICK_PRESETS = [
    "fedp2eft-fedaya", "potara-flan", "flame-alpagasus", "flame-alpagasus-dense", "flame-dolly", "flame-dolly-dense",
    "guidance-sni", "fedmosaic-fedscope",
]  # fmt: skip
LARGE_PRESETS = ["fedp2eft-xnli", "fedp2eft-masakhanews", "potara-commonsense", "potara-cifar100", "fedmosaic-drake",
                 "fedmosaic-hflb"]  # fmt: skip


@pytest.fixture(autouse=True)
def empty_hub_cache(monkeypatch, tmp_path):
    """No Hugging Face cache: the real data is never here, whatever this machine's cache holds."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))


def stand_in(cfg: ExperimentConfig, root: Path, scale: float = 1.0) -> tuple[StandIn, ExperimentConfig, FederatedData]:
    """Write the stand-in, point the config at it and build the federation with the real loader."""
    written = write_standin(cfg, root, scale=scale)
    stood = cfg.model_copy(update={"data": cfg.data.model_copy(update=written.data_updates)})
    return written, stood, DATASETS.get(stood.data.name)(stood.data)


def shape(data: FederatedData) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    clients, train, test = Counter[str](), Counter[str](), Counter[str]()
    for client in data.clients:
        clients[client.pool] += 1
        train[client.pool] += len(client.train)
        test[client.pool] += len(client.test)
    return dict(clients), dict(train), dict(test)


def assert_true_shape(data: FederatedData, planned: Federation, tolerance: int = 0) -> None:
    """The built federation has the planned clients per pool and, where the plan knows them, its train and test rows
    within ``tolerance`` (the classification loaders move a row between a client's train and test, keeping their sum;
    the instruction sets round each client's 80 / 10 / 10 cut)."""
    clients, train, test = shape(data)
    assert clients == {pool: n for pool, n in planned.clients.items() if n}
    for pool in clients:
        if planned.train_rows[pool] is None:
            continue
        assert abs(train[pool] - planned.train_rows[pool]) <= tolerance
        assert abs(test[pool] - planned.test_rows[pool]) <= tolerance
        if data.task == "classification":
            assert train[pool] + test[pool] == planned.train_rows[pool] + planned.test_rows[pool]


def check_schema(name: str, written: StandIn, cfg: ExperimentConfig, data: FederatedData) -> None:
    """What the real loader made of the stand-in: the dataset's true label set, groups, columns and prompt format."""
    path = Path(written.data_updates["path"])
    assert "not the real dataset" in written.description and "\n" not in written.description
    assert 0 < len(written.texts) <= standin_data.TOKENIZER_TEXTS or name == "cifar100"
    if name == "xnli":
        assert data.label_names == ["entailment", "neutral", "contradiction"]
        assert data.groups == (cfg.data.groups or list(standin_data.XNLI_LANGUAGES))
        table = pq.read_table(path / data.groups[0] / "train.parquet")
        assert table.column_names == ["premise", "hypothesis", "label"]
        assert all(re.fullmatch(r"[a-z]{2}-(seen|unseen)-\d\d", c.client_id) for c in data.clients)
        labels = Counter(e["label"] for c in data.clients for e in c.train)
        assert set(labels) == {0, 1, 2}
        assert all(e["text"] and e["text_pair"] for c in data.clients for e in c.train)
    elif name == "masakhanews":
        assert data.label_names == list(standin_data.MASAKHANEWS_LABELS)
        table = pq.read_table(path / data.groups[0] / "train.parquet")
        assert table.column_names == ["label", "headline", "text", "headline_text", "url"]
        lengths = [len(e["text"].split()) for c in data.clients[:20] for e in c.train]
        assert np.mean(lengths) > 200  # the preset reads headline_text: headline and article
    elif name == "fedaya":
        assert set(data.groups) == set(standin_data.AYA_CLIENTS_PER_LANGUAGE)
        assert all(re.fullmatch(r"[0-9a-f]{64}", c.client_id) for c in data.clients)
        for client in data.clients:
            assert abs(len(client.test) / (len(client.train) + len(client.test)) - 0.2) < 0.02
    elif name == "sni":
        assert len(data.groups) == cfg.data.options["num_tasks"]
        assert all(len(c.train) == 500 and len(c.test) == 50 for c in data.clients)
        example = data.clients[0].train[0]
        assert example["prompt"].startswith("Definition: ") and example["prompt"].endswith("\nOutput:")
    elif name in ("dolly", "alpagasus"):
        assert all(e["prompt"].startswith("Below is an instruction") for c in data.clients for e in c.train[:5])
        counts = data.info["samples_per_category"]
        if name == "dolly":
            assert counts == {c: n for c, (n, _) in sorted(standin_data.DOLLY_CATEGORIES.items())}
        else:
            assert set(counts) == set(standin_data.ALPAGASUS_TYPES)  # every type of the verb rule
        assert any("### Input:" in e["prompt"] for c in data.clients for e in c.train)
    elif name == "flan":
        assert data.groups == list(standin_data.FLAN_TASKS)
        mnli = next(c for c in data.clients if c.group == "mnli")
        assert {e["response"] for e in mnli.train} == {"yes", "it is not possible to tell", "no"}
        assert "OPTIONS:\n- yes" in mnli.train[0]["prompt"]
    elif name == "commonsense":
        assert data.groups == list(standin_data.COMMONSENSE_TASKS)
        for client in data.clients:
            example = client.train[0]
            assert example["answer"] in example["options"] and "Answer format:" in example["prompt"]
    elif name == "cifar100":
        assert data.label_names == standin_data.CIFAR100_FINE
        image = data.clients[0].train[0]["image"]
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8
        assert len({e["label"] for c in data.clients for e in c.train}) == 100
    else:  # FedMosaic's task directories
        assert data.name == name
        examples = [e for c in data.clients for e in c.train]
        if name == "fedscope":
            assert all("image" not in e for e in examples)
            assert {e["stage"] for e in examples} == {0}  # the preset's static setting
        else:
            images = [e["image"] for e in examples[:50]] + [e["image"] for e in data.base_train[:50]]
            for image in images:
                assert all(Path(p).is_file() for p in (image if isinstance(image, list) else [image]))
            assert {e["stage"] for e in examples} == {0, 1, 2, 3}  # the preset's dynamic setting: 4 tasks
        assert len(data.base_train) == cfg.data.base_samples


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_every_paper_preset_has_a_standin(preset):
    cfg = load_config(preset, [])
    assert cfg.data.name in STANDIN_DATASETS
    assert not real_data_available(cfg)  # no cache, no local copy here


@pytest.mark.parametrize("preset", QUICK_PRESETS)
def test_quick_presets_come_out_at_their_true_shape(preset, tmp_path):
    cfg = load_config(preset, [])
    written, stood, data = stand_in(cfg, tmp_path)
    assert real_data_available(stood)
    name = cfg.data.name
    if name in ("drake", "hflb", "fedscope"):  # sizes nobody published: the plan counts the directory
        assert_true_shape(data, federation_of(stood))
    elif name == "fedaya":  # the release publishes the total; clients differ in size
        planned = federation_of(cfg)
        clients, train, test = shape(data)
        assert clients == planned.clients
        assert sum(train.values()) + sum(test.values()) == standin_data.FEDAYA_SAMPLES
    else:
        assert_true_shape(data, federation_of(cfg), tolerance=2 * len(data.clients))
    check_schema(name, written, cfg, data)


def test_xnli_at_its_true_per_language_shape(tmp_path):
    """XNLI cut to four languages (one per script family), each at the preset's 20 clients and 2,000 / 500 rows
    per pool."""
    cfg = load_config("fedp2eft-xnli", ["data.groups=[en,ar,hi,zh]"])
    written, _, data = stand_in(cfg, tmp_path)
    assert_true_shape(data, federation_of(cfg), tolerance=20)
    check_schema("xnli", written, cfg, data)
    assert len(data.clients) == 4 * 2 * 20


def test_masakhanews_keeps_the_real_size_skew_at_a_cut_size(tmp_path):
    cfg = load_config("fedp2eft-masakhanews", [])
    written, _, data = stand_in(cfg, tmp_path, scale=0.2)
    clients, train, test = shape(data)
    assert clients == {"seen": 160, "unseen": 160}
    expected = sum(round(MASAKHANEWS_SIZES[lang][0] * 0.2) // 2 + round(MASAKHANEWS_SIZES[lang][1] * 0.2) // 2
                   for lang in MASAKHANEWS_SIZES)  # fmt: skip
    assert train["seen"] + test["seen"] == expected
    per_language = data.info["group_sizes"]
    assert per_language["eng"]["train_per_pool"] > 4 * per_language["lin"]["train_per_pool"]  # 3,309 vs 608
    check_schema("masakhanews", written, cfg, data)


def test_commonsense_at_a_cut_size(tmp_path):
    cfg = load_config("potara-commonsense", [])
    written, _, data = stand_in(cfg, tmp_path, scale=0.1)
    for client in data.clients:
        train, test = COMMONSENSE_SIZES[client.group]
        assert len(client.train) == min(1000, round(train * 0.1))
        assert len(client.test) == min(500, round(test * 0.1))
    check_schema("commonsense", written, cfg, data)


def test_cifar100_at_a_cut_size(tmp_path):
    cfg = load_config("potara-cifar100", [])
    written, _, data = stand_in(cfg, tmp_path, scale=0.05)
    clients, train, test = shape(data)
    assert clients == {"seen": 10} and train["seen"] + test["seen"] == 3000
    check_schema("cifar100", written, cfg, data)


@pytest.mark.parametrize("preset", ["fedmosaic-drake", "fedmosaic-hflb"])
def test_fedmosaic_images_at_a_cut_size(preset, tmp_path):
    cfg = load_config(preset, ["data.base_samples=100"])
    written, stood, data = stand_in(cfg, tmp_path, scale=0.02)
    assert_true_shape(data, federation_of(stood))
    assert len(data.clients) == sum(cfg.assign.counts.values())
    plan = json.loads((Path(written.data_updates["path"]) / "clients.json").read_text())
    assert all(len(tasks) == 4 for tasks in plan.values())
    if preset == "fedmosaic-drake":
        assert len({t for tasks in plan.values() for t in tasks}) == 40
        assert any(isinstance(e["image"], list) for c in data.clients for e in c.train)  # multi-image tasks
        assert any("choices :" in e["prompt"] for c in data.clients for e in c.train)
    check_schema(cfg.data.name, written, cfg, data)


@pytest.mark.slow
@pytest.mark.parametrize("preset", LARGE_PRESETS)
def test_large_presets_come_out_at_their_true_shape(preset, tmp_path):
    cfg = load_config(preset, [])
    written, stood, data = stand_in(cfg, tmp_path)
    name = cfg.data.name
    planned = federation_of(stood if name in ("drake", "hflb") else cfg)
    tolerance = {"xnli": 300, "masakhanews": 160}.get(name, 0)  # a row moved per client at most
    assert_true_shape(data, planned, tolerance)
    check_schema(name, written, cfg, data)


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_standins_are_deterministic_and_follow_the_seed(tmp_path):
    cfg = load_config("guidance-sni", [])
    first = write_standin(cfg, tmp_path / "a")
    again = write_standin(cfg, tmp_path / "b")
    other = write_standin(load_config("guidance-sni", ["data.seed=1"]), tmp_path / "c")
    assert first.texts == again.texts and first.texts != other.texts
    assert tree_digest(tmp_path / "a" / "sni") == tree_digest(tmp_path / "b" / "sni")
    assert tree_digest(tmp_path / "a" / "sni") != tree_digest(tmp_path / "c" / "sni")
    assert first.data_updates == {"path": str(tmp_path / "a" / "sni"), "hub_id": None}


def test_a_standin_is_reused_for_the_same_data_and_rewritten_for_other(tmp_path):
    cfg = load_config("potara-flan", ["data.groups=[mnli,sst2]", "data.train_per_group=50", "data.test_per_group=10"])
    first = write_standin(cfg, tmp_path)
    marker = tmp_path / "flan" / "mnli" / "train.jsonl"
    stamp = marker.stat().st_mtime_ns
    assert write_standin(cfg, tmp_path) == first and marker.stat().st_mtime_ns == stamp
    bigger = load_config("potara-flan", ["data.groups=[mnli]", "data.train_per_group=80"])
    _, _, data = stand_in(bigger, tmp_path)
    assert [len(c.train) for c in data.clients] == [80] and not (tmp_path / "flan" / "sst2").exists()
    (tmp_path / "dolly").mkdir()
    (tmp_path / "dolly" / "mine.jsonl").write_text("{}\n")
    with pytest.raises(UserError, match="holds no stand-in written here"):
        write_standin(load_config("flame-dolly", []), tmp_path)


def test_languages_have_their_own_scripts_and_words(tmp_path):
    cfg = load_config("fedp2eft-xnli", ["data.groups=[en,fr,ru,el,ar,hi,th,zh]", "data.train_per_group=20",
                                        "data.test_per_group=5", "data.clients_per_group=2"])  # fmt: skip
    written = write_standin(cfg, tmp_path)
    scripts = {"ru": "\u0400-\u04ff", "el": "\u0370-\u03ff", "ar": "\u0600-\u06ff", "hi": "\u0900-\u097f",
               "th": "\u0e00-\u0e7f", "zh": "\u4e00-\u9fff"}  # fmt: skip
    vocabulary = {}
    for lang in cfg.data.groups:
        premises = pq.read_table(Path(written.data_updates["path"]) / lang / "train.parquet")["premise"].to_pylist()
        letters = [ch for ch in "".join(premises) if ch.isalpha()]
        if lang in scripts:
            inside = sum(bool(re.match(f"[{scripts[lang]}]", ch)) for ch in letters)
            assert inside / len(letters) > 0.95, lang
        else:
            assert all(ch.isascii() or lang == "fr" for ch in letters)
        vocabulary[lang] = {w.strip(".,") for p in premises for w in p.lower().split()}
    assert len(vocabulary["en"] & vocabulary["fr"]) < 0.2 * len(vocabulary["en"])
    assert any(ch in "éèêàçù" for ch in "".join(vocabulary["fr"]))


def test_text_lengths_follow_the_table(tmp_path):
    cfg = load_config("fedp2eft-xnli", ["data.groups=[en]", "data.train_per_group=1000", "data.unseen_pool=false"])
    written = write_standin(cfg, tmp_path)
    table = pq.read_table(Path(written.data_updates["path"]) / "en" / "train.parquet")
    for column in ("premise", "hypothesis"):
        mean = np.mean([len(t.split()) for t in table[column].to_pylist()])
        assert abs(mean / standin_data.MEAN_WORDS["xnli"][column] - 1) < 0.1


def test_datasets_without_a_standin_are_refused_or_need_none(tmp_path):
    assert real_data_available(load_config("smoke", []))  # synthetic: nothing to stand in
    files = load_config("smoke", ["data.name=files", f"data.path={tmp_path}"])
    assert real_data_available(files)
    with pytest.raises(UserError, match="no generated stand-in for dataset files"):
        write_standin(files, tmp_path)
    with pytest.raises(UserError, match="data.groups names xx"):
        write_standin(load_config("fedp2eft-xnli", ["data.groups=[en,xx]"]), tmp_path)


def test_the_hub_cache_makes_the_real_data_available(tmp_path):
    from huggingface_hub import constants

    cfg = load_config("flame-dolly", [])
    assert not real_data_available(cfg)
    snapshot = Path(constants.HF_HUB_CACHE) / "datasets--databricks--databricks-dolly-15k" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("card\n")
    assert real_data_available(cfg)
    # The datasets cache: a prepared copy per configuration, <namespace>___<name in snake case>/<config>/<ver>/<hash>.
    xnli = load_config("fedp2eft-xnli", ["data.groups=[en,fr]"])
    prepared = tmp_path / "hf" / "datasets" / "facebook___xnli"
    (prepared / "en" / "0.0.0" / "abc").mkdir(parents=True)
    assert hub_dataset_cached("facebook/xnli", "en") and not real_data_available(xnli)
    (prepared / "fr" / "0.0.0" / "abc").mkdir(parents=True)
    assert real_data_available(xnli)
    assert hub_dataset_cached(str(tmp_path))  # a local dataset directory given as the hub id
    fedaya = load_config("fedp2eft-fedaya", [])
    assert not real_data_available(fedaya)  # a local file only
    assert real_data_available(
        fedaya.model_copy(update={"data": fedaya.data.model_copy(update={"path": str(tmp_path)})})
    )


def test_tables_agree_with_the_loaders():
    from fedpeft.data.real import alpagasus, cifar100, commonsense, dolly, fedaya, flan, masakhanews, sni, xnli

    assert standin_data.DEFAULT_HUB_IDS == {
        "xnli": xnli.DEFAULT_HUB_ID, "masakhanews": masakhanews.DEFAULT_HUB_ID, "sni": sni.DEFAULT_HUB_ID,
        "dolly": dolly.DOLLY_HUB_ID, "alpagasus": alpagasus.ALPAGASUS_HUB_ID, "flan": flan.DEFAULT_HUB_ID,
        "cifar100": cifar100.DEFAULT_HUB_ID,
    }  # fmt: skip
    assert standin_data.COMMONSENSE_HUB == {task: hub[:2] for task, hub in commonsense.HUB.items()}
    assert standin_data.COMMONSENSE_TASKS == commonsense.TASKS and standin_data.FLAN_TASKS == flan.TASKS
    assert list(standin_data.XNLI_LABELS) == xnli.XNLI_LABELS
    assert list(standin_data.MASAKHANEWS_LABELS) == masakhanews.MASAKHANEWS_LABELS
    assert tuple(standin_data.DOLLY_CATEGORIES) == dolly.DOLLY_CATEGORIES
    assert set(standin_data.ALPAGASUS_TYPES) == {*alpagasus.INSTRUCTION_TYPES, "other"}
    assert set(standin_data.AYA_CLIENTS_PER_LANGUAGE) == set(fedaya.FEDAYA_LANGUAGES)
    assert sum(standin_data.AYA_CLIENTS_PER_LANGUAGE.values()) == 38
    languages = {*xnli.XNLI_LANGUAGES, *masakhanews.MASAKHANEWS_LANGUAGES, *fedaya.FEDAYA_LANGUAGES}
    assert languages <= set(standin_data.LANGUAGE_SCRIPTS)
    fine = standin_data.CIFAR100_FINE
    assert len(set(fine)) == 100 and fine == sorted(fine)
    assert sorted(f for fines in standin_data.CIFAR100_COARSE.values() for f in fines) == fine
    assert sum(n for n, _ in standin_data.DOLLY_CATEGORIES.values()) == 15_011


def test_writing_a_standin_imports_no_torch(tmp_path):
    code = (
        "import sys; from fedpeft.core.config import load_config; "
        "from fedpeft.rehearsal.standin_data import write_standin; "
        f"write_standin(load_config('guidance-sni', []), {str(tmp_path)!r}); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
