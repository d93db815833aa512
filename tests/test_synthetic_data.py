"""The synthetic benchmarks: determinism, pools and sizes, skews, language relations, caching, errors."""

from __future__ import annotations

import json
import pickle
import random
import unicodedata
from collections import Counter

import numpy as np
import pytest

import fedpeft.data.synthetic  # noqa: F401  (registers the builders)
from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data import federation_file
from fedpeft.data.synthetic.common import cache_path
from fedpeft.data.synthetic.instructions import TASKS, make_instruction
from fedpeft.data.synthetic.languages import INVENTORY, language, languages
from fedpeft.data.synthetic.nli import LABEL_NAMES, sample_pair
from fedpeft.data.types import FederatedData

NAMES = ("synthetic-xnli", "synthetic-masakhanews", "synthetic-fedaya")
SMALL = {
    "synthetic-xnli": dict(
        groups=["lat1", "lat2", "cyr1"], clients_per_group=4, train_per_group=120, test_per_group=30, base_samples=90
    ),
    "synthetic-masakhanews": dict(
        groups=["lat1", "cyr2", "geo1"], clients_per_group=3, train_per_group=140, test_per_group=35, base_samples=90
    ),
    "synthetic-fedaya": dict(
        groups=["lat1", "cyr1", "hng1"],
        base_samples=60,
        options={"num_clients": 8, "unseen_clients": 2, "samples_per_client": 50},
    ),
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path / "cache"))


def build(name: str, **fields) -> FederatedData:
    return DATASETS.get(name)(DataConfig(name=name, **{**SMALL[name], **fields}))


