"""The runtime's weights: one base model and the named LoRA adapters on it.

A :class:`ModelWeights` owns the base model of a worker: its weights (:mod:`~fedpeft.models.base_weights`: the
model's own parameters are the one copy of them; a client's work that overwrites or trains some keeps the values
it replaced, and only those, to restore between clients), the PEFT adapters of every shape in use,
which of them is active, and the context forward passes run in (the base alone when no adapter is active; autocast
in ``model.dtype``). Adapters of every shape live side by side as named PEFT adapters on the same base model;
switching clients means loading tensors, never rebuilding modules.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from peft.utils.other import AuxiliaryTrainingWrapper

from fedpeft.core.errors import UserError
from fedpeft.core.types import StateDict
from fedpeft.models.base_weights import BaseWeights
from fedpeft.models.targets import lora_modules, max_rank, stores_in_out


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

    def to_peft(self, head_modules: list[str], fan_in_fan_out: bool = False) -> LoraConfig:
        """PEFT's config of this adapter; ``fan_in_fan_out`` for a model whose LoRA layers store their weight
        (in, out) (GPT-2's ``Conv1D``: PEFT then merges the transposed product, and sets it itself, with a warning,
        when it is not given)."""
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]  # PEFT annotates int; a float works
            target_modules=list(self.targets),
            lora_dropout=self.dropout,
            rank_pattern=dict(self.rank_pattern),
            alpha_pattern=dict(self.alpha_pattern),
            modules_to_save=(list(head_modules) or None) if self.head else None,
            target_parameters=list(self.target_parameters) or None,
            fan_in_fan_out=fan_in_fan_out,
        )


def _lora_params(module: LoraLayer, name: str) -> list[torch.nn.Parameter]:
    """The parameters of adapter ``name`` in the LoRA layer ``module`` (its A and B, embedding A and B)."""
    params: list[torch.nn.Parameter] = []
    for attr in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
        container = getattr(module, attr, None)
        if container is None or name not in container:
            continue
        part = container[name]
        params.extend(part.parameters() if isinstance(part, torch.nn.Module) else [part])
    return params


@contextlib.contextmanager
def _on_cpu(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Move ``params`` to the CPU for the block (their objects kept), then back where each was."""
    devices = [p.device for p in params]
    for p in params:
        p.data = p.data.cpu()
    try:
        yield
    finally:
        for p, device in zip(params, devices, strict=True):
            p.data = p.data.to(device)


def dense_strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a freshly allocated row-major tensor of ``shape`` (size-one dimensions included)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _contiguous(module: torch.nn.Module, args: tuple[object, ...]) -> tuple[object, ...] | None:
    first = args[0] if args else None
    if isinstance(first, torch.Tensor) and first.stride() != dense_strides(first.shape):
        return (first.clone(memory_format=torch.contiguous_format), *args[1:])
    return None


def contiguous_output_input(model: torch.nn.Module) -> None:
    """Give the output layer of a causal LM (``lm_head``) a contiguous input.

    Generation keeps the last position's hidden state only (``logits_to_keep=1``), a strided view; a 3-d strided
    input makes ``torch.matmul`` take its batched path, which copies the weight once per sequence
    (batch x vocabulary x hidden: 2 GB for four prompts of a Llama 3 in bfloat16, 90 s on a CPU). One prompt's view
    counts as contiguous (its size-one dimensions keep the prompt's strides), yet a bfloat16 product over it with
    a frozen weight takes a path 100 times slower on a CPU (2.6 s against 0.025 s for Llama 3's output layer with
    torch 2.13). A dense copy of the few hidden states, with the strides of a fresh tensor, keeps the plain matrix
    product; an input that has them passes untouched.
    """
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    if isinstance(output, torch.nn.Linear):
        output.register_forward_pre_hook(_contiguous)


