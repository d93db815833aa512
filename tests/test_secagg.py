"""Secure aggregation with Flower's SecAgg+: the same model as plain aggregation, within the quantization error,
also when a node drops out within the threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.config import validate
from fedpeft.core.errors import UserError
from fedpeft.engine.flower import GridEngine, flower_config
from fedpeft.runner import Experiment
from fedpeft.worker import build_data
from tests.test_flower import InProcessGrid, one_torch_thread, read_records, task_identity, tiny_raw

__all__ = ["one_torch_thread", "task_identity"]  # fixtures used here

NODES = 3
SECAGG = {"num_shares": 3, "reconstruction_threshold": 2}
# One round (so that training does not amplify the difference): per coordinate, each node's contribution is
# quantized in steps of 2 * clipping_range / quantization_range (3.8e-6 with the defaults), with stochastic
# rounding; the mean of NODES such contributions is off by at most NODES steps (the weights sum to at most 1).
QUANTIZATION_ATOL = NODES * 2 * 8.0 / 2**22


def raw(**changes: object) -> dict:
    base = tiny_raw(base={"kind": "pretrained"}, methods=[{**tiny_raw()["methods"][0], "rounds": 1}])
    base.update(changes)
    return base


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / "fedit" / "seed0.safetensors")["state"].tensors


def secure_run(tmp_path: Path, name: str, **changes: object) -> Path:
    cfg = flower_config(validate(raw(engine={"secagg": SECAGG}, **changes)))
    grid = InProcessGrid(num_nodes=NODES)
    return Experiment(cfg, tmp_path / name).run(engine_factory=lambda worker: GridEngine(grid, worker))


def assert_close_states(secure: dict[str, torch.Tensor], plain: dict[str, torch.Tensor]) -> float:
    assert list(secure) == list(plain)
    worst = 0.0
    for key, tensor in plain.items():
        assert secure[key].dtype == tensor.dtype
        worst = max(worst, float((secure[key] - tensor).abs().max()))
    assert worst < QUANTIZATION_ATOL
    return worst


def test_secure_aggregation_gives_the_plain_model_within_the_quantization_error(tmp_path, task_identity):
    plain = Experiment(validate(raw()), tmp_path / "plain").run()
    secure = secure_run(tmp_path, "secure")
    worst = assert_close_states(final_state(secure), final_state(plain))
    assert worst > 0  # the sum really went through quantization and masks
    plain_records, secure_records = read_records(plain), read_records(secure)
    assert plain_records.keys() == secure_records.keys()
    for key, value in plain_records.items():
        assert secure_records[key] == pytest.approx(value, abs=0.02), key


def test_a_node_dropping_out_within_the_threshold_does_not_break_the_round(tmp_path, task_identity):
    """Every client of node 0 drops out of the round after the key exchange: the node does not answer, its masks
    are rebuilt from the other two nodes' shares, and the round's model is the mean of the other clients, as on
    the local engine with the same faults."""
    ids = sorted(c.client_id for c in build_data(validate(raw())).clients)
    seen = [c for c in ids if "-seen-" in c]
    node0 = [c for c in seen if ids.index(c) % NODES == 0]
    assert node0 and len(node0) < len(seen)
    faults = [{"kind": "drop", "clients": node0, "rounds": [1]}]
    plain = Experiment(validate(raw(faults=faults)), tmp_path / "plain").run()
    secure = secure_run(tmp_path, "secure", faults=faults)
    assert_close_states(final_state(secure), final_state(plain))
    rows = [json.loads(line) for line in (secure / "costs.jsonl").read_text().splitlines()]
    dropped = sorted(r["client"] for r in rows if r["metric"] == "dropped_client")
    assert dropped == sorted(node0)


def test_secure_aggregation_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(UserError, match="num_shares"):
        validate(raw(engine={"secagg": {"num_shares": 2}}))
    with pytest.raises(UserError, match="Flower engine"):
        Experiment(validate(raw(engine={"secagg": SECAGG})), tmp_path / "local").run()
    flower = {"name": "flower", "secagg": SECAGG}
    hetlora = {"name": "hetlora", "rounds": 1, "fraction": 1.0, "local_steps": 1, "batch_size": 8}
    with pytest.raises(UserError, match="'hetlora' cannot run under secure aggregation"):
        Experiment(validate(raw(engine=flower, methods=[hetlora])), tmp_path / "hetlora").run()
    private = {**tiny_raw()["methods"][0], "dp": {"clip_norm": 1.0}}
    with pytest.raises(UserError, match="'fedit' sets `dp` or `aggregation.robust`"):
        Experiment(validate(raw(engine=flower, methods=[private])), tmp_path / "dp").run()
    assert not (tmp_path / "hetlora").exists() and not (tmp_path / "dp").exists()


@pytest.mark.slow
def test_secure_aggregation_on_the_flower_simulation_engine(tmp_path):
    from fedpeft.apps.flower import run_flower_simulation

    plain = Experiment(validate(raw()), tmp_path / "plain").run()
    cfg = validate(raw(engine={"name": "flower", "num_supernodes": NODES, "secagg": SECAGG}))
    run_flower_simulation(cfg, tmp_path / "secure")
    assert_close_states(final_state(tmp_path / "secure"), final_state(plain))
