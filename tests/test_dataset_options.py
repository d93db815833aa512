"""Every dataset's ``data.options`` model: its documented defaults, and one sentence for a wrong key or type."""

from __future__ import annotations

import importlib
import re

import pytest

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.options import DatasetOptions, parse_options, setting

# The defaults docs/data.md, docs/real-data.md and the builders' docstrings give for each option.
DOCUMENTED: dict[str, dict[str, object]] = {
    "alpagasus": {"num_clients": 4, "category_rule": "verb", "max_samples": None},
    "cifar100": {"num_clients": 10, "revision": None},
    "commonsense": {"clients_per_task": 1},
    "dolly": {"num_clients": 4, "categories": None, "max_samples": None},
    "drake": {"setting": "dynamic", "train_per_task": None, "test_per_task": None},
    "fedaya": {"num_clients": 38, "unseen_clients": 8, "unseen_ids": None, "test_fraction": 0.2, "file": None},
    "fedscope": {"setting": "dynamic", "train_per_task": None, "test_per_task": None},
    "files": {},
    "flan": {"hub_files": "{split}/{task}_10templates.json", "hub_task_names": {"mnli": "mnli_matched"}},
    "hflb": {"setting": "dynamic", "train_per_task": None, "test_per_task": None},
    "hub": {},
    "masakhanews": {"text_field": "headline", "revision": None},
    "sni": {"num_tasks": 10, "train_per_client": 500, "test_per_client": 50, "definition": True},
    "synthetic-fedaya": {"num_clients": 38, "unseen_clients": 8, "samples_per_client": 125},
    "synthetic-images": {"num_clients": 10, "image_size": 32},
    "synthetic-instructions": {"num_clients": 4, "samples": 2000, "knowledge_share": 0.5},
    "synthetic-masakhanews": {"quantity_skew": 8.0, "unseen_only_groups": []},
    "synthetic-mosaic": {"num_clients": 10, "tasks_per_client": 4, "train_per_task": 60, "setting": "dynamic"},
    "synthetic-tasks": {"num_clients": 8, "clients_per_task": 1, "task_hint": True, "evaluate_on": "test"},
    "synthetic-vqa": {"num_clients": 10, "tasks_per_client": 4, "test_per_task": 15, "setting": "dynamic"},
    "synthetic-xnli": {"unseen_only_groups": ["cyr1"]},
    "xnli": {"revision": None},
}


def options_of(name: str) -> type[DatasetOptions]:
    """The ``Options`` model the module registering ``name`` declares."""
    module = importlib.import_module(str(DATASETS.entry(name).module))
    options = module.Options
    assert issubclass(options, DatasetOptions), name
    return options


def test_every_registered_dataset_is_listed() -> None:
    assert sorted(DOCUMENTED) == DATASETS.names()


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_options_accept_their_documented_defaults(name: str) -> None:
    options = options_of(name)
    defaults = options()
    for key, value in DOCUMENTED[name].items():
        assert getattr(defaults, key) == value, key
    given = parse_options(DataConfig(name=name, options=dict(DOCUMENTED[name])), options)
    assert given == defaults
    assert parse_options(DataConfig(name=name, options=defaults.model_dump()), options) == defaults


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_an_unknown_key_is_one_sentence_naming_the_valid_keys(name: str) -> None:
    options = options_of(name)
    valid = ", ".join(options.model_fields) or "(none)"
    expected = f"Unknown data.options key(s) colour, size for dataset {name}; valid options: {valid}."
    with pytest.raises(UserError) as caught:
        parse_options(DataConfig(name=name, options={"size": 3, "colour": "red"}), options)
    assert str(caught.value) == expected


@pytest.mark.parametrize(
    ("name", "key"), [(name, key) for name in sorted(DOCUMENTED) for key in options_of(name).model_fields]
)
def test_a_wrong_type_is_one_sentence_naming_the_key(name: str, key: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_options(DataConfig(name=name, options={key: [[1]]}), options_of(name))
    message = str(caught.value)
    assert message.startswith(f"data.options.{key}=[[1]] is invalid for dataset {name}: ")
    assert message.endswith(".") and "\n" not in message


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_builders_refuse_an_unknown_key(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FEDPEFT_CACHE", str(tmp_path))
    with pytest.raises(UserError, match=re.escape(f"Unknown data.options key(s) colour for dataset {name};")):
        DATASETS.get(name)(DataConfig(name=name, path=str(tmp_path), hub_id="x", options={"colour": "red"}))


def test_one_name_may_stand_for_a_list_of_names() -> None:
    options = options_of("synthetic-xnli")
    assert parse_options(DataConfig(name="synthetic-xnli", options={"unseen_only_groups": "lat2"}), options) == (
        options(unseen_only_groups=["lat2"])
    )


def test_setting_reads_a_field_only_when_it_was_set() -> None:
    assert setting(DataConfig(), "train_per_group", 7) == 7
    assert setting(DataConfig(train_per_group=2000), "train_per_group", 7) == 2000
