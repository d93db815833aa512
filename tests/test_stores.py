"""Client-state stores: each read and write touches its own client's files only, a pass over many clients keeps
exactly what a rollback to the last checkpoint needs, and a run of the earlier one-folder layout resumes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from fedpeft.core import stores
from fedpeft.core.checkpoints import save_checkpoint
from fedpeft.core.stores import DiskStore, MemoryStore


@pytest.fixture
def listed(monkeypatch) -> list[Path]:
    """Every directory the stores list (``os.scandir``), in order."""
    calls: list[Path] = []
    scandir = os.scandir

    def recording(path):  # noqa: ANN001, ANN202
        calls.append(Path(path))
        return scandir(path)

    monkeypatch.setattr(stores.os, "scandir", recording)
    return calls


def test_a_disk_stores_reads_and_writes_list_only_their_clients_directory(tmp_path, listed):
    root = tmp_path / "states"
    store = DiskStore(root)
    clients = [f"client-{i:03d}" for i in range(120)]
    for round_ in range(3):
        for number, client_id in enumerate(clients):
            listed.clear()
            store.put(client_id, {"w": torch.tensor([float(number + 100 * round_)])}, round_)
            assert set(listed) == {root / client_id}
            listed.clear()
            assert store.get(client_id)["w"].item() == number + 100 * round_
            assert listed == [root / client_id]

    listed.clear()
    assert store.get("never-written") is None
    assert listed == [root / "never-written"]
    # One directory per client, each with its newest version and the newest of an earlier round: nothing more.
    assert sorted(os.listdir(root)) == clients
    for client_id in clients:
        assert sorted(os.listdir(root / client_id)) == ["r1.safetensors", "r2.safetensors"]


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_store_keeps_what_a_rollback_needs(kind, tmp_path):
    store = MemoryStore() if kind == "memory" else DiskStore(tmp_path)
    store.put("a", {"v": torch.tensor([0.0])}, 0)
    store.put("a", {"v": torch.tensor([1.0])}, 2)
    store.put("a", {"v": torch.tensor([2.0])}, 2)  # written again in the same round (an asynchronous resend)
    store.put("a", {"v": torch.tensor([3.0])}, 5)
    store.put("b", {"v": torch.tensor([7.0])}, 5)
    assert store.get("a")["v"].item() == 3.0
    store.rollback(4)  # the checkpoint after round 4 (0-based): round 5's writes are undone
    assert store.get("a")["v"].item() == 2.0 and store.get("b") is None
    store.rollback(1)  # older than anything kept of "a": it starts over
    assert store.get("a") is None


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_store_resumes_from_the_earlier_one_folder_layout(kind, tmp_path):
    """Files ``<client>.r<round>.safetensors`` directly under the root (an earlier version's disk store): restored
    and rolled back as a resumed phase does, into either kind of store."""
    root = tmp_path / "states"
    root.mkdir()
    for client_id, round_, value in [("c.r1", 0, 1.0), ("c.r1", 3, 2.0), ("c2", 4, 9.0)]:
        save_checkpoint({"w": torch.tensor([value])}, root / f"{client_id}.r{round_}.safetensors")
    store = MemoryStore(root) if kind == "memory" else DiskStore(root)
    store.restore(None)
    store.rollback(3)
    assert store.get("c.r1")["w"].item() == 2.0 and store.get("c2") is None
    store.rollback(2)
    assert store.get("c.r1")["w"].item() == 1.0
    if kind == "disk":  # moved into the clients' directories
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*.safetensors")) == ["c.r1/r0.safetensors"]


def test_stores_of_two_processes_writing_different_clients_see_each_others_states(tmp_path):
    """Worker processes each hold a disk store of the same root; a client's newest state is whichever wrote it."""
    first, second = DiskStore(tmp_path), DiskStore(tmp_path)
    first.put("a", {"v": torch.tensor([1.0])}, 0)
    second.put("b", {"v": torch.tensor([2.0])}, 0)
    second.put("a", {"v": torch.tensor([3.0])}, 1)
    assert first.get("a")["v"].item() == 3.0 and first.get("b")["v"].item() == 2.0
