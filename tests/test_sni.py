"""The Super-NaturalInstructions loader on the fixtures of tests/fixtures/sni (release) and sni_records (flat)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

import fedpeft.data.real  # noqa: F401  (registers the builders)
from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS

FIXTURES = Path(__file__).parent / "fixtures"
RELEASE = FIXTURES / "sni"
RECORDS = FIXTURES / "sni_records" / "natural_instructions.jsonl"
SMALL = {"train_per_client": 20, "test_per_client": 5}


def sni(options: dict | None = None, **fields):
    return DATASETS.get("sni")(DataConfig(name="sni", **fields, options={**SMALL, **(options or {})}))


def test_release_layout_gives_one_client_per_largest_task():
    fd = sni(path=str(RELEASE))
    ids = [c.client_id for c in fd.clients]
    # Tasks 1-9 are the largest; task010 and task011 tie at 30 instances and the name breaks the tie.
    names = sorted(p.stem for p in (RELEASE / "tasks").glob("task*.json"))
    assert ids == names[:10] and ids[-1] == "task010_double_word"
    assert fd.task == "generation" and fd.groups == ids
    for client in fd.clients:
        assert client.pool == "seen" and client.group == client.client_id
        assert len(client.test) == 5 and len(client.train) == 20
        prompts = [e["prompt"] for e in client.train + client.test]
        assert len(set(prompts)) == len(prompts)  # train and test are disjoint instances
        assert all(p.startswith("Definition: Apply the rule") and p.endswith("\nOutput:") for p in prompts)
        # The first reference is the response; instances without any reference are skipped.
        assert all(e["response"] and e["response"] != "alternative reference" for e in client.train)
    copy = fd.client("task001_copy_words").train[0]
    assert copy["response"] == copy["prompt"].split("Input: ")[1].removesuffix("\nOutput:")
    assert fd.info["instances_per_task"]["task001_copy_words"] == 40


def test_seed_and_sizes_options():
    first, again, other = sni(path=str(RELEASE)), sni(path=str(RELEASE)), sni(path=str(RELEASE), seed=1)
    assert [c.train for c in first.clients] == [c.train for c in again.clients]
    assert [c.train for c in first.clients] != [c.train for c in other.clients]
    capped = sni({"train_per_client": 500, "test_per_client": 10}, path=str(RELEASE))
    # Training gets what is left after the held-out instances.
    assert len(capped.client("task001_copy_words").train) == 40 - 10
    assert len(capped.client("task010_double_word").train) == 30 - 10


def test_validation_split_is_held_out_from_train_and_test():
    opts = {"validation_per_client": 3}
    on_test = sni(opts, path=str(RELEASE))
    on_val = sni({**opts, "evaluate_on": "validation"}, path=str(RELEASE))
    for a, b in zip(on_test.clients, on_val.clients, strict=True):
        assert a.train == b.train and len(b.test) == 3
        held = {e["prompt"] for e in b.test}
        assert not held & {e["prompt"] for e in a.test + a.train}


def test_explicit_tasks_unseen_tasks_and_prompt_options():
    fd = sni(
        {"tasks": ["task012_tiny_task", "task003_first_word"], "unseen_tasks": 1, "test_per_client": 2,
         "definition": False, "positive_examples": 1},
        path=str(RELEASE),
    )  # fmt: skip
    assert [(c.client_id, c.pool) for c in fd.clients] == [
        ("task012_tiny_task", "seen"),
        ("task003_first_word", "seen"),
        ("task001_copy_words", "unseen"),
    ]
    prompt = fd.clients[1].train[0]["prompt"]
    assert prompt.startswith("Positive Example 1:\nInput: red blue\nOutput: red\n\nInput: ")
    assert len(fd.clients[0].train) == 12 - 2


def test_flat_records_from_a_file_and_from_the_hub(monkeypatch):
    local = sni({"num_tasks": 3}, path=str(RECORDS))
    # The fixture's four tasks hold 22, 24, 26 and 28 records.
    assert [c.client_id for c in local.clients] == ["task004_last_word", "task003_first_word", "task002_reverse_words"]
    assert local.clients[0].train[0]["prompt"].startswith("Definition: Apply the rule of task004_last_word.")
    rows = [json.loads(line) for line in RECORDS.read_text().splitlines()]
    half = len(rows) // 2
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:half]), "test": datasets.Dataset.from_list(rows[half:])}
    )
    calls = []

    def fake_load(hub_id, *args, **kwargs):
        calls.append(hub_id)
        return splits

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    hub = sni({"num_tasks": 3})
    assert calls == ["Muennighoff/natural-instructions"]
    assert [c.train for c in hub.clients] == [c.train for c in local.clients]


@pytest.mark.parametrize(
    ("fields", "options", "message"),
    [
        ({"path": "/nonexistent/sni"}, {}, "does not exist"),
        ({"path": str(RELEASE)}, {"num_tasks": 13}, "fewer than the 13"),
        ({"path": str(RELEASE)}, {"tasks": ["task999_none"]}, "task999_none"),
        ({"path": str(RELEASE)}, {"evaluate_on": "dev"}, "evaluate_on"),
        ({"path": str(RELEASE)}, {"evaluate_on": "validation"}, "validation_per_client"),
        ({"path": str(RELEASE)}, {"test_per_client": 40}, "too few"),
        ({"path": str(RELEASE)}, {"colour": 1}, "Unknown data.options"),
        ({"path": str(FIXTURES / "xnli" / "en" / "train.jsonl")}, {}, "no task column"),
    ],
)
def test_user_errors(fields, options, message):
    with pytest.raises(UserError, match=message) as excinfo:
        sni(options, **fields)
    assert str(excinfo.value).endswith(".")
