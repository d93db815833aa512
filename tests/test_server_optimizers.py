"""Server optimizers of weighted-mean server steps: golden numbers against Flower's FedAvgM, FedAdam, FedYogi and
FedAdagrad on the same arrays, the plain step kept bit for bit, moments through checkpoints and the codec,
combination with robust rules and DP, config-time refusals, every mean method, and both engines."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi

import fedpeft.methods  # noqa: F401
from fedpeft.core.checkpoints import load_checkpoint, save_checkpoint
from fedpeft.core.config import method_config, validate
from fedpeft.core.errors import UserError
from fedpeft.core.registry import METHODS
from fedpeft.core.types import ClientUpdate, ServerState
from fedpeft.engine.flower import GridEngine, decode, encode, flower_config
from fedpeft.merging.server_opt import ServerOptimizerConfig, server_step
from fedpeft.merging.server_step import weighted_mean
from fedpeft.methods.base import method_server_step
from fedpeft.methods.fedit import FedITState
from fedpeft.runner import Experiment
from fedpeft.worker import build_method
from tests.test_flower import ATOL, InProcessGrid, one_torch_thread, task_identity, tiny_raw
from tests.test_methods import lora_products

__all__ = ["one_torch_thread", "task_identity"]  # fixtures used here

FAST = {"rounds": 2, "fraction": 0.5, "local_steps": 2, "local_epochs": None, "lr": 1e-2, "local_rounds": 2}
FEDERATED = [n for n in METHODS.names() if METHODS.get(n).federated]
MEAN = [n for n in FEDERATED if method_server_step(build_method({"name": n})) is not None]
NOT_MEAN = [n for n in FEDERATED if method_server_step(build_method({"name": n})) is None]
# Methods whose server step re-factorizes the averaged LoRA (B A kept, the factors rotated).
REFACTORED = {"fedsvd"}
KEYS = {"a.lora_A.weight": (2, 3), "a.lora_B.weight": (3, 2), "head.bias": (4,)}
SIZES = [10.0, 30.0, 7.0]


def rounds_of_uploads(rounds: int = 3, seed: int = 0) -> tuple[dict[str, np.ndarray], list[list[dict]]]:
    """The initial global arrays and, per round, three clients' uploads (float64)."""
    rng = np.random.default_rng(seed)
    x0 = {k: rng.normal(size=shape) for k, shape in KEYS.items()}
    uploads = [
        [{k: x0[k] + rng.normal(scale=0.1 * (r + 1), size=shape) for k, shape in KEYS.items()} for _ in SIZES]
        for r in range(rounds)
    ]
    return x0, uploads


def updates_of(uploads: list[dict]) -> list[ClientUpdate]:
    return [
        ClientUpdate(f"c{i}", {k: torch.from_numpy(v.copy()) for k, v in u.items()}, w, {"loss": float(i)})
        for i, (u, w) in enumerate(zip(uploads, SIZES, strict=True))
    ]


def fedpeft_rounds(entry: dict, x0: dict[str, np.ndarray], rounds: list[list[dict]]) -> list[dict[str, np.ndarray]]:
    """The global arrays after each round of FedIT's server step under ``entry``'s server optimizer."""
    method = build_method({"name": "fedit", **entry})
    state = FedITState(tensors={k: torch.from_numpy(v.copy()) for k, v in x0.items()})
    out = []
    for number, uploads in enumerate(rounds, start=1):
        state, _ = method.aggregate(state, iter(updates_of(uploads)))
        state = dataclasses.replace(state, round=number)  # the round loop counts the round
        out.append({k: v.numpy().copy() for k, v in state.tensors.items()})
    return out


