"""Per-client state stores (memory or disk).

Personalized methods keep per-client state (local adapters, optimizer moments, memories) between rounds. It never
lives in the server state: it lives in a store, in memory for small federations or on disk (one checkpoint file,
:mod:`fedpeft.core.checkpoints`, per client and version, in a directory of the client's own) so that any number of
clients fit. Every entry is tagged with the round that wrote it so a resumed run can roll back to a checkpoint; a
client keeps what that needs: its newest version, and the newest one written in an earlier round.

A run may resume with the other kind of store (another ``engine.workers``: worker processes keep client states
on disk): a disk store restores a memory store's snapshot by writing its versions as files, and a memory store
restores a disk store's (``None``) by reading the files a disk store left under its root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, TypeAlias

from fedpeft.core.checkpoints import SUFFIX, load_checkpoint, save_checkpoint

StoreSnapshot: TypeAlias = dict[str, list[tuple[int, object]]]
"""A memory store's snapshot: each client's versions, ``(round written, state)``, oldest first."""


class ClientStateStore(Protocol):
    """Where per-client state lives between rounds."""

    def get(self, client_id: str) -> object:
        """The latest state of ``client_id``; None when it has none."""

    def put(self, client_id: str, state: object, round_: int) -> None:
        """Keep ``state`` as the state of ``client_id`` written in round ``round_``."""

    def rollback(self, round_: int) -> None:
        """Forget every write of a round later than ``round_`` (restoring the version before it)."""

    def snapshot(self) -> StoreSnapshot | None:
        """What a checkpoint keeps of the store (``None`` where the store lives on disk already)."""

    def restore(self, snapshot: StoreSnapshot | None) -> None:
        """Restore what :meth:`snapshot` returned."""


class MemoryStore:
    """Client states in a dict (current and previous version); ``root``: where a disk store of the same run keeps
    them (read when a checkpoint of a run on disk is restored)."""

    def __init__(self, root: Path | None = None) -> None:
        self._data: StoreSnapshot = {}
        self.root = root

    def get(self, client_id: str) -> object:
        """The latest state of ``client_id``; None when it has none."""
        versions = self._data.get(client_id)
        return versions[-1][1] if versions else None

    def put(self, client_id: str, state: object, round_: int) -> None:
        """Keep ``state`` as written in round ``round_`` (replacing one written in that round); of the versions of
        earlier rounds only the newest stays (for rollback)."""
        earlier = [version for version in self._data.get(client_id, []) if version[0] < round_]
        self._data[client_id] = earlier[-1:] + [(round_, state)]

    def rollback(self, round_: int) -> None:
        """Drop the versions written after round ``round_``; a client left with none is forgotten."""
        for client_id in list(self._data):
            kept = [v for v in self._data[client_id] if v[0] <= round_]
            if kept:
                self._data[client_id] = kept
            else:
                del self._data[client_id]

    def snapshot(self) -> StoreSnapshot:
        """Every client's versions (a shallow copy), for a checkpoint."""
        return dict(self._data)

    def restore(self, snapshot: StoreSnapshot | None) -> None:
        """Take the versions in ``snapshot`` (from :meth:`snapshot`) as the store's; ``None`` (the checkpoint of a
        run that kept client states on disk): the versions in the files under ``root``."""
        if snapshot is not None:
            self._data = dict(snapshot)
            return
        self._data = {}
        for client_id, round_, path in _files(self.root):
            self._data.setdefault(client_id, []).append((round_, load_checkpoint(path)))
        for versions in self._data.values():
            versions.sort(key=lambda version: version[0])
            del versions[:-2]


