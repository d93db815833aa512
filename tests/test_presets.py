"""Every packaged preset is a valid experiment: its config validates, its methods build, its synthetic data builds."""

from __future__ import annotations

import pytest

from fedpeft.config import load_config, preset_names
from fedpeft.worker import build_data, build_method


@pytest.mark.parametrize("preset", preset_names())
def test_preset_validates_and_its_methods_build(preset):
    cfg = load_config(preset)
    labels = [build_method(entry).label for entry in cfg.methods]
    assert len(labels) == len(set(labels))
    build_method(cfg.base.method)


SYNTHETIC = [p for p in preset_names() if load_config(p).data.name.startswith("synthetic-")]


@pytest.mark.parametrize("preset", SYNTHETIC)
def test_synthetic_preset_data_builds(preset):
    cfg = load_config(preset)
    data = build_data(cfg)
    assert data.pool("seen"), f"{preset} has no seen client"
    assert all(c.train and c.test for c in data.clients)
    if cfg.base.kind == "centralized":
        assert data.base_train, f"{preset} trains a centralized base but its dataset has no base corpus"
