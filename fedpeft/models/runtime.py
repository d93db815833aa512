"""The worker's model runtime: one base model, adapters swapped in place.

A :class:`ModelRuntime` owns the base model of one worker (process). Methods never build models: they ask the
runtime to install weights (a base state, a LoRA adapter of some shape), to train a set of parameters with the one
training loop, and to evaluate. Adapters of every shape in use (one per rank structure) live side by side as named
PEFT adapters on the same base model; switching clients means loading tensors, never rebuilding modules.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from peft.utils.other import AuxiliaryTrainingWrapper

from fedpeft.core.errors import UserError
from fedpeft.core.types import Metrics, StateDict
from fedpeft.data.types import Example
from fedpeft.models.moe import MoeControl, Routing
from fedpeft.models.precision import DTYPES
from fedpeft.models.targets import lora_modules, max_rank
from fedpeft.training import Batch, LossHook, Step, StepHook, train_loop


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


@dataclass(frozen=True)
class LoraSpec:
    """The shape of a LoRA adapter: rank, scaling and where it sits.

    ``rank_pattern`` / ``alpha_pattern`` give per-module ranks (pruned rank structures); ``targets`` are module-name
    suffixes as PEFT's ``target_modules`` reads them. ``slot`` tells apart adapters of the same shape that must
    coexist on the model (a client's "global" and "local" LoRA, a frozen teacher beside a trained student).
    ``head=False`` leaves the task head out of the adapter (a second adapter that is active together with one that
    carries the head: PEFT lets only one active adapter own it).
    ``target_parameters`` are parameter-name suffixes that get LoRA directly (PEFT ``target_parameters``), such
    as the fused expert tensors of a mixture-of-experts model (one rank-r block per expert).
    """

    rank: int
    alpha: float
    targets: tuple[str, ...]
    dropout: float = 0.0
    rank_pattern: tuple[tuple[str, int], ...] = ()
    alpha_pattern: tuple[tuple[str, float], ...] = ()
    slot: str = ""
    head: bool = True
    target_parameters: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """A short name usable as a PEFT adapter name."""
        digest = hashlib.blake2b(repr(self).encode(), digest_size=6).hexdigest()
        return f"r{self.rank}_{digest}"

    def to_peft(self, head_modules: list[str]) -> LoraConfig:
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int; a float works
            target_modules=list(self.targets),
            lora_dropout=self.dropout,
            rank_pattern=dict(self.rank_pattern),
            alpha_pattern=dict(self.alpha_pattern),
            modules_to_save=(list(head_modules) or None) if self.head else None,
            target_parameters=list(self.target_parameters) or None,
        )


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
        loaded: the loaded model (``fedpeft.models.table.LoadedModel``).
        max_length: truncation length of tokenized inputs.
        device: torch device string (``auto``: see :func:`resolve_device`).
        eval_batch_size: batch size of evaluation.
        max_new_tokens: generation length for generation tasks.
        dtype: ``model.dtype``, the dtype the base weights were loaded in; other than ``float32``, forward passes
            of :meth:`train` and :meth:`predict` run under ``torch.autocast`` in it, and adapters are kept in
            float32 (float16 also scales the loss with a ``GradScaler``; it needs a CUDA device).
        grad_accum_steps: micro-batches per optimizer step in :meth:`train` (``train.grad_accum_steps``).
        chat_template: format generation prompts (and training responses) with the tokenizer's chat template.
    """

    def __init__(
        self,
        loaded: Any,
        *,
        max_length: int = 64,
        device: str = "cpu",
        eval_batch_size: int = 64,
        max_new_tokens: int = 32,
        dtype: str = "float32",
        grad_accum_steps: int = 1,
        chat_template: bool = False,
    ) -> None:
        self.loaded = loaded
        self.task: str = loaded.task
        self.tokenizer = loaded.tokenizer
        self.device = torch.device(resolve_device(device))
        self.max_length = max_length
        self.eval_batch_size = eval_batch_size
        self.max_new_tokens = max_new_tokens
        if dtype not in DTYPES:
            raise UserError(f"model.dtype must be one of {', '.join(DTYPES)}, not {dtype!r}.")
        if dtype == "float16" and self.device.type == "cpu":
            raise UserError("model.dtype float16 needs a GPU (cuda or mps); use bfloat16 or float32 on the cpu.")
        self.dtype = DTYPES[dtype]
        self.grad_accum_steps = grad_accum_steps
        self.chat_template = chat_template
        # float16 gradients underflow without loss scaling; the scaler's scale carries over between train calls.
        self._scaler = torch.amp.GradScaler(self.device.type) if self.dtype == torch.float16 else None
        # A bitsandbytes-quantized model is placed on its GPU when loaded and cannot be moved.
        quantized = getattr(loaded.model, "is_quantized", False) is True
        self.base_model = loaded.model if quantized else loaded.model.to(self.device)
        # Parameter objects survive PEFT's injection (they move under base_layer / original_module), so these
        # references keep addressing the base weights under their canonical names.
        self.base_params: dict[str, torch.nn.Parameter] = dict(self.base_model.named_parameters())
        # The layers LoRA wraps, captured before PEFT injects adapters (the module objects survive injection as
        # each LoRA layer's ``base_layer``, so hooks on them see the base layer's input).
        self.target_modules: list[tuple[str, torch.nn.Module]] = lora_modules(self.base_model, loaded.lora_targets)
        self._initial_base = {k: v.detach().clone() for k, v in self.base_params.items()}
        self.peft: PeftModel | None = None
        self.active: LoraSpec | None = None
        # Heterogeneous federations: the architecture this runtime serves and the federation it belongs to
        # (``fedpeft.federation.Federation``), set by the worker.
        self.architecture: str = "default"
        self.federation: Any = None
        # Removes the installed client model's extension (forward hooks); None when it has none.
        self._detach_extension: Callable[[], None] | None = None
        # Top-k, rescaler and activation counts of a mixture-of-experts model (None for dense models).
        self.moe: MoeControl | None = MoeControl.of(self.base_model)

    # ------------------------------------------------------------------ weights
    def base_state(self) -> StateDict:
        """A copy of the current base weights, by canonical parameter name."""
        return {k: v.detach().clone() for k, v in self.base_params.items()}

    def load_base(self, state: StateDict | None) -> None:
        """Overwrite base weights in place (``None`` restores the weights the model was loaded with)."""
        source = self._initial_base if state is None else state
        with torch.no_grad():
            for name, tensor in source.items():
                self.base_params[name].copy_(tensor)

    def set_initial_base(self, state: StateDict) -> None:
        """Make ``state`` the weights that ``load_base(None)`` restores (the output of the base stage)."""
        self._initial_base = {k: v.detach().clone() for k, v in state.items()}
        self.load_base(None)

    def activate(self, spec: LoraSpec | None) -> torch.nn.Module:
        """Make the adapter of shape ``spec`` the active one (creating it once) and return the model to call.

        ``None`` deactivates adapters: the returned model computes with the base weights only. An installed
        extension stays attached (it is removed by :meth:`install` or :meth:`detach_extension`).
        """
        if spec is None:
            self.active = None
            return self.base_model if self.peft is None else self.peft
        name = spec.key
        config = spec.to_peft(self.loaded.head_modules)
        if self.peft is None:
            self.peft = get_peft_model(self.base_model, config, adapter_name=name)
        elif name not in self.peft.peft_config:
            self.peft.add_adapter(name, config)
        self.peft.set_adapter(name)
        self.active = spec
        if self.dtype != torch.float32:
            self._adapter_in_float32()
        return self.peft

    def _adapter_in_float32(self) -> None:
        """Keep the active adapter's trainable tensors (LoRA weights, head copy) in float32 under a low-precision
        base: the optimizer then updates float32 weights, and autocast computes in the low precision."""
        with torch.no_grad():
            for param in self.adapter_parameters().values():
                if param.is_floating_point() and param.dtype != torch.float32:
                    param.data = param.data.float()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context forward passes run in: ``torch.autocast`` in ``model.dtype`` (none for float32).

        Code that calls the model itself (outside :meth:`train` and :meth:`predict`) wraps its forward passes in
        it, so that float32 adapters and a low-precision base compute together.
        """
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """The context in which code outside :meth:`train` and :meth:`predict` calls the model: the base model
        alone when no adapter is active, and :meth:`autocast` (statistics, feature capture, per-sample
        gradients, hypergradients and distillation targets compute as training and prediction do)."""
        with self._adapter_context(), self.autocast():
            yield

    def _model(self) -> torch.nn.Module:
        if self.active is None:
            return self.base_model if self.peft is None else self.peft
        return self.peft  # type: ignore[return-value]

    def _adapter_context(self):  # noqa: ANN202
        """Context in which the model computes without any adapter."""
        if self.active is None and self.peft is not None:
            return self.peft.disable_adapter()
        return contextlib.nullcontext()

    def adapter_state(self) -> StateDict:
        """A copy of the active adapter's tensors (LoRA weights and head), PEFT names without adapter name."""
        assert self.peft is not None and self.active is not None, "no active adapter"
        state = get_peft_model_state_dict(self.peft, adapter_name=self.active.key)
        return {k: v.detach().clone() for k, v in state.items()}

    def load_adapter(self, state: StateDict) -> None:
        """Load tensors (as returned by :meth:`adapter_state`, possibly partial) into the active adapter."""
        assert self.peft is not None and self.active is not None, "no active adapter"
        result = set_peft_model_state_dict(self.peft, state, adapter_name=self.active.key)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unexpected:
            raise KeyError(f"adapter tensors not in the model: {unexpected[:3]}")

    def reset_adapter(self, seed: int) -> None:
        """Fresh LoRA weights (A random from ``seed``, B = 0) and the head copied from the base model."""
        assert self.peft is not None and self.active is not None, "no active adapter"
        name = self.active.key
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for module in self.peft.modules():
                if isinstance(module, LoraLayer) and name in module.lora_A:
                    module.reset_lora_parameters(name, True)
        with torch.no_grad():
            for module in self.peft.modules():
                to_save = getattr(module, "modules_to_save", None)
                if isinstance(to_save, torch.nn.ModuleDict) and name in to_save:
                    original = module.original_module
                    assert isinstance(original, torch.nn.Module)
                    to_save[name].load_state_dict(original.state_dict())

    def install(self, client_model: ClientModel, *, seed: int = 0) -> torch.nn.Module:
        """Install a client's model (base overrides, adapter, extension) and return the model to call.

        The previous client model's extension is removed first, before any weights change.
        """
        self.detach_extension()
        if client_model.base is not None and len(client_model.base) < len(self.base_params):
            self.load_base(None)  # a partial override applies on top of the initial weights, not the last client's
        self.load_base(client_model.base)
        if self.moe is not None:
            self.moe.configure(client_model.routing)
        model = self.activate(client_model.lora)
        if client_model.lora is not None:
            self.reset_adapter(seed)
            if client_model.adapter:
                self.load_adapter(client_model.adapter)
        if client_model.extension is not None:
            self._detach_extension = client_model.extension.attach(self)
        return model

    def detach_extension(self) -> None:
        """Remove the installed client model's extension (if any); :meth:`install` calls it first."""
        if self._detach_extension is not None:
            self._detach_extension()
            self._detach_extension = None

    def remove_adapter(self, spec: LoraSpec) -> None:
        """Delete the PEFT adapter of shape ``spec`` if present (for one-off shapes such as pruned structures)."""
        if self.peft is None or spec.key not in self.peft.peft_config:
            return
        if self.active == spec:
            self.active = None
        self.peft.delete_adapter(spec.key)

    @contextlib.contextmanager
    def using_adapter(self, spec: LoraSpec | None) -> Iterator[torch.nn.Module]:
        """Compute with another adapter (``None``: base weights only) in eval mode, then restore everything.

        For a frozen teacher beside a trained student: inside, the model runs with ``spec``'s adapter (which
        must have been created and loaded before); on exit the previously active adapter, the train/eval mode
        and every parameter's ``requires_grad`` flag are as they were, so a training loop can call this between
        its forward and backward passes.
        """
        previous = self.active
        model = self._model()
        flags = {name: p.requires_grad for name, p in model.named_parameters()}
        was_training = model.training
        try:
            if spec is None:
                context = self.peft.disable_adapter() if self.peft is not None else contextlib.nullcontext()
                with context:
                    model.eval()
                    yield model
            else:
                teacher = self.activate(spec)
                teacher.eval()
                yield teacher
        finally:
            if spec is not None:
                self.activate(previous)
            for name, p in model.named_parameters():
                p.requires_grad_(flags.get(name, False))
            model.train(was_training)

    def adapter_parameters(self) -> dict[str, torch.nn.Parameter]:
        """Trainable parameters of the active adapter (LoRA weights and head copy), by PEFT name."""
        assert self.peft is not None and self.active is not None, "no active adapter"
        name = self.active.key
        return {k: p for k, p in self.peft.named_parameters() if f".{name}." in k or k.endswith(f".{name}")}

    def detach_adapters(self) -> None:
        """Remove every injected LoRA layer and head copy, restoring the plain base modules.

        Lets a PEFT adapter of another type (AdaLoRA) wrap the base model; LoRA adapters are re-created on the next
        :meth:`activate` (their tensors always come from :meth:`install`, so nothing is lost).
        """
        if self.peft is None:
            return
        unload_adapters(self.peft)
        self.peft = None
        self.active = None

    def merged_weights(self, scale: float = 1.0) -> StateDict:
        """Base weights with the active adapter merged in, for the layers and head the adapter touches.

        Returns ``{canonical parameter name: W + scale * delta}`` for every LoRA-adapted layer (``delta`` from PEFT's
        ``get_delta_weight``), plus the adapter's copy of the task head; the model itself is left unchanged.
        """
        assert self.peft is not None and self.active is not None, "no active adapter"
        key = self.active.key
        prefix = "base_model.model."
        merged: StateDict = {}
        with torch.no_grad():
            for name, module in self.peft.named_modules():
                canonical = name.removeprefix(prefix)
                if isinstance(module, LoraLayer) and key in module.lora_A:
                    weight = f"{canonical}.weight"
                    # The LoraLayer mixin does not declare get_delta_weight; every concrete PEFT LoRA layer
                    # (Linear, Embedding, Conv*, MultiheadAttention, ParamWrapper) defines it.
                    delta = module.get_delta_weight(key)  # type: ignore[attr-defined]  # see the comment above
                    merged[weight] = self.base_params[weight].detach() + scale * delta.to(self.base_params[weight])
                to_save = getattr(module, "modules_to_save", None)
                if isinstance(to_save, torch.nn.ModuleDict) and key in to_save:
                    for pname, param in to_save[key].named_parameters():
                        merged[f"{canonical}.{pname}"] = param.detach().clone()
        return merged

    def override_initial_base(self, tensors: StateDict) -> StateDict:
        """Replace some tensors of the weights :meth:`load_base` restores, and load them.

        Returns the tensors they replaced, so that the caller can put them back (a per-client base model on top of
        a shared one).
        """
        previous = {k: self._initial_base[k] for k in tensors}
        with torch.no_grad():
            for name, tensor in tensors.items():
                self._initial_base[name] = tensor.detach().clone()
                self.base_params[name].copy_(tensor)
        return previous

    # ------------------------------------------------------------------ data
    def encode(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """Tokenize examples into padded tensors (labels included)."""
        tok = self.tokenizer
        if self.task == "classification" and examples and "image" in examples[0]:
            from fedpeft.models.vision import encode_images

            return encode_images(self.loaded.image_processor, examples)
        if self.task == "classification":
            pairs = [ex.get("text_pair") for ex in examples]
            has_pair = any(p is not None for p in pairs)
            batch = tok(
                [ex["text"] for ex in examples],
                [p or "" for p in pairs] if has_pair else None,
                truncation=True,
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
            batch["labels"] = torch.tensor([int(ex["label"]) for ex in examples])
            return dict(batch)
        return self._encode_generation(examples)

    def _chat_ids(self, prompt: str, response: str | None = None) -> tuple[list[int], list[int]]:
        """Token ids of ``prompt`` as a user turn rendered by the tokenizer's chat template (with the generation
        prompt that opens the assistant's turn), and of ``response`` as the assistant's turn that follows.

        The prompt is cut, inside the template, to half of ``max_length``. The response ids are what the full
        conversation adds after the prompt (its end-of-turn tokens included); for a template whose conversation
        does not start with the prompt's rendering they are the response's own tokens and eos.
        """
        tok = self.tokenizer

        def render(messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
            return list(tok(text, add_special_tokens=False)["input_ids"])

        limit = self.max_length // 2
        user = [{"role": "user", "content": prompt}]
        ids = render(user, True)
        if len(ids) > limit:  # cut the user's text, keeping the template's tokens around it
            content = tok(prompt, add_special_tokens=False)["input_ids"]
            keep = max(0, len(content) - (len(ids) - limit))
            prompt = tok.decode(content[:keep], skip_special_tokens=True)
            user = [{"role": "user", "content": prompt}]
            ids = render(user, True)[:limit]
        if response is None:
            return ids, []
        full = render([*user, {"role": "assistant", "content": response}], False)
        if full[: len(ids)] == ids:
            return ids, full[len(ids) :]
        eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
        return ids, list(tok(response, add_special_tokens=False)["input_ids"]) + eos

    def _encode_generation(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        tok = self.tokenizer
        ids, labels = [], []
        for ex in examples:
            if self.chat_template:
                prompt, answer = self._chat_ids(ex["prompt"], ex["response"])
                full = (prompt + answer)[: self.max_length]
                ids.append(full)
                labels.append([-100] * len(prompt) + full[len(prompt) :])
                continue
            prompt = tok(ex["prompt"], add_special_tokens=False)["input_ids"]
            response = tok(ex["response"], add_special_tokens=False)["input_ids"]
            bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
            eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
            prompt = (bos + prompt)[: self.max_length // 2]
            full = (prompt + response + eos)[: self.max_length]
            ids.append(full)
            # Loss on the response tokens only.
            labels.append([-100] * len(prompt) + full[len(prompt) :])
        width = max(len(x) for x in ids)
        pad = tok.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
        label_t = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
        return {"input_ids": input_ids, "attention_mask": attention, "labels": label_t}

    def batches(self, examples: list[Example], batch_size: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
        """An endless stream of shuffled minibatches; each pass over the data is a new permutation."""
        for chunk in self._chunks(examples, batch_size, seed):
            yield self._to_device(self.encode(chunk))

    def accumulated_batches(
        self, examples: list[Example], batch_size: int, accumulation: int, seed: int
    ) -> Iterator[list[Batch]]:
        """An endless stream of optimizer steps, each the micro-batches (of ``batch_size``) of one batch of
        ``batch_size * accumulation`` examples drawn as :meth:`batches` draws them: the same examples in the
        same order as ``batches(examples, batch_size * accumulation, seed)``."""
        for chunk in self._chunks(examples, batch_size * accumulation, seed):
            yield [
                self._to_device(self.encode(chunk[start : start + batch_size]))
                for start in range(0, len(chunk), batch_size)
            ]

    @staticmethod
    def _chunks(examples: list[Example], size: int, seed: int) -> Iterator[list[Example]]:
        generator = torch.Generator().manual_seed(seed)
        while True:
            order = torch.randperm(len(examples), generator=generator).tolist()
            for start in range(0, len(order), size):
                yield [examples[i] for i in order[start : start + size]]

    def _to_device(self, batch: dict[str, torch.Tensor]) -> Batch:
        return {k: v.to(self.device) for k, v in batch.items()}

    # ------------------------------------------------------------------ training
    def steps_for(self, n_examples: int, batch_size: int, epochs: float | None, steps: int | None) -> int:
        """Number of optimizer steps for ``steps`` or ``epochs`` passes over ``n_examples``.

        With gradient accumulation ``batch_size`` is the examples of one step (micro-batch size x accumulation).
        """
        if steps is not None:
            return steps
        return max(1, math.ceil(float(epochs or 1.0) * math.ceil(n_examples / batch_size)))

    def train(
        self,
        examples: list[Example],
        params: dict[str, torch.nn.Parameter] | str = "adapter",
        *,
        lr: float,
        batch_size: int,
        seed: int,
        epochs: float | None = None,
        steps: int | None = None,
        weight_decay: float = 0.0,
        extra_loss: LossHook | None = None,
        after_backward: StepHook | None = None,
        optimizer_groups: list[dict[str, Any]] | None = None,
        after_step: StepHook | None = None,
        model: torch.nn.Module | None = None,
        max_grad_norm: float | None = 1.0,
    ) -> Metrics:
        """Train ``params`` (``"adapter"``, ``"all"`` base weights, or an explicit dict) on ``examples``.

        ``model`` is the module to call instead of the runtime's own (a PEFT model of another adapter type wrapped
        around the base model after :meth:`detach_adapters`); ``after_step`` runs after every optimizer step;
        ``max_grad_norm`` clips the global gradient norm (``None``: no clipping).

        With ``grad_accum_steps`` k above 1 a step accumulates k micro-batches of ``batch_size``: the same step as
        one batch of ``batch_size * k`` (:meth:`accumulated_batches`), and ``epochs`` count those steps.
        """
        if not examples:
            raise ValueError("no training examples")
        if params == "adapter":
            params = self.adapter_parameters()
        elif params == "all":
            if getattr(self.base_model, "is_quantized", False) is True:
                raise UserError(
                    "A quantized base model (model.quantization) cannot train its own weights; "
                    "train adapters only, or drop model.quantization."
                )
            params = self.base_params
        assert isinstance(params, dict)
        if self._scaler is not None and any(p.dtype == torch.float16 for p in params.values()):
            raise UserError(
                "model.dtype float16 trains adapters only (float16 weights cannot be updated with "
                "loss scaling); use bfloat16 to train the base weights."
            )
        accumulation = self.grad_accum_steps
        total = self.steps_for(len(examples), batch_size * accumulation, epochs, steps)
        stream: Iterator[Step] = (
            self.batches(examples, batch_size, seed)
            if accumulation == 1
            else self.accumulated_batches(examples, batch_size, accumulation, seed)
        )
        model = model if model is not None else self._model()
        with self._adapter_context():
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return train_loop(
                    model,
                    stream,
                    params,
                    steps=total,
                    lr=lr,
                    weight_decay=weight_decay,
                    extra_loss=extra_loss,
                    after_backward=after_backward,
                    optimizer_groups=optimizer_groups,
                    max_grad_norm=max_grad_norm,
                    after_step=after_step,
                    autocast=None if self.dtype == torch.float32 else self.autocast,
                    scaler=self._scaler,
                )

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def predict(self, examples: list[Example]) -> list[Any]:
        """Predicted labels (classification) or generated responses (generation)."""
        model = self._model()
        was_training = model.training
        model.eval()
        outputs: list[Any] = []
        try:
            with self.forward_context():
                for start in range(0, len(examples), self.eval_batch_size):
                    chunk = examples[start : start + self.eval_batch_size]
                    if self.task == "classification":
                        batch = {k: v.to(self.device) for k, v in self.encode(chunk).items()}
                        batch.pop("labels")
                        logits = model(**batch).logits
                        outputs.extend(logits.argmax(-1).tolist())
                    else:
                        outputs.extend(self._generate(model, chunk))
        finally:
            model.train(was_training)
        return outputs

    def _generate(self, model: torch.nn.Module, examples: list[Example]) -> list[str]:
        tok = self.tokenizer
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        if self.chat_template:
            prompts = [self._chat_ids(ex["prompt"])[0] for ex in examples]
        else:
            prompts = [
                (bos + tok(ex["prompt"], add_special_tokens=False)["input_ids"])[: self.max_length // 2]
                for ex in examples
            ]
        width = max(len(p) for p in prompts)
        pad = tok.pad_token_id
        # Left padding so that every prompt ends at the same position.
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        generate = model.generate
        assert callable(generate), f"{type(model).__name__} cannot generate"
        generated = generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=tok.eos_token_id,
        )
        return [tok.decode(row[width:], skip_special_tokens=True).strip() for row in generated]

    def evaluate(self, examples: list[Example]) -> Metrics:
        """Task metrics on ``examples`` (accuracy, or METEOR / ROUGE-1 / ROUGE-L)."""
        from fedpeft import evaluation

        predictions = self.predict(examples)
        if self.task == "classification":
            return {"accuracy": evaluation.accuracy(predictions, [int(ex["label"]) for ex in examples])}
        metrics = evaluation.generation_metrics(predictions, [ex["response"] for ex in examples])
        if examples and all("answer" in ex for ex in examples):  # multiple choice answered in words
            answers, options = [ex["answer"] for ex in examples], [ex.get("options", [ex["answer"]]) for ex in examples]
            metrics["accuracy"] = evaluation.answer_accuracy(predictions, answers, options)
        return metrics

    def check_budget(self, rank: int) -> None:
        """Refuse a LoRA rank larger than the smallest targeted layer allows."""
        limit = max_rank(self.base_model, self.loaded.lora_targets)
        if rank > limit:
            raise UserError(f"Budget r={rank} exceeds the largest rank this model allows ({limit}); use r <= {limit}.")


def unload_adapters(model: PeftModel) -> torch.nn.Module:
    """Remove a PEFT model's adapter layers and head copies, putting the original base modules back in place."""
    for module in model.modules():
        if isinstance(module, AuxiliaryTrainingWrapper):
            module.set_adapter([])  # unloading then restores the original head, not a trained copy
    return model.unload()


HookFactory = Callable[[ModelRuntime], Any]
