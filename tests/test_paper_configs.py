"""The paper presets' model configurations shipped with fedpeft: one for every model a preset names, each with
its model card's parameter count."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlavaForConditionalGeneration

from fedpeft.core.config import load_config, preset_names
from fedpeft.models.paper_configs import SOURCES, config_file, model_config, shipped_models
from fedpeft.models.table import model_names

# Parameter counts as the models' cards and papers state them (LLaVA: Llama 3.2 with one more token, CLIP
# ViT-L/14-336's vision tower of 303,507,456 and a 1024 -> hidden -> hidden projector).
PARAMETERS = {
    "google-bert/bert-base-multilingual-cased": 177_853_440,
    "google/vit-base-patch16-224-in21k": 86_389_248,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "Qwen/Qwen3-4B-Instruct-2507": 4_022_468_096,
    "allenai/OLMo-1B-hf": 1_176_764_416,
    "allenai/OLMoE-1B-7B-0924": 6_919_161_856,
    "checkpoints/llava-llama3.2-1b": 1_235_814_400 + 2048 + 303_507_456 + (1024 * 2048 + 2048) + (2048 * 2048 + 2048),
    "checkpoints/llava-llama3.2-3b": 3_212_749_824 + 3072 + 303_507_456 + (1024 * 3072 + 3072) + (3072 * 3072 + 3072),
}


def test_every_model_a_preset_names_has_a_shipped_configuration_with_its_source():
    named = set()
    for preset in preset_names():
        cfg = load_config(preset)
        named |= {cfg.model.name, *(m.name for m in (cfg.models or {}).values())}
    external = named - set(model_names())
    assert external == set(shipped_models()) == set(PARAMETERS)
    assert all(SOURCES[name] for name in external)


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_a_shipped_configuration_builds_its_model_with_the_published_parameter_count(name):
    values = model_config(name)
    assert values is not None
    kind = values.pop("model_type")
    config = AutoConfig.for_model(kind, **values)
    with torch.device("meta"):  # shapes only: no memory for the weights
        if kind == "llava":
            model = LlavaForConditionalGeneration(config)
        elif kind in ("bert", "vit"):
            model = AutoModel.from_config(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]


def test_a_local_config_json_is_preferred_and_an_unknown_model_has_none(tmp_path):
    local = tmp_path / "my-model"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    assert model_config("meta-llama/Llama-3.2-1B", local=local)["hidden_size"] == 64
    assert model_config("meta-llama/Llama-3.2-1B", local=local / "config.json")["hidden_size"] == 64
    assert model_config(str(local))["hidden_size"] == 64
    assert model_config("meta-llama/Llama-3.2-1B", local=tmp_path / "absent")["hidden_size"] == 2048
    assert model_config("someone/unknown-model") is None and config_file("someone/unknown-model") is None
