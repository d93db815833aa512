"""Plugins: the contributing guide's example method, kept outside the package, found through a config's
``plugins`` list and through an installed entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"
NAME = "fedavgm_lora"
RUN = [
    "--set",
    "data.groups=[lat1, lat3]",
    "--set",
    "base.kind=pretrained",
    "--set",
    "budgets=[2]",
    "--set",
    "output.plots=false",
    "--set",
    f"methods=[{{name: {NAME}, rounds: 1, fraction: 1.0, local_steps: 2, lr: 0.005, momentum: 0.5}}]",
]


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    """A directory outside the package holding the guide's example as the module ``my_methods``."""
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    root = tmp_path / "site"
    root.mkdir()
    (root / "my_methods.py").write_text(code.group(1))
    return root


def cli(*args: str, path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(path)}
    return subprocess.run(
        [sys.executable, "-m", "fedpeft.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def method_records(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return [r for r in rows if r["method"] == NAME and r["metric"] == "accuracy"]


@pytest.mark.slow
def test_a_config_plugin_registers_the_example_method(plugin_dir, tmp_path):
    listed = cli("list", "methods", path=plugin_dir)
    assert NAME not in listed.stdout  # unknown until a config names the plugin
    out = tmp_path / "run"
    done = cli("run", "smoke", "--set", "plugins=[my_methods]", *RUN, "--out", str(out), path=plugin_dir)
    assert done.returncode == 0, done.stderr
    assert method_records(out) and all(r["round"] == 1 for r in method_records(out))
    assert "- my_methods" in (out / "config.yaml").read_text()


@pytest.mark.slow
def test_an_installed_entry_point_declares_the_example_method(plugin_dir, tmp_path):
    info = plugin_dir / "my_methods-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-methods\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fedpeft.methods]\n{NAME} = my_methods\n")
    listed = cli("list", "methods", path=plugin_dir)
    assert re.search(rf"^{NAME} +\(plugin: my-methods\)$", listed.stdout, re.M), listed.stdout
    out = tmp_path / "run"
    done = cli("run", "smoke", *RUN, "--out", str(out), path=plugin_dir)  # no `plugins:` needed
    assert done.returncode == 0, done.stderr
    assert method_records(out)


def test_a_plugin_that_cannot_be_imported_is_one_sentence(tmp_path):
    done = cli("run", "smoke", "--set", "plugins=[no_such_plugin]", "--out", str(tmp_path / "run"), path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: The plugin module 'no_such_plugin' could not be imported (No module named 'no_such_plugin'); "
        "install it or fix `plugins`."
    ]
    assert not (tmp_path / "run").exists()
