"""GGUF checkpoints, de-quantized once and cached as an ordinary transformers checkpoint.

transformers reads GGUF files (``from_pretrained(dir, gguf_file=...)``) by de-quantizing every tensor,
which for a 270M-parameter model takes about a minute on a laptop CPU. fedpeft does this once per file: it
writes the de-quantized model (float32 safetensors), its config and its tokenizer to
``<cache root>/models/gguf-<hash>/``, and every later load reads that directory like any local checkpoint.

A cache entry is keyed by the SHA-256 of the GGUF file, so a changed file gives a new entry and an unchanged
one is never parsed again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from fedpeft.core.errors import UserError
from fedpeft.data.tokenizer import cache_root, publish_dir

# Bump when the way a cache entry is written changes, so that old entries are rebuilt.
_RECIPE_VERSION = 1
SOURCE_RECORD = "fedpeft-gguf-source.json"


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file to de-quantize, identified before it is read.

    Attributes:
        key: the SHA-256 of the file's bytes (names the cache entry).
        locate: returns the file's path; it may write the file into the scratch directory it is given
            (e.g. to join a model split over several packages). Called only on a cache miss.
        label: what the file is, for messages and the cache record.
    """

    key: str
    locate: Callable[[Path], Path]
    label: str


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_gguf_source(path: Path) -> GGUFSource:
    """A :class:`GGUFSource` for a GGUF file on disk."""
    if not path.is_file():
        raise UserError(f"GGUF file {path} does not exist; give the path of an existing .gguf file.")
    return GGUFSource(key=file_sha256(path), locate=lambda _scratch: path, label=str(path))


def gguf_cache_dir(key: str) -> Path:
    """The directory holding (or to hold) the de-quantized checkpoint of the GGUF file with hash ``key``."""
    return cache_root() / "models" / f"gguf-{key[:24]}-v{_RECIPE_VERSION}"


def is_cached(key: str) -> bool:
    """Whether the GGUF file with hash ``key`` has been de-quantized into the cache already."""
    return (gguf_cache_dir(key) / SOURCE_RECORD).is_file()


def dequantize_to(gguf_path: Path, out_dir: Path) -> float:
    """De-quantize ``gguf_path`` through transformers and save model, config and tokenizer into ``out_dir``.

    Returns:
        The seconds it took (parsing, de-quantizing and writing).
    """
    start = time.perf_counter()
    folder, filename = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except (ValueError, NotImplementedError, KeyError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(
            f"transformers {transformers.__version__} cannot read GGUF file {gguf_path} ({reason}); "
            "use a GGUF of an architecture transformers supports."
        ) from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # Every tensor is dense now (no GGUF kernels are in use on this path); drop the record of the source
        # quantization so that the model saves and reloads as an ordinary float checkpoint.
        packed = [n for n, m in model.named_modules() if type(m).__name__.startswith("Gguf")]
        if packed:
            raise UserError(
                f"GGUF file {gguf_path} loaded with packed GGUF layers ({packed[0]}, ...), which cannot be "
                "cached as safetensors; uninstall the `kernels` package so that transformers de-quantizes it."
            )
        quantizer.remove_quantization_config(model)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return time.perf_counter() - start


def cached_gguf_checkpoint(source: GGUFSource) -> Path:
    """The cache directory of ``source``'s de-quantized checkpoint, building it on the first call.

    The directory is a plain transformers checkpoint (``config.json``, ``model.safetensors``, tokenizer files)
    plus a record of its source, loadable with ``from_pretrained``.
    """
    target = gguf_cache_dir(source.key)
    if is_cached(source.key):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    scratch = Path(tempfile.mkdtemp(prefix=".scratch-", dir=target.parent))
    try:
        seconds = dequantize_to(source.locate(scratch), staging)
        record = {
            "source": source.label,
            "sha256": source.key,
            "dequantize_seconds": round(seconds, 2),
            "transformers": transformers.__version__,
            "dtype": "float32",
        }
        (staging / SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        publish_dir(staging, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    return target


def source_record(key: str) -> dict:
    """The record written next to a cached checkpoint (source, hash, de-quantization seconds, versions)."""
    return json.loads((gguf_cache_dir(key) / SOURCE_RECORD).read_text())