class DiskStore:
    """Client states as checkpoint files, one directory per client under ``root``
    (``<client>/r<round>.safetensors``): a read or write lists its client's directory only (two files at most), so a
    pass over every client costs time linear in the clients whatever their number, and processes that write
    different clients (worker processes, Flower nodes) never touch the same file. Memory use is independent of
    the clients.

    A run written by an earlier version kept ``<client>.r<round>.safetensors`` files directly under ``root``: a
    resume moves them into this layout (:meth:`rollback`, :meth:`restore`) before any client is read."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def get(self, client_id: str) -> object:
        """The latest state of ``client_id``, loaded from its newest file; None when it has none."""
        versions = _versions(self.root / client_id)
        if not versions:
            return None
        return load_checkpoint(versions[-1][1])

    def put(self, client_id: str, state: object, round_: int) -> None:
        """Save ``state`` as ``<client>/r<round_>.safetensors``, then delete the client's other files but the
        newest of an earlier round (what a rollback to the last checkpoint needs)."""
        directory = self.root / client_id
        directory.mkdir(exist_ok=True)
        save_checkpoint(state, directory / _file_name(round_))
        earlier = [path for version, path in _versions(directory) if version < round_]
        later = [path for version, path in _versions(directory) if version > round_]
        for path in earlier[:-1] + later:
            path.unlink(missing_ok=True)

    def rollback(self, round_: int) -> None:
        """Delete every file written in a round later than ``round_`` (one pass over the clients' directories)."""
        _move_legacy_files(self.root)
        for _, version, path in _files(self.root):
            if version > round_:
                path.unlink()

    def snapshot(self) -> None:
        """None: the files under ``root`` are already what a checkpoint needs."""
        return None

    def restore(self, snapshot: StoreSnapshot | None) -> None:
        """``None``: nothing to restore, the files under ``root`` are the store (:meth:`rollback` returns them to a
        round). A memory store's snapshot (the checkpoint of a run that kept client states in memory): its versions
        replace every file."""
        _move_legacy_files(self.root)
        if snapshot is None:
            return
        for _, _, path in _files(self.root):
            path.unlink()
        for client_id, versions in snapshot.items():
            (self.root / client_id).mkdir(exist_ok=True)
            for round_, state in versions:
                save_checkpoint(state, self.root / client_id / _file_name(round_))


def _file_name(round_: int) -> str:
    return f"r{round_}{SUFFIX}"


def _versions(directory: Path) -> list[tuple[int, Path]]:
    """``(round, path)`` of each state file in one client's ``directory``, oldest first (none when it is absent)."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        version = entry.name.removesuffix(SUFFIX).removeprefix("r")
        if entry.name.startswith("r") and entry.name.endswith(SUFFIX) and version.isdigit():
            found.append((int(version), Path(entry.path)))
    return sorted(found)


def _files(root: Path | None) -> list[tuple[str, int, Path]]:
    """``(client, round, path)`` of each state file a disk store keeps under ``root`` (none when it has no files);
    one pass over the clients' directories, for a resume."""
    if root is None or not root.is_dir():
        return []
    found = []
    for entry in os.scandir(root):
        if entry.is_dir():
            found += [(entry.name, version, path) for version, path in _versions(Path(entry.path))]
    found += _legacy_files(root)
    return found


def _legacy_files(root: Path) -> list[tuple[str, int, Path]]:
    """``(client, round, path)`` of the ``<client>.r<round>.safetensors`` files an earlier version wrote directly
    under ``root``."""
    found = []
    for path in root.glob(f"*.r*{SUFFIX}"):
        client_id, _, version = path.name.removesuffix(SUFFIX).rpartition(".r")
        if client_id and version.isdigit() and path.is_file():
            found.append((client_id, int(version), path))
    return found


def _move_legacy_files(root: Path) -> None:
    """Move the state files of an earlier version's layout into the clients' directories (a resumed run of that
    version reads on in this layout); a file another process moved first is skipped."""
    for client_id, version, path in _legacy_files(root):
        (root / client_id).mkdir(exist_ok=True)
        try:
            os.replace(path, root / client_id / _file_name(version))
        except FileNotFoundError:
            continue


def make_store(kind: str, root: Path) -> MemoryStore | DiskStore:
    """A store of ``kind`` (``memory`` or ``disk``); disk stores live under ``root``, where a memory store looks for
    the files of a run that kept them on disk before it resumed in memory."""
    return DiskStore(root) if kind == "disk" else MemoryStore(root)