class ModelWeights(BaseWeights):
    """A base model's weights (:class:`~fedpeft.models.base_weights.BaseWeights`) and the named LoRA adapters
    installed on it in place.

    Args:
        model: the base model (a transformers model with its task head); moved to ``device`` unless it is
            quantized (a bitsandbytes-quantized model is placed on its GPU when loaded and cannot be moved).
        lora_targets: module-name suffixes of the layers LoRA may wrap.
        head_modules: modules an adapter trains in full (PEFT ``modules_to_save``).
        device: the torch device forward passes run on.
        dtype: the dtype the base weights were loaded in; other than float32, adapters are kept in float32 and
            forward passes run under ``torch.autocast`` in it.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lora_targets: list[str],
        head_modules: list[str],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__(model, device=device, dtype=dtype)
        self.lora_targets = lora_targets
        self.head_modules = head_modules
        # The layers LoRA wraps, captured before PEFT injects adapters (the module objects survive injection as
        # each LoRA layer's ``base_layer``, so hooks on them see the base layer's input).
        self.target_modules: list[tuple[str, torch.nn.Module]] = lora_modules(self.base_model, lora_targets)
        # GPT-2-style models: LoRA layers over weights stored (in, out), told to PEFT rather than left to its warning.
        self.fan_in_fan_out = any(stores_in_out(module) for _, module in self.target_modules)
        self.peft: PeftModel | None = None
        self.active: LoraSpec | None = None
        contiguous_output_input(self.base_model)

    # ------------------------------------------------------------------ adapters
    def check_budget(self, rank: int) -> None:
        """Refuse a LoRA rank larger than the smallest targeted layer allows."""
        limit = max_rank(self.base_model, self.lora_targets)
        if rank > limit:
            raise UserError(f"Budget r={rank} exceeds the largest rank this model allows ({limit}); use r <= {limit}.")

    def activate(self, spec: LoraSpec | None) -> torch.nn.Module:
        """Make the adapter of shape ``spec`` the active one (creating it once) and return the model to call.

        ``None`` deactivates adapters: the returned model computes with the base weights only.
        """
        if spec is None:
            self.active = None
            return self.base_model if self.peft is None else self.peft
        name = spec.key
        config = spec.to_peft(self.head_modules, self.fan_in_fan_out)
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

    def adapter_parameters(self) -> dict[str, torch.nn.Parameter]:
        """Trainable parameters of the active adapter (LoRA weights and head copy), by PEFT name."""
        assert self.peft is not None and self.active is not None, "no active adapter"
        name = self.active.key
        return {k: p for k, p in self.peft.named_parameters() if f".{name}." in k or k.endswith(f".{name}")}

    def adapter_state(self) -> StateDict:
        """A copy of the active adapter's tensors (LoRA weights and head) on the CPU, PEFT names without adapter
        name."""
        assert self.peft is not None and self.active is not None, "no active adapter"
        state = get_peft_model_state_dict(self.peft, adapter_name=self.active.key)
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

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
        # Drawn on the CPU from its generator alone, whatever the device: a seed gives the same adapter on a GPU.
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            for module in self.peft.modules():
                if isinstance(module, LoraLayer) and name in module.lora_A:
                    with _on_cpu(_lora_params(module, name)):
                        module.reset_lora_parameters(name, True)
        with torch.no_grad():
            for module in self.peft.modules():
                to_save = getattr(module, "modules_to_save", None)
                if isinstance(to_save, torch.nn.ModuleDict) and name in to_save:
                    original = module.original_module
                    assert isinstance(original, torch.nn.Module)
                    to_save[name].load_state_dict(original.state_dict())

    def remove_adapter(self, spec: LoraSpec) -> None:
        """Delete the PEFT adapter of shape ``spec`` if present (for one-off shapes such as pruned structures)."""
        if self.peft is None or spec.key not in self.peft.peft_config:
            return
        if self.active == spec:
            self.active = None
        self.peft.delete_adapter(spec.key)

    def detach_adapters(self) -> None:
        """Remove every injected LoRA layer and head copy, restoring the plain base modules.

        Lets a PEFT adapter of another type (AdaLoRA) wrap the base model; LoRA adapters are re-created on the next
        :meth:`activate`.
        """
        if self.peft is None:
            return
        unload_adapters(self.peft)
        self.peft = None
        self.active = None

    @contextlib.contextmanager
    def using_adapter(self, spec: LoraSpec | None) -> Iterator[torch.nn.Module]:
        """Compute with another adapter (``None``: base weights only) in eval mode, then restore everything.

        For a frozen teacher beside a trained student: inside, the model runs with ``spec``'s adapter (which
        must have been created and loaded before); on exit the previously active adapter, the train/eval mode
        and every parameter's ``requires_grad`` flag are as they were, so a training loop can call this between
        its forward and backward passes.
        """
        previous = self.active
        model = self.model()
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

    # ------------------------------------------------------------------ computing
    def model(self) -> torch.nn.Module:
        """The model to call: the PEFT model with the active adapter, or the base model when none is active."""
        if self.active is None:
            return self.base_model if self.peft is None else self.peft
        return self.peft  # type: ignore[return-value]

    def adapter_context(self) -> contextlib.AbstractContextManager[None]:
        """Context in which the model computes without any adapter (when none is active)."""
        if self.active is None and self.peft is not None:
            return self.peft.disable_adapter()
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The context forward passes run in: ``torch.autocast`` in ``model.dtype`` (none for float32)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """The context any forward pass runs in: the base model alone when no adapter is active, and
        :meth:`autocast`."""
        with self.adapter_context(), self.autocast():
            yield


FORMED = "fedpeft-formed"
"""The name :func:`parameter_adapters_formed` lists among a parameter LoRA's merged adapters while it holds the
adapted weight formed, so that the layer's forward reads it rather than forming it again."""


@contextlib.contextmanager
def parameter_adapters_formed(model: torch.nn.Module) -> Iterator[None]:
    """Within: every active LoRA on a parameter (PEFT's ``ParamWrapper``: a mixture of experts' fused expert
    tensors, ``target_parameters``) forms its adapted weight once, at the first forward pass that reads it, and
    every later pass reads that one, rather than forming every expert's W + s B A again at each pass (a decoding
    step of OLMoE-1B-7B forms 6.4 G weights: benchmarks/expert_lora_passes.py). For predictions only: nothing
    formed keeps a gradient.

    It is PEFT's own forming, entered once: the layer's parametrization registered as its forward registers it,
    inside ``torch.nn.utils.parametrize.cached()``, so every output is the per-pass one, bit for bit. It holds the
    formed weights of every such layer at once (as much memory as their parameters) until it exits. A PEFT without
    that mechanism (``_activate_lora``) forms them at each pass, as before.
    """
    from peft.tuners.lora.layer import ParamWrapper

    with contextlib.ExitStack() as stack:
        for module in model.modules():
            if not isinstance(module, ParamWrapper) or module.disable_adapters or module.merged:
                continue
            activate = getattr(module, "_activate_lora", None)
            if activate is None or not any(name in module.lora_A for name in module.active_adapters):
                continue
            stack.enter_context(activate(module.active_adapters))
            module.merged_adapters.append(FORMED)  # its forward now calls the parametrized base layer as it is
            stack.callback(module.merged_adapters.remove, FORMED)
        yield


def unload_adapters(model: PeftModel) -> torch.nn.Module:
    """Remove a PEFT model's adapter layers and head copies, putting the original base modules back in place."""
    for module in model.modules():
        if isinstance(module, AuxiliaryTrainingWrapper):
            module.set_adapter([])  # unloading then restores the original head, not a trained copy
    return model.unload()
