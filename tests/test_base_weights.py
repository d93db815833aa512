"""One copy of the base weights per process: the model's own parameters, plus only the values that a client's work
replaced (restored between clients), and none of the model in the main process when worker processes train."""

from __future__ import annotations

import gc

import pytest
import torch

from fedpeft.core.checkpoints import save_checkpoint
from fedpeft.core.config import ExperimentConfig
from fedpeft.data.types import FederatedData
from fedpeft.models.runtime import ClientModel
from fedpeft.training import TrainArgs
from fedpeft.worker import Worker

EMBEDDING = "bert.embeddings.word_embeddings.weight"


def copies_of(tensor: torch.Tensor) -> int:
    """How many distinct storages in this process hold ``tensor``'s dtype, shape and values (itself included)."""
    gc.collect()
    storages = set()
    for obj in gc.get_objects():
        # type(), not isinstance: some objects of torch warn when their class is looked up
        if issubclass(type(obj), torch.Tensor) and obj.shape == tensor.shape and obj.dtype == tensor.dtype:
            if obj.device == tensor.device and torch.equal(obj.detach(), tensor.detach()):
                storages.add(obj.untyped_storage().data_ptr())
    return len(storages)


def loaded_copy(runtime) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in runtime.base_params.items()}


def assert_weights(runtime, expected: dict[str, torch.Tensor]) -> None:
    for name, param in runtime.base_params.items():
        torch.testing.assert_close(param.detach(), expected[name], rtol=0, atol=0, msg=name)


def test_training_every_base_weight_keeps_the_loaded_ones_until_they_are_restored(toy_runtime, toy_clients):
    loaded = loaded_copy(toy_runtime)
    weights = toy_runtime.weights
    assert weights.replaced_names == set()  # the parameters are the restore copy: nothing kept beside them
    toy_runtime.install(ClientModel())
    toy_runtime.train(toy_clients[0].train, TrainArgs(lr=0.05, batch_size=16, seed=0, steps=2), "all")
    assert weights.replaced_names == set(toy_runtime.base_params)
    assert not torch.equal(toy_runtime.base_params[EMBEDDING].detach(), loaded[EMBEDDING])
    toy_runtime.install(ClientModel())
    assert weights.replaced_names == set()
    assert_weights(toy_runtime, loaded)


def test_a_client_base_keeps_only_the_tensors_it_replaces(toy_runtime):
    loaded = loaded_copy(toy_runtime)
    override = {EMBEDDING: torch.zeros_like(loaded[EMBEDDING])}
    toy_runtime.install(ClientModel(base=override))
    assert toy_runtime.weights.replaced_names == {EMBEDDING}
    assert torch.equal(toy_runtime.base_params[EMBEDDING].detach(), override[EMBEDDING])
    toy_runtime.install(ClientModel())
    assert toy_runtime.weights.replaced_names == set()
    assert_weights(toy_runtime, loaded)


def test_overriding_the_initial_base_returns_what_it_replaced_and_restores_to_it(toy_runtime):
    loaded = loaded_copy(toy_runtime)
    weights = toy_runtime.weights
    toy_runtime.install(ClientModel(base={EMBEDDING: torch.ones_like(loaded[EMBEDDING])}))  # a client's edit first
    previous = weights.override_initial_base({EMBEDDING: torch.zeros_like(loaded[EMBEDDING])})
    assert torch.equal(previous[EMBEDDING], loaded[EMBEDDING]) and weights.replaced_names == set()
    toy_runtime.install(ClientModel(base={EMBEDDING: torch.ones_like(loaded[EMBEDDING])}))
    toy_runtime.install(ClientModel())
    assert torch.equal(toy_runtime.base_params[EMBEDDING].detach(), torch.zeros_like(loaded[EMBEDDING]))
    weights.override_initial_base(previous)
    assert_weights(toy_runtime, loaded)


def test_a_worker_holds_one_copy_of_the_base_weights_after_its_clients(toy_worker_factory, toy_clients):
    worker = toy_worker_factory([{"name": "lora", "lr": 0.05, "epochs": 1}])
    runtime = worker.runtime
    loaded = loaded_copy(runtime)
    for client in toy_clients:
        worker.personalize("lora", 0, client.client_id, worker.methods["lora"].init_server(runtime, 0))
        worker.evaluate_base(0, client.client_id)
    assert_weights(runtime, loaded)
    del loaded
    assert copies_of(runtime.base_params[EMBEDDING]) == 1  # the parameter itself: no restore copy, no "pretrained"
    assert worker.bases.pretrained[EMBEDDING].data_ptr() == runtime.base_params[EMBEDDING].data_ptr()


def test_a_seed_base_model_keeps_of_the_loaded_weights_only_those_it_replaced(toy_runtime, toy_clients, tmp_path):
    data = FederatedData("toy", "classification", ["no", "yes"], ["g"], toy_clients)
    stage = {"name": "fedit", "rounds": 1, "fraction": 1.0, "local_steps": 1, "lr": 5e-2, "rank": 2}
    cfg = ExperimentConfig(base={"kind": "federated", "method": stage}, methods=[{"name": "lora"}], budgets=[2])
    worker = Worker(cfg, tmp_path, data=data, runtime=toy_runtime)
    loaded = loaded_copy(toy_runtime)
    trained = {name: tensor.clone() for name, tensor in loaded.items()}
    query = "bert.encoder.layer.0.attention.self.query.weight"
    trained[query] += 1.0  # a merged LoRA changes the layers it adapts, not the embeddings
    save_checkpoint({"tensors": trained}, worker.bases.base_checkpoint(0))
    for _ in range(2):
        worker.bases.use_base(0)
        assert_weights(toy_runtime, trained)
        assert worker.bases.pretrained.keys() == loaded.keys()
        assert_weights_equal(worker.bases.pretrained, loaded)
        worker.bases.use_base(None)
        assert_weights(toy_runtime, loaded)
    worker.bases.use_base(0)
    del trained
    embedding = toy_runtime.base_params[EMBEDDING]
    assert copies_of(embedding) == 2  # the parameter and the test's own copy in `loaded`: nothing of the worker's
    assert copies_of(toy_runtime.base_params[query]) == 1 and torch.equal(worker.bases.pretrained[query], loaded[query])


def assert_weights_equal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    for name, tensor in first.items():
        torch.testing.assert_close(tensor, second[name], rtol=0, atol=0, msg=name)


@pytest.fixture(autouse=True)
def _collected():
    yield
    gc.collect()
