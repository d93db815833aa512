"""The multi-modal path: tiny LLaVA, its runtime, LLaVA checkpoints, synthetic-vqa and the DRAKE / HFLB loaders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fedpeft.data.catalog  # noqa: F401  (registers the datasets)
from fedpeft.core.config import DataConfig, ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.synthetic.vqa import COLORS, SIZE, _generate
from fedpeft.models.multimodal import MultimodalRuntime
from fedpeft.models.table import load_model
from fedpeft.training import TrainArgs

FIXTURES = Path(__file__).parent / "fixtures"


def drake(**fields):
    return DATASETS.get("drake")(DataConfig(name="drake", path=str(FIXTURES / "drake"), **fields))


def test_drake_directory_gives_clients_with_tasks_in_arrival_order():
    data = drake()
    assert [c.client_id for c in data.clients] == ["client-01", "client-02"] and data.task == "generation"
    first = data.clients[0]
    assert [ex["stage"] for ex in first.train] == [0, 0, 0, 1, 1, 1]
    assert [ex["task"] for ex in first.train][::3] == ["vqa-color", "reasoning-pair"]
    pair = first.train[4]
    assert isinstance(pair["image"], list) and len(pair["image"]) == 2 and Path(pair["image"][0]).is_absolute()
    choice = data.clients[1].train[0]
    assert choice["prompt"].endswith("choices : blue , green , red")
    assert len(data.base_train) == 3 and data.base_train[0]["task"] == "public"
    static = drake(options={"setting": "static", "train_per_task": 2})
    assert {ex["stage"] for ex in static.clients[0].train} == {0} and len(static.clients[0].train) == 4
    hflb = DATASETS.get("hflb")(DataConfig(name="hflb", path=str(FIXTURES / "hflb")))
    assert [c.client_id for c in hflb.clients] == ["gqa-yesno"] and len(hflb.clients[0].test) == 4
    scope = DATASETS.get("fedscope")(DataConfig(name="fedscope", path=str(FIXTURES / "fedscope")))
    assert [len(c.train) for c in scope.clients] == [6, 3] and "image" not in scope.clients[0].train[0]
    expected = {"prompt": "gsm-algebra question 1 : 2 + 1 ?", "response": "3", "task": "gsm-algebra"}
    assert scope.clients[0].train[4] == {**expected, "stage": 1, "group": "math-01"}


def test_drake_errors_name_the_fix(tmp_path):
    with pytest.raises(UserError, match="set data.path"):
        DATASETS.get("drake")(DataConfig(name="drake"))
    with pytest.raises(UserError, match="clients.json is missing"):
        DATASETS.get("drake")(DataConfig(name="drake", path=str(tmp_path)))
    (tmp_path / "clients.json").write_text(json.dumps({"c": ["t"]}))
    (tmp_path / "tasks" / "t").mkdir(parents=True)
    (tmp_path / "tasks" / "t" / "train.jsonl").write_text('{"question": "q", "answer": "a", "image": "gone.png"}\n')
    with pytest.raises(UserError, match="image gone.png"):
        DATASETS.get("drake")(DataConfig(name="drake", path=str(tmp_path)))


def test_synthetic_vqa_answers_match_the_pictures():
    data = _generate(DataConfig(name="synthetic-vqa", options={"num_clients": 4, "train_per_task": 8}))
    assert len(data.clients) == 4 and {ex["stage"] for ex in data.clients[0].train} == {0, 1, 2, 3}
    for client in data.clients:
        for ex in client.train:
            image = ex["image"]
            assert image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8
            if ex["task"] == "color":
                assert (image == np.array(COLORS[ex["response"]], np.uint8)).all(-1).sum() >= 9
            if ex["task"] == "position":
                painted = np.isin(image.reshape(-1, 3).tolist(), [list(c) for c in COLORS.values()]).all(-1)
                columns = np.nonzero(painted.reshape(SIZE, SIZE))[1]
                assert (columns < SIZE // 2).all() == (ex["response"] == "left")
    again = _generate(DataConfig(name="synthetic-vqa", options={"num_clients": 4, "train_per_task": 8}))
    assert np.array_equal(again.clients[2].train[5]["image"], data.clients[2].train[5]["image"])


def _tiny_llava(data, path=None):
    cfg = ModelConfig(name=path or "tiny-llava", max_length=64, vocab_size=300)
    return load_model(cfg, task="generation", corpus=data.corpus)


def test_tiny_llava_trains_and_answers_with_lora_on_the_language_model_only(tmp_path):
    data = drake()
    loaded = _tiny_llava(data)
    assert loaded.family == "llava"
    assert loaded.lora_targets and all(".language_model." in t for t in loaded.lora_targets)
    assert not any("vision" in t or "projector" in t for t in loaded.lora_targets)
    runtime = MultimodalRuntime(loaded, max_length=64, max_new_tokens=3)
    examples = data.clients[0].train[3:6]  # includes a two-image question
    batch = runtime.encode(examples)
    assert batch["pixel_values"].shape == (4, 3, 16, 16)
    image_tokens = (batch["input_ids"] == runtime.image_token_id).sum(1).tolist()
    assert image_tokens == [16, 32, 16]
    assert (batch["labels"][batch["input_ids"] == runtime.image_token_id] == -100).all()
    assert torch.isfinite(loaded.model(**batch).loss)
    from fedpeft.methods.families.branched import hooked_adapter, install_adapter

    runtime.architecture = "llava"
    adapter = hooked_adapter(runtime, 0, rank=2)
    assert {s.key for s in adapter.sites if s.kind == "pq"} >= {"pq2.mlp.down_proj", "pq1.self_attn.q_proj"}
    install_adapter(runtime, adapter)
    params = adapter.trainable(["local/", "gate/"])
    metrics = runtime.train(examples, TrainArgs(lr=1e-2, batch_size=2, seed=0, steps=2), params)
    assert metrics["steps"] == 2.0
    answers = runtime.predict(data.clients[0].test[:2])
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    runtime.detach_extension()
    # A LLaVA checkpoint directory loads the same way (LLaVA classes, tokenizer, language-model targets).
    loaded.model.save_pretrained(tmp_path / "llava")
    loaded.tokenizer.save_pretrained(tmp_path / "llava")
    reloaded = _tiny_llava(data, str(tmp_path / "llava"))
    assert reloaded.family == "llava" and reloaded.lora_targets == loaded.lora_targets
    again = MultimodalRuntime(reloaded, max_length=64)
    torch.testing.assert_close(reloaded.model(**again.encode(examples)).logits, loaded.model(**batch).logits)
