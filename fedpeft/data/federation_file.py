"""A built federation on disk without pickle: one ``.npz`` file read back with ``allow_pickle=False``.

The file holds a JSON document (member ``federation``, its UTF-8 bytes) with the federation's fields, every
client and every example as written, and the examples' NumPy arrays (images) stacked by dtype and shape (members
``arrays_0``, ``arrays_1``, ...), an array in the document standing as ``{"__ndarray__": [stack, row]}``. Reading
it runs no code from the file: a JSON parser and NumPy's array reader. The document carries :data:`FORMAT` and
:data:`VERSION`; a file of another version is refused, and its reader (the synthetic-data cache) builds again.

Only what reads back equal is written: str, int, float, bool and None, lists, dicts with str keys, and NumPy
arrays of a plain dtype. Anything else (a tuple, a non-str key, another object) raises :class:`TypeError` when
writing, so a federation is never cached as something else than it was built.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import cast

import numpy as np

from fedpeft.core.jsontypes import JSONObject
from fedpeft.data.types import ClientData, FederatedData

FORMAT = "fedpeft-federation"
VERSION = 1
_ARRAY = "__ndarray__"
_SCALARS = (str, int, float, bool, type(None))


class _Arrays:
    """The arrays of a document while it is written: each one's (stack, row), stacks by dtype and shape."""

    def __init__(self) -> None:
        self.stacks: dict[tuple[str, tuple[int, ...]], int] = {}
        self.rows: list[list[np.ndarray]] = []

    def add(self, array: np.ndarray) -> dict[str, list[int]]:
        if array.dtype.hasobject or array.dtype.names is not None:
            raise TypeError(f"an array of dtype {array.dtype} is not written without pickle")
        key = (array.dtype.str, array.shape)
        stack = self.stacks.setdefault(key, len(self.rows))
        if stack == len(self.rows):
            self.rows.append([])
        self.rows[stack].append(array)
        return {_ARRAY: [stack, len(self.rows[stack]) - 1]}


def _plain(value: object, arrays: _Arrays) -> object:
    """``value`` with its arrays replaced by references; raises TypeError for what JSON would not give back."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if type(value) is list:
        return [_plain(v, arrays) for v in value]
    if type(value) is dict:
        if any(type(k) is not str for k in value) or _ARRAY in value:
            raise TypeError(f"a dict with keys {list(value)[:5]} is not written as JSON")
        return {k: _plain(v, arrays) for k, v in value.items()}
    if type(value) is np.ndarray:
        return arrays.add(value)
    raise TypeError(f"a {kind.__name__} is not written as JSON")


def dumps(data: FederatedData) -> bytes:
    """The bytes of ``data``'s file (raises TypeError where a value would not read back equal)."""
    arrays = _Arrays()
    document = {
        "format": FORMAT,
        "version": VERSION,
        "name": data.name,
        "task": data.task,
        "label_names": _plain(data.label_names, arrays),
        "groups": _plain(data.groups, arrays),
        "clients": [
            [c.client_id, c.group, c.pool, _plain(c.train, arrays), _plain(c.test, arrays)] for c in data.clients
        ],
        "base_train": _plain(data.base_train, arrays),
        "info": _plain(data.info, arrays),
    }
    for client in data.clients:
        if not all(type(getattr(client, f)) is str for f in ("client_id", "group", "pool")):
            raise TypeError(f"client {client.client_id!r} has an id, group or pool that is not a str")
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    members = {"federation": np.frombuffer(text.encode(), dtype=np.uint8)}
    members.update({f"arrays_{i}": np.stack(rows) for i, rows in enumerate(arrays.rows)})
    buffer = io.BytesIO()
    np.savez(buffer, **members)  # type: ignore[arg-type]
    return buffer.getvalue()


def load(path: Path) -> FederatedData:
    """The federation written to ``path`` by :func:`dumps`.

    Raises:
        ValueError: the file is not such a file, or of another version (OSError and the parsers' errors for a
            damaged one).
    """
    with np.load(path, allow_pickle=False) as members:
        text = members["federation"].tobytes().decode()
        stacks = [members[f"arrays_{i}"] for i in range(sum(name.startswith("arrays_") for name in members.files))]

    def array(obj: JSONObject) -> JSONObject | np.ndarray:
        reference = cast("list[int] | None", obj.get(_ARRAY) if len(obj) == 1 else None)  # [stack, row]
        return obj if reference is None else stacks[reference[0]][reference[1]]

    # Without arrays the document is read by the C parser alone (no hook called for every example).
    document = json.loads(text, object_hook=array) if stacks else json.loads(text)
    if not isinstance(document, dict) or document.get("format") != FORMAT or document.get("version") != VERSION:
        raise ValueError(f"{path} is not a {FORMAT} file of version {VERSION}")
    clients = [ClientData(*client) for client in document["clients"]]
    return FederatedData(
        name=document["name"],
        task=document["task"],
        label_names=document["label_names"],
        groups=document["groups"],
        clients=clients,
        base_train=document["base_train"],
        info=document["info"],
    )
