"""The typed settings (fedpeft/settings/ and each method's config module beside it): importable without torch, named
by the method catalogue, and the one place that says whether a method's server step is a weighted mean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedpeft.core.registry import METHODS
from fedpeft.merging.parts import build_server_step
from fedpeft.merging.robust import RobustRule
from fedpeft.merging.server_opt import ServerOptimizer
from fedpeft.merging.server_step import WeightedMean
from fedpeft.methods.base import method_server_step
from fedpeft.methods.fedit_config import FedITConfig
from fedpeft.settings.methods import FederatedLoraConfig, MeanServerConfigMixin
from fedpeft.settings.server import SERVER_PARTS
from fedpeft.worker import build_method

SHIPPED = [name for name in METHODS.names() if (METHODS.entry(name).module or "").startswith("fedpeft.methods.")]
HEAVY = ("torch", "transformers", "peft")


def run_fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object, returned here with ``heavy``: the heavy
    libraries it had imported by then."""
    probe = f"{code}\nimport sys\nout['heavy'] = sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})\n"
    probe += "print(json.dumps(out))"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


METHODS_DIR = Path(__file__).resolve().parents[1] / "fedpeft" / "methods"
CONFIG_MODULES = sorted(f"fedpeft.methods.{path.stem}" for path in METHODS_DIR.glob("*_config.py"))


def test_the_settings_and_every_method_config_module_import_no_torch():
    assert len(CONFIG_MODULES) > 30
    modules = ", ".join(["fedpeft.settings.methods", "fedpeft.settings.server", *CONFIG_MODULES])
    out = run_fresh(f"import json\nimport {modules}\nout = {{}}")
    assert out["heavy"] == []


def test_the_catalogue_names_the_config_class_of_every_shipped_method():
    assert len(SHIPPED) > 30
    for name in SHIPPED:
        declared = METHODS.entry(name).config
        module = declared.partition(":")[0] if declared is not None else ""
        assert module in (*CONFIG_MODULES, "fedpeft.settings.methods"), (
            f"{name}: declare its config in fedpeft/catalog/methods.py, the class in fedpeft/methods/{name}_config.py"
        )
        assert METHODS.config_class(name) is METHODS.get(name).Config, name


def test_config_class_resolves_aliases_and_refuses_unknown_names_like_get():
    assert METHODS.config_class("fedavg") is FedITConfig
    from fedpeft.core.errors import UserError

    with pytest.raises(UserError) as by_get:
        METHODS.get("fedlt")
    with pytest.raises(UserError) as by_config:
        METHODS.config_class("fedlt")
    assert str(by_config.value) == str(by_get.value)


@pytest.mark.parametrize("name", SHIPPED)
def test_the_server_step_is_none_exactly_when_the_config_says_it_is_not_a_mean(name):
    method = build_method({"name": name})
    cfg = method.cfg
    not_mean = isinstance(cfg, MeanServerConfigMixin) and not cfg.server_step_parts()
    assert (method_server_step(method) is None) == not_mean


def test_fedit_with_merge_is_not_a_mean():
    merged = build_method({"name": "fedit", "merge": {"operator": "ties"}})
    assert not merged.cfg.available_server_parts() and method_server_step(merged) is None
    assert method_server_step(build_method({"name": "fedprox"})) is not None


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_config_takes_every_part_of_the_server_step_or_none(name):
    config = METHODS.config_class(name)
    if issubclass(config, MeanServerConfigMixin):
        assert config.server_parts in ((), SERVER_PARTS), name


class MeanThenOptimizerConfig(FederatedLoraConfig):
    server_parts = ("mean", "optimizer")  # a step that takes a server optimizer but no rule


def test_the_config_names_the_parts_of_the_server_step_in_their_order():
    adam = {"name": "adam", "lr": 0.1}
    full = FedITConfig(name="fedit", aggregation={"robust": "median"}, server_optimizer=adam)
    assert full.server_step_parts() == ("mean", "robust", "optimizer") and full.refused_server_settings() == []
    step = build_server_step(full, lambda round_: None)
    assert isinstance(step, ServerOptimizer) and isinstance(step.inner, RobustRule)
    assert isinstance(step.inner.inner, WeightedMean)
    partial = MeanThenOptimizerConfig(name="partial", server_optimizer=adam, dp={"clip_norm": 1.0})
    assert partial.server_step_parts() == ("mean", "optimizer")
    assert partial.refused_server_settings() == ["`dp`"]
    assert build_server_step(FedITConfig(name="fedit", merge={"operator": "ties"}), lambda round_: None) is None


VALIDATE = """
import json
from fedpeft.core.config import InvalidConfigError, load_config, load_raw, validate
from fedpeft.core.registry import METHODS
"""


def test_a_misspelt_method_key_of_the_quickstart_is_refused_before_torch_is_imported():
    out = run_fresh(
        VALIDATE
        + """
try:
    load_config("quickstart", ["methods.0.epoch=3"])
    out = {"problems": []}
except InvalidConfigError as err:
    out = {"problems": err.problems}
"""
    )
    assert out["heavy"] == []
    assert len(out["problems"]) == 1 and "did you mean `epochs`?" in out["problems"][0]


def test_every_shipped_method_is_validated_before_torch_is_imported():
    """A config listing every shipped method by name validates, and one misspelt key in each is refused, method by
    method, without importing torch."""
    out = run_fresh(
        VALIDATE
        + """
names = [n for n in METHODS.names() if (METHODS.entry(n).module or "").startswith("fedpeft.methods.")]
raw = load_raw("smoke")
raw["methods"] = [{"name": n} for n in names]
valid = [m.name for m in validate(raw).methods]
raw["methods"] = [{"name": n, "lerning_rate": 0.1} for n in names]
try:
    validate(raw)
    problems = []
except InvalidConfigError as err:
    problems = err.problems
out = {"names": names, "valid": valid, "problems": problems}
"""
    )
    assert out["heavy"] == []
    assert out["names"] == SHIPPED and out["valid"] == SHIPPED
    assert len(out["problems"]) == len(SHIPPED)
    for name, problem in zip(SHIPPED, out["problems"], strict=True):
        assert f"method {name!r}" in problem and "lerning_rate" in problem


def test_a_config_error_raised_in_a_worker_process_keeps_its_problems():
    """Worker processes send their exceptions back pickled: the error is rebuilt from its problems, not from its
    message (each character of which once counted as a problem)."""
    import pickle

    from fedpeft.core.config import InvalidConfigError

    for problems in (["one sentence."], ["first.", "second."]):
        err = InvalidConfigError(problems, "Method 'lora'")
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is InvalidConfigError and back.problems == problems and str(back) == str(err)