def flower_rounds(strategy, x0: dict[str, np.ndarray], rounds: list[list[dict]]) -> list[dict[str, np.ndarray]]:  # noqa: ANN001
    """The global arrays after each round of a Flower strategy's ``aggregate_train`` on the same uploads, with the
    strategy's record of the global arrays set as its ``configure_train`` sets it."""
    current = {k: v.copy() for k, v in x0.items()}
    out = []
    for server_round, uploads in enumerate(rounds, start=1):
        if isinstance(strategy, FedAvgM):
            if strategy.current_arrays is None:  # FedAvgM records the first arrays and then keeps its own
                strategy.current_arrays = ArrayRecord({k: Array(v) for k, v in current.items()})
        else:
            strategy.current_arrays = {k: v.copy() for k, v in current.items()}
        replies = [
            Message(
                RecordDict(
                    {
                        "arrays": ArrayRecord({k: Array(v) for k, v in u.items()}),
                        "metrics": MetricRecord({"num-examples": w}),
                    }
                ),
                dst_node_id=1,
                message_type="train",
            )
            for u, w in zip(uploads, SIZES, strict=True)
        ]
        arrays, _ = strategy.aggregate_train(server_round, replies)
        current = {k: np.asarray(a.numpy(), dtype=np.float64) for k, a in arrays.items()}
        out.append(current)
    return out


# ---------------------------------------------------------------------- golden numbers against Flower


@pytest.mark.parametrize(
    ("entry", "strategy"),
    [
        ({"name": "sgd", "lr": 0.5}, lambda: FedAvgM(server_learning_rate=0.5, server_momentum=0.0)),
        ({"name": "avgm"}, lambda: FedAvgM(server_learning_rate=1.0, server_momentum=0.9)),
        ({"name": "avgm", "lr": 0.7, "momentum": 0.5}, lambda: FedAvgM(server_learning_rate=0.7, server_momentum=0.5)),
        ({"name": "adam"}, FedAdam),
        (
            {"name": "adam", "lr": 0.05, "betas": [0.8, 0.95], "tau": 1e-2},
            lambda: FedAdam(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-2),
        ),
        ({"name": "yogi"}, FedYogi),
        (
            {"name": "yogi", "lr": 0.3, "betas": [0.5, 0.9], "tau": 1e-4},
            lambda: FedYogi(eta=0.3, beta_1=0.5, beta_2=0.9, tau=1e-4),
        ),
        ({"name": "adagrad"}, FedAdagrad),
        ({"name": "adagrad", "lr": 0.02, "tau": 1e-6}, lambda: FedAdagrad(eta=0.02, tau=1e-6)),
    ],
    ids=lambda value: value["name"] if isinstance(value, dict) else "",
)
def test_three_rounds_match_flowers_strategy_on_the_same_arrays(entry, strategy, task_identity):
    x0, rounds = rounds_of_uploads()
    ours = fedpeft_rounds({"server_optimizer": entry}, x0, rounds)
    theirs = flower_rounds(strategy(), x0, rounds)
    plain = fedpeft_rounds({}, x0, rounds)
    for round_, (got, expected) in enumerate(zip(ours, theirs, strict=True)):
        assert list(got) == list(KEYS)
        for key in KEYS:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-9, atol=1e-12, err_msg=f"{key} {round_}")
    assert not np.allclose(ours[-1]["head.bias"], plain[-1]["head.bias"])  # the optimizer did something


def test_defaults_are_flowers_except_fedavgms_momentum():
    def default(cls: type, name: str) -> float:
        return inspect.signature(cls).parameters[name].default

    adam, yogi, adagrad = (ServerOptimizerConfig(name=n) for n in ("adam", "yogi", "adagrad"))
    assert (adam.lr, adam.betas, adam.tau) == (
        default(FedAdam, "eta"),
        (default(FedAdam, "beta_1"), default(FedAdam, "beta_2")),
        default(FedAdam, "tau"),
    )
    assert (yogi.lr, yogi.betas, yogi.tau) == (
        default(FedYogi, "eta"),
        (default(FedYogi, "beta_1"), default(FedYogi, "beta_2")),
        default(FedYogi, "tau"),
    )
    assert (adagrad.lr, adagrad.betas, adagrad.tau) == (default(FedAdagrad, "eta"), None, default(FedAdagrad, "tau"))
    avgm = ServerOptimizerConfig(name="avgm")
    assert avgm.lr == default(FedAvgM, "server_learning_rate") and avgm.momentum == 0.9
    assert ServerOptimizerConfig(name="sgd").lr == 1.0


