"""The worker's model runtime: one base model, adapters swapped in place.

A :class:`ModelRuntime` serves one worker (process). Methods never build models: they ask the runtime to install
weights (a base state, a LoRA adapter of some shape), to train a set of parameters with the one training loop, and
to evaluate. The runtime composes four parts, each owning one job:

- :class:`~fedpeft.models.weights.ModelWeights`: the base model, its weights and the named PEFT adapters of every
  shape in use, side by side on the same base model (switching clients means loading tensors, never rebuilding
  modules), and the context forward passes run in;
- :class:`~fedpeft.models.text.TextEncoder`: the tokenizer, chat templates and the one prompt builder;
- :class:`~fedpeft.models.trainer.Trainer`: minibatches and the one training loop;
- :class:`~fedpeft.models.evaluator.Evaluator`: predictions, generation and task metrics.

The runtime itself installs a client's whole model (base overrides, mixture-of-experts routing, adapter,
extension) and keeps the operations of its parts under the names methods call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from peft import PeftModel

from fedpeft.core.errors import UserError
from fedpeft.core.types import Metrics, StateDict
from fedpeft.data.types import Example
from fedpeft.models.evaluator import Evaluator
from fedpeft.models.moe import MoeControl, Routing
from fedpeft.models.precision import DTYPES
from fedpeft.models.text import TextEncoder
from fedpeft.models.trainer import Trainer
from fedpeft.models.weights import LoraSpec, ModelWeights, unload_adapters
from fedpeft.training import Batch, TrainArgs

__all__ = [
    "ClientModel",
    "Extension",
    "HookFactory",
    "Loaded",
    "LoraSpec",
    "ModelRuntime",
    "check_device",
    "resolve_device",
    "unload_adapters",
]


def resolve_device(device: str) -> str:
    """The torch device ``device`` names; ``auto``: ``cuda`` if available, else ``mps`` if available, else ``cpu``."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def check_device(device: str) -> None:
    """Refuse, in one sentence, a ``device`` this machine does not have: CUDA without a GPU or a CUDA build of
    PyTorch, ``cuda:N`` beyond the visible GPUs, ``mps`` off Apple silicon.

    Raises:
        UserError: naming the device and what to set instead.
    """
    target = torch.device(resolve_device(device))
    if target.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build of PyTorch" if torch.version.cuda is None else "no visible GPU"
            raise UserError(
                f"device {device} needs an NVIDIA GPU, and this machine has {build} (torch {torch.__version__}); "
                "set device: cpu or auto."
            )
        count = torch.cuda.device_count()
        if target.index is not None and target.index >= count:
            raise UserError(
                f"device {device} names GPU {target.index}, but {count} GPU(s) are visible (numbered from 0, "
                "after CUDA_VISIBLE_DEVICES); name one of them, or set device: cuda."
            )
    if target.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError(f"device {device} needs Apple silicon with PyTorch's MPS backend; set device: cpu or auto.")


