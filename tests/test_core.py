"""Golden numbers and invariants of the core: seeds, aggregation, sampling, stores, config, registry."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fedpeft.core.config import apply_override, load_config, validate
from fedpeft.core.errors import UserError
from fedpeft.core.registry import Registry
from fedpeft.core.sampling import sample_clients
from fedpeft.core.seeds import derive_seed
from fedpeft.core.stores import DiskStore, MemoryStore
from fedpeft.core.types import ClientUpdate, num_bytes
from fedpeft.merging.server_step import metric_mean, weighted_mean


def test_derive_seed_is_stable_and_distinct():
    assert derive_seed(0, "fedit", 3, "c1") == derive_seed(0, "fedit", 3, "c1")
    assert derive_seed(0, "fedit", 3, "c1") != derive_seed(0, "fedit", 3, "c2")
    assert derive_seed(0, "fedit", 3, "c1") != derive_seed(1, "fedit", 3, "c1")
    assert 0 <= derive_seed(7, "x") < 2**31 - 1


def test_weighted_mean_golden():
    updates = [
        ClientUpdate("a", {"w": torch.tensor([1.0, 2.0])}, 1.0, {"loss": 1.0}),
        ClientUpdate("b", {"w": torch.tensor([3.0, 4.0])}, 3.0, {"loss": 3.0}),
    ]
    mean, metrics = weighted_mean(iter(updates)), metric_mean(iter(updates))
    torch.testing.assert_close(mean["w"], torch.tensor([2.5, 3.5]))
    assert mean["w"].dtype == torch.float32
    assert metrics == {"train_loss": 2.0, "clients": 2.0}


def test_weighted_mean_of_identical_updates_is_identity():
    tensor = torch.randn(5, 3)
    updates = [ClientUpdate(str(i), {"w": tensor.clone()}, float(i + 1)) for i in range(4)]
    mean = weighted_mean(updates)
    torch.testing.assert_close(mean["w"], tensor)


def test_weighted_mean_leaves_the_uploads_as_they_were_and_sums_as_in_float64():
    """Summed in place, never into an upload: a float64 upload (which ``.double()`` would not copy) is left
    unchanged; the result is the float64 sum of the weighted uploads, bit for bit."""
    generator = torch.Generator().manual_seed(0)
    uploads = [{"w": torch.randn(64, generator=generator, dtype=dtype)} for dtype in (torch.float64, torch.float32)]
    kept = [{k: v.clone() for k, v in upload.items()} for upload in uploads]
    weights = [3.0, 5.0]
    mean = weighted_mean(ClientUpdate(str(i), u, w) for i, (u, w) in enumerate(zip(uploads, weights, strict=True)))
    assert all(torch.equal(u["w"], k["w"]) for u, k in zip(uploads, kept, strict=True))
    expected = (kept[0]["w"] * 3.0 + kept[1]["w"].double() * 5.0) / 8.0
    assert mean["w"].dtype == torch.float64 and torch.equal(mean["w"], expected)


def test_weighted_mean_of_nothing_is_empty():
    assert weighted_mean([]) == {} and metric_mean([]) == {"clients": 0.0}


def test_num_bytes():
    assert num_bytes({"a": torch.zeros(10), "b": torch.zeros(2, 2, dtype=torch.float16)}) == 48


def test_sample_clients_fraction_and_determinism():
    ids = [f"c{i:02d}" for i in range(30)]
    first = sample_clients(ids, 0.1, 1, seed=0, round_=0)
    assert len(first) == 3 and first == sorted(first)
    assert first == sample_clients(list(reversed(ids)), 0.1, 1, seed=0, round_=0)
    rounds = {tuple(sample_clients(ids, 0.1, 1, seed=0, round_=r)) for r in range(10)}
    assert len(rounds) > 1
    assert len(sample_clients(ids, 0.0, 2, seed=0, round_=0)) == 2
    assert len(sample_clients(ids, 1.0, 1, seed=0, round_=0)) == 30


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_store_rollback(kind, tmp_path):
    store = MemoryStore() if kind == "memory" else DiskStore(tmp_path)
    assert store.get("c1") is None
    store.put("c1", {"v": 1}, 0)
    store.put("c1", {"v": 2}, 3)
    store.put("c2", {"v": 9}, 4)
    assert store.get("c1") == {"v": 2}
    store.rollback(2)
    assert store.get("c1") == {"v": 1}
    assert store.get("c2") is None


def test_a_store_restores_the_other_kinds_checkpoint(tmp_path):
    """A run resumed with another engine.workers changes store kind: each restores the other's snapshot, versions
    and rollback included."""
    import torch

    memory = MemoryStore()
    memory.put("c.r1", {"w": torch.tensor([1.0])}, 0)  # a client id that looks like a version suffix
    memory.put("c.r1", {"w": torch.tensor([2.0])}, 3)
    memory.put("c2", {"w": torch.tensor([9.0])}, 4)
    root = tmp_path / "states"
    (root).mkdir()
    (root / "stale.r7.safetensors").write_bytes(b"from an older sitting")
    disk = DiskStore(root)
    disk.restore(memory.snapshot())
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.safetensors"))
    assert files == ["c.r1/r0.safetensors", "c.r1/r3.safetensors", "c2/r4.safetensors"]
    disk.rollback(3)
    assert disk.get("c.r1")["w"].item() == 2.0 and disk.get("c2") is None

    back = MemoryStore(root)
    back.restore(disk.snapshot())  # None: the files are the store
    assert back.get("c.r1")["w"].item() == 2.0 and back.get("c2") is None
    back.rollback(2)
    assert back.get("c.r1")["w"].item() == 1.0
    assert MemoryStore(tmp_path / "none").get("c.r1") is None


def test_overrides_nested_and_list_items():
    raw = {"data": {"seed": 0}, "methods": [{"name": "lora"}, {"name": "fedit", "rounds": 3}]}
    apply_override(raw, "data.seed=5")
    apply_override(raw, "methods.1.rounds=7")
    apply_override(raw, "budgets=[2, 4]")
    apply_override(raw, "model.overrides.hidden_size=32")
    assert raw["data"]["seed"] == 5 and raw["methods"][1]["rounds"] == 7 and raw["budgets"] == [2, 4]
    assert raw["model"]["overrides"] == {"hidden_size": 32}
    with pytest.raises(UserError, match="key=value"):
        apply_override(raw, "data.seed")
    with pytest.raises(UserError, match="index"):
        apply_override(raw, "methods.5.rounds=1")


def test_config_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="Unknown preset"):
        load_config("no-such-preset")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(str(bad))
    with pytest.raises(UserError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(UserError, match="Invalid config at data.clients_per_group"):
        validate({"data": {"clients_per_group": "many"}})
    with pytest.raises(UserError, match="Invalid config at unknown_key"):
        validate({"unknown_key": 1})


def test_registry_is_loud():
    registry: Registry = Registry("thing")
    registry.add("one", 1, aliases=("uno",))
    assert registry.get("uno") == 1 and registry.canonical("uno") == "one"
    with pytest.raises(ValueError, match="already registered"):
        registry.add("uno", 2)
    with pytest.raises(UserError, match="Unknown thing 'two'; choose one of: one"):
        registry.get("two")


@pytest.fixture
def lazy_registry(tmp_path, monkeypatch):
    """A registry with a catalogue and declared modules written to ``tmp_path`` (importable, not yet imported)."""
    registry: Registry = Registry("thing", catalog="lazy_things_catalog")
    holder = types.ModuleType("lazy_things_holder")
    holder.REGISTRY = registry  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lazy_things_holder", holder)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lazy_things_catalog.py").write_text(
        "from lazy_things_holder import REGISTRY\n"
        "REGISTRY.declare('one', 'lazy_things_one', 'The first thing', aliases=('uno',))\n"
        "REGISTRY.declare('ghost', 'lazy_things_empty', 'Promised but never registered')\n"
    )
    (tmp_path / "lazy_things_one.py").write_text(
        "from lazy_things_holder import REGISTRY\nREGISTRY.add('one', 1, aliases=('uno',))\n"
    )
    (tmp_path / "lazy_things_empty.py").write_text("")
    yield registry
    for name in ("lazy_things_catalog", "lazy_things_one", "lazy_things_empty"):
        sys.modules.pop(name, None)


def test_declared_entries_answer_without_importing_and_load_on_get(lazy_registry):
    registry = lazy_registry
    assert registry.names() == ["ghost", "one"] and "uno" in registry and "two" not in registry
    assert registry.canonical("uno") == "one" and registry.aliases_of("one") == ["uno"]
    assert registry.describe("uno") == "The first thing" and registry.entry("one").module == "lazy_things_one"
    assert "lazy_things_one" not in sys.modules
    assert registry.get("uno") == 1 and "lazy_things_one" in sys.modules
    with pytest.raises(LookupError, match="lazy_things_empty is declared to register the thing 'ghost'"):
        registry.get("ghost")
    with pytest.raises(UserError, match="Unknown thing 'two'; choose one of: ghost, one"):
        registry.get("two")


def test_an_entry_declared_as_module_and_name_is_read_there_without_a_register_call(tmp_path, monkeypatch):
    registry: Registry = Registry("thing")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lazy_things_named.py").write_text("THING = 'the thing'\n")
    registry.declare(
        "named",
        "lazy_things_named:THING",
        "Declared with its name",
        config="lazy_things_named:Config",
        report_plots="lazy_things_named:plots",
    )
    entry = registry.entry("named")
    assert (entry.module, entry.attribute, entry.report_plots) == (
        "lazy_things_named",
        "THING",
        "lazy_things_named:plots",
    )
    assert "lazy_things_named" not in sys.modules
    assert registry.get("named") == "the thing"
    registry.declare("missing", "lazy_things_named:NOTHING", "Declared with a name its module lacks")
    with pytest.raises(LookupError, match="declared as lazy_things_named:NOTHING, which does not exist"):
        registry.get("missing")
    with pytest.raises(ValueError, match="the report_sections of thing 'bad' must be given as 'module:Name'"):
        registry.declare("bad", "lazy_things_named:THING", "A hook without its module", report_sections="plots")
    sys.modules.pop("lazy_things_named", None)


def test_declarations_and_registrations_refuse_duplicates(lazy_registry):
    registry = lazy_registry
    registry.get("one")
    with pytest.raises(ValueError, match="'one' is already registered"):
        registry.add("one", 2, aliases=("uno",))  # a declaration is filled once
    with pytest.raises(ValueError, match="'uno' is already registered"):
        registry.declare("uno", "elsewhere", "An alias taken as a name")
    with pytest.raises(ValueError, match="'ghost' is already registered"):
        registry.declare("ghost", "elsewhere", "Declared twice")
    with pytest.raises(ValueError, match="registered with aliases \\['boo'\\] but declared"):
        registry.add("ghost", 3, aliases=("boo",))  # aliases must match the declaration
    registry.add("ghost", 3)  # registering a declared name fills the declaration
    assert registry.get("ghost") == 3 and registry.entry("ghost").module == "lazy_things_empty"
    registry.add("two", 2, description="Registered directly")  # undeclared names still register
    assert registry.get("two") == 2 and registry.describe("two") == "Registered directly"
    assert registry.entry("two").module is None and registry.names() == ["ghost", "one", "two"]
