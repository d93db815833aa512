"""``engine.batch_clients``: several clients' LoRA trainings in one forward/backward train each client as training
it alone does, within 1e-5 (FedIT's rounds and per-client LoRA, classifiers and causal LMs, clients of unequal sizes
and text lengths), a run gives the records of one-by-one training, and what cannot batch is refused in one
sentence with exit code 2.

Float rounding differs between the joined batch and a client's own (other matrix shapes, padding): each client's
loss and gradients agree within about 1e-6 relative. AdamW divides each gradient entry by its running root mean
square plus 1e-8, so an entry near 1e-8 turns that rounding into an update difference of up to about 1% of the
learning rate; the tests train at the methods' default lr, 1e-4, where the adapters agree within 1e-5
(docs/flower.md, "Several clients in one batch").
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from test_bad_input_config import refused, smoke_args
from test_run_dirs import TINY

from fedpeft.core.config import ExperimentConfig, ModelConfig, load_config
from fedpeft.core.faults import FaultConfig, InjectedFaultError
from fedpeft.core.registry import METHODS
from fedpeft.core.seeds import client_seed
from fedpeft.core.types import ServerState
from fedpeft.data.types import ClientData, FederatedData
from fedpeft.engine import batched
from fedpeft.engine.batched import personalize_clients, train_clients
from fedpeft.methods.base import Method, lora_spec, method_class
from fedpeft.models.multi_lora import LoraTraining, RoutedLora, routed_lora_delta, train_alone, train_together
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.models.table import load_model
from fedpeft.runner import Experiment
from fedpeft.training import TrainArgs
from fedpeft.worker import Worker

TOLERANCE = 1e-5
LR = 1e-4  # the default learning rate of fedit, local and lora
WORDS = "the cat sat on a red mat while dogs ran far away from big blue houses near old green trees".split()
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
MODELS = {  # model, task, overrides
    "llama-generation": ("tiny-llama", "generation", {}),
    "llama-classification": ("tiny-llama", "classification", {}),
    "bert-classification": ("tiny-bert", "classification", NO_DROPOUT),
}
SIZES = [5, 9, 14, 3]  # training examples per client: 2, 3, 4 and 1 steps an epoch at batch size 4


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def example(rng: random.Random, task: str) -> dict:
    if task == "generation":
        return {"prompt": words(rng, 2, 9), "response": words(rng, 1, 6), "group": "g"}
    return {"text": words(rng, 2, 14), "text_pair": None, "label": rng.randint(0, 2), "group": "g"}


@pytest.fixture(scope="module", params=list(MODELS))
def runtime(request, tmp_path_factory) -> ModelRuntime:
    name, task, overrides = MODELS[request.param]
    rng = random.Random(1)
    corpus = [words(rng, 6, 12) for _ in range(60)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDPEFT_CACHE", str(tmp_path_factory.mktemp("fedpeft-cache")))
        cfg = ModelConfig(name=name, vocab_size=300, max_length=32, overrides=overrides)
        loaded = load_model(cfg, task=task, num_labels=3, corpus=lambda: corpus)
    return ModelRuntime(loaded, max_length=32, max_new_tokens=3)


def make_worker(
    runtime: ModelRuntime, tmp_path: Path, methods: list[dict], faults: list[FaultConfig] | None = None
) -> Worker:
    rng = random.Random(2)
    clients = [
        ClientData(
            f"c{i}",
            "g",
            "seen",
            [example(rng, runtime.task) for _ in range(size)],
            [example(rng, runtime.task) for _ in range(4)],
        )
        for i, size in enumerate(SIZES)
    ]
    labels = ["x", "y", "z"] if runtime.task == "classification" else None
    data = FederatedData("toy", runtime.task, labels, ["g"], clients)
    cfg = ExperimentConfig(methods=methods, budgets=[2, 4], faults=faults or [])
    return Worker(cfg, tmp_path, data=data, runtime=runtime)


def assert_same_tensors(
    alone: dict[str, torch.Tensor], together: dict[str, torch.Tensor], atol: float = TOLERANCE
) -> None:
    assert alone.keys() == together.keys()
    for key, tensor in alone.items():
        torch.testing.assert_close(together[key], tensor, atol=atol, rtol=0, msg=key)


def moved(trained: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """How far training moved the adapter (so that agreeing within the tolerance says something)."""
    return max((t - start.get(key, torch.zeros_like(t))).abs().max().item() for key, t in trained.items())


# ------------------------------------------------------------------------------ each client as trained alone
def test_a_fedit_round_trains_each_client_as_alone(runtime, tmp_path):
    entry = {"name": "fedit", "rounds": 1, "local_steps": None, "local_epochs": 2.0, "batch_size": 4, "lr": LR}
    worker = make_worker(runtime, tmp_path, [entry])
    method = worker.methods["fedit"]
    state = method.init_server(runtime, 0)
    ids = list(worker.clients)
    payloads = [method.payload(state, client_id) for client_id in ids]
    alone = [worker.train("fedit", 0, 0, client_id, payload) for client_id, payload in zip(ids, payloads, strict=True)]
    together = train_clients(worker, "fedit", 0, 0, ids, payloads)
    for first, second in zip(alone, together, strict=True):
        assert not isinstance(second, Exception)
        assert second.update.client_id == first.update.client_id and second.update.weight == first.update.weight
        assert_same_tensors(first.update.tensors, second.update.tensors)
        assert second.update.metrics["steps"] == first.update.metrics["steps"]
        assert second.update.metrics["loss"] == pytest.approx(first.update.metrics["loss"], abs=TOLERANCE)
    assert max(moved(r.update.tensors, state.tensors) for r in alone) > 30 * TOLERANCE
    assert [r.update.metrics["steps"] for r in alone] == [4, 6, 8, 2]  # clients drop out of the batch as they finish


def test_a_client_that_fails_in_a_batch_fails_alone(runtime, tmp_path):
    entry = {"name": "fedit", "rounds": 1, "local_steps": 2, "batch_size": 4, "lr": LR}
    worker = make_worker(runtime, tmp_path, [entry], faults=[FaultConfig(kind="raise", clients=["c1"])])
    method = worker.methods["fedit"]
    state = method.init_server(runtime, 0)
    ids = list(worker.clients)
    together = train_clients(worker, "fedit", 0, 0, ids, [method.payload(state, c) for c in ids])
    assert isinstance(together[1], InjectedFaultError)
    for client_id, result in zip(ids, together, strict=True):
        if client_id != "c1":
            assert not isinstance(result, Exception)
            alone = worker.train("fedit", 0, 0, client_id, method.payload(state, client_id))
            assert_same_tensors(alone.update.tensors, result.update.tensors)


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "local", "rounds": 2, "local_steps": 3, "lr": LR, "batch_size": 4},
        {"name": "lora", "epochs": 2.0, "lr": LR, "batch_size": 4},
    ],
    ids=["local", "lora"],
)
def test_per_client_lora_trains_each_client_as_alone(runtime, tmp_path, entry):
    worker = make_worker(runtime, tmp_path, [entry])
    method: Method = worker.methods[entry["name"]]
    state = ServerState()
    jobs, alone = [], []
    for client_id, client in worker.clients.items():
        for budget in method.budgets_of(client, worker.cfg.budgets):  # lora: ranks 2 and 4 in one call
            seed = client_seed(0, method.name, "personalize", budget, client_id)
            alone.append(method.personalize(runtime, client, state, None, budget, seed).adapter)
            job = method.personal_training(runtime, client, state, None, budget, seed)
            assert job is not None
            jobs.append(job)
    together = train_together(runtime, jobs)
    assert len(together) == len(alone) == len(worker.clients) * (2 if method.uses_budget else 1)
    for first, (second, _) in zip(alone, together, strict=True):
        assert_same_tensors(first, second)
    assert max(moved(first, {}) for first in alone) > 30 * TOLERANCE


def test_a_batched_personalization_gives_the_records_of_one_by_one(runtime, tmp_path):
    entry = {"name": "fedit", "rounds": 1, "finetune_epochs": 1.0, "batch_size": 4, "lr": LR}
    worker = make_worker(runtime, tmp_path, [entry])
    state = worker.methods["fedit"].init_server(runtime, 0)
    ids = list(worker.clients)
    alone = [worker.personalize("fedit", 0, client_id, state) for client_id in ids]
    together = personalize_clients(worker, "fedit", 0, ids, state)
    for (records, _), result in zip(alone, together, strict=True):
        assert not isinstance(result, Exception)
        assert [{**r, "value": None} for r in result[0]] == [{**r, "value": None} for r in records]
        assert [r["value"] for r in result[0]] == pytest.approx([r["value"] for r in records], abs=TOLERANCE)


def test_each_client_gets_the_loss_and_gradients_of_its_batch_alone(runtime):
    """One step, before any optimizer: the joined forward/backward gives each client its own loss and gradients."""
    rng = random.Random(3)
    spec = lora_spec(runtime, 4)
    starts, batches = [], []
    for k, size in enumerate(SIZES):
        runtime.install(ClientModel(lora=spec), seed=k)
        with torch.no_grad():  # B away from 0, so that every factor has a gradient
            for name, param in runtime.adapter_parameters().items():
                if "lora_B" in name:
                    param.copy_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(k)))
        starts.append({name: p.detach().clone() for name, p in runtime.adapter_parameters().items()})
        batches.append(runtime.encode([example(rng, runtime.task) for _ in range(size)]))
    model = runtime.activate(spec)
    alone = []
    for start, batch in zip(starts, batches, strict=True):
        params = runtime.adapter_parameters()
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(start[name])
        for param in model.parameters():
            param.requires_grad_(False)
            param.grad = None
        for param in params.values():
            param.requires_grad_(True)
        model.train()
        loss = model(**batch).loss
        loss.backward()
        alone.append((loss.detach(), {name: p.grad.clone() for name, p in params.items()}))
    routed = RoutedLora(runtime, spec, starts)
    with routed.attached():
        losses = routed.losses(list(range(len(SIZES))), batches)
        torch.stack(losses).sum().backward()
    for (loss, grads), together, own in zip(alone, losses, routed.params, strict=True):
        torch.testing.assert_close(together.detach(), loss, atol=TOLERANCE, rtol=0)
        for name, grad in grads.items():
            assert own[name].grad is not None
            scale = grad.abs().max().item()
            torch.testing.assert_close(own[name].grad, grad, atol=TOLERANCE * scale, rtol=0, msg=name)


def low_precision_jobs(tmp_path_factory, device: str, dtype: str) -> tuple[ModelRuntime, list]:
    """A tiny Llama causal LM on ``device`` in ``dtype``, and three clients' trainings (fresh LoRA, 2 epochs)."""
    rng = random.Random(4)
    corpus = [words(rng, 6, 12) for _ in range(60)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDPEFT_CACHE", str(tmp_path_factory.mktemp("fedpeft-cache")))
        cfg = ModelConfig(name="tiny-llama", vocab_size=300, max_length=32, dtype=dtype)
        loaded = load_model(cfg, task="generation", corpus=lambda: corpus, device=device)
    runtime = ModelRuntime(loaded, max_length=32, device=device, dtype=dtype)
    examples = [[example(rng, "generation") for _ in range(size)] for size in [5, 9, 3]]
    model = ClientModel(lora=lora_spec(runtime, 4))
    args = [TrainArgs(lr=LR, batch_size=4, seed=k, epochs=2.0) for k in range(len(examples))]
    return runtime, [LoraTraining(model, own, own_args) for own, own_args in zip(examples, args, strict=True)]


def test_bfloat16_trains_together_under_autocast(tmp_path_factory):
    """The low-precision path a GPU takes (autocast, float32 adapters), on the CPU: bfloat16 rounds each forward,
    so the clients agree with training alone to bfloat16's precision only."""
    runtime, jobs = low_precision_jobs(tmp_path_factory, "cpu", "bfloat16")
    alone = [train_alone(runtime, job) for job in jobs]
    together = train_together(runtime, jobs)
    for (first, first_metrics), (second, second_metrics) in zip(alone, together, strict=True):
        assert all(tensor.dtype == torch.float32 for tensor in second.values())
        assert second_metrics["loss"] == pytest.approx(first_metrics["loss"], rel=1e-3)
        assert_same_tensors(first, second, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_clients_train_together_on_a_gpu(tmp_path_factory, dtype):
    runtime, jobs = low_precision_jobs(tmp_path_factory, "cuda", dtype)
    alone = [train_alone(runtime, job) for job in jobs]
    together = train_together(runtime, jobs)
    for (first, first_metrics), (second, second_metrics) in zip(alone, together, strict=True):
        # Trained on the GPU, handed back as CPU copies, as one client's training hands them back.
        assert all(tensor.device.type == "cpu" for tensor in second.values())
        assert all(tensor.device.type == "cpu" for tensor in first.values())
        assert second_metrics["loss"] == pytest.approx(first_metrics["loss"], rel=1e-5 if dtype == "float32" else 1e-3)
        assert_same_tensors(first, second, atol=TOLERANCE if dtype == "float32" else 1e-3)


def test_equal_and_unequal_client_rows_route_alike():
    generator = torch.Generator().manual_seed(0)
    a = [torch.randn(3, 8, generator=generator) for _ in range(3)]
    b = [torch.randn(5, 3, generator=generator) for _ in range(3)]
    x = torch.randn(6, 4, 8, generator=generator)
    expected = torch.cat([(part @ a_k.T) @ b_k.T for part, a_k, b_k in zip(x.split(2), a, b, strict=True)])
    torch.testing.assert_close(routed_lora_delta(x, a, b, [2, 2, 2]), expected)
    uneven = torch.cat([(part @ a_k.T) @ b_k.T for part, a_k, b_k in zip(x.split([1, 4, 1]), a, b, strict=True)])
    torch.testing.assert_close(routed_lora_delta(x, a, b, [1, 4, 1]), uneven)


def test_a_batchable_method_runs_the_training_a_batch_runs():
    """A batchable method's client_update and personalize are defined beside the hooks that describe their training
    (a subclass that changes one without the other must set ``batchable_clients = False``, as FedProx does), or
    personalize is the base class's, which runs personal_training's."""
    shipped = [name for name in METHODS.names() if METHODS.entry(name).module is not None]  # not a test's example
    batchable = [method_class(name) for name in shipped if method_class(name).batchable_clients]
    assert {cls.name for cls in batchable} >= {"fedit", "local", "lora"}
    assert not method_class("fedprox").batchable_clients

    def owner(cls: type, hook: str) -> type:
        return next(klass for klass in cls.__mro__ if hook in vars(klass))

    for cls in batchable:
        assert owner(cls, "client_update") is owner(cls, "client_training"), cls.name
        # Method's own personalize trains what personal_training describes.
        assert owner(cls, "personalize") in (owner(cls, "personal_training"), Method), cls.name


# ------------------------------------------------------------------------------------------- a whole run
BATCHABLE_RUN = [
    *TINY,
    "data.groups=[lat1, lat3, cyr1]",
    "model.overrides={hidden_dropout_prob: 0.0, attention_probs_dropout_prob: 0.0}",
    "methods=[{name: lora, lr: 0.001, epochs: 1}, {name: fedit, rounds: 2, fraction: 1.0, local_steps: 2, "
    "lr: 0.001, finetune_epochs: 1}, {name: local, rounds: 1, local_steps: 3, lr: 0.001}]",
]


def records_of(run: Path) -> dict[str, float]:
    keys = ("method", "budget", "pool", "client", "group", "seed", "round", "split", "metric")
    out = {}
    for line in (run / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["metric"] != "seconds":  # timings
            out[json.dumps([record[k] for k in keys])] = record["value"]
    return out


def test_a_run_with_batch_clients_gives_the_records_of_one_by_one(tmp_path, monkeypatch):
    one_by_one = Experiment(load_config("smoke", BATCHABLE_RUN), tmp_path / "one").run()
    groups: list[int] = []

    def counted(runtime: ModelRuntime, jobs: list) -> list:
        groups.append(len(jobs))
        return train_together(runtime, jobs)

    monkeypatch.setattr(batched, "train_together", counted)
    batched_run = Experiment(load_config("smoke", [*BATCHABLE_RUN, "engine.batch_clients=4"]), tmp_path / "four").run()
    assert max(groups) == 4  # fedit's rounds: its 4 seen clients; personalization: 10 clients in groups of 4, 4, 2
    first, second = records_of(one_by_one), records_of(batched_run)
    assert first.keys() == second.keys()
    assert {json.loads(k)[0] for k in first} >= {"lora", "fedit", "local"}
    for key, value in first.items():
        assert second[key] == pytest.approx(value, abs=TOLERANCE), key


# ------------------------------------------------------------------------------------------- refusals
REFUSALS = {
    "a method that cannot batch": (["engine.batch_clients=4"], ["fedprox", "plain LoRA", "fedit"]),
    "LoRA dropout": (
        ["engine.batch_clients=4", "methods=[{name: fedit, rounds: 1, dropout: 0.1}]"],
        ["LoRA dropout 0", "fedit"],
    ),
    "worker processes": (["engine.batch_clients=2", "engine.workers=2"], ["engine.workers"]),
    "the flower engine": (["engine.batch_clients=2", "engine.name=flower"], ["local engine", "--engine flower"]),
    "a model with dropout": (["engine.batch_clients=2"], ["hidden_dropout_prob: 0", "attention_probs_dropout_prob"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_cannot_batch_is_refused_in_one_sentence(case, monkeypatch, capsys, tmp_path):
    overrides, expected = REFUSALS[case]
    if case == "a method that cannot batch":
        overrides = [*overrides, "methods=[{name: fedprox, rounds: 1}]"]
    line = refused(monkeypatch, capsys, tmp_path, smoke_args(tmp_path / "run", *overrides))
    assert "engine.batch_clients" in line and line.count(". ") == 0, line
    for part in expected:
        assert part in line, line