def char_ngrams(texts: list[str], n: int = 3) -> set[str]:
    return {t[i : i + n] for text in texts for t in text.split() for i in range(len(t) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b)


def total_variation(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


@pytest.mark.parametrize("name", NAMES)
def test_registered_and_deterministic(name):
    first = build(name)
    cache_path(name, DataConfig(name=name, **SMALL[name])).unlink()
    assert build(name) == first  # rebuilt from scratch: identical
    assert build(name, seed=1).clients != first.clients


@pytest.mark.parametrize("name", NAMES)
def test_cache_is_used_and_a_corrupt_file_is_rebuilt(name):
    data = build(name)
    path = cache_path(name, DataConfig(name=name, **SMALL[name]))
    assert path.exists()
    path.write_bytes(b"not a pickle")
    assert build(name) == data


def test_the_cache_is_read_without_pickle_and_an_old_pickle_is_never_read(monkeypatch):
    cfg = DataConfig(name="synthetic-xnli", **SMALL["synthetic-xnli"])
    path = cache_path("synthetic-xnli", cfg)
    old = path.with_suffix(".pkl")
    old.parent.mkdir(parents=True)
    old.write_bytes(pickle.dumps("an earlier fedpeft's cache"))
    data = build("synthetic-xnli")
    assert not old.exists()  # replaced by the new file
    with np.load(path, allow_pickle=False) as members:  # nothing in it needs pickle
        document = json.loads(members["federation"].tobytes())
    assert (document["format"], document["version"]) == (federation_file.FORMAT, federation_file.VERSION)
    monkeypatch.setattr(pickle, "load", None)
    monkeypatch.setattr(pickle, "loads", None)
    assert federation_file.load(path) == data and build("synthetic-xnli") == data


def test_a_cache_file_of_another_version_is_rebuilt(monkeypatch):
    data = build("synthetic-xnli")
    path = cache_path("synthetic-xnli", DataConfig(name="synthetic-xnli", **SMALL["synthetic-xnli"]))
    monkeypatch.setattr(federation_file, "VERSION", federation_file.VERSION + 1)
    with pytest.raises(ValueError, match="version"):
        federation_file.load(path)
    assert build("synthetic-xnli") == data
    assert federation_file.load(path) == data  # rewritten in this version


@pytest.mark.parametrize("name", ["synthetic-images", "synthetic-vqa"])
def test_cached_images_read_back_as_the_arrays_built(name):
    cfg = DataConfig(name=name, options={"num_clients": 2}, train_per_group=8, test_per_group=4, base_samples=8)
    built = DATASETS.get(name)(cfg)
    read = federation_file.load(cache_path(name, cfg))
    examples = [(c.train + c.test) for c in built.clients] + [built.base_train]
    again = [(c.train + c.test) for c in read.clients] + [read.base_train]
    pairs = [(a, b) for x, y in zip(examples, again, strict=True) for a, b in zip(x, y, strict=True)]
    assert pairs and [(c.client_id, c.pool) for c in read.clients] == [(c.client_id, c.pool) for c in built.clients]
    for a, b in pairs:
        assert a.keys() == b.keys() and a["image"].dtype == b["image"].dtype == np.uint8
        assert all(np.array_equal(a[k], b[k]) if k == "image" else a[k] == b[k] for k in a)


def test_a_federation_that_would_not_read_back_equal_is_not_cached():
    data = FederatedData("x", "generation", None, ["g"], [], info={"pair": (1, 2)})
    with pytest.raises(TypeError, match="tuple"):
        federation_file.dumps(data)
    assert federation_file.dumps(FederatedData("x", "generation", None, ["g"], [], info={"pair": [1, 2]}))


def test_xnli_pools_sizes_and_schema():
    data = build("synthetic-xnli", options={"unseen_only_groups": ["cyr1"]})
    assert data.task == "classification" and data.label_names == LABEL_NAMES
    seen, unseen = data.pool("seen"), data.pool("unseen")
    assert {c.group for c in seen} == {"lat1", "lat2"}  # cyr1 is unseen-only
    assert {c.group for c in unseen} == {"lat1", "lat2", "cyr1"}
    assert len(seen) == 2 * 4 and len(unseen) == 3 * 4
    assert not {c.client_id for c in seen} & {c.client_id for c in unseen}
    assert unseen[0].client_id == "lat1-unseen-00"
    for pools in data.info["group_sizes"].values():
        for sizes in pools.values():
            assert sizes["train"] + sizes["test"] == 150
            assert 20 <= sizes["test"] <= 40
    example = seen[0].train[0]
    assert set(example) == {"text", "text_pair", "label", "group"} and example["group"] == "lat1"
    words = [len(ex[k].split()) for c in data.clients for ex in c.train for k in ("text", "text_pair")]
    assert max(words) < 20
    only_seen = build("synthetic-xnli", unseen_pool=False)
    assert {c.pool for c in only_seen.clients} == {"seen"} and "cyr1" not in only_seen.groups


def test_label_skew_inside_a_language_and_test_split_follows_train():
    data = build("synthetic-xnli")
    clients = [c for c in data.pool("seen") if c.group == "lat1"]
    labels = [Counter(ex["label"] for ex in c.train + c.test) for c in clients]
    spread = max(total_variation(a, b) for a in labels for b in labels)
    assert spread > 0.3
    # A client's test labels come from its own (skewed) distribution.
    big = max(clients, key=lambda c: len(c.test))
    train, test = Counter(ex["label"] for ex in big.train), Counter(ex["label"] for ex in big.test)
    assert total_variation(train, test) < 0.35


def test_base_corpus_follows_resource_levels():
    data = build("synthetic-xnli", groups=["lat1", "lat3", "geo1"], base_samples=1000)
    levels = data.info["resource_level"]
    assert levels == {"lat1": "high", "lat3": "mid", "geo1": "low"}
    counts = Counter(ex["group"] for ex in data.base_train)
    assert counts["lat1"] > 3 * counts["lat3"] > 3 * counts["geo1"] > 0
    assert counts == data.info["base_per_group"]


def test_scripts_differ_across_unrelated_languages():
    def scripts(code: str) -> set[str]:
        lang = language(code)
        text = " ".join(lang.write(w) for words in lang.lexicon.values() for w in words)
        return {unicodedata.name(ch).split()[0] for ch in text if ch.isalpha()}

    found = {code: scripts(code) for code in ("lat1", "cyr1", "grk1", "arb1", "dev1", "hng1", "geo1", "eth1")}
    assert len({frozenset(s) for s in found.values()}) == len(found)
    assert found["lat1"] == scripts("lat2") == {"LATIN"}


def test_related_languages_share_more_subwords_than_unrelated():
    def texts(code: str) -> list[str]:
        lang = language(code)
        return [lang.write(w) for words in lang.lexicon.values() for w in words]

    related = jaccard(char_ngrams(texts("lat1")), char_ngrams(texts("lat2")))
    unrelated_same_script = jaccard(char_ngrams(texts("lat1")), char_ngrams(texts("lat4")))
    assert related > 3 * unrelated_same_script
    assert jaccard(set(texts("cyr1")), set(texts("cyr2"))) > 0.2  # whole words shared by cognates


def test_negation_marker_is_no_keyword_for_contradiction():
    lang, rng = language("lat1"), random.Random(0)
    marker = lang.write(lang.word("NEG"))
    with_marker = Counter()
    for i in range(900):
        premise, hypothesis, _ = sample_pair(rng, i % 3)
        with_marker[i % 3] += premise.negated or hypothesis.negated
    assert lang.negation == "pre" and marker
    assert all(count > 0.25 * 300 for count in with_marker.values())


def test_masakhanews_quantity_skew_and_schema():
    data = build("synthetic-masakhanews")
    assert data.label_names[0] == "business" and len(data.label_names) == 7
    per_client = data.info["samples_per_client"]
    assert max(per_client.values()) / min(per_client.values()) > 4
    assert per_client["lat1"] > per_client["geo1"]  # high resource gets more
    assert {len([c for c in data.pool(p) if c.group == "lat1"]) for p in ("seen", "unseen")} == {3}
    assert data.clients[0].train[0]["text_pair"] is None


def test_fedaya_clients_languages_and_pools():
    data = build("synthetic-fedaya")
    assert data.task == "generation" and data.label_names is None
    assert len(data.clients) == 8 and len(data.pool("unseen")) == 2
    assert all(c.client_id.startswith("annotator-") for c in data.clients)
    for client in data.clients:
        spoken = Counter(ex["group"] for ex in client.train + client.test)
        assert len(spoken) <= 4 and spoken.most_common(1)[0][0] == client.group
        assert set(client.train[0]) == {"prompt", "response", "group"}
        if client.pool == "seen":  # the unseen-only language, not even as a translation target
            texts = " ".join(ex["prompt"] + ex["response"] for ex in client.train + client.test)
            assert "cyr1" not in spoken and not any("CYRILLIC" in unicodedata.name(ch, "") for ch in texts)
    assert "cyr1" in {ex["group"] for c in data.pool("unseen") for ex in c.train + c.test}
    answers: dict[str, str] = {}
    for ex in [ex for c in data.clients for ex in c.train + c.test] + data.base_train:
        assert answers.setdefault(ex["prompt"], ex["response"]) == ex["response"]  # the prompt decides


@pytest.mark.parametrize("task", [t for t in TASKS if t != "translate"])
def test_same_instruction_in_another_language_has_another_response(task):
    responses = set()
    for lang in languages(["lat1", "cyr1", "hng1"]):
        _, response, response_lang = make_instruction(random.Random(3), lang, task, [lang])
        assert response_lang is lang
        responses.add(lang.text(response))
    assert len(responses) == 3


def test_translation_response_is_in_the_requested_language():
    source = language("lat1")
    responses = set()
    for target in languages(["cyr1", "hng1", "eth1"]):
        prompt, response, response_lang = make_instruction(random.Random(3), source, "translate", [source, target])
        assert response_lang is target and target.name in prompt
        responses.add(target.text(response))
    assert len(responses) == 3


@pytest.mark.parametrize("name", NAMES)
def test_unknown_language_and_option_fail_with_one_sentence(name):
    with pytest.raises(UserError, match="choose from") as excinfo:
        build(name, groups=["lat1", "xx9"])
    assert str(excinfo.value).endswith(".") and "lat1" in str(excinfo.value)
    with pytest.raises(UserError, match="valid options"):
        build(name, options={"colour": "red"})


def test_inventory_has_many_languages_and_scripts():
    assert len(INVENTORY) >= 16
    assert len({script for _, script, _ in INVENTORY.values()}) >= 10