class Loaded(Protocol):
    """What a runtime reads of a loaded model: a :class:`fedpeft.models.table.LoadedModel`, or any object with
    these attributes (a vision model's ``image_processor`` is read when present)."""

    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def tokenizer(self) -> Any: ...
    @property
    def task(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def lora_targets(self) -> list[str]: ...
    @property
    def head_modules(self) -> list[str]: ...


class Extension(Protocol):
    """Computation a client's model adds that a PEFT adapter cannot express.

    PQ-LoRA and gated dual adapters (:class:`fedpeft.adapters.hooked.HookedAdapter`), or a per-input mixer of two
    LoRAs (FedALT), live outside PEFT and join the model through forward hooks. ``attach`` adds them to the
    runtime's model once the client's base weights and adapter are in place and returns the function that removes
    them again; the runtime calls it at the next :meth:`ModelRuntime.install` or
    :meth:`ModelRuntime.detach_extension`, so activating another adapter in between keeps them. An extension that
    can be written to disk also has ``save(directory)``; the worker calls it when adapters are saved and the
    client's model has no PEFT adapter to save.
    """

    def attach(self, runtime: ModelRuntime) -> Callable[[], None]:
        """Add the extension to ``runtime``'s model and return the function that removes it."""
        ...


@dataclass
class ClientModel:
    """The model a client keeps: optional full-weight base overrides plus an optional adapter.

    ``routing`` sets how a mixture-of-experts model runs for this client (experts per token, output rescaler);
    ``None`` runs it as loaded. Dense models ignore it.
    Optional extras (all default to nothing):

    - ``extension``: what a PEFT adapter cannot express (see :class:`Extension`), attached after the adapter is
      loaded and removed at the next :meth:`ModelRuntime.install`.
    - ``variants``: other models the method built on the way (e.g. the two parts of a merge); the worker
      evaluates each and records it as the method ``<label>-<variant name>``.
    - ``info``: facts about how the model was built (a mixing weight, seconds spent merging), recorded in
      ``results.jsonl`` with split ``personalize``.
    """

    lora: LoraSpec | None = None
    adapter: StateDict = field(default_factory=dict)
    base: StateDict | None = None
    routing: Routing | None = None
    extension: Extension | None = None
    variants: dict[str, ClientModel] = field(default_factory=dict)
    info: Metrics = field(default_factory=dict)


class ModelRuntime:
    """One base model per worker with named LoRA adapters installed in place.

    Args:
        loaded: the loaded model (see :class:`Loaded`).
        max_length: truncation length of tokenized inputs.
        device: torch device string (``auto``: see :func:`resolve_device`).
        eval_batch_size: batch size of evaluation.
        max_new_tokens: generation length for generation tasks.
        dtype: ``model.dtype``, the dtype the base weights were loaded in; other than ``float32``, forward passes
            of :meth:`train` and :meth:`predict` run under ``torch.autocast`` in it, and adapters are kept in
            float32 (float16 also scales the loss with a ``GradScaler``; it needs a CUDA device).
        grad_accum_steps: micro-batches per optimizer step in :meth:`train` (``train.grad_accum_steps``).
        chat_template: format generation prompts (and training responses) with the tokenizer's chat template.
        max_steps: the most optimizer steps of one :meth:`train` call (``train.max_steps``; ``None``: no cap).
        eval_max_batches: the most batches of one :meth:`evaluate` call (``eval.max_batches``; ``None``: all).
        statistics_max_batches: the most batches of a client's feature statistics
            (``train.max_statistics_batches``; ``None``: all its examples).
    """

    def __init__(
        self,
        loaded: Loaded,
        *,
        max_length: int = 64,
        device: str = "cpu",
        eval_batch_size: int = 64,
        max_new_tokens: int = 32,
        dtype: str = "float32",
        grad_accum_steps: int = 1,
        chat_template: bool = False,
        max_steps: int | None = None,
        eval_max_batches: int | None = None,
        statistics_max_batches: int | None = None,
    ) -> None:
        self.loaded = loaded
        self.task: str = loaded.task
        self.statistics_max_batches = statistics_max_batches
        torch_device = torch.device(resolve_device(device))
        if dtype not in DTYPES:
            raise UserError(f"model.dtype must be one of {', '.join(DTYPES)}, not {dtype!r}.")
        if dtype == "float16" and torch_device.type == "cpu":
            raise UserError("model.dtype float16 needs a GPU (cuda or mps); use bfloat16 or float32 on the cpu.")
        self.weights = ModelWeights(
            loaded.model,
            lora_targets=loaded.lora_targets,
            head_modules=loaded.head_modules,
            device=torch_device,
            dtype=DTYPES[dtype],
        )
        self.text = self._text_encoder(loaded, max_length=max_length, chat_template=chat_template)
        self.trainer = Trainer(self.weights, self.text, grad_accum_steps=grad_accum_steps, max_steps=max_steps)
        self.evaluator = Evaluator(
            self.weights,
            self.text,
            eval_batch_size=eval_batch_size,
            max_new_tokens=max_new_tokens,
            max_batches=eval_max_batches,
        )
        # Heterogeneous federations: the architecture this runtime serves and the federation it belongs to
        # (``fedpeft.federation.Federation``), set by the worker.
        self.architecture: str = "default"
        self.federation: Any = None
        # Removes the installed client model's extension (forward hooks); None when it has none.
        self._detach_extension: Callable[[], None] | None = None
        # Top-k, rescaler and activation counts of a mixture-of-experts model (None for dense models).
        self.moe: MoeControl | None = MoeControl.of(self.base_model)

    def _text_encoder(self, loaded: Loaded, *, max_length: int, chat_template: bool) -> TextEncoder:
        """The text part (a runtime whose examples carry more than text builds its own)."""
        return TextEncoder(
            loaded.tokenizer,
            loaded.task,
            max_length=max_length,
            chat_template=chat_template,
            image_processor=getattr(loaded, "image_processor", None),
        )

    # ------------------------------------------------------------------ a client's model
    def install(self, client_model: ClientModel, *, seed: int = 0) -> torch.nn.Module:
        """Install a client's model (base overrides, adapter, extension) and return the model to call.

        The previous client model's extension is removed first, before any weights change.
        """
        self.detach_extension()
        weights = self.weights
        if client_model.base is not None and len(client_model.base) < len(weights.base_params):
            weights.load_base(None)  # a partial override applies on top of the initial weights, not the last client's
        weights.load_base(client_model.base)
        if self.moe is not None:
            self.moe.configure(client_model.routing)
        model = weights.activate(client_model.lora)
        if client_model.lora is not None:
            weights.reset_adapter(seed)
            if client_model.adapter:
                weights.load_adapter(client_model.adapter)
        if client_model.extension is not None:
            self._detach_extension = client_model.extension.attach(self)
        return model

    def detach_extension(self) -> None:
        """Remove the installed client model's extension (if any); :meth:`install` calls it first."""
        if self._detach_extension is not None:
            self._detach_extension()
            self._detach_extension = None

    def activate(self, spec: LoraSpec | None) -> torch.nn.Module:
        """Make the adapter of shape ``spec`` the active one (creating it once) and return the model to call
        (:meth:`ModelWeights.activate`). An installed extension stays attached (it is removed by :meth:`install`
        or :meth:`detach_extension`)."""
        return self.weights.activate(spec)

    # ------------------------------------------------------------------ the parts' state
    @property
    def device(self) -> torch.device:
        return self.weights.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.dtype

    @property
    def base_model(self) -> Any:
        return self.weights.base_model

    @property
    def base_params(self) -> dict[str, torch.nn.Parameter]:
        return self.weights.base_params

    @property
    def target_modules(self) -> list[tuple[str, torch.nn.Module]]:
        return self.weights.target_modules

    @property
    def peft(self) -> PeftModel | None:
        return self.weights.peft

    @property
    def active(self) -> LoraSpec | None:
        return self.weights.active

    @property
    def tokenizer(self) -> Any:
        return self.text.tokenizer

    @property
    def max_length(self) -> int:
        return self.text.max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        self.text.max_length = value

    @property
    def chat_template(self) -> bool:
        return self.text.chat_template

    @chat_template.setter
    def chat_template(self, value: bool) -> None:
        self.text.chat_template = value

    @property
    def grad_accum_steps(self) -> int:
        return self.trainer.grad_accum_steps

    @grad_accum_steps.setter
    def grad_accum_steps(self, value: int) -> None:
        self.trainer.grad_accum_steps = value

    @property
    def eval_batch_size(self) -> int:
        return self.evaluator.eval_batch_size

    @eval_batch_size.setter
    def eval_batch_size(self, value: int) -> None:
        self.evaluator.eval_batch_size = value

    @property
    def max_new_tokens(self) -> int:
        return self.evaluator.max_new_tokens

    @max_new_tokens.setter
    def max_new_tokens(self, value: int) -> None:
        self.evaluator.max_new_tokens = value

    # ------------------------------------------------------------------ weights and adapters (ModelWeights)
    def base_state(self) -> StateDict:
        return self.weights.base_state()

    def base_tensors(self) -> StateDict:
        return self.weights.base_tensors()

    def load_base(self, state: StateDict | None) -> None:
        self.weights.load_base(state)

    def set_initial_base(self, state: StateDict) -> None:
        self.weights.set_initial_base(state)

    def override_initial_base(self, tensors: StateDict) -> StateDict:
        return self.weights.override_initial_base(tensors)

    def check_budget(self, rank: int) -> None:
        self.weights.check_budget(rank)

    def adapter_parameters(self) -> dict[str, torch.nn.Parameter]:
        return self.weights.adapter_parameters()

    def adapter_state(self) -> StateDict:
        return self.weights.adapter_state()

    def load_adapter(self, state: StateDict) -> None:
        self.weights.load_adapter(state)

    def saved_adapter_config(self, base_model: str) -> Any:
        """The PEFT config the active adapter is saved with: its LoRA settings, ``base_model`` as
        ``base_model_name_or_path`` and the task type PEFT's ``AutoPeftModelFor...`` classes read (``SEQ_CLS`` for
        text classification, ``CAUSAL_LM`` for text generation; none for image models, which PEFT has no type for)."""
        assert self.active is not None
        config = self.active.to_peft(self.loaded.head_modules, self.weights.fan_in_fan_out)
        config.base_model_name_or_path = base_model
        text = self.tokenizer is not None and getattr(self.loaded, "image_processor", None) is None
        if text and self.loaded.family != "llava":
            config.task_type = "SEQ_CLS" if self.task == "classification" else "CAUSAL_LM"
        return config

    def reset_adapter(self, seed: int) -> None:
        self.weights.reset_adapter(seed)

    def remove_adapter(self, spec: LoraSpec) -> None:
        self.weights.remove_adapter(spec)

    def detach_adapters(self) -> None:
        self.weights.detach_adapters()

    def using_adapter(self, spec: LoraSpec | None) -> contextlib.AbstractContextManager[torch.nn.Module]:
        return self.weights.using_adapter(spec)

    def merged_weights(self, scale: float = 1.0) -> StateDict:
        return self.weights.merged_weights(scale)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context forward passes run in: ``torch.autocast`` in ``model.dtype`` (none for float32).

        Code that calls the model itself (outside :meth:`train` and :meth:`predict`) wraps its forward passes in
        it, so that float32 adapters and a low-precision base compute together.
        """
        return self.weights.autocast()

    def forward_context(self) -> contextlib.AbstractContextManager[None]:
        """The context in which code outside :meth:`train` and :meth:`predict` calls the model: the base model
        alone when no adapter is active, and :meth:`autocast` (statistics, feature capture, per-sample
        gradients, hypergradients and distillation targets compute as training and prediction do)."""
        return self.weights.forward_context()

    def _model(self) -> torch.nn.Module:
        return self.weights.model()

    def _adapter_context(self) -> contextlib.AbstractContextManager[Any]:
        return self.weights.adapter_context()

    # ------------------------------------------------------------------ text (TextEncoder)
    def encode(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        return self.text.encode(examples)

    # ------------------------------------------------------------------ training (Trainer)
    def steps_for(self, n_examples: int, batch_size: int, epochs: float | None, steps: int | None) -> int:
        return self.trainer.steps_for(n_examples, batch_size, epochs, steps)

    def batches(self, examples: list[Example], batch_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
        return self.trainer.batches(examples, batch_size, seed)

    def accumulated_batches(
        self, examples: list[Example], batch_size: int, accumulation: int, seed: int
    ) -> Iterator[list[Batch]]:
        return self.trainer.accumulated_batches(examples, batch_size, accumulation, seed)

    def train(
        self, examples: list[Example], args: TrainArgs, params: dict[str, torch.nn.Parameter] | str = "adapter"
    ) -> Metrics:
        """Train ``params`` (``"adapter"``, ``"all"`` base weights, or an explicit dict) on ``examples`` as ``args``
        says (:meth:`Trainer.train`)."""
        return self.trainer.train(examples, args, params)

    # ------------------------------------------------------------------ evaluation (Evaluator)
    def predict(self, examples: list[Example]) -> list[Any]:
        """Predicted labels (classification) or generated responses (generation)."""
        return self.evaluator.predict(examples)

    def evaluation_examples(self, examples: list[Example]) -> list[Example]:
        """The examples an evaluation scores (``eval.max_batches`` may cut them); for a method's own evaluation."""
        return self.evaluator.evaluation_examples(examples)

    def evaluate(self, examples: list[Example]) -> Metrics:
        """Task metrics on ``examples`` (accuracy, or METEOR / ROUGE-1 / ROUGE-L)."""
        return self.evaluator.evaluate(examples)


HookFactory = Callable[[ModelRuntime], Any]
