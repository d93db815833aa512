"""LLaVA-style image-text models: a vision encoder, a projector and a causal LM, as in FedMosaic's clients.

- ``tiny-llava``: transformers' ``LlavaForConditionalGeneration`` with a tiny ViT vision tower (16 x 16 images,
  4 x 4 patches: 16 image tokens) and a tiny Llama (hidden 64, 2 layers; ``model.overrides`` change the Llama,
  ``vision_*`` keys the ViT), with a byte-level BPE vocabulary trained on the data plus the ``<image>`` token.
  Registered in :mod:`fedpeft.models.table`; generation only.
- LLaVA checkpoints (hub ids or local directories with ``model_type: llava``, e.g. LLaVA-1.5 variants) load with
  their tokenizer and, when saved with one, their image processor.

Examples carry ``image``: an ``(H, W, 3)`` uint8 array, an image file path, or a list of them (several images
per question); the prompt gets one block of image tokens per image. :class:`MultimodalRuntime` encodes such
examples (with its :class:`MultimodalEncoder`: pixel values plus image tokens) for training, evaluation and
generation. LoRA goes on the language model's linear layers only (:func:`language_model_targets`): the vision
tower and the projector stay frozen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ViTConfig,
)

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.data.tokenizer import train_tokenizer
from fedpeft.data.types import Example
from fedpeft.models.runtime import Loaded, ModelRuntime
from fedpeft.models.targets import FAMILY_LORA_TARGETS, LORA_LAYER_TYPES, matches
from fedpeft.models.text import TextEncoder, pad_left, pad_right
from fedpeft.models.tiny import (
    TINY_LLAMA_SHAPE,
    Corpus,
    apply_overrides,
    require_corpus,
    seeded_model,
    tiny_decoder_config,
)

IMAGE_TOKEN = "<image>"

ImageSource = np.ndarray | str | Path
"""An example's image: its pixels, or the file that holds them."""


def build_tiny_llava(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A tiny LLaVA (ViT + projector + Llama) with a tokenizer trained on the corpus plus ``<image>``."""
    if task != "generation":
        raise UserError("tiny-llava answers questions about images: use it with a generation dataset.")
    tokenizer = train_tokenizer(require_corpus(corpus, "tiny-llava"), cfg.vocab_size, kind="bpe")
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    vision = ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=16, patch_size=4
    )
    text = tiny_decoder_config(LlamaConfig, tokenizer, cfg.max_length, **TINY_LLAMA_SHAPE)
    apply_overrides(
        vision, {k[len("vision_") :]: v for k, v in cfg.overrides.items() if k.startswith("vision_")}, cfg.name
    )
    apply_overrides(text, {k: v for k, v in cfg.overrides.items() if not k.startswith("vision_")}, cfg.name)
    image_token = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    assert isinstance(image_token, int)  # one token in, one id out
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token,
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
    )
    config.pad_token_id = tokenizer.pad_token_id
    return seeded_model(LlavaForConditionalGeneration, config), tokenizer


def load_image_text_checkpoint(
    source: str, cfg: ModelConfig, task: str, revision: str | None = None, *, local_files_only: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A LLaVA checkpoint with its tokenizer and (if saved with it) its image processor (``local_files_only``:
    read a hub id from the local cache, never from the hub)."""
    if task != "generation":
        raise UserError(f"Model {cfg.name} is an image-text model; use it with a generation dataset.")
    model = LlavaForConditionalGeneration.from_pretrained(
        source,
        revision=revision,  # type: ignore[arg-type]  # annotated str; None (the default branch) works
        local_files_only=local_files_only,
        dtype=torch.float32,
    )
    tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, local_files_only=local_files_only)
    try:
        from transformers import AutoImageProcessor

        model.image_processor = AutoImageProcessor.from_pretrained(
            source, revision=revision, local_files_only=local_files_only
        )
    except (OSError, ValueError):
        model.image_processor = None  # type: ignore[assignment]  # torch types module attributes as Tensor | Module
    return model, tokenizer


