"""Instruction data for FLAME: the Alpaca template, ``synthetic-instructions``, and the Dolly-15k and AlpaGasus
loaders on fixture files in the real schemas (tests/fixtures/make_instruction_fixtures.py)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import datasets
import pytest

import fedpeft.data.catalog  # noqa: F401  (registers the builders)
from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.instruct import alpaca_prompt
from fedpeft.data.real.alpagasus import instruction_type
from fedpeft.data.synthetic.categories import (
    ARITHMETIC,
    CATEGORIES,
    knowledge_text,
    make_example,
    number_words,
    plural,
    third_person,
)
from fedpeft.data.types import FederatedData

FIXTURES = Path(__file__).parent / "fixtures"
DOLLY_FILE = FIXTURES / "dolly" / "databricks-dolly-15k.jsonl"
ALPAGASUS_FILE = FIXTURES / "alpagasus" / "alpaca_t45.json"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path / "cache"))


def build(name: str, **fields) -> FederatedData:
    return DATASETS.get(name)(DataConfig(name=name, **fields))


def skew(fd: FederatedData) -> float:
    """Mean total-variation distance between each client's category mix and the overall mix."""
    mixes = [Counter(ex["group"] for ex in c.train + c.test) for c in fd.clients]
    overall = sum(mixes, Counter())
    n = sum(overall.values())
    distances = []
    for mix in mixes:
        m = sum(mix.values())
        distances.append(0.5 * sum(abs(mix[k] / m - overall[k] / n) for k in overall))
    return sum(distances) / len(distances)


def test_alpaca_template():
    with_input = alpaca_prompt("Give the opposite.", "big")
    assert with_input.startswith("Below is an instruction that describes a task, paired with an input")
    assert with_input.endswith("### Instruction:\nGive the opposite.\n\n### Input:\nbig\n\n### Response:\n")
    assert alpaca_prompt("Name a color.", "  ").endswith("### Instruction:\nName a color.\n\n### Response:\n")
    assert "paired with an input" not in alpaca_prompt("Name a color.")


# ------------------------------------------------------------------------------------- synthetic-instructions


def test_synthetic_instruction_answers_are_determined():
    import random

    rng = random.Random(3)
    seen = set()
    for _ in range(400):
        category = rng.choice(CATEGORIES)
        instruction, given, response = make_example(rng, category)
        seen.add(category)
        if category == "count":
            target = instruction.removeprefix("How many times does the word ").removesuffix(" occur?")
            numerals = ["zero", "one", "two", "three", "four", "five"]
            assert response == numerals[given.split().count(target)]
        elif category == "negate":
            assert " does not " in response and response.replace(" does not ", " ").split()[0] == given.split()[0]
        elif category == "plural":
            assert response.split()[-1] == plural(given.split()[-1])
        elif category == "closed_qa":
            assert response in given
    assert seen == set(CATEGORIES)
    assert (plural("child"), plural("dog"), plural("fish")) == ("children", "dogs", "fish")
    assert (third_person("carry"), third_person("wash"), third_person("see")) == ("carries", "washes", "sees")


def test_arithmetic_categories_are_opt_in_tables_of_facts():
    import random

    assert [number_words(n) for n in (0, 13, 20, 56, 81)] == ["zero", "thirteen", "twenty", "fifty six", "eighty one"]
    words = {number_words(n): n for n in range(100)}
    rng = random.Random(5)
    for _ in range(200):
        category = rng.choice(ARITHMETIC)
        instruction, given, response = make_example(rng, category)
        first, operator, second = instruction.removeprefix("What is ").removesuffix("?").split()
        a, b = words[first], words[second]
        assert given == "" and operator == ("plus" if category == "add" else "times")
        assert words[response] == (a + b if category == "add" else a * b)
        assert category == "add" or min(a, b) >= 2
    # Without arithmetic categories the knowledge sentences are those of the eight-category version (golden).
    plain = random.Random(7)
    assert [knowledge_text(plain) for _ in range(3)] == [
        "one child, eight children.",
        "the small dog breaks the old bird.",
        "the young man finds the bird in the field. then the young man does not find the bird in the field.",
    ]
    facts = [knowledge_text(rng, ("multiply",)) for _ in range(400)]
    products = [f for f in facts if " times " in f]
    assert 30 < len(products) < 90 and not any(" plus " in f for f in facts)
    first, _, second, _, *result = products[0].removesuffix(".").split()
    assert words[" ".join(result)] == words[first] * words[second]

    fd = build(
        "synthetic-instructions",
        options={"categories": [*CATEGORIES, "add"], "base_categories": ["qualities", "add"], "samples": 900},
    )
    assert {ex["group"] for c in fd.clients for ex in c.train} == {*CATEGORIES, "add"}
    assert {ex["group"] for ex in fd.base_train} == {"knowledge", "qualities", "add"}
    assert any(" plus " in ex["response"] for ex in fd.base_train if ex["group"] == "knowledge")
    default = build("synthetic-instructions", options={"samples": 900})
    assert not any(" plus " in ex["response"] + ex["prompt"] for ex in default.base_train)