def test_hand_computed_first_and_second_steps():
    x, a = {"w": torch.tensor([0.0], dtype=torch.float64)}, {"w": torch.tensor([1.0], dtype=torch.float64)}
    adam = ServerOptimizerConfig(name="adam")
    new, moments = server_step(adam, x, a, None, 1)
    # m = 0.1, v = 0.01, bias correction sqrt(1 - 0.99^2) / (1 - 0.9^2): 0.1 * 0.742460 * 0.1 / (0.1 + 0.001).
    correction = math.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    assert new["w"].item() == pytest.approx(0.1 * correction * 0.1 / 0.101, rel=1e-12)
    assert moments["m"]["w"].item() == pytest.approx(0.1) and moments["v"]["w"].item() == pytest.approx(0.01)
    avgm = ServerOptimizerConfig(name="avgm")
    x1, moments = server_step(avgm, x, a, None, 1)  # u = 1, x = 1
    x2, moments = server_step(avgm, x1, {"w": x1["w"] + 1.0}, moments, 2)  # u = 0.9 + 1, x = 1 + 1.9
    assert x2["w"].item() == pytest.approx(2.9) and moments["momentum"]["w"].item() == pytest.approx(1.9)
    adagrad = ServerOptimizerConfig(name="adagrad", lr=1.0, tau=1.0)
    new, moments = server_step(adagrad, x, {"w": torch.tensor([3.0], dtype=torch.float64)}, None, 1)
    assert new["w"].item() == pytest.approx(3.0 / (3.0 + 1.0)) and moments == {"v": {"w": moments["v"]["w"]}}


def test_integer_and_new_tensors_take_the_aggregate_and_dtypes_are_kept():
    x = {"w": torch.zeros(2, dtype=torch.bfloat16), "ids": torch.arange(2)}
    a = {"w": torch.ones(2, dtype=torch.bfloat16), "ids": torch.tensor([5, 6]), "new": torch.ones(1)}
    new, moments = server_step(ServerOptimizerConfig(name="adam"), x, a, None, 1)
    assert new["w"].dtype == torch.bfloat16 and moments["m"]["w"].dtype == torch.float32
    assert torch.equal(new["ids"], a["ids"]) and torch.equal(new["new"], a["new"])
    assert set(moments["m"]) == {"w"}


# ---------------------------------------------------------------------- the plain step, bit for bit


@pytest.mark.parametrize("entry", [{"name": "sgd"}, {"name": "sgd", "lr": 1.0}, {"name": "avgm", "momentum": 0.0}])
def test_sgd_at_lr_1_is_bit_identical_to_no_optimizer(entry):
    x0, rounds = rounds_of_uploads()
    x0 = {k: v.astype(np.float32) for k, v in x0.items()}
    rounds = [[{k: v.astype(np.float32) for k, v in u.items()} for u in r] for r in rounds]
    for got, expected in zip(
        fedpeft_rounds({"server_optimizer": entry}, x0, rounds), fedpeft_rounds({}, x0, rounds), strict=True
    ):
        for key in KEYS:
            assert np.array_equal(got[key], expected[key]), key


def test_without_an_optimizer_the_state_keeps_no_moments():
    x0, rounds = rounds_of_uploads(rounds=1)
    state = FedITState(tensors={k: torch.from_numpy(v) for k, v in x0.items()})
    new_state, _ = build_method({"name": "fedit"}).aggregate(state, iter(updates_of(rounds[0])))
    assert new_state.server_optimizer is None


# ---------------------------------------------------------------------- moments through checkpoints and messages


def three_rounds_with_a_round_trip(through) -> tuple[FedITState, FedITState]:  # noqa: ANN001
    """The state after three FedAdam rounds run straight, and with ``through`` applied to the state after each."""
    x0, rounds = rounds_of_uploads()
    method = build_method({"name": "fedit", "server_optimizer": {"name": "adam"}})
    straight = carried = FedITState(tensors={k: torch.from_numpy(v.copy()) for k, v in x0.items()}, seed=3)
    for number, uploads in enumerate(rounds, start=1):
        straight, _ = method.aggregate(straight, iter(updates_of(uploads)))
        carried, _ = method.aggregate(carried, iter(updates_of(uploads)))
        # the round loop counts the round
        straight, carried = (dataclasses.replace(s, round=number) for s in (straight, carried))
        carried = through(carried)
    return straight, carried


