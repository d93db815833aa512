"""Vision models: a tiny ViT for CPU runs and image-classification checkpoints (e.g. ViT-B/16) from the hub.

``tiny-vit`` (registered in :mod:`fedpeft.models.table`): a 2-layer ViTForImageClassification (hidden 64,
patches of 4 pixels on 32 x 32 images) built from a transformers config, with a ViT image processor from
transformers (resize to the model's size, rescale to [0, 1], normalize with mean and SD 0.5; the PIL backend, so
torchvision is not needed). Hub ids and local directories whose config is an image-classification architecture
load with ``AutoModelForImageClassification`` and their own image processor; a head for another label count is
replaced by a fresh one.

Image examples carry an ``image`` (an ``H x W x 3`` uint8 array) and a ``label``; the runtime turns them into
``pixel_values`` with the model's image processor (``LoadedModel.image_processor``).
"""

from __future__ import annotations

import warnings

import torch
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModelForImageClassification,
    BaseImageProcessor,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessorPil,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.models.tiny import Corpus, apply_overrides, seeded_init, seeded_model

TINY_VIT_IMAGE_SIZE = 32

Preprocessor = PreTrainedTokenizerBase | BaseImageProcessor
"""What reads a model's inputs: its tokenizer, or an image classifier's image processor."""


def is_image_classifier(config: PretrainedConfig) -> bool:
    """Whether a transformers config belongs to an image-classification architecture."""
    return type(config) in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING


def image_processor(size: int) -> ViTImageProcessorPil:
    """A ViT image processor for ``size`` x ``size`` inputs (PIL backend: no torchvision)."""
    return ViTImageProcessorPil(do_resize=True, size={"height": size, "width": size})


def build_tiny_vit(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, ViTImageProcessorPil]:
    """The tiny ViT (overrides from ``model.overrides``) and its image processor."""
    config = ViTConfig(
        image_size=TINY_VIT_IMAGE_SIZE,
        patch_size=4,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=num_labels,  # type: ignore[call-arg]  # a PreTrainedConfig kwarg the dataclass typing omits
    )
    apply_overrides(config, cfg.overrides, cfg.name)
    model = seeded_model(ViTForImageClassification, config)
    size = config.image_size
    if not isinstance(size, int):
        raise UserError(f"{cfg.name}: model.overrides.image_size must be one integer (square images), not {size!r}.")
    return model, image_processor(size)


def load_image_checkpoint(
    source: str, cfg: ModelConfig, num_labels: int, revision: str | None = None, *, local_files_only: bool = False
) -> tuple[PreTrainedModel, BaseImageProcessor]:
    """An image-classification checkpoint with a head of ``num_labels`` classes, and its image processor
    (``local_files_only``: read a hub id from the local cache, never from the hub)."""
    config = AutoConfig.from_pretrained(source, revision=revision, local_files_only=local_files_only)
    apply_overrides(config, cfg.overrides, cfg.name)
    config.num_labels = num_labels
    with seeded_init():
        model = AutoModelForImageClassification.from_pretrained(
            source,
            config=config,
            revision=revision,
            local_files_only=local_files_only,
            dtype=torch.float32,
            ignore_mismatched_sizes=True,
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torchvision is not installed, falling back to PIL"
            processor = AutoImageProcessor.from_pretrained(source, revision=revision, local_files_only=local_files_only)
    except (OSError, ValueError):
        size = getattr(config, "image_size", 224)
        processor = image_processor(int(size if isinstance(size, int) else size[0]))
    return model, processor


def encode_images(processor: BaseImageProcessor, examples: list[dict]) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``labels`` of image examples."""
    import numpy as np

    images = [np.asarray(ex["image"], dtype=np.uint8) for ex in examples]
    if any(image.ndim != 3 or image.shape[-1] != 3 for image in images):
        raise UserError("Image examples must hold H x W x 3 RGB arrays in their `image` field.")
    pixels = processor(images, return_tensors="pt")["pixel_values"]
    return {"pixel_values": pixels, "labels": torch.tensor([int(ex["label"]) for ex in examples])}