def test_synthetic_instructions_federation():
    fd = build("synthetic-instructions", options={"num_clients": 4, "samples": 800})
    again = build("synthetic-instructions", options={"num_clients": 4, "samples": 800})
    assert [(c.client_id, c.train, c.test) for c in fd.clients] == [
        (c.client_id, c.train, c.test) for c in again.clients
    ]
    assert fd.task == "generation" and [c.client_id for c in fd.clients] == [f"client-0{i}" for i in range(4)]
    validation = fd.info["validation_examples"]
    total = sum(len(c.train) + len(c.test) + validation[c.client_id] for c in fd.clients)
    assert total == 800
    for client in fd.clients:
        n = len(client.train) + len(client.test) + validation[client.client_id]
        assert abs(len(client.test) - 0.1 * n) <= 1 and abs(validation[client.client_id] - 0.1 * n) <= 1
        for ex in client.train + client.test:
            assert ex["prompt"].startswith("Below is an instruction") and ex["prompt"].endswith("### Response:\n")
            assert ex["group"] in CATEGORIES and ex["response"]
    # Base corpus: plain knowledge sentences plus instructions of the base categories only.
    kinds = Counter(ex["group"] for ex in fd.base_train)
    assert len(fd.base_train) == 4000 and set(kinds) == {"knowledge", "qualities", "closed_qa", "negate", "plural"}
    assert 0.45 < kinds["knowledge"] / 4000 < 0.55
    assert all(ex["prompt"].startswith("Below is") for ex in fd.base_train if ex["group"] != "knowledge")
    assert all(ex["prompt"] == "" for ex in fd.base_train if ex["group"] == "knowledge")
    other = build("synthetic-instructions", seed=1, options={"num_clients": 4, "samples": 800})
    assert other.clients[0].train != fd.clients[0].train


def test_dirichlet_concentration_controls_category_skew():
    fields = {"options": {"num_clients": 8, "samples": 1600}}
    mild = build("synthetic-instructions", dirichlet_alpha=5.0, **fields)
    strong = build("synthetic-instructions", dirichlet_alpha=0.5, **fields)
    iid = build("synthetic-instructions", partition="iid", **fields)
    assert skew(iid) < skew(mild) < skew(strong)
    assert strong.info["partition"].startswith("dirichlet over categories (alpha 0.5)")


def test_synthetic_instruction_errors():
    with pytest.raises(UserError, match="Unknown categories"):
        build("synthetic-instructions", options={"categories": ["poetry"]})
    with pytest.raises(UserError, match="Unknown data.options"):
        build("synthetic-instructions", options={"clients": 3})
    with pytest.raises(UserError, match="set data.partition to dirichlet or iid"):
        build("synthetic-instructions", partition="natural")


# --------------------------------------------------------------------------------------------------- Dolly


def dolly_rows() -> list[dict]:
    return [json.loads(line) for line in DOLLY_FILE.read_text().splitlines()]


