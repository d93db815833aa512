"""A causal LM's logits only where its loss reads them (``fedpeft.training.labelled_tail``): every training path
(one client, clients batched, per-example gradients, frozen gradients, example losses) computes the logits from
the position before the first label on, and trains as with the whole sequence's logits. The tiny models' logits are
far below the size from which the cut applies (``LOGITS_CUT_BYTES``), which these tests set to 0; the last test
checks the size itself."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import fedpeft.training
from fedpeft.adapters.gradients import per_sample_gradients
from fedpeft.core.config import ModelConfig
from fedpeft.methods.families.branched import frozen_gradient
from fedpeft.methods.families.distillation import example_losses
from fedpeft.models.multi_lora import LoraTraining, train_alone, train_together
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.models.table import load_model
from fedpeft.models.weights import LoraSpec
from fedpeft.training import TrainArgs, first_scored, keeps_logits, labelled_tail, scored_positions

WORDS = "the cat sat on a red mat while dogs ran far away from big blue houses near old green trees".split()


def words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def examples(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": words(rng, 4, 9), "response": words(rng, 1, 4), "group": "g"} for _ in range(count)]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory) -> ModelRuntime:
    rng = random.Random(1)
    corpus = [words(rng, 6, 12) for _ in range(60)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDPEFT_CACHE", str(tmp_path_factory.mktemp("fedpeft-cache")))
        cfg = ModelConfig(name="tiny-llama", vocab_size=300, max_length=32)
        loaded = load_model(cfg, task="generation", corpus=lambda: corpus)
    return ModelRuntime(loaded, max_length=32, max_new_tokens=3)


@pytest.fixture(autouse=True)
def cut_at_any_size(monkeypatch):
    monkeypatch.setattr(fedpeft.training, "LOGITS_CUT_BYTES", 0)


@contextmanager
def computed_logits(runtime: ModelRuntime) -> Iterator[list[int]]:
    """The positions each call of the output layer computes logits for."""
    seen: list[int] = []
    handle = runtime.base_model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: seen.append(args[0].shape[1])
    )
    try:
        yield seen
    finally:
        handle.remove()


@contextmanager
def whole_logits() -> Iterator[None]:
    """Every path as before the cut: the whole sequence's logits."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fedpeft.training, "keeps_logits", lambda model: False)
        yield


def lora(runtime: ModelRuntime) -> LoraSpec:
    return LoraSpec(rank=4, alpha=8.0, targets=tuple(runtime.loaded.lora_targets))


def test_the_scored_positions_run_from_before_each_rows_first_label_to_its_last():
    labels = torch.tensor([[-100, -100, -100, 5, 6, -100], [-100, 7, 8, -100, -100, -100]])
    assert first_scored(labels) == 0
    assert scored_positions(labels).tolist() == [[2, 3, 4], [0, 1, 2]]
    late = torch.tensor([[-100, -100, -100, -100, 5, 6], [-100, -100, 7, 8, 9, -100]])
    assert first_scored(late) == 1
    assert scored_positions(late).tolist() == [[2, 3, 4, 5], [1, 2, 3, 4]]  # the first row's would pass the end
    assert scored_positions(torch.tensor([[3, 4, 5]])) is None  # every position is read
    assert scored_positions(torch.tensor([[3, 4, -100]])).tolist() == [[0, 1]]  # a padded end is not
    assert scored_positions(torch.full((2, 4), -100)).shape == (2, 1)


@pytest.mark.parametrize("rows", [True, False], ids=["positions-per-row", "common-start"])
def test_the_cut_batch_gives_the_whole_batchs_loss_and_gradients(runtime, rows, monkeypatch):
    model = runtime.activate(lora(runtime))
    if not rows:  # a model that keeps the last k positions only (an int logits_to_keep)
        monkeypatch.setattr(fedpeft.training, "_logit_cuts", lambda model: (True, False))
    runtime.reset_adapter(0)
    torch.manual_seed(0)
    for param in runtime.adapter_parameters().values():  # B != 0, so that every adapter tensor has a gradient
        param.data.normal_(0, 0.1)
    batch = runtime.encode(examples(0, 4))
    cut = labelled_tail(model, batch)
    width, start = batch["input_ids"].shape[1], first_scored(batch["labels"])
    assert start >= 3 and cut["input_ids"] is batch["input_ids"]
    if rows:
        positions = scored_positions(batch["labels"])
        assert torch.equal(cut["logits_to_keep"], positions) and positions.shape[1] < width - start
        assert torch.equal(cut["labels"], batch["labels"].gather(1, positions))
    else:
        assert cut["logits_to_keep"] == width - start and torch.equal(cut["labels"], batch["labels"][:, start:])
    params = list(runtime.adapter_parameters().values())
    results = []
    for inputs in (batch, cut):
        outputs = model(**inputs)
        results.append((outputs.logits.shape[1], outputs.loss, torch.autograd.grad(outputs.loss, params)))
    (full_width, full_loss, full_grads), (cut_width, cut_loss, cut_grads) = results
    assert full_width == width and cut_width == cut["labels"].shape[1] < width
    torch.testing.assert_close(cut_loss, full_loss, atol=1e-6, rtol=0)
    for full, part in zip(full_grads, cut_grads, strict=True):
        assert full.abs().max() > 0
        torch.testing.assert_close(part, full, atol=1e-7, rtol=1e-6)


