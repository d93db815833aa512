"""Potara's datasets: commonsense-8, FLAN-8 and CIFAR-100 on fixtures in their real schemas, synthetic images,
and the vision path (tiny ViT, image encoding, Potara merging the head with its alpha)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import fedpeft.data.catalog  # noqa: F401  (registers the builders)
from fedpeft import evaluation
from fedpeft.core.config import DataConfig, ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.real.commonsense import TASKS as COMMONSENSE_TASKS
from fedpeft.data.real.flan import TASKS as FLAN_TASKS
from fedpeft.data.synthetic.images import LABELS, _generate
from fedpeft.models.runtime import ModelRuntime
from fedpeft.worker import build_method

FIXTURES = Path(__file__).parent / "fixtures"


def build(name: str, **fields):
    return DATASETS.get(name)(DataConfig(name=name, **fields))


def total_variation(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def jsonl_dataset(path: Path) -> datasets.Dataset:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return datasets.Dataset.from_list(rows)


# ------------------------------------------------------------------------------------------------ commonsense


def test_commonsense_reads_the_llm_adapters_format():
    data = build("commonsense", path=str(FIXTURES / "commonsense"), train_per_group=5, test_per_group=3)
    assert data.groups == list(COMMONSENSE_TASKS) and data.task == "generation"
    assert [c.client_id for c in data.clients][:2] == ["arc-c-seen-00", "arc-e-seen-00"]
    for client in data.clients:
        assert len(client.train) == 5 and len(client.test) == 3
        for ex in client.train + client.test:
            assert ex["answer"] in ex["options"] and ex["response"].endswith(ex["answer"])
    paired = build(
        "commonsense",
        path=str(FIXTURES / "commonsense"),
        groups=["boolq"],
        train_per_group=4,
        test_per_group=2,
        options={"clients_per_task": 2},
    )
    first, second = paired.clients
    assert not {e["prompt"] for e in first.train} & {e["prompt"] for e in second.train}


def test_commonsense_converts_every_hub_schema(monkeypatch):
    calls = []

    def fake_load_dataset(hub_id, config=None, **kwargs):
        calls.append((hub_id, config))
        task = next(t for t, spec in __import__("fedpeft.data.real.commonsense", fromlist=["HUB"]).HUB.items()
                    if spec[:2] == (hub_id, config))  # fmt: skip
        folder = FIXTURES / "commonsense_hub" / task
        test_name = {"arc-c": "test", "arc-e": "test", "obqa": "test"}.get(task, "validation")
        return datasets.DatasetDict(
            {"train": jsonl_dataset(folder / "train.jsonl"), test_name: jsonl_dataset(folder / "test.jsonl")}
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = build("commonsense", train_per_group=8, test_per_group=4)
    assert ("allenai/ai2_arc", "ARC-Challenge") in calls and ("allenai/winogrande", "winogrande_xl") in calls
    by_task = {c.group: c for c in data.clients}
    rows = {t: [json.loads(x) for x in (FIXTURES / "commonsense_hub" / t / "train.jsonl").read_text().splitlines()]
            for t in COMMONSENSE_TASKS}  # fmt: skip
    arc_row = rows["arc-c"][2]  # labels A-D, answerKey C -> answer3
    arc = next(e for e in by_task["arc-c"].train if arc_row["question"] in e["prompt"])
    assert arc["answer"] == "answer" + str(arc_row["choices"]["label"].index(arc_row["answerKey"]) + 1)
    siqa = next(e for e in by_task["siqa"].train if "answer" in e)
    assert siqa["options"] == ["answer1", "answer2", "answer3"]
    boolq = {e["prompt"]: e["answer"] for e in by_task["boolq"].train}
    for row in rows["boolq"]:
        key = next(p for p in boolq if row["question"] in p)
        assert boolq[key] == ("true" if row["answer"] else "false")
    wino = by_task["winogrande"].train[0]
    assert wino["options"] == ["option1", "option2"] and "Answer format: option1/option2" in wino["prompt"]
    assert {e["answer"] for e in by_task["hellaswag"].train} <= {"ending1", "ending2", "ending3", "ending4"}
    # The same original-schema files also load from a local path.
    local = build("commonsense", path=str(FIXTURES / "commonsense_hub"), groups=["piqa"], train_per_group=3)
    assert {e["answer"] for e in local.clients[0].train} <= {"solution1", "solution2"}


def test_commonsense_refuses_bad_settings():
    with pytest.raises(UserError):
        build("commonsense", path=str(FIXTURES / "commonsense"), groups=["chess"])
    with pytest.raises(UserError):
        build("commonsense", path=str(FIXTURES / "flan"))


def test_answer_accuracy_takes_the_first_option_named():
    predictions = ["the correct answer is answer2", "Answer1, surely", "no idea", "true... or false"]
    answers = ["answer2", "answer3", "answer1", "false"]
    options = [["answer1", "answer2", "answer3"]] * 3 + [["true", "false"]]
    assert evaluation.answer_accuracy(predictions, answers, options) == 0.25


# ------------------------------------------------------------------------------------------------------- FLAN


def test_flan_reads_task_directories():
    data = build("flan", path=str(FIXTURES / "flan"), train_per_group=6, test_per_group=3)
    assert data.groups == list(FLAN_TASKS)
    assert all(len(c.train) == 6 and len(c.test) == 3 for c in data.clients)
    assert all(ex["prompt"] and ex["response"] and "answer" not in ex for c in data.clients for ex in c.train)
    with pytest.raises(UserError):
        build("flan", path=str(FIXTURES / "flan"), groups=["wmt"])


def test_flan_hub_reads_the_named_files(monkeypatch):
    requested = []

    def fake_load_dataset(hub_id, data_files=None, **kwargs):
        requested.append((hub_id, data_files["train"]))
        task = next(
            t for t in FLAN_TASKS if t in data_files["train"] or (t == "mnli" and "mnli" in data_files["train"])
        )
        folder = FIXTURES / "flan" / task
        return datasets.DatasetDict(
            {"train": jsonl_dataset(folder / "train.jsonl"), "test": jsonl_dataset(folder / "test.jsonl")}
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = build("flan", groups=["mnli", "sst2"], train_per_group=4, test_per_group=2)
    assert requested == [
        ("Muennighoff/flan", "train/mnli_matched_10templates.json"),
        ("Muennighoff/flan", "train/sst2_10templates.json"),
    ]
    assert [len(c.train) for c in data.clients] == [4, 4]


# --------------------------------------------------------------------------------------------------- images


def check_label_skew(clients) -> None:
    """Each client's test labels follow its own train labels more closely than another client's."""
    own, other = [], []
    for i, client in enumerate(clients):
        train = Counter(e["label"] for e in client.train)
        own.append(total_variation(train, Counter(e["label"] for e in client.test)))
        neighbour = clients[(i + 1) % len(clients)]
        other.append(total_variation(train, Counter(e["label"] for e in neighbour.test)))
    assert np.mean(own) < np.mean(other)


def test_cifar100_from_parquet_files_with_label_skew():
    data = build(
        "cifar100", path=str(FIXTURES / "cifar100"), train_per_group=10, test_per_group=5, options={"num_clients": 4}
    )
    assert [c.client_id for c in data.clients] == [f"client-0{i}" for i in range(4)]
    assert sum(len(c.train) for c in data.clients) == 40 and sum(len(c.test) for c in data.clients) == 20
    image = data.clients[0].train[0]["image"]
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert {e["label"] for c in data.clients for e in c.train} <= set(range(5))


def test_cifar100_hub_images_come_as_pil(monkeypatch):
    from PIL import Image

    def fake_load_dataset(hub_id, config=None, **kwargs):
        assert hub_id == "uoft-cs/cifar100"
        features = datasets.Features(
            {"img": datasets.Image(), "fine_label": datasets.ClassLabel(names=[f"c{i}" for i in range(100)])}
        )
        rows = lambda n: {  # noqa: E731
            "img": [Image.fromarray(np.full((32, 32, 3), 8 * i, np.uint8)) for i in range(n)],
            "fine_label": [i % 7 for i in range(n)],
        }
        return datasets.DatasetDict(
            {
                "train": datasets.Dataset.from_dict(rows(30), features),
                "test": datasets.Dataset.from_dict(rows(12), features),
            }
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = build("cifar100", options={"num_clients": 3}, dirichlet_alpha=1.0)
    assert data.label_names[:2] == ["c0", "c1"] and len(data.label_names) == 100
    assert sum(len(c.train) for c in data.clients) == 30
    assert data.clients[0].train[0]["image"].shape == (32, 32, 3)


def test_synthetic_images_have_composite_classes_and_own_test_distributions():
    data = _generate(DataConfig(name="synthetic-images", train_per_group=60, test_per_group=30, base_samples=64))
    assert len(data.clients) == 10 and len(LABELS) == 32 and data.num_labels == 32
    check_label_skew(data.clients)
    again = _generate(DataConfig(name="synthetic-images", train_per_group=60, test_per_group=30, base_samples=64))
    assert all(
        np.array_equal(a["image"], b["image"])
        for a, b in zip(data.clients[3].train, again.clients[3].train, strict=True)
    )
    assert Counter(e["label"] for e in data.base_train) == Counter({k: 2 for k in range(32)})
    # Mean colour separates colour classes: red-solid images are redder than blue-solid ones.
    red = [e["image"] for e in data.base_train if LABELS[e["label"]].startswith("red-solid")]
    blue = [e["image"] for e in data.base_train if LABELS[e["label"]].startswith("blue-solid")]
    assert np.mean([i[..., 0].mean() - i[..., 2].mean() for i in red]) > np.mean(
        [i[..., 0].mean() - i[..., 2].mean() for i in blue]
    )


def test_potara_on_a_tiny_vit_merges_the_head_with_alpha():
    from fedpeft.models.table import load_model

    data = _generate(
        DataConfig(
            name="synthetic-images", train_per_group=16, test_per_group=4, base_samples=32, options={"num_clients": 2}
        )
    )
    runtime = ModelRuntime(load_model(ModelConfig(name="tiny-vit"), task="classification", num_labels=32))
    method = build_method(
        {
            "name": "potara",
            "rounds": 1,
            "local_rounds": 2,
            "local_steps": 2,
            "lr": 0.01,
            "batch_size": 4,
            "merge_samples": 6,
            "targets": ["q_proj", "v_proj"],
            "parts": True,
        }  # fmt: skip
    )
    state = method.init_server(runtime, seed=0)
    update, _ = method.client_update(runtime, data.clients[0], method.payload(state, "c"), None, seed=1)
    state.tensors = update.tensors
    model = method.personalize(runtime, data.clients[1], state, None, None, seed=2)
    alpha = model.info["alpha"]
    head = [k for k in model.adapter if "classifier" in k]
    assert head and all("q_proj" in k or "v_proj" in k for k in model.adapter if "lora_" in k)
    fed, local = model.variants["fedit"].adapter, model.variants["local"].adapter
    for key in head:
        torch.testing.assert_close(model.adapter[key], alpha * fed[key] + (1 - alpha) * local[key])
    runtime.install(model)
    assert 0 <= runtime.evaluate(data.clients[1].test)["accuracy"] <= 1


@pytest.mark.parametrize(
    "preset", ["potara-tasks-cpu", "potara-vision-cpu", "potara-commonsense", "potara-flan", "potara-cifar100"]
)
def test_potara_presets_validate(preset, tmp_path):
    from fedpeft.core.config import load_config
    from fedpeft.runner import Experiment

    cfg = load_config(preset)
    Experiment(cfg, tmp_path)  # checks the method entries across each other
    labels = [m.label or m.name for m in cfg.methods]  # every entry was validated into its typed config
    assert "potara" in labels and "local" in labels and "fedit" in labels
    assert cfg.data.name in DATASETS
    if not preset.endswith("-cpu"):  # the paper's baselines of Tables 2, 3 and 6
        assert {"ffa_lora", "fedsa_lora", "fedalt", "feddpa"} <= set(labels)


def test_representations_statistics_and_site_inputs_take_images_without_an_attention_mask():
    """FedDPA's instance mixing, FedP2EFT's and FedL2P's feature statistics and FedMosaic's alignment inputs on a
    ViT, whose batches have pixels and no attention mask: every patch position counts."""
    from fedpeft.adapters.alignment import row_counts, site_inputs
    from fedpeft.adapters.statistics import feature_statistics
    from fedpeft.methods.feddpa import representations
    from fedpeft.models.table import load_model

    data = _generate(
        DataConfig(name="synthetic-images", train_per_group=8, test_per_group=4, options={"num_clients": 2})
    )
    runtime = ModelRuntime(load_model(ModelConfig(name="tiny-vit"), task="classification", num_labels=32))
    examples = data.clients[0].train[:5]
    pooled = representations(runtime, examples)
    assert pooled.shape == (5, runtime.base_model.config.hidden_size) and torch.isfinite(pooled).all()
    stats = feature_statistics(runtime, examples)
    assert stats.shape == (2 * len(runtime.target_modules),) and torch.isfinite(stats).all()
    name = runtime.target_modules[0][0]
    inputs = site_inputs(runtime, [name], examples, batch_size=2)[name]
    patches = (32 // runtime.base_model.config.patch_size) ** 2 + 1  # and the class token
    assert len(inputs) == 5 and all(row.shape[0] == patches for row in inputs)
    assert row_counts(runtime, name, examples) == [patches] * 5
