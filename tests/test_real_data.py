"""The real-dataset loaders (XNLI, MasakhaNEWS, Fed-Aya) on the small fixture files of tests/fixtures/.

The hub code path is exercised by monkeypatching ``datasets.load_dataset`` to return fixture DatasetDicts.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import datasets
import pandas as pd
import pytest

import fedpeft.data.real  # noqa: F401  (registers the builders)
from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.real import MASAKHANEWS_LABELS, XNLI_LABELS
from fedpeft.data.types import FederatedData

FIXTURES = Path(__file__).parent / "fixtures"
XNLI_DIR = FIXTURES / "xnli"
NEWS_DIR = FIXTURES / "masakhanews"
AYA_RELEASE = FIXTURES / "fedaya" / "aya_38c_25k.json"
AYA_RECORDS = FIXTURES / "fedaya_records" / "aya_records.jsonl"
XNLI_FILES = {"en": "{}.jsonl", "fr": "{}.csv", "sw": "{}.tsv", "zh": "{}.parquet"}
# Samples per split in the MasakhaNEWS fixtures (see make_fixtures.py).
NEWS_SIZES = {"amh": (56, 18), "eng": (100, 30), "hau": (80, 24), "swa": (64, 20)}


def build(name: str, **fields) -> FederatedData:
    return DATASETS.get(name)(DataConfig(name=name, **fields))


def xnli(**fields) -> FederatedData:
    defaults = dict(path=str(XNLI_DIR), train_per_group=20, test_per_group=8, clients_per_group=3)
    return build("xnli", **{**defaults, **fields})


def snapshot(fd: FederatedData) -> list[tuple]:
    return [(c.client_id, c.group, c.pool, c.train, c.test) for c in fd.clients]


def total_variation(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def assert_user_error(excinfo: pytest.ExceptionInfo) -> None:
    message = str(excinfo.value)
    assert message.endswith(".") and "\n" not in message


def read_fixture(path: Path) -> pd.DataFrame:
    if path.suffix == ".jsonl":
        return pd.read_json(path, lines=True)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, sep="\t" if path.suffix == ".tsv" else ",")


@pytest.fixture(scope="module")
def xnli_dicts() -> dict[str, datasets.DatasetDict]:
    """The XNLI fixture as the hub returns it: one DatasetDict per language, ``label`` a ClassLabel."""
    features = datasets.Features(
        {
            "premise": datasets.Value("string"),
            "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=XNLI_LABELS),
        }
    )
    out = {}
    for lang, pattern in XNLI_FILES.items():
        splits = {}
        for split in ("train", "test", "validation"):
            frame = read_fixture(XNLI_DIR / lang / pattern.format(split))
            splits[split] = datasets.Dataset.from_pandas(frame, features=features, preserve_index=False)
        out[lang] = datasets.DatasetDict(splits)
    return out


def test_builders_are_registered() -> None:
    assert {"xnli", "masakhanews", "fedaya"} <= set(DATASETS.names())


# ------------------------------------------------------------------------------------------------------ XNLI


def test_xnli_files_layout_builds_pools_of_clients() -> None:
    fd = xnli()
    assert fd.name == "xnli" and fd.task == "classification"
    assert fd.label_names == XNLI_LABELS and fd.base_train == []
    assert fd.groups == ["en", "fr", "sw", "zh"]
    assert fd.info["layout"] == "files"
    assert len(fd.clients) == 4 * 2 * 3
    for client in fd.clients:
        assert re.fullmatch(r"(en|fr|sw|zh)-(seen|unseen)-0[0-2]", client.client_id)
        assert client.client_id.startswith(f"{client.group}-{client.pool}-")
        assert client.train and client.test
        for ex in client.train + client.test:
            assert set(ex) == {"text", "text_pair", "label", "group"}
            assert ex["group"] == client.group and ex["label"] in (0, 1, 2)
            assert ex["text"] and ex["text_pair"]
    for lang in fd.groups:
        texts = {}
        for pool in ("seen", "unseen"):
            clients = [c for c in fd.pool(pool) if c.group == lang]
            assert len(clients) == 3
            train = [e for c in clients for e in c.train]
            test = [e for c in clients for e in c.test]
            # 20 train + 8 test per language and pool; a client left without test data borrows one sample.
            assert len(train) + len(test) == 28 and abs(len(train) - 20) <= 3
            texts[pool] = {(e["text"], e["text_pair"]) for e in train + test}
            assert len(texts[pool]) == 28
        assert not texts["seen"] & texts["unseen"]
    assert all(ex["text"].endswith("。") for c in fd.clients if c.group == "zh" for ex in c.train)


def test_xnli_clients_have_label_skew() -> None:
    fd = xnli(clients_per_group=2, train_per_group=28, test_per_group=12)
    skews = []
    for lang in fd.groups:
        for pool in ("seen", "unseen"):
            clients = [c for c in fd.pool(pool) if c.group == lang]
            overall = Counter(e["label"] for c in clients for e in c.train + c.test)
            skews += [total_variation(Counter(e["label"] for e in c.train + c.test), overall) for c in clients]
    assert max(skews) > 0.3


def test_xnli_is_deterministic_by_seed() -> None:
    assert snapshot(xnli(seed=3)) == snapshot(xnli(seed=3))
    assert snapshot(xnli(seed=3)) != snapshot(xnli(seed=4))


def test_xnli_options_unseen_pool_and_iid() -> None:
    fd = xnli(unseen_pool=False, partition="iid", groups=["sw", "en"])
    assert fd.groups == ["sw", "en"]
    assert {c.pool for c in fd.clients} == {"seen"} and len(fd.clients) == 6
    sizes = [len(c.train) + len(c.test) for c in fd.clients]
    assert max(sizes) - min(sizes) <= 1


def test_xnli_save_to_disk_layout_matches_files(tmp_path: Path, xnli_dicts) -> None:
    for lang, dd in xnli_dicts.items():
        dd.save_to_disk(str(tmp_path / lang))
    saved = xnli(path=str(tmp_path))
    assert saved.info["layout"] == "save_to_disk"
    assert snapshot(saved) == snapshot(xnli())


def test_xnli_hub_id_goes_through_load_dataset(monkeypatch: pytest.MonkeyPatch, xnli_dicts) -> None:
    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return xnli_dicts[name]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    fd = xnli(path=None, groups=["en", "zh"])
    assert calls == [("facebook/xnli", "en", {}), ("facebook/xnli", "zh", {})]
    assert fd.info["source"] == "hub:facebook/xnli" and fd.info["layout"] == "hub"
    assert snapshot(fd) == snapshot(xnli(groups=["en", "zh"]))

    calls.clear()
    xnli(path=None, hub_id="my-org/xnli-copy", groups=["fr"], options={"revision": "v1"})
    assert calls == [("my-org/xnli-copy", "fr", {"revision": "v1"})]


def test_xnli_hub_unreachable_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(path, name=None, **kwargs):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match="data.path") as excinfo:
        xnli(path=None, groups=["en"])
    assert_user_error(excinfo)


OFFLINE_MISS = """
import fedpeft.data.real
from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
try:
    DATASETS.get("xnli")(DataConfig(name="xnli", hub_id="fedpeft-tests/not-a-cached-dataset", groups=["en"]))
