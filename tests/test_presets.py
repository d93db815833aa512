"""Every packaged preset is a valid experiment: its config validates, its methods build, its synthetic data builds.
So is every experiment file the results pages run (docs/results/**/*.yaml), and every results page says which CPU
and which kernel path made its numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedpeft.core.config import ExperimentConfig, load_config, preset_names
from fedpeft.core.errors import UserError
from fedpeft.worker import build_data, build_method


def method_labels(cfg: ExperimentConfig) -> list[str]:
    """The labels of a config's methods, each built (which validates its settings)."""
    return [build_method(entry).label for entry in cfg.methods]


@pytest.mark.parametrize("preset", preset_names())
def test_preset_validates_and_its_methods_build(preset):
    cfg = load_config(preset)
    labels = method_labels(cfg)
    assert len(labels) == len(set(labels))
    build_method(cfg.base.method)


RESULT_CONFIGS = sorted((Path(__file__).parents[1] / "docs" / "results").rglob("*.yaml"))


@pytest.mark.parametrize("path", RESULT_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_result_page_configs_validate(path):
    labels = method_labels(load_config(str(path)))
    assert labels and len(labels) == len(set(labels))


def test_result_page_configs_are_found():
    assert len(RESULT_CONFIGS) >= 9


RESULT_PAGES = sorted((Path(__file__).parents[1] / "docs" / "results").glob("*.md"))
# Another CPU's float kernels give other records (docs/results/machines.md), so a reader must know which made them:
# the run's `cpu.kernels` where it was recorded, or that it was not.
MADE_ON = re.compile(r"\*\*Made on:\*\* .*\bkernel path (AVX-512|AVX2|not recorded)\b")


@pytest.mark.parametrize("page", RESULT_PAGES, ids=lambda p: p.name)
def test_every_result_page_names_the_cpu_kernel_path_of_its_numbers(page):
    top = page.read_text(encoding="utf-8").split("\n## ")[0]  # before the page's first section
    paragraphs = [" ".join(p.split()) for p in top.split("\n\n")]
    assert any(MADE_ON.match(p) for p in paragraphs), (
        f"{page.name} needs a paragraph before its first section starting **Made on:** with its CPU and "
        "`kernel path AVX-512`, `AVX2` or `not recorded` (the run's `cpu.kernels` in env.json)"
    )


def test_result_pages_are_found():
    assert len(RESULT_PAGES) >= 10


SYNTHETIC = [p for p in preset_names() if load_config(p).data.name.startswith("synthetic-")]


@pytest.mark.parametrize("preset", SYNTHETIC)
def test_synthetic_preset_data_builds(preset):
    cfg = load_config(preset)
    data = build_data(cfg)
    assert data.pool("seen"), f"{preset} has no seen client"
    assert all(c.train and c.test for c in data.clients)
    if cfg.base.kind == "centralized":
        assert data.base_train, f"{preset} trains a centralized base but its dataset has no base corpus"


def test_a_preset_name_wins_over_a_directory_of_that_name(tmp_path, monkeypatch):
    """A run's output directory named after its preset (runs/quickstart, cd runs) does not hide the preset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").mkdir()
    assert load_config("quickstart").name == "quickstart"
    (tmp_path / "mine").mkdir()
    with pytest.raises(UserError, match="does not exist"):
        load_config("mine")
