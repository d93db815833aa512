"""The configurations of the paper presets' models: their ``config.json`` (sizes, no weights), shipped as facts.

A paper-scale run cannot start on a machine without the model's weights, but its cost can be planned and its
whole pipeline rehearsed at the model's true width with random weights, from the model's configuration alone. Each
model a shipped preset names has its configuration here (``configs/<owner>--<name>.json``), copied from the
``config.json`` of the model's repository on the Hugging Face hub (:data:`SOURCES` names each), so no network is
needed. A model in the local Hugging Face cache, or a local checkpoint directory, brings its own ``config.json``,
which :func:`model_config` prefers.

Checked by ``tests/test_paper_configs.py``: built on the ``meta`` device, every configuration has its model card's
parameter count to the parameter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedpeft.core.jsontypes import JSONObject

CONFIG_DIR = Path(__file__).resolve().parent / "configs"

HUB = "https://huggingface.co/{name}/blob/main/config.json"

# Where each shipped configuration comes from. FedMosaic's LLaVA-Llama3.2 checkpoints are not published: theirs
# is assumed (the paper names the language models only): LLaVA-1.5's vision tower, CLIP ViT-L/14 at 336 pixels
# (openai/clip-vit-large-patch14-336), its two-layer GELU projector, and the <image> token appended to Llama 3's
# vocabulary.
SOURCES: dict[str, str] = {
    name: HUB.format(name=name)
    for name in (
        "google-bert/bert-base-multilingual-cased",
        "google/vit-base-patch16-224-in21k",
        "meta-llama/Llama-3.2-1B",
        "meta-llama/Llama-3.2-3B",
        "meta-llama/Llama-3.2-3B-Instruct",
        "meta-llama/Llama-3.1-8B",
        "Qwen/Qwen3-4B-Instruct-2507",
        "allenai/OLMo-1B-hf",
        "allenai/OLMoE-1B-7B-0924",
    )
} | {
    f"checkpoints/llava-llama3.2-{size}": (
        f"assumed: meta-llama/Llama-3.2-{size.upper()} ({HUB.format(name=f'meta-llama/Llama-3.2-{size.upper()}')}) "
        "as the language model, the vision tower of openai/clip-vit-large-patch14-336 and LLaVA-1.5's projector"
    )
    for size in ("1b", "3b")
}


def config_file(name: str) -> Path | None:
    """The shipped configuration file of model ``name`` (a hub id or a preset's checkpoint path); None if none."""
    path = CONFIG_DIR / f"{name.strip('/').replace('/', '--')}.json"
    return path if name in SOURCES and path.is_file() else None


def shipped_models() -> list[str]:
    """The models whose configuration ships with fedpeft."""
    return sorted(name for name in SOURCES if config_file(name) is not None)


def model_config(name: str, *, local: Path | None = None) -> JSONObject | None:
    """The ``config.json`` values of model ``name``: from ``local`` (a ``config.json`` file or a directory holding
    one) when given and present, else from a local checkpoint directory ``name``, else the shipped configuration;
    None when there is none of them."""
    for candidate in (local, Path(name)):
        if candidate is None:
            continue
        path = candidate / "config.json" if candidate.is_dir() else candidate
        if path.is_file() and path.name.endswith(".json"):
            return dict(json.loads(path.read_text()))
    shipped = config_file(name)
    return dict(json.loads(shipped.read_text())) if shipped is not None else None


def cut_depth(config: dict[str, Any], layers: int | None) -> dict[str, Any]:
    """``config`` with at most ``layers`` hidden layers in its text model and vision tower (``None``: as it is);
    per-layer lists (``layer_types``) are cut with them."""
    config = json.loads(json.dumps(config))
    if layers is None:
        return config
    for part in (config, config.get("text_config"), config.get("vision_config")):
        if not isinstance(part, dict) or "num_hidden_layers" not in part:
            continue
        depth = min(int(part["num_hidden_layers"]), layers)
        part["num_hidden_layers"] = depth
        if isinstance(part.get("layer_types"), list):
            part["layer_types"] = part["layer_types"][:depth]
        if isinstance(part.get("max_window_layers"), int):
            part["max_window_layers"] = min(part["max_window_layers"], depth)
    return config


def text_part(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's part of a configuration (``text_config`` of an image-text model, else all of it)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def true_depth(config: dict[str, Any]) -> int:
    """The hidden layers of a configuration's text model."""
    return int(text_part(config).get("num_hidden_layers", 0))