def language_model_targets(model: torch.nn.Module) -> list[str]:
    """Full names of the language model's linear layers (attention and MLP), never the vision tower's."""
    suffixes = FAMILY_LORA_TARGETS["llama"]
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, LORA_LAYER_TYPES) and ".language_model." in f".{name}" and matches(name, suffixes)
    ]


def _load_image(image: ImageSource) -> np.ndarray:
    if isinstance(image, np.ndarray):
        return image
    from PIL import Image

    with Image.open(Path(image)) as handle:
        return np.asarray(handle.convert("RGB"))


class MultimodalEncoder(TextEncoder):
    """A :class:`~fedpeft.models.text.TextEncoder` for examples that carry images: each image becomes a block of
    image tokens in the prompt and its pixel values join the batch."""

    def __init__(self, loaded: Loaded, *, max_length: int = 64) -> None:
        super().__init__(loaded.tokenizer, loaded.task, max_length=max_length)
        config: Any = loaded.model.config  # a LlavaConfig
        vision = config.vision_config
        self.image_size = int(vision.image_size)
        per_side = self.image_size // int(vision.patch_size)
        full = getattr(config, "vision_feature_select_strategy", "default") == "full"
        self.image_tokens = per_side * per_side + (1 if full else 0)
        self.image_token_id = int(config.image_token_id)
        self.image_processor = getattr(loaded.model, "image_processor", None)

    def pixels(self, examples: list[Example]) -> torch.Tensor:
        """Pixel values of every image of ``examples`` in order: (images, 3, size, size)."""
        images = [_load_image(image) for ex in examples for image in self._images(ex)]
        if self.image_processor is not None:
            return self.image_processor(images=images, return_tensors="pt")["pixel_values"]
        batch = []
        for image in images:
            tensor = torch.from_numpy(np.array(image, dtype=np.float32)).permute(2, 0, 1) / 255.0
            if tensor.shape[-1] != self.image_size or tensor.shape[-2] != self.image_size:
                tensor = torch.nn.functional.interpolate(tensor[None], size=(self.image_size,) * 2, mode="bilinear")[0]
            batch.append((tensor - 0.5) / 0.5)
        return torch.stack(batch)

    @staticmethod
    def _images(example: Example) -> list[ImageSource]:
        image = example.get("image")
        if image is None:
            return []
        return list(image) if isinstance(image, (list, tuple)) else [image]

    def _prompt_ids(self, example: Example) -> list[int]:
        tok = self.tokenizer
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        images = [self.image_token_id] * (self.image_tokens * len(self._images(example)))
        text = tok(example["prompt"], add_special_tokens=False)["input_ids"]
        # Image tokens are never cut: the text is truncated to what is left of half the length.
        return bos + images + text[: max(0, self.max_length // 2 - len(bos) - len(images))]

    def encode(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        tok = self.tokenizer
        ids, labels = [], []
        for ex in examples:
            prompt = self._prompt_ids(ex)
            response = tok(ex["response"], add_special_tokens=False)["input_ids"]
            eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
            full = (prompt + response + eos)[: max(self.max_length, len(prompt) + 1)]
            ids.append(full)
            labels.append([-100] * len(prompt) + full[len(prompt) :])
        batch = pad_right(ids, labels, tok.pad_token_id)
        if any(self._images(ex) for ex in examples):
            batch["pixel_values"] = self.pixels(examples)
        return batch

    def prompt_batch(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        batch = pad_left([self._prompt_ids(ex) for ex in examples], self.tokenizer.pad_token_id)
        if any(self._images(ex) for ex in examples):
            batch["pixel_values"] = self.pixels(examples)
        return batch


class MultimodalRuntime(ModelRuntime):
    """A :class:`~fedpeft.models.runtime.ModelRuntime` whose examples carry images (LLaVA-style models)."""

    text: MultimodalEncoder

    def _text_encoder(self, loaded: Loaded, *, max_length: int, chat_template: bool) -> TextEncoder:
        return MultimodalEncoder(loaded, max_length=max_length)

    @property
    def image_token_id(self) -> int:
        return self.text.image_token_id
