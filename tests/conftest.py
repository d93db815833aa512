"""Shared fixtures: a toy classification runtime (tiny BERT, word-level tokenizer) and toy clients."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `engine.workers: auto` (the default) in one process: the suite already keeps every core busy, and a run of a few
# tiny clients is faster without worker processes to start. The tests of `auto` itself remove it.
os.environ["FEDPEFT_WORKERS"] = "1"
# Tiny models run fastest on one thread, and a second thread only contends on a shared machine.
torch.set_num_threads(1)

FILE_SECONDS = Path(__file__).with_name("file_seconds.json")

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` need a CUDA device: where none is visible they are deselected (reported as
    deselected, never as passed or skipped); benchmarks/gpu.sh runs them on a GPU machine with ``-m cuda``.

    The files come in the order of their measured seconds, longest first (tests/file_seconds.json; a file not in
    it after them, in collection order), each file's tests in their own order: ``--dist loadfile`` hands the files
    out in this order (see :func:`pytest_configure`), so the long ones no longer end the run on one worker."""
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))  # stable: files stay whole
    if torch.cuda.is_available():
        return
    gpu_only = [item for item in items if item.get_closest_marker("cuda") is not None]
    if gpu_only:
        config.hook.pytest_deselected(items=gpu_only)
        items[:] = [item for item in items if item.get_closest_marker("cuda") is None]


def _sigint_ignored() -> bool:
    """Whether this process ignores SIGINT, as the kernel has it (a library may change it behind Python's back)."""
    try:
        with open("/proc/self/status") as status:
            ignored = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    return bool(ignored & (1 << (signal.SIGINT - 1)))


def pytest_configure(config: pytest.Config) -> None:
    """A test process started as a background job of a non-interactive shell (``pytest ... &``, as a CI runner may
    start it) inherits SIGINT ignored, and so would every `fedpeft run` the interrupt tests start: they install
    Python's handler first, as an interactive start has it."""
    if threading.current_thread() is threading.main_thread() and _sigint_ignored():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # xdist's controller would reorder the files by their count of tests, most first (which put the few-test Flower
    # and deployment files, the longest, last); keep the order pytest_collection_modifyitems gives.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.fixture(autouse=True)
def _sigint_restored(request: pytest.FixtureRequest):
    """An ignored signal is inherited across exec: a test that left SIGINT ignored in this worker process would make
    every later subprocess of the worker ignore Ctrl-C (the interrupt tests start `fedpeft run` as a terminal
    would). Restore Python's handler after each test that changed it, and say which test did."""
    yield
    if threading.current_thread() is not threading.main_thread():
        return
    if _sigint_ignored() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        left = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        warnings.warn(f"{request.node.nodeid} left SIGINT as {left!r}; Python's handler restored", stacklevel=1)


@dataclass
class ToyLoaded:
    model: torch.nn.Module
    tokenizer: object
    task: str = "classification"
    name: str = "toy-bert"
    family: str = "bert"
    lora_targets: list[str] = field(default_factory=lambda: ["query", "value"])
    head_modules: list[str] = field(default_factory=lambda: ["classifier"])


def toy_example(rng: random.Random) -> dict:
    text = " ".join(rng.choice(WORDS) for _ in range(6))
    return {"text": text, "text_pair": None, "label": int("a" in text.split()), "group": "g"}


def toy_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models run fastest on one thread, and several threads contend on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def flower_home(tmp_path_factory):
    """A Flower home (``FLWR_HOME``) of this test process's own, for Flower's simulation engine and the processes
    the tests start: never the user's ``~/.flwr``, and never one that a parallel test process writes at once.
    A loopback deployment (fedpeft.apps.loopback) still gives its processes a home in its own directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLWR_HOME", str(tmp_path_factory.mktemp("flwr-home")))
        yield


@pytest.fixture
def toy_runtime():
    from transformers import BertConfig, BertForSequenceClassification

    from fedpeft.models.runtime import ModelRuntime

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertForSequenceClassification(
            BertConfig(
                vocab_size=20,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                num_labels=2,
            )
        )
    return ModelRuntime(ToyLoaded(model, toy_tokenizer()), eval_batch_size=32)


@pytest.fixture
def toy_clients():
    from fedpeft.data.types import ClientData

    rng = random.Random(0)
    return [
        ClientData(f"c{i}", "g", "seen", [toy_example(rng) for _ in range(48)], [toy_example(rng) for _ in range(24)])
        for i in range(4)
    ]


@pytest.fixture
def toy_worker_factory(toy_runtime, toy_clients, tmp_path):
    """Build a Worker over the toy runtime and clients for the given method entries."""
    from fedpeft.core.config import ExperimentConfig
    from fedpeft.data.types import FederatedData
    from fedpeft.worker import Worker

    def make(methods: list[dict]) -> Worker:
        data = FederatedData("toy", "classification", ["no", "yes"], ["g"], toy_clients)
        cfg = ExperimentConfig(methods=methods, budgets=[2])
        return Worker(cfg, tmp_path, data=data, runtime=toy_runtime)

    return make


# ---------------------------------------------------------------------- a toy sparse mixture of experts


@dataclass
class ToyMoeLoaded:
    model: torch.nn.Module
    tokenizer: object
    task: str = "generation"
    name: str = "toy-olmoe"
    family: str = "olmoe"
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    head_modules: list[str] = field(default_factory=list)
    lora_parameters: list[str] = field(default_factory=lambda: ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])


def toy_moe_model(num_experts: int = 8, top_k: int = 8, layers: int = 1) -> torch.nn.Module:
    """A 1-layer OLMoE (hidden 32, experts of width 8) over the toy vocabulary, from a fixed seed."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = OlmoeConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=8,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return OlmoeForCausalLM(config)


def toy_generation_example(rng: random.Random) -> dict:
    words = [rng.choice(WORDS) for _ in range(4)]
    return {"prompt": " ".join(words), "response": " ".join(reversed(words[:2])), "group": "g"}


@pytest.fixture
def toy_moe_runtime():
    from fedpeft.models.runtime import ModelRuntime

    return ModelRuntime(ToyMoeLoaded(toy_moe_model(), toy_tokenizer()), eval_batch_size=32, max_new_tokens=3)


@pytest.fixture
def toy_moe_clients():
    from fedpeft.data.types import ClientData

    rng = random.Random(1)
    return [
        ClientData(
            f"c{i}",
            "g",
            "seen",
            [toy_generation_example(rng) for _ in range(24)],
            [toy_generation_example(rng) for _ in range(6)],
        )
        for i in range(4)
    ]


@pytest.fixture
def toy_moe_worker_factory(toy_moe_runtime, toy_moe_clients, tmp_path):
    """Build a Worker over the toy OLMoE runtime and generation clients for the given method entries."""
    from fedpeft.core.config import ExperimentConfig
    from fedpeft.data.types import FederatedData
    from fedpeft.worker import Worker

    def make(methods: list[dict]) -> Worker:
        data = FederatedData("toy-moe", "generation", None, ["g"], toy_moe_clients)
        cfg = ExperimentConfig(methods=methods, budgets=[2])
        return Worker(cfg, tmp_path, data=data, runtime=toy_moe_runtime)

    return make
