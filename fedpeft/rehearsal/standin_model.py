"""A paper model at its true width with random weights: a checkpoint directory the real loader reads.

A rehearsal cannot download a paper model's weights, and needs none: its cost lives in the shapes. From the model's
``config.json`` (shipped with fedpeft for every model a preset names, :mod:`fedpeft.models.paper_configs`, or a local
one) :func:`standin_checkpoint` writes a checkpoint directory of the same architecture class, every width and the
vocabulary at their true size, the depth cut to ``layers`` (``num_hidden_layers`` of the text model and, for an
image-text model, of its vision tower; ``None`` keeps the true depth), random weights drawn from a fixed seed in the
checkpoint's own dtype, a stand-in tokenizer and, for image models, an image processor at the true resolution. The
run then loads it through the same code as the real checkpoint (``load_model``: a task head the checkpoint lacks,
the dtype, the LoRA targets).

The stand-in tokenizer is trained on the stand-in data's texts with the recipe of the tiny models
(:mod:`fedpeft.data.tokenizer`: WordPiece for encoders, byte-level BPE for decoders) and its vocabulary padded with
unused tokens to the model's true size, so that a batch has about the token count real text would give and the
embedding and output layers are the real ones. Directories are cached under ``<cache root>/rehearsal/models/``,
keyed by the configuration, the depth and the texts.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedpeft.core.errors import UserError
from fedpeft.data.tokenizer import cache_root, corpus_key, publish_dir
from fedpeft.models.paper_configs import cut_depth, text_part

if TYPE_CHECKING:
    import torch
    from transformers import CLIPImageProcessor, PreTrainedTokenizerFast, ViTImageProcessorPil

# Bump when the recipe below changes, so that stale cached stand-ins are not reused.
_RECIPE_VERSION = 1

# Model types whose tokenizer is BERT-style (WordPiece with [CLS] A [SEP] B [SEP]); any other text model gets a
# byte-level BPE with a bos token, as Llama, Qwen and OLMo tokenizers are.
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "electra", "deberta", "deberta-v2"})
TRAINED_VOCAB = 8000  # the most tokens learnt from the stand-in texts; the rest of the vocabulary is padding
IMAGE_TOKEN = "<image>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def standin_checkpoint(
    name: str,
    config: dict[str, Any],
    *,
    layers: int | None,
    texts: list[str],
    chat_template: bool = False,
) -> Path:
    """The cached stand-in checkpoint directory of model ``name`` (its ``config`` values), built on first use.

    Args:
        name: the model's hub id or path (recorded in the stand-in's config as ``_name_or_path``).
        config: the model's ``config.json`` values.
        layers: the depth to cut the model to (``None``: its true depth).
        texts: texts to train the stand-in tokenizer on (the stand-in data's); unused by image classifiers.
        chat_template: give the tokenizer a chat template (for ``model.chat_template``).
    """
    cut = cut_depth(config, layers)
    texts = [t for t in texts if t.strip()]
    key = json.dumps([cut, corpus_key(texts), chat_template, _RECIPE_VERSION], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    slug = name.strip("/").replace("/", "--")
    target = cache_root() / "rehearsal" / "models" / f"{slug}-L{layers or 'full'}-{digest}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    _write_checkpoint(staging, name, cut, texts, chat_template)
    return publish_dir(staging, target)


def _write_checkpoint(directory: Path, name: str, config: dict[str, Any], texts: list[str], chat: bool) -> None:
    import transformers
    from transformers import AutoConfig

    from fedpeft.models.tiny import seeded_init

    (directory / "config.json").write_text(json.dumps(config, indent=2))
    loaded = AutoConfig.from_pretrained(str(directory))
    architecture = (config.get("architectures") or [None])[0]
    model_class = getattr(transformers, architecture, None) if architecture else None
    if model_class is None:
        raise UserError(
            f"The configuration of {name} names no architecture class this transformers version has "
            f"({architecture!r}); give a config.json whose `architectures` names one."
        )
    dtype = _dtype(config)
    with seeded_init():
        model = model_class(loaded)
    model.to(dtype)
    model.save_pretrained(str(directory), safe_serialization=True)
    del model
    text = text_part(config)
    if config.get("model_type") == "vit":
        _image_processor(int(config.get("image_size", 224))).save_pretrained(str(directory))
        return
    vision = config.get("vision_config")
    if isinstance(vision, dict):
        _clip_processor(int(vision.get("image_size", 336))).save_pretrained(str(directory))
    if not texts:
        raise UserError(f"The stand-in tokenizer of {name} needs texts to learn from, and the stand-in data has none.")
    vocab = int(text["vocab_size"])
    image_token = config.get("image_token_index")
    tokenizer = _tokenizer(
        texts,
        vocab=int(image_token) if isinstance(image_token, int) and image_token < vocab else vocab,
        encoder=text.get("model_type") in ENCODER_TYPES,
    )
    if isinstance(image_token, int):
        tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
        if tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) != image_token:
            raise UserError(f"The stand-in tokenizer of {name} could not put {IMAGE_TOKEN} at id {image_token}.")
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))


def _dtype(config: dict[str, Any]) -> torch.dtype:
    import torch

    text = text_part(config)
    name = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or "float32"
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(name), torch.float32)


def _tokenizer(texts: list[str], *, vocab: int, encoder: bool) -> PreTrainedTokenizerFast:
    """A tokenizer trained on ``texts`` (at most :data:`TRAINED_VOCAB` tokens learnt) with exactly ``vocab``
    tokens: the learnt ones, then unused padding tokens."""
    from transformers import PreTrainedTokenizerFast

    from fedpeft.data.tokenizer import train_tokenizer

    trained = train_tokenizer(texts, min(vocab, TRAINED_VOCAB), kind="wordpiece" if encoder else "bpe")
    spec = json.loads(trained.backend_tokenizer.to_str())
    table: dict[str, int] = spec["model"]["vocab"]
    taken = len(table)
    if taken > vocab:
        raise UserError(f"The stand-in tokenizer learnt {taken} tokens, more than the model's {vocab}.")
    table.update({f"<|unused_{i}|>": i for i in range(taken, vocab)})
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(json.dumps(spec))
    specials = {
        key: value
        for key, value in trained.special_tokens_map.items()
        if key in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token", "eos_token")
    }
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_input_names=trained.model_input_names, **specials)


def _image_processor(size: int) -> ViTImageProcessorPil:
    from fedpeft.models.vision import image_processor

    return image_processor(size)


def _clip_processor(size: int) -> CLIPImageProcessor:
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
