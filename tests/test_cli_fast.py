"""The fast command line: `fedpeft --help` and `fedpeft list` import no torch, transformers, peft, method, dataset
or model module, and the catalogues they answer from agree exactly with the modules' own registrations."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest

from fedpeft.core.config import preset_description, preset_names
from fedpeft.core.registry import DATASETS, METHODS, MODELS, Registry

REGISTRIES = {"methods": METHODS, "datasets": DATASETS, "models": MODELS}
HEAVY = ("torch", "transformers", "peft", "datasets", "flwr")
# The only fedpeft modules a listing may load: the package, the command line, the core and the catalogues.
LIGHT = ("fedpeft", "fedpeft.cli", "fedpeft.core", "fedpeft.catalog")

# Runs the console entry point with the given arguments, then reports on stderr, as its last line, what it imported.
PROBE = """
import json, sys
from fedpeft.cli import main
sys.argv = ["fedpeft", *sys.argv[1:]]
try:
    main()
finally:
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def run_cli(*args: str, code: int = 0) -> tuple[str, list[str]]:
    """stdout of `fedpeft *args` run in a fresh interpreter (ending with exit ``code``; for a code other than 0:
    its stderr instead), and the modules it had imported when done."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == code, result.stderr
    *said, modules = result.stderr.strip().splitlines()
    return result.stdout if code == 0 else "\n".join(said), json.loads(modules)


def heavy_modules(modules: list[str]) -> list[str]:
    outside = [m for m in modules if m.split(".")[0] in HEAVY]
    ours = [m for m in modules if m.startswith("fedpeft.") and not m.startswith(tuple(f"{p}." for p in LIGHT[1:]))]
    return outside + [m for m in ours if m not in LIGHT]


def listed(stdout: str) -> dict[str, str]:
    """`name  description` lines -> {name: description}."""
    rows = [line.split(None, 1) for line in stdout.splitlines() if line.strip()]
    assert all(len(row) == 2 for row in rows), f"a listed entry has no description:\n{stdout}"
    return {name: description.strip() for name, description in rows}


TEST_REGISTERED = {"fedavgm_lora"}  # tests/test_contributing.py imports docs/contributing.md's example method


def shipped(registry: Registry) -> list[str]:
    """The registry's declared names (leaving out anything a test registered directly in this process)."""
    return [name for name in registry.names() if registry.entry(name).module is not None]


@pytest.mark.parametrize("what", sorted(REGISTRIES))
def test_list_shows_every_entry_with_its_description_without_importing_it(what):
    stdout, modules = run_cli("list", what)
    assert heavy_modules(modules) == []
    registry = REGISTRIES[what]
    rows = listed(stdout)
    assert sorted(rows) == shipped(registry)
    for name, description in rows.items():
        assert description.startswith(registry.describe(name)) and registry.describe(name)
        for alias in registry.aliases_of(name):
            assert alias in description


def test_list_methods_shows_aliases():
    rows = listed(run_cli("list", "methods")[0])
    assert rows["local"].endswith("(alias: sft)") and rows["fedit"].endswith("(alias: fedavg)")


def test_list_presets_shows_each_presets_first_comment_line():
    stdout, modules = run_cli("list", "presets")
    assert heavy_modules(modules) == []
    rows = listed(stdout)
    assert sorted(rows) == preset_names()
    assert all(rows[name] == preset_description(name) for name in rows)


def test_help_imports_nothing_heavy():
    stdout, modules = run_cli("--help")
    assert "list" in stdout and "run" in stdout
    assert heavy_modules(modules) == []


def test_version_prints_the_installed_version_and_imports_nothing_heavy():
    from importlib.metadata import version

    stdout, modules = run_cli("--version")
    assert stdout.strip() == f"fedpeft {version('fedpeft')}"
    assert heavy_modules(modules) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("methods.1.name=fedlt", "Unknown method 'fedlt'"),
        ("base={kind: federated, method: {name: nope}}", "Unknown method 'nope'"),
        ("data.name=synthetic-xnlii", "Unknown dataset 'synthetic-xnlii'"),
    ],
)
def test_a_misspelt_name_is_refused_before_anything_heavy_is_imported(override, message, tmp_path):
    stderr, modules = run_cli("run", "smoke", "--set", override, "--out", str(tmp_path / "run"), code=2)
    assert stderr.startswith(f"error: {message}; choose one of: ") and len(stderr.splitlines()) == 1
    assert [m for m in heavy_modules(modules) if m.split(".")[0] in HEAVY] == []
    assert not (tmp_path / "run").exists()


def test_a_model_nothing_can_load_without_the_hub_is_refused_before_torch_is_imported(tmp_path):
    """conftest.py sets HF_HUB_OFFLINE for the suite (the fresh interpreter inherits it)."""
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    override = "model.name=no-such-org/no-such-model"
    stderr, modules = run_cli("run", "smoke", "--set", override, "--out", str(tmp_path / "run"), code=2)
    assert stderr.startswith("error: Model no-such-org/no-such-model is neither a registered name nor a local path")
    assert "HF_HUB_OFFLINE is set" in stderr and len(stderr.splitlines()) == 1
    assert [m for m in heavy_modules(modules) if m.split(".")[0] in HEAVY] == []
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_starts_with_a_one_line_description(preset):
    from importlib import resources

    lines = (resources.files("fedpeft") / "presets" / f"{preset}.yaml").read_text().splitlines()
    assert preset_description(preset), f"{preset}.yaml does not start with a `# description` line"
    # The description stands alone: the next line ends the comment or is an empty comment line.
    assert len(lines) > 1 and (not lines[1].startswith("#") or lines[1].strip() == "#"), preset


def test_catalogues_agree_with_the_registrations():
    """Import every module of the methods, data and models packages: each registration fills a declaration made
    by the module that registers it, with the declared aliases, every method's declaration names its class, and no
    declaration is left unfilled."""
    for package in ("fedpeft.methods", "fedpeft.data", "fedpeft.models"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            importlib.import_module(info.name)
    for kind, registry in REGISTRIES.items():
        for name in registry.names():
            entry = registry.entry(name)
            if name in TEST_REGISTERED:  # the contributing guide's example, registered by its test in this process
                continue
            assert entry.module is not None, f"{name} is registered but not declared in fedpeft/catalog/{kind}.py"
            assert entry.description and "\n" not in entry.description, name
            obj = registry.get(name)  # raises if the declared module does not register it
            if registry is MODELS:
                assert entry.description == obj.summary, f"catalogue and ModelSpec.summary of {name} differ"
            else:
                assert obj.__module__ == entry.module, f"{name} is registered by {obj.__module__}, not {entry.module}"
            if registry is METHODS:  # the class a declaration names is the method of that name
                assert obj.name == name, f"fedpeft/catalog/methods.py declares {name!r} as {obj}, named {obj.name!r}"
    assert "fedprox" in METHODS and METHODS.canonical("sft") == "local" and METHODS.canonical("fedavg") == "fedit"