except UserError as err:
    print(err)
"""


def test_real_offline_hub_miss_is_a_user_error() -> None:
    """Offline (HF_HUB_OFFLINE=1, read when datasets is imported, hence a fresh interpreter), a dataset missing
    from the cache is one sentence that says how to get it."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", OFFLINE_MISS], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "download it once" in done.stdout


def _xnli_dir_without_files(tmp_path: Path) -> dict:
    (tmp_path / "en").mkdir()
    (tmp_path / "en" / "README.txt").write_text("nothing here")
    return {"path": str(tmp_path)}


def _xnli_dir_missing_column(tmp_path: Path) -> dict:
    (tmp_path / "en").mkdir()
    for split in ("train", "test"):
        (tmp_path / "en" / f"{split}.jsonl").write_text(json.dumps({"premise": "A cat sleeps.", "label": 0}) + "\n")
    return {"path": str(tmp_path)}


@pytest.mark.parametrize(
    ("make_fields", "message"),
    [
        (lambda tmp: {"path": str(tmp / "missing")}, "does not exist"),
        (lambda tmp: {"path": str(tmp)}, "holds no XNLI language directory"),
        (lambda tmp: {"path": str(XNLI_DIR / "en" / "train.jsonl")}, "is a file"),
        (_xnli_dir_without_files, "has no train file; expected"),
        (_xnli_dir_missing_column, "lacks column"),
        (lambda tmp: {"groups": ["en", "xx"]}, "Unknown XNLI language"),
        (lambda tmp: {"groups": ["de"]}, "no directory for language"),
        (lambda tmp: {"groups": []}, "data.groups is empty"),
        (lambda tmp: {"train_per_group": 1000}, "lower data.train_per_group"),
        (lambda tmp: {"test_per_group": 20}, "lower data.test_per_group"),
        (lambda tmp: {"clients_per_group": 20}, "too few for 20 clients"),
        (lambda tmp: {"partition": "natural"}, "natural client ids"),
        (lambda tmp: {"options": {"colour": "red"}}, "Unknown data.options"),
    ],
)
def test_xnli_user_errors(tmp_path: Path, make_fields, message: str) -> None:
    with pytest.raises(UserError, match=message) as excinfo:
        xnli(**make_fields(tmp_path))
    assert_user_error(excinfo)