def check_dolly(fd: FederatedData, samples: int = 80) -> None:
    assert fd.name == "dolly" and fd.task == "generation" and fd.base_train == []
    validation = fd.info["validation_examples"]
    assert sum(len(c.train) + len(c.test) + validation[c.client_id] for c in fd.clients) == samples
    assert sum(fd.info["samples_per_category"].values()) == samples
    expected = {(alpaca_prompt(r["instruction"], r["context"]), r["response"], r["category"]) for r in dolly_rows()}
    got = [(ex["prompt"], ex["response"], ex["group"]) for c in fd.clients for ex in c.train + c.test]
    assert set(got) <= expected and len(set(got)) == len(got)
    assert any("### Input:\nThis passage is mostly about" in prompt for prompt, _, _ in got)


def test_dolly_from_a_local_file_and_directory(tmp_path):
    fd = build("dolly", path=str(DOLLY_FILE), options={"num_clients": 4})
    check_dolly(fd)
    assert len(fd.clients) == 4 and set(fd.info["samples_per_category"]) == {r["category"] for r in dolly_rows()}
    same = build("dolly", path=str(DOLLY_FILE.parent), options={"num_clients": 4})
    assert [c.train for c in same.clients] == [c.train for c in fd.clients]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(dolly_rows())}).save_to_disk(str(saved))
    check_dolly(build("dolly", path=str(saved), options={"num_clients": 2}))
    subset = build("dolly", path=str(DOLLY_FILE), options={"categories": ["closed_qa", "summarization"]})
    assert set(subset.info["samples_per_category"]) == {"closed_qa", "summarization"}
    assert build("dolly", path=str(DOLLY_FILE), options={"max_samples": 40}).info["samples"] == 40


def test_dolly_hub_id_goes_through_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name))
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(dolly_rows())})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    check_dolly(build("dolly"))
    assert calls == [("databricks/databricks-dolly-15k", None)]


def test_dolly_errors(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"instruction": "a", "response": "b"}) + "\n")
    with pytest.raises(UserError, match=r"lacks column\(s\) context, category"):
        build("dolly", path=str(broken))
    with pytest.raises(UserError, match="does not exist"):
        build("dolly", path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="not in"):
        build("dolly", path=str(DOLLY_FILE), options={"categories": ["poetry"]})
    with pytest.raises(UserError, match="Cannot split"):
        build("dolly", path=str(DOLLY_FILE), options={"num_clients": 40})


# ----------------------------------------------------------------------------------------------- AlpaGasus


@pytest.mark.parametrize(
    ("instruction", "kind"),
    [
        ("Classify the following word as a noun or a verb.", "classification"),
        ("Rewrite the sentence in the passive voice.", "rewriting"),
        ("Summarize the text below.", "summarization"),
        ("write a short story.", "creative_writing"),
        ("What are owls?", "open_qa"),
        ("Explain why maps matter.", "explanation"),
        ("Tea or coffee?", "open_qa"),
        ("Hello there.", "other"),
    ],
)
def test_alpagasus_instruction_type_rule(instruction, kind):
    assert instruction_type(instruction) == kind


def test_alpagasus_from_the_release_file_and_without_categories():
    fd = build("alpagasus", path=str(ALPAGASUS_FILE), options={"num_clients": 3})
    assert fd.name == "alpagasus" and len(fd.clients) == 3 and fd.info["samples"] == 60
    assert set(fd.info["samples_per_category"]) == {
        "classification", "rewriting", "summarization", "creative_writing", "open_qa", "explanation",
    }  # fmt: skip
    rows = json.loads(ALPAGASUS_FILE.read_text())
    outputs = {r["output"] for r in rows}
    assert all(ex["response"] in outputs for c in fd.clients for ex in c.train + c.test)
    assert re.search(r"### Input:\nChildren enjoy \w+\.", "".join(ex["prompt"] for c in fd.clients for ex in c.train))
    flat = build("alpagasus", path=str(ALPAGASUS_FILE), options={"num_clients": 3, "category_rule": "none"})
    assert fd.groups and flat.groups == ["all"] and flat.info["partition"].startswith("iid")
    with pytest.raises(UserError, match="category_rule"):
        build("alpagasus", path=str(ALPAGASUS_FILE), options={"category_rule": "topic"})


def test_alpagasus_default_hub_id(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append(path)
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(json.loads(ALPAGASUS_FILE.read_text()))})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert build("alpagasus").info["samples"] == 60 and calls == ["mlabonne/alpagasus"]
