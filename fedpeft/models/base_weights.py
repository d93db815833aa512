"""A base model's weights kept in place: the model's own parameters are the one copy of them; a client's work that
overwrites or trains some keeps the values it replaced, and only those, to restore between clients
(:class:`BaseWeights`). :class:`~fedpeft.models.weights.ModelWeights` adds the named LoRA adapters on top."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, cast

import torch

from fedpeft.core.errors import UserError
from fedpeft.core.types import StateDict

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _is_quantized(param: torch.Tensor) -> bool:
    """Whether ``param`` is a bitsandbytes packed weight (``Params4bit``, ``Int8Params``)."""
    return type(param).__module__.split(".")[0] == "bitsandbytes"


class BaseWeights:
    """A base model's weights, overwritten in place and restored.

    Args:
        model: the base model (a transformers model with its task head); moved to ``device`` unless it is
            quantized (a bitsandbytes-quantized model is placed on its GPU when loaded and cannot be moved).
        device: the torch device forward passes run on.
        dtype: the dtype the base weights were loaded in.
    """

    def __init__(self, model: torch.nn.Module, *, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype
        self.quantized = getattr(model, "is_quantized", False) is True
        # A transformers model: callers read its config and call generate, which torch's Module type does not know.
        self.base_model = cast("PreTrainedModel", model if self.quantized else model.to(device))
        # Parameter objects survive PEFT's injection (they move under base_layer / original_module), so these
        # references keep addressing the base weights under their canonical names.
        self.base_params: dict[str, torch.nn.Parameter] = dict(self.base_model.named_parameters())
        # bitsandbytes' packed 4-bit / 8-bit weights: frozen by QLoRA, so never copied or overwritten (a copy of
        # the packed data does not load back into the layer).
        self.quantized_params = {name for name, p in self.base_params.items() if _is_quantized(p)}
        # The weights load_base(None) restores are the parameters themselves, except where a client's work put
        # others in place: this holds the replaced values of those parameters only (one copy of the base weights
        # per process, not two).
        self._replaced: StateDict = {}

    def _copy(self, state: Mapping[str, torch.Tensor], device: torch.device | None = None) -> StateDict:
        """A copy of ``state`` on ``device`` (``None``: each tensor where its base weight lives); a quantized weight
        is kept as the layer's own tensor (it never changes)."""
        return {
            k: v if k in self.quantized_params else v.detach().to(device or self.base_params[k].device, copy=True)
            for k, v in state.items()
        }

    def base_state(self) -> StateDict:
        """A copy of the current base weights on the CPU, by canonical parameter name (what a server keeps and a
        message carries; quantized weights, which never change, as the layers' own tensors)."""
        return self._copy(self.base_params, torch.device("cpu"))

    def _write(self, name: str, tensor: torch.Tensor) -> None:
        param = self.base_params[name]
        if name not in self.quantized_params:
            param.copy_(tensor)
        elif tensor.data_ptr() != param.data_ptr():
            raise UserError(
                f"model.quantization keeps the base weights frozen, and this method replaces {name}; drop "
                "model.quantization, or use a method that trains adapters only on a pretrained base."
            )

    def base_tensors(self) -> StateDict:
        """The current base weights by canonical parameter name, as the parameters' own tensors (no copy: read
        them before the weights change, e.g. to write them to a file)."""
        return {name: param.detach() for name, param in self.base_params.items()}

    def keep_initial(self, names: Iterable[str]) -> None:
        """Keep the initial values of the base weights ``names`` before they change in place (training, a
        client's base tensors), so that :meth:`load_base` restores them; a weight kept already is not copied
        again."""
        for name in names:
            if name not in self._replaced and name not in self.quantized_params:
                self._replaced[name] = self.base_params[name].detach().clone()

    def keep_trained(self, params: Iterable[torch.nn.Parameter]) -> None:
        """:meth:`keep_initial` for the base weights among ``params`` (what a training run is about to update)."""
        names = {id(param): name for name, param in self.base_params.items()}
        self.keep_initial(names[id(param)] for param in params if id(param) in names)

    @property
    def replaced_names(self) -> set[str]:
        """The base weights that hold other values than the initial ones now (restored by ``load_base(None)``)."""
        return set(self._replaced)

    def initial_tensor(self, name: str) -> torch.Tensor:
        """The initial value of base weight ``name`` (what ``load_base(None)`` puts back), without a copy."""
        kept = self._replaced.get(name)
        return kept if kept is not None else self.base_params[name].detach()

    def load_base(self, state: StateDict | None) -> None:
        """Overwrite base weights in place (``None`` restores the initial weights: those the model was loaded
        with, or set by :meth:`set_initial_base` and :meth:`override_initial_base`)."""
        with torch.no_grad():
            if state is None:
                for name, tensor in self._replaced.items():
                    self.base_params[name].copy_(tensor)
                self._replaced = {}
                return
            self.keep_initial(state)
            for name, tensor in state.items():
                self._write(name, tensor)

    def set_initial_base(self, state: StateDict) -> None:
        """Make ``state`` the weights that ``load_base(None)`` restores (the output of the base stage), and load
        them."""
        self.load_base(None)
        with torch.no_grad():
            for name, tensor in state.items():
                self._write(name, tensor)

    def override_initial_base(self, tensors: StateDict) -> StateDict:
        """Replace some tensors of the weights :meth:`load_base` restores, and load them.

        Returns the tensors they replaced, so that the caller can put them back (a per-client base model on top of
        a shared one).
        """
        previous: StateDict = {}
        with torch.no_grad():
            for name, tensor in tensors.items():
                kept = self._replaced.pop(name, None)
                if name in self.quantized_params:
                    previous[name] = self.base_params[name]
                else:
                    previous[name] = kept if kept is not None else self.base_params[name].detach().clone()
                self._write(name, tensor)
        return previous