# ----------------------------------------------------------------------------------------------- MasakhaNEWS


def test_masakhanews_uses_every_sample_over_ten_clients() -> None:
    fd = build("masakhanews", path=str(NEWS_DIR))
    assert fd.task == "classification" and fd.label_names == MASAKHANEWS_LABELS
    assert fd.groups == ["amh", "eng", "hau", "swa"]
    assert len(fd.clients) == 4 * 2 * 10
    headlines = set()
    for lang in ("eng", "hau"):
        for split in ("train", "test"):
            headlines |= set(read_fixture(NEWS_DIR / lang / f"{split}.jsonl")["headline"])
    mean_size = {}
    for lang, (n_train, n_test) in NEWS_SIZES.items():
        for pool in ("seen", "unseen"):
            clients = [c for c in fd.pool(pool) if c.group == lang]
            assert [c.client_id for c in clients] == [f"{lang}-{pool}-{i:02d}" for i in range(10)]
            assert sum(len(c.train) + len(c.test) for c in clients) == n_train // 2 + n_test // 2
        mean_size[lang] = (n_train // 2 + n_test // 2) / 10
        for ex in (e for c in fd.clients if c.group == lang for e in c.train + c.test):
            assert ex["text_pair"] is None and 0 <= ex["label"] < 7 and ex["group"] == lang
            if lang in ("eng", "hau"):
                assert ex["text"] in headlines
    # The quantity skew comes from the languages' real sizes.
    assert mean_size["eng"] > mean_size["hau"] > mean_size["swa"] > mean_size["amh"]
    assert fd.info["capped"] == {} and fd.info["clients_per_group"] == 10


def test_masakhanews_caps_when_sizes_are_set() -> None:
    fd = build("masakhanews", path=str(NEWS_DIR), train_per_group=20, test_per_group=6, clients_per_group=4)
    assert fd.info["capped"] == {"train": 20, "test": 6}
    for lang in fd.groups:
        for pool in ("seen", "unseen"):
            clients = [c for c in fd.pool(pool) if c.group == lang]
            assert len(clients) == 4
            assert sum(len(c.train) + len(c.test) for c in clients) == 26


def test_masakhanews_text_field_and_determinism() -> None:
    fields = dict(path=str(NEWS_DIR), groups=["eng", "hau"], options={"text_field": "headline_text"})
    fd = build("masakhanews", **fields)
    assert all(e["text"].endswith(".") for c in fd.clients for e in c.train)  # headline + body sentence
    assert snapshot(fd) == snapshot(build("masakhanews", **fields))
    assert snapshot(fd) != snapshot(build("masakhanews", seed=1, **fields))


def test_masakhanews_hub_falls_back_to_parquet_export(monkeypatch: pytest.MonkeyPatch) -> None:
    features = datasets.Features(
        {
            "label": datasets.ClassLabel(names=MASAKHANEWS_LABELS),
            "headline": datasets.Value("string"),
            "text": datasets.Value("string"),
            "headline_text": datasets.Value("string"),
            "url": datasets.Value("string"),
        }
    )
    hub = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_pandas(
                read_fixture(NEWS_DIR / "eng" / f"{split}.jsonl"), features=features, preserve_index=False
            )
            for split in ("train", "validation", "test")
        }
    )
    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        if "revision" not in kwargs:
            raise RuntimeError("Dataset scripts are no longer supported, but found masakhanews.py")
        return hub

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    fd = build("masakhanews", groups=["eng"])
    assert calls == [
        ("masakhane/masakhanews", "eng", {}),
        ("masakhane/masakhanews", "eng", {"revision": "refs/convert/parquet"}),
    ]
    assert snapshot(fd) == snapshot(build("masakhanews", path=str(NEWS_DIR), groups=["eng"]))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"options": {"text_field": "body"}}, "not a MasakhaNEWS text column"),
        ({"groups": ["swa"], "options": {"text_field": "headline_text"}}, "lacks column"),
        ({"groups": ["xyz"]}, "Unknown MasakhaNEWS language"),
        ({"groups": ["amh"], "clients_per_group": 30}, "too few for 30 clients"),
    ],
)
def test_masakhanews_user_errors(fields: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as excinfo:
        build("masakhanews", path=str(NEWS_DIR), **fields)
    assert_user_error(excinfo)


# ---------------------------------------------------------------------------------------------------- Fed-Aya


def aya_release() -> dict[str, list[dict]]:
    return json.loads(AYA_RELEASE.read_text(encoding="utf-8"))


def test_fedaya_release_layout_natural_clients() -> None:
    fd = build("fedaya", path=str(AYA_RELEASE.parent))
    release = aya_release()
    assert fd.task == "generation" and fd.label_names is None and fd.base_train == []
    assert fd.info["layout"] == "fedllm-bench"
    assert {c.client_id for c in fd.clients} == set(release)
    assert len(fd.pool("seen")) == 30 and len(fd.pool("unseen")) == 8
    assert sorted(fd.info["unseen_clients"]) == sorted(c.client_id for c in fd.pool("unseen"))
    assert set(fd.groups) == {s["language"] for items in release.values() for s in items}
    for client in fd.clients:
        samples = release[client.client_id]
        assert len(client.train) + len(client.test) == len(samples)
        assert len(client.test) == min(max(round(0.2 * len(samples)), 1), len(samples) - 1)
        counts = Counter(s["language"] for s in samples)
        assert counts[client.group] == max(counts.values())
        expected = sorted((s["instruction"], s["response"], s["language"]) for s in samples)
        got = sorted((e["prompt"], e["response"], e["group"]) for e in client.train + client.test)
        assert got == expected
        assert all(set(e) == {"prompt", "response", "group"} for e in client.train)


def test_fedaya_unseen_pool_follows_seed() -> None:
    by_file = build("fedaya", path=str(AYA_RELEASE), seed=5)
    assert snapshot(by_file) == snapshot(build("fedaya", path=str(AYA_RELEASE.parent), seed=5))
    other = build("fedaya", path=str(AYA_RELEASE), seed=6)
    assert {c.client_id for c in by_file.pool("unseen")} != {c.client_id for c in other.pool("unseen")}
    assert not build("fedaya", path=str(AYA_RELEASE), unseen_pool=False).pool("unseen")


def test_fedaya_keeps_largest_clients_and_filters_languages() -> None:
    release = aya_release()
    fd = build("fedaya", path=str(AYA_RELEASE), options={"num_clients": 10, "unseen_clients": 2})
    sizes = sorted((len(v) for v in release.values()), reverse=True)
    assert len(fd.clients) == 10 and len(fd.pool("unseen")) == 2
    assert sorted((len(c.train) + len(c.test) for c in fd.clients), reverse=True) == sizes[:10]

    some = sorted(release)[:3]
    chosen = build("fedaya", path=str(AYA_RELEASE), options={"unseen_ids": some})
    assert sorted(c.client_id for c in chosen.pool("unseen")) == some

    only = build(
        "fedaya", path=str(AYA_RELEASE), groups=["ar", "zh"], options={"num_clients": "all", "unseen_clients": 2}
    )
    assert set(only.groups) == {"ar", "zh"}
    assert all(e["group"] in ("ar", "zh") for c in only.clients for e in c.train + c.test)


def test_fedaya_generic_records_with_aya_field_names() -> None:
    fd = build("fedaya", path=str(AYA_RECORDS), options={"num_clients": "all", "unseen_clients": 2})
    assert fd.info["layout"] == "records"
    assert fd.groups == ["ar", "en", "fr"]  # "Standard Arabic", "English", "French" normalized
    assert len(fd.clients) == 6 and len(fd.pool("unseen")) == 2
    users = {json.loads(line)["user_id"] for line in AYA_RECORDS.read_text(encoding="utf-8").splitlines()}
    assert {c.client_id for c in fd.clients} == users

    explicit = build(
        "fedaya",
        path=str(AYA_RECORDS),
        options={
            "num_clients": "all",
            "unseen_clients": 1,
            "prompt_field": "inputs",
            "response_field": "targets",
            "language_field": "language_code",
            "client_field": "user_id",
        },
    )
    assert explicit.groups == ["ar", "en", "fr"]  # "arb", "eng", "fra" normalized


def _aya_file(tmp_path: Path, content: str, name: str = "fed.json") -> dict:
    (tmp_path / name).write_text(content, encoding="utf-8")
    return {"path": str(tmp_path / name)}


def _one_sample_client(tmp_path: Path) -> dict:
    sample = {"instruction": "Hi?", "response": "Hello.", "language": "en"}
    fields = _aya_file(tmp_path, json.dumps({"a": [sample], "b": [sample, sample]}))
    return {**fields, "options": {"num_clients": 2, "unseen_clients": 0}}


def test_fedaya_drops_clients_with_a_single_sample(tmp_path: Path) -> None:
    fields = _one_sample_client(tmp_path)
    fd = build("fedaya", **{**fields, "options": {"num_clients": "all", "unseen_clients": 0}})
    assert [c.client_id for c in fd.clients] == ["b"] and fd.info["dropped_clients"] == ["a"]


@pytest.mark.parametrize(
    ("make_fields", "message"),
    [
        (lambda tmp: {}, "needs data.path"),
        (lambda tmp: {"hub_id": "someone/fed-aya"}, "set data.path instead of data.hub_id"),
        (lambda tmp: {"path": str(tmp / "missing.json")}, "does not exist"),
        (lambda tmp: {"path": str(tmp)}, "no JSON file"),
        (lambda tmp: _aya_file(tmp, '"just a string"'), "does not hold Fed-Aya samples"),
        (lambda tmp: _aya_file(tmp, '[{"question": "q", "answer": "a"}]'), "prompt_field"),
        (lambda tmp: _aya_file(tmp, "{not json\n"), "not valid JSON"),
        (lambda tmp: {"path": str(AYA_RELEASE), "options": {"num_clients": 50}}, "fewer than"),
        (lambda tmp: {"path": str(AYA_RELEASE), "options": {"unseen_clients": 38}}, "leaves no seen client"),
        (lambda tmp: {"path": str(AYA_RELEASE), "options": {"unseen_ids": ["nobody"]}}, "not among the kept"),
        (lambda tmp: {"path": str(AYA_RELEASE), "options": {"test_fraction": 1.5}}, "between 0 and 1"),
        (lambda tmp: {"path": str(AYA_RELEASE), "groups": ["de"]}, "does not contain"),
        (lambda tmp: {"path": str(AYA_RELEASE), "partition": "iid"}, "natural annotator ids"),
        (_one_sample_client, "holds 1 clients with at least 2 samples"),
    ],
)
def test_fedaya_user_errors(tmp_path: Path, make_fields, message: str) -> None:
    with pytest.raises(UserError, match=message) as excinfo:
        build("fedaya", **make_fields(tmp_path))
    assert_user_error(excinfo)