def test_nothing_is_cut_where_nothing_can_be(runtime):
    model = runtime.activate(lora(runtime))
    batch = runtime.encode(examples(1, 2))
    classifier = {"input_ids": batch["input_ids"], "labels": torch.tensor([0, 1])}  # one label a row
    assert labelled_tail(model, classifier) is classifier
    assert not keeps_logits(torch.nn.Linear(2, 2)) and labelled_tail(torch.nn.Linear(2, 2), batch) is batch


def test_a_client_trains_as_with_the_whole_logits_and_computes_fewer(runtime):
    job = LoraTraining(
        ClientModel(lora=lora(runtime)), examples(2, 10), TrainArgs(lr=1e-3, batch_size=4, seed=3, steps=4)
    )
    with whole_logits(), computed_logits(runtime) as whole:
        before, before_metrics = train_alone(runtime, job)
    with computed_logits(runtime) as cut:
        after, metrics = train_alone(runtime, job)
    assert len(cut) == len(whole) == 4 and all(c < w for c, w in zip(cut, whole, strict=True))
    assert metrics["loss"] == pytest.approx(before_metrics["loss"], abs=1e-6)
    for key, tensor in before.items():
        torch.testing.assert_close(after[key], tensor, atol=1e-6, rtol=0, msg=key)


def test_clients_trained_together_cut_to_the_earliest_clients_first_label(runtime):
    jobs = [
        LoraTraining(
            ClientModel(lora=lora(runtime)), examples(seed, 6), TrainArgs(lr=1e-3, batch_size=3, seed=seed, steps=2)
        )
        for seed in (4, 5)
    ]
    with whole_logits():
        before = train_together(runtime, jobs)
    with computed_logits(runtime) as cut:
        after = train_together(runtime, jobs)
    widths = [runtime.encode(job.examples[:3])["input_ids"].shape[1] for job in jobs]
    assert len(cut) == 2 and cut[0] < max(widths)
    for (old, _), (new, _) in zip(before, after, strict=True):
        for key, tensor in old.items():
            torch.testing.assert_close(new[key], tensor, atol=1e-6, rtol=0, msg=key)


def test_gradients_and_losses_outside_training_use_the_cut_too(runtime):
    chosen = examples(6, 5)
    runtime.install(ClientModel(lora=lora(runtime)), seed=1)
    width = runtime.encode(chosen)["input_ids"].shape[1]
    with whole_logits():
        grads_before, _ = per_sample_gradients(runtime, chosen)
        losses_before = example_losses(runtime, chosen)
    with computed_logits(runtime) as cut:
        grads, _ = per_sample_gradients(runtime, chosen)
        losses = example_losses(runtime, chosen)
    assert cut and all(c < width for c in cut)
    torch.testing.assert_close(grads, grads_before, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(losses, losses_before, atol=1e-6, rtol=0)
    runtime.install(ClientModel())
    module = next(name for name, _ in runtime.target_modules)
    with whole_logits():
        frozen_before = frozen_gradient(runtime, module, chosen)
    with computed_logits(runtime) as cut:
        frozen = frozen_gradient(runtime, module, chosen)
    assert len(cut) == 1 and cut[0] < width
    torch.testing.assert_close(frozen, frozen_before, atol=1e-7, rtol=1e-5)


def test_a_llava_batch_drops_its_image_positions_logits():
    from test_multimodal import _tiny_llava, drake

    from fedpeft.models.multimodal import MultimodalRuntime

    data = drake()
    loaded = _tiny_llava(data)
    runtime = MultimodalRuntime(loaded, max_length=64)
    batch = runtime.encode(data.clients[0].train[3:6])  # 16, 32 and 16 image tokens before each text
    cut = labelled_tail(loaded.model, batch)
    assert batch["input_ids"].shape[1] - cut["labels"].shape[1] > 16  # more than an image's tokens
    full, part = loaded.model(**batch), loaded.model(**cut)
    assert part.logits.shape[1] == cut["labels"].shape[1]
    torch.testing.assert_close(part.loss, full.loss, atol=1e-6, rtol=0)


def test_logits_smaller_than_the_threshold_are_computed_whole(runtime, monkeypatch):
    monkeypatch.undo()  # the default size
    model = runtime.activate(lora(runtime))
    batch = runtime.encode(examples(7, 4))
    vocabulary = model.get_output_embeddings().weight.shape[0]
    assert batch["labels"].numel() * vocabulary * 4 < fedpeft.training.LOGITS_CUT_BYTES
    assert labelled_tail(model, batch) is batch  # the numbers of the whole computation, bit for bit
    with computed_logits(runtime) as seen:
        per_sample_gradients(runtime, examples(7, 4))
    assert seen == [batch["input_ids"].shape[1]]
    # The same labels' rows, long enough that the whole logits pass the size: cut.
    rows = fedpeft.training.LOGITS_CUT_BYTES // (vocabulary * 4 * batch["labels"].shape[1]) + 1
    labels = batch["labels"].repeat(rows, 1)
    keep, cut = fedpeft.training.logits_cut(model, labels)
    assert keep is not None and cut.shape[1] < labels.shape[1]
