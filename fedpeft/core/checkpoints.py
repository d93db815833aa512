"""Checkpoints: what ``--resume`` continues from (a phase's server state and the rest of its round, base models,
client states), one safetensors file each.

A checkpoint holds one value in the encoding of the Flower messages (:mod:`fedpeft.core.encoding`): its tensors
are the file's tensors (``t0``, ``t1``, ...), everything else is JSON in the file's metadata (``fedpeft.checkpoint``,
beside ``fedpeft.format``, the format's version), where a tensor off the CPU also names its device. Loading reads
the tensors and parses the JSON, building only the dataclasses of the method contract (and those the caller
names): nothing in a checkpoint runs code. A checkpoint is written to a temporary sibling, flushed to disk and
renamed over its target, so a kill leaves the previous one or the new one, never a part of one.

Earlier fedpeft versions wrote checkpoints as pickles (``.pt``), which this version never loads: a run that holds
one where a checkpoint belongs is refused (:func:`has_checkpoint`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from fedpeft.core.encoding import TENSOR, Packer, UnknownClassError, known_classes, unpack
from fedpeft.core.errors import UserError
from fedpeft.core.io import write_file_atomic
from fedpeft.core.jsontypes import JSONObject

SUFFIX = ".safetensors"
"""The file suffix of a checkpoint."""
EARLIER_SUFFIX = ".pt"
"""The suffix of an earlier version's (pickled) checkpoint."""
FORMAT = "1"
FORMAT_KEY = "fedpeft.format"
CONTENT_KEY = "fedpeft.checkpoint"


class _FilePacker(Packer):
    """Keeps tensors as safetensors stores them: on the CPU, contiguous, none sharing memory with another."""

    def __init__(self, extra: Iterable[type]) -> None:
        super().__init__("be kept in a checkpoint", extra)
        self._storages: set[int] = set()

    def store(self, name: str, tensor: torch.Tensor) -> JSONObject:
        tensor = tensor.detach()
        device: JSONObject = {} if tensor.device.type == "cpu" else {"device": str(tensor.device)}
        tensor = tensor.cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if storage and storage in self._storages:  # a view of a tensor stored already
            tensor = tensor.clone()
        self._storages.add(tensor.untyped_storage().data_ptr())
        self.tensors[name] = tensor
        return device


def save_checkpoint(value: object, path: Path, extra: Iterable[type] = ()) -> None:
    """Write ``value`` to the checkpoint file ``path``, atomically and flushed to disk.

    Args:
        value: tensors, numbers, strings, ``None``, lists, tuples and dicts of them, and the dataclasses of
            :data:`fedpeft.core.encoding.STATE_TYPES` (every method's server state).
        path: the file (its suffix :data:`SUFFIX`).
        extra: other dataclasses ``value`` holds (their readers pass the same ones to :func:`load_checkpoint`).
    """
    packer = _FilePacker(extra)
    content = json.dumps(packer.pack(value), separators=(",", ":"))
    metadata = {FORMAT_KEY: FORMAT, CONTENT_KEY: content}
    write_file_atomic(Path(path), lambda tmp: save_file(packer.tensors, str(tmp), metadata=metadata), fsync=True)


def load_checkpoint(path: Path, extra: Iterable[type] = ()) -> Any:
    """The value :func:`save_checkpoint` wrote to ``path``, its tensors on the devices they were saved from.

    Raises:
        UserError: the file is no fedpeft checkpoint, or it names a class that is none of the state types (those
            of :data:`fedpeft.core.encoding.STATE_TYPES`, ``extra`` and their subclasses).
    """
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise UserError(f"{path} is not a checkpoint fedpeft can read ({err}).") from None
    if metadata.get(FORMAT_KEY) != FORMAT or CONTENT_KEY not in metadata:
        raise UserError(f"{path} is not a fedpeft checkpoint of format {FORMAT} (its metadata lacks {CONTENT_KEY}).")
    placed: dict[str, torch.Tensor] = {}

    def tensor_of(marker: JSONObject) -> torch.Tensor:
        name = cast(str, marker[TENSOR])
        if name not in placed:  # a tensor met twice is one tensor, as it was when it was saved
            device = cast("str | None", marker.get("device"))
            try:
                placed[name] = tensors[name] if device is None else tensors[name].to(device)
            except (RuntimeError, AssertionError) as err:
                raise UserError(f"{path} holds tensors on {device}, which this machine cannot use ({err}).") from None
        return placed[name]

    try:
        return unpack(json.loads(metadata[CONTENT_KEY]), tensor_of, known_classes(extra), f"Checkpoint {path}")
    except UnknownClassError as err:
        raise UserError(str(err)) from None
    except (KeyError, ValueError, TypeError) as err:
        raise UserError(f"{path} is not a checkpoint fedpeft can read ({type(err).__name__}: {err}).") from None


def has_checkpoint(path: Path, run_dir: Path) -> bool:
    """Whether the checkpoint ``path`` of the run in ``run_dir`` exists.

    Raises:
        UserError: an earlier version's checkpoint (a ``.pt`` pickle, never loaded) stands in its place; one
            sentence names the run and the file.
    """
    path = Path(path)
    if path.exists():
        return True
    earlier = path.with_suffix(EARLIER_SUFFIX)
    if earlier.exists():
        shown = earlier.relative_to(run_dir) if earlier.is_relative_to(run_dir) else earlier
        raise UserError(
            f"{run_dir} holds a checkpoint of an earlier fedpeft version ({shown}), which this version does not "
            "load; start the run again in a new directory."
        )
    return False
