"""The other paper families of tests/test_rehearsal_presets.py, rehearsed end to end at a cut size (a file of their
own, so that a parallel test run spreads the families over its processes)."""

from __future__ import annotations

import pytest

from tests.test_rehearsal_presets import FAMILIES, HERE, rehearses_end_to_end

OTHERS = sorted(set(FAMILIES) - set(HERE))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """Stand-ins of this module's rehearsals (data, models), never ~/.cache."""
    return tmp_path_factory.mktemp("fedpeft-cache")


@pytest.mark.slow
@pytest.mark.parametrize("family", OTHERS)
def test_a_paper_preset_rehearses_end_to_end(family, tmp_path, cache, monkeypatch):
    rehearses_end_to_end(family, tmp_path, cache, monkeypatch)