def assert_same_state(got: ServerState, expected: ServerState) -> None:
    assert type(got) is type(expected) and got.round == expected.round
    assert got.server_optimizer is not None and expected.server_optimizer is not None
    assert set(got.server_optimizer) == set(expected.server_optimizer) == {"m", "v"}
    for name, moments in expected.server_optimizer.items():
        assert list(got.server_optimizer[name]) == list(moments)
        for key, tensor in moments.items():
            assert torch.equal(got.server_optimizer[name][key], tensor), (name, key)
    for key, tensor in expected.tensors.items():
        assert torch.equal(got.tensors[key], tensor), key


def test_moments_survive_a_checkpoint_round_trip(tmp_path):
    def checkpoint(state: FedITState) -> FedITState:
        path = tmp_path / "state.safetensors"
        save_checkpoint({"state": state, "round": state.round}, path)
        return load_checkpoint(path)["state"]

    straight, carried = three_rounds_with_a_round_trip(checkpoint)
    assert_same_state(carried, straight)


def test_moments_survive_the_flower_codec():
    straight, carried = three_rounds_with_a_round_trip(lambda state: decode(encode({"state": state}))["state"])
    assert_same_state(carried, straight)


def test_a_state_pickled_before_the_field_existed_reads_as_no_moments():
    state = FedITState(tensors={"w": torch.ones(1)}, round=2, seed=1)
    del state.__dict__["server_optimizer"]  # as unpickled from a checkpoint written before the field existed
    assert state.server_optimizer is None
    assert dataclasses.replace(state, round=3).server_optimizer is None


# ---------------------------------------------------------------------- with robust rules and DP


@pytest.mark.parametrize(
    "rule",
    [
        {"dp": {"clip_norm": 0.5, "noise_multiplier": 1.0, "seed": 11}},
        {"aggregation": {"robust": "median"}},
        {"aggregation": {"robust": "clip", "clip_norm": 0.5}},
    ],
    ids=["dp", "median", "clip"],
)
def test_the_optimizer_steps_along_the_robust_or_dp_aggregate(rule):
    x0, rounds = rounds_of_uploads()
    optimizer = {"name": "adam", "lr": 0.2}
    combined = build_method({"name": "fedit", "fraction": 1.0, **rule, "server_optimizer": optimizer})
    alone = build_method({"name": "fedit", "fraction": 1.0, **rule})
    for method in (combined, alone):
        method.bind_pool([f"c{i}" for i in range(3)])
    state = FedITState(tensors={k: torch.from_numpy(v.copy()) for k, v in x0.items()})
    moments = None
    for uploads in rounds:
        released, metrics = alone.aggregate(state, iter(updates_of(uploads)))  # the same noise: seeded per round
        expected, moments = server_step(
            combined.cfg.server_optimizer, state.tensors, released.tensors, moments, state.round + 1
        )
        state, combined_metrics = combined.aggregate(state, iter(updates_of(uploads)))
        state = dataclasses.replace(state, round=state.round + 1)  # the round loop counts the round
        assert combined_metrics == metrics
        for key, tensor in expected.items():
            torch.testing.assert_close(state.tensors[key], tensor, rtol=0, atol=1e-12, msg=key)


# ---------------------------------------------------------------------- every mean method, and the refusals


@pytest.mark.parametrize("name", MEAN)
def test_every_mean_method_steps_along_its_aggregate(name, request):
    prefix = "toy_moe" if name == "flame" else "toy"
    runtime, clients = (request.getfixturevalue(f"{prefix}_{part}") for part in ("runtime", "clients"))
    cls = METHODS.get(name)
    fields = {k: v for k, v in FAST.items() if k in cls.Config.model_fields}
    method = build_method({"name": name, **fields, "server_optimizer": {"name": "sgd", "lr": 0.5}})
    plain = build_method({"name": name, **fields})
    state = method.init_server(runtime, seed=0)
    update, _ = method.client_update(runtime, clients[0], method.payload(state, "c0"), None, seed=1)
    copies = [
        ClientUpdate(str(i), {k: v.clone() for k, v in update.tensors.items()}, 10.0 + i, extras=update.extras)
        for i in range(3)
    ]
    new_state, _ = method.aggregate(state, iter(copies))
    if name in REFACTORED:  # the aggregate before the re-factorization
        aggregate = weighted_mean(iter(copies))
    else:
        aggregate = plain.aggregate(state, iter(copies))[0].tensors
    stepped = 0
    expected = {}
    for key, tensor in aggregate.items():
        before = state.tensors.get(key)
        if before is None or not tensor.is_floating_point():
            expected[key] = tensor
        else:
            expected[key] = (before.double() + 0.5 * (tensor.double() - before.double())).to(tensor.dtype)
            stepped += 1
    assert stepped > 0
    if name in REFACTORED:  # the step is taken before the re-factorization, which keeps every product B A
        expected = {**state.tensors, **expected}
        got, want = lora_products(new_state.tensors), lora_products(expected)
        assert got and list(got) == list(want)
        for key, product in want.items():
            torch.testing.assert_close(got[key], product, rtol=1e-4, atol=1e-5, msg=key)
        return
    for key, tensor in expected.items():
        torch.testing.assert_close(new_state.tensors[key], tensor, msg=key)


