"""One encoding of fedpeft's values as named tensors plus JSON, shared by the Flower messages
(:mod:`fedpeft.engine.flower.codec`) and the checkpoints on disk (:mod:`fedpeft.core.checkpoints`).

A value may nest dicts, lists, tuples, numbers, strings, ``None``, tensors and the dataclasses of
:mod:`fedpeft.core.types` (``Payload``, ``ClientUpdate``, ``ServerState``, ``TrainResult`` and their subclasses:
each method's typed server state), plus the dataclasses a caller names. Packing moves every tensor into a table of
its own, under a short name, and leaves a marker (``{"__tensor__": name}``) in the JSON; a dataclass becomes its
module-qualified class name and its fields. Unpacking builds only the dataclasses of that list already imported,
by calling them with the fields: nothing else of the JSON names code to run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass
from typing import cast

import numpy as np
import torch

from fedpeft.core.jsontypes import JSONObject, JSONValue
from fedpeft.core.types import ClientUpdate, Payload, ServerState, TrainResult

TENSOR, TUPLE, ITEMS, DATACLASS = "__tensor__", "__tuple__", "__items__", "__dataclass__"
STATE_TYPES: tuple[type, ...] = (Payload, ClientUpdate, ServerState, TrainResult)
"""The dataclasses every packer takes, with their subclasses."""


class UnknownClassError(TypeError):
    """Packed data names a class that is none of the dataclasses its reader accepts."""


def class_name(cls: type) -> str:
    """``module:qualified name``, as packed data names a dataclass."""
    return f"{cls.__module__}:{cls.__qualname__}"


def known_classes(extra: Iterable[type] = ()) -> dict[str, type]:
    """Every dataclass unpacking may build, by :func:`class_name`: :data:`STATE_TYPES`, ``extra`` and their
    subclasses.

    Only classes already imported are found, which is all packed data may name: a Flower node has built its
    worker (and so imported the method) before it decodes a message with the method's state, and a run has built
    its methods before it loads a checkpoint."""
    found: dict[str, type] = {}
    pending = [*STATE_TYPES, *extra]
    while pending:
        cls = pending.pop()
        if class_name(cls) not in found:
            found[class_name(cls)] = cls
            pending += cls.__subclasses__()
    return found


class Packer:
    """Turns values into JSON-compatible data, moving their tensors into :attr:`tensors` (``t0``, ``t1``, ...).

    Args:
        where: what the value is packed for, as the refusal of a value it cannot pack says it ("travel in a
            Flower message").
        extra: dataclasses it packs besides :data:`STATE_TYPES` (and their subclasses).
    """

    def __init__(self, where: str, extra: Iterable[type] = ()) -> None:
        self.where = where
        self.types = (*STATE_TYPES, *extra)
        self.tensors: dict[str, torch.Tensor] = {}
        # id(tensor) -> (the tensor, kept alive so that its id stays its own; its marker): a tensor met twice
        # (a payload every client of a node gets) is stored once
        self._markers: dict[int, tuple[torch.Tensor, JSONObject]] = {}

    def pack(self, value: object) -> JSONValue:
        """``value`` as JSON-compatible data (its tensors replaced by markers)."""
        if value is None or isinstance(value, (bool, int, float, str)):  # the most common first: records, metrics
            return value
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in value):
                return {k: self.pack(v) for k, v in value.items()}
            return {ITEMS: [[self.pack(k), self.pack(v)] for k, v in value.items()]}
        if isinstance(value, list):
            return [self.pack(v) for v in value]
        if isinstance(value, torch.Tensor):
            if id(value) not in self._markers:
                name = f"t{len(self._markers)}"
                self._markers[id(value)] = (value, {TENSOR: name, **self.store(name, value)})
            return self._markers[id(value)][1]
        if isinstance(value, tuple):
            return {TUPLE: [self.pack(v) for v in value]}
        if is_dataclass(value) and isinstance(value, self.types):
            packed = {f.name: self.pack(getattr(value, f.name)) for f in fields(value)}
            return {DATACLASS: class_name(type(value)), "fields": packed}
        if isinstance(value, np.generic):
            return value.item()
        raise TypeError(
            f"A {type(value).__name__} cannot {self.where}; use tensors, numbers, strings, lists, tuples or dicts "
            "of them."
        )

    def store(self, name: str, tensor: torch.Tensor) -> JSONObject:
        """Keep ``tensor`` under ``name``; returns what its marker needs besides the name to read it back."""
        self.tensors[name] = tensor
        return {}


def unpack(
    value: JSONValue, tensor_of: Callable[[JSONObject], torch.Tensor], classes: dict[str, type], source: str
) -> object:
    """The value :meth:`Packer.pack` turned into ``value``.

    Args:
        value: the packed data (parsed JSON).
        tensor_of: the tensor of a marker.
        classes: the dataclasses it may build, by name (:func:`known_classes`).
        source: what holds the data, as the refusal of an unknown class names it ("A message").

    Raises:
        UnknownClassError: the data names a class not in ``classes``, or fields that class lacks.
    """

    def read(item: JSONValue) -> object:
        if isinstance(item, list):
            return [read(v) for v in item]
        if not isinstance(item, dict):
            return item
        if TENSOR in item:
            return tensor_of(item)
        if TUPLE in item:
            return tuple(read(v) for v in cast(list[JSONValue], item[TUPLE]))
        if ITEMS in item:
            return {read(k): read(v) for k, v in cast(list[list[JSONValue]], item[ITEMS])}
        if DATACLASS in item:
            cls = classes.get(cast(str, item[DATACLASS]))
            if cls is None:
                raise UnknownClassError(f"{source} names the unknown state class {item[DATACLASS]!r}.")
            known = {f.name for f in fields(cls)}
            packed = cast(JSONObject, item["fields"])
            unknown = sorted(set(packed) - known)
            if unknown:
                raise UnknownClassError(f"{source} gives {item[DATACLASS]!r} fields it lacks: {unknown}.")
            return cls(**{k: read(v) for k, v in packed.items()})
        return {k: read(v) for k, v in item.items()}

    return read(value)