@pytest.mark.parametrize("name", NOT_MEAN)
def test_a_method_whose_server_step_is_not_a_mean_refuses_a_server_optimizer(name):
    with pytest.raises(UserError, match="not a weighted mean") as error:
        method_config({"name": name, "server_optimizer": {"name": "adam"}})
    assert "`server_optimizer`" in str(error.value) and str(error.value).count(". ") == 0


def test_the_refusal_reaches_a_whole_config():
    raw = tiny_raw(methods=[{"name": "hetlora", "server_optimizer": {"name": "yogi"}}])
    with pytest.raises(UserError, match="Method 'hetlora' cannot use `server_optimizer`"):
        validate(raw)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "adam", "momentum": 0.9}, "`server_optimizer.momentum` applies only to `name: avgm`"),
        ({"name": "adagrad", "betas": [0.9, 0.99]}, "`server_optimizer.betas` applies only to"),
        ({"name": "sgd", "tau": 1e-3}, "`server_optimizer.tau` applies only to"),
        ({"name": "adam", "betas": [0.9, 1.0]}, "must both be in [0, 1)"),
        ({"name": "adam", "lr": 0.0}, "server_optimizer.lr"),
        ({"name": "avgm", "momentum": 1.0}, "server_optimizer.momentum"),
        ({"name": "rmsprop"}, "server_optimizer.name"),
        ({"name": "adam", "beta1": 0.9}, "server_optimizer.beta1"),
    ],
)
def test_inconsistent_optimizer_settings_are_one_sentence_config_errors(entry, message):
    with pytest.raises(UserError, match="of method 'fedit'") as error:
        method_config({"name": "fedit", "server_optimizer": entry})
    assert message in str(error.value)


def test_merge_refuses_a_server_optimizer():
    with pytest.raises(UserError, match="`merge` replaces the weighted mean"):
        method_config({"name": "fedit", "merge": {"operator": "ties"}, "server_optimizer": {"name": "adam"}})


# ---------------------------------------------------------------------- both engines


def test_fedadam_gives_the_same_state_on_both_engines(tmp_path, task_identity):
    fedit = tiny_raw()["methods"][0] | {"server_optimizer": {"name": "adam", "lr": 0.05}}
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[fedit])
    raw["data"] = {**raw["data"], "unseen_pool": False}
    local = Experiment(validate(raw), tmp_path / "local").run()
    grid = InProcessGrid(num_nodes=2)
    flower = Experiment(flower_config(validate(raw)), tmp_path / "grid").run(
        engine_factory=lambda worker: GridEngine(grid, worker)
    )

    def final_state(run_dir) -> ServerState:  # noqa: ANN001
        return load_checkpoint(run_dir / "checkpoints" / "fedit" / "seed0.safetensors")["state"]

    local_state, flower_state = final_state(local), final_state(flower)
    assert local_state.round == flower_state.round == 2
    assert local_state.server_optimizer is not None and flower_state.server_optimizer is not None
    assert set(local_state.server_optimizer) == {"m", "v"}
    assert list(local_state.tensors) == list(flower_state.tensors) == list(local_state.server_optimizer["m"])
    for key, tensor in local_state.tensors.items():
        torch.testing.assert_close(flower_state.tensors[key], tensor, atol=ATOL, rtol=0, msg=key)
    for name, moments in local_state.server_optimizer.items():
        for key, tensor in moments.items():
            torch.testing.assert_close(flower_state.server_optimizer[name][key], tensor, atol=ATOL, rtol=0)
