"""Adapters with several branches per linear module, added to a base model by forward hooks.

PEFT has no PQ-LoRA and no learnable gate between two adapters, so these live here: a :class:`HookedAdapter`
holds, for every :class:`~fedpeft.adapters.pq_lora.Site` of a model, one or more named *branches* (``local``,
``global``, ...) and adds their output to the base module's output through a forward hook (torch's public API;
the base model and its classes are left untouched, and detaching removes every hook). A site is

- ordinary LoRA: each branch has its own ``lora_A`` (r x d_in) and ``lora_B`` (d_out x r); the output is
  ``alpha / r * B A x``;
- PQ-LoRA: the branches share the frozen frame ``A``, ``B`` of the site and each has ``P`` (r x r), ``Q`` (r);
  the output is ``B (P A x + Q)``, so all branches share ``A x``.

Branches are mixed by a learnable gate per transformer layer, ``(1 - sigmoid(beta)) * local + sigmoid(beta) *
global`` (beta = 0 at the start: both halves), or summed (``mix="sum"``); ``active`` selects the branches that
compute. A classification head, if any, is replaced by a trainable copy (``head/...`` tensors).

Tensor names: ``frame/<key>.A|B`` (PQ frames), ``<branch>/<key>.P|Q|lora_A|lora_B``, ``gate/<layer>``,
``head/<module>.<param>``; ``<key>`` is the site key (``pq<k>.<type>`` or ``<architecture>:<module>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from fedpeft.adapters.pq_lora import Site, orthonormal_columns, orthonormal_rows
from fedpeft.core.io import write_bytes_atomic

if TYPE_CHECKING:
    from fedpeft.models.runtime import ModelRuntime

GATED = "gated"
SUM = "sum"


def lora_init(rank: int, d_in: int, d_out: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """PEFT's LoRA initialization: A Kaiming-uniform (a = sqrt(5)), B = 0."""
    bound = 1.0 / math.sqrt(d_in)  # kaiming_uniform_ with a = sqrt(5): gain sqrt(1/3), bound gain * sqrt(3 / fan_in)
    lora_a = (torch.rand(rank, d_in, generator=generator) * 2 - 1) * bound
    return lora_a, torch.zeros(d_out, rank)


def _find_module(model: torch.nn.Module, leaf: str) -> torch.nn.Module | None:
    """The base module whose name ends in ``leaf`` (through PEFT's wrapper if one was put around it)."""
    for name, module in model.named_modules():
        if name == leaf or name.endswith("." + leaf):
            if "original_module" in name or "modules_to_save" in name:
                continue
            return getattr(module, "original_module", module)
    return None


class HookedAdapter:
    """Branches of ordinary LoRA and PQ-LoRA on a model's linear modules (see the module docstring).

    Args:
        sites: where the adapters go (:func:`~fedpeft.adapters.pq_lora.plan_sites`).
        rank: r of every site.
        alpha: ordinary-LoRA scaling numerator (scaling alpha / r); PQ-LoRA has no scaling.
        branches: branch names.
        mix: ``"gated"`` (two branches ``local`` and ``global``, one gate per layer) or ``"sum"``.
    """

    def __init__(
        self,
        sites: list[Site],
        *,
        rank: int,
        alpha: float | None = None,
        branches: tuple[str, ...] = ("local", "global"),
        mix: str = GATED,
    ) -> None:
        if mix == GATED and set(branches) != {"local", "global"}:
            raise ValueError("a gated adapter has exactly the branches 'local' and 'global'")
        self.sites = list(sites)
        self.rank = rank
        self.scaling = float(alpha if alpha is not None else 2 * rank) / rank
        self.branches = tuple(branches)
        self.mix = mix
        self.active: tuple[str, ...] = self.branches
        self.enabled = True
        self.tensors: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ construction
    def initialize(self, generator: torch.Generator) -> HookedAdapter:
        """Fresh tensors: random orthonormal PQ frames, P = Q = 0, LoRA (A random, B = 0) copied into every
        branch (so all branches start equal), gates 0."""
        for site in self.sites:
            if site.kind == "pq":
                self.tensors[f"frame/{site.key}.A"] = orthonormal_rows(self.rank, site.d_in, generator)
                self.tensors[f"frame/{site.key}.B"] = orthonormal_columns(site.d_out, self.rank, generator)
                for branch in self.branches:
                    self.tensors[f"{branch}/{site.key}.P"] = torch.zeros(self.rank, self.rank)
                    self.tensors[f"{branch}/{site.key}.Q"] = torch.zeros(self.rank)
            else:
                lora_a, lora_b = lora_init(self.rank, site.d_in, site.d_out, generator)
                for branch in self.branches:
                    self.tensors[f"{branch}/{site.key}.lora_A"] = lora_a.clone()
                    self.tensors[f"{branch}/{site.key}.lora_B"] = lora_b.clone()
        for layer in sorted({site.layer for site in self.sites}):
            self.tensors[f"gate/{layer}"] = torch.zeros(())
        return self

    def add_head(self, runtime: ModelRuntime) -> HookedAdapter:
        """Trainable copies of the runtime's classification-head parameters (nothing for generation)."""
        for leaf in runtime.loaded.head_modules:
            module = _find_module(runtime.base_model, leaf)
            if module is None:
                continue
            for pname, param in module.named_parameters():
                self.tensors[f"head/{leaf}.{pname}"] = param.detach().clone()
        return self

    # ------------------------------------------------------------------ tensors
    def branch(self, name: str) -> dict[str, torch.Tensor]:
        """The tensors of branch ``name`` under their travelling names (``<key>.P``, ``<key>.lora_A``, ...)."""
        prefix = f"{name}/"
        return {k[len(prefix) :]: v.detach().clone() for k, v in self.tensors.items() if k.startswith(prefix)}

    def load_branch(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """Overwrite branch ``name`` with ``tensors`` (travelling names; keys of other sites are ignored)."""
        for key, value in tensors.items():
            full = f"{name}/{key}"
            if full in self.tensors:
                self.tensors[full] = value.detach().clone().to(self.tensors[full].dtype)

    def group(self, prefix: str) -> dict[str, torch.Tensor]:
        """Copies of every tensor whose name starts with ``prefix`` (``"frame/"``, ``"gate/"``, ``"head/"``)."""
        return {k: v.detach().clone() for k, v in self.tensors.items() if k.startswith(prefix)}

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        """Overwrite tensors by full name."""
        for key, value in tensors.items():
            if key in self.tensors:
                self.tensors[key] = value.detach().clone().to(self.tensors[key].dtype)

    def frames(self) -> dict[str, dict[str, torch.Tensor]]:
        """The PQ frames by site key: ``{key: {"A": r x d_in, "B": d_out x r}}``."""
        frames: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in self.group("frame/").items():
            key, part = name[len("frame/") :].rsplit(".", 1)
            frames.setdefault(key, {})[part] = tensor
        return frames

    def trainable(self, prefixes: Iterable[str]) -> dict[str, torch.nn.Parameter]:
        """Make the tensors whose names start with one of ``prefixes`` trainable and return them by name.

        Frames never train. Every other tensor becomes (or stays) a plain frozen tensor.
        """
        prefixes = tuple(prefixes)
        params: dict[str, torch.nn.Parameter] = {}
        for key, value in list(self.tensors.items()):
            if key.startswith(prefixes) and not key.startswith("frame/"):
                param = value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value.detach().clone())
                self.tensors[key] = params[key] = param
            elif isinstance(value, torch.nn.Parameter):
                self.tensors[key] = value.detach().clone()
        return params

    def save(self, directory: Path) -> Path:
        """Write every tensor as ``adapter.safetensors`` with the site plan in its metadata."""
        directory.mkdir(parents=True, exist_ok=True)
        sites = ";".join(f"{s.module},{s.layer},{s.kind},{s.key},{s.d_in},{s.d_out}" for s in self.sites)
        metadata = {"rank": str(self.rank), "scaling": str(self.scaling), "mix": self.mix, "sites": sites}
        path = directory / "adapter.safetensors"
        tensors = {k: v.detach().contiguous() for k, v in self.tensors.items()}
        write_bytes_atomic(path, safetensors_bytes(tensors, metadata=metadata))
        return path

    @classmethod
    def load_file(cls, path: Path, branches: tuple[str, ...] = ("local", "global")) -> HookedAdapter:
        """An adapter written by :meth:`save`."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata()
        sites = []
        for row in metadata["sites"].split(";"):
            module, layer, kind, key, d_in, d_out = row.split(",")
            sites.append(Site(module, int(layer), kind, key, int(d_in), int(d_out)))
        rank = int(metadata["rank"])
        adapter = cls(sites, rank=rank, alpha=float(metadata["scaling"]) * rank, branches=branches, mix=metadata["mix"])
        adapter.tensors = dict(load_file(str(path)))
        return adapter

    # ------------------------------------------------------------------ forward
    def gate(self, layer: int) -> torch.Tensor:
        """sigmoid(beta) of ``layer``: the weight of the global branch."""
        return torch.sigmoid(self.tensors[f"gate/{layer}"])

    def _coefficients(self, layer: int) -> list[tuple[str, torch.Tensor | float]]:
        if self.mix == GATED:
            weight = self.gate(layer)
            mixing = {"local": 1 - weight, "global": weight}
            return [(b, mixing[b]) for b in self.active]
        return [(b, 1.0) for b in self.active]

    def delta(self, site: Site, inputs: torch.Tensor) -> torch.Tensor:
        """What the branches add to the output of ``site`` for ``inputs`` (..., d_in)."""
        t = self.tensors
        out: torch.Tensor | float = 0.0
        if site.kind == "pq":
            codes = inputs @ t[f"frame/{site.key}.A"].T
            for branch, weight in self._coefficients(site.layer):
                out = out + weight * (codes @ t[f"{branch}/{site.key}.P"].T + t[f"{branch}/{site.key}.Q"])
            return out @ t[f"frame/{site.key}.B"].T  # type: ignore[operator]
        for branch, weight in self._coefficients(site.layer):
            hidden = inputs @ t[f"{branch}/{site.key}.lora_A"].T
            out = out + (weight * self.scaling) * (hidden @ t[f"{branch}/{site.key}.lora_B"].T)
        return out  # type: ignore[return-value]

    def attach(self, runtime: ModelRuntime) -> Callable[[], None]:
        """Hook the branches onto the runtime's modules; returns the function that removes every hook."""
        modules = dict(runtime.target_modules)
        handles = []
        for site in self.sites:
            handles.append(modules[site.module].register_forward_hook(self._site_hook(site)))
        for leaf in {k[len("head/") :].split(".")[0] for k in self.tensors if k.startswith("head/")}:
            module = _find_module(runtime.base_model, leaf)
            if module is not None:
                handles.append(module.register_forward_hook(self._head_hook(leaf)))

        def detach() -> None:
            for handle in handles:
                handle.remove()

        return detach

    def _site_hook(self, site: Site) -> Callable[..., torch.Tensor]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            if not self.enabled or not self.active:
                return output
            return output + self.delta(site, args[0].to(torch.float32)).to(output.dtype)

        return hook

    def _head_hook(self, leaf: str) -> Callable[..., torch.Tensor]:
        prefix = f"head/{leaf}."
        running: list[bool] = []  # the copy's forward runs the module again, which must not re-enter this hook

        def hook(module: torch.nn.Module, args: tuple[object, ...], output: torch.Tensor) -> torch.Tensor:
            if not self.enabled or running:
                return output
            params = {k[len(prefix) :]: v for k, v in self.tensors.items() if k.startswith(prefix)}
            running.append(True)
            try:
                return torch.func.functional_call(module, params, args)
            finally:
                running.pop()

        return hook


def frame_tensors(frames: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """PQ frames (as :meth:`HookedAdapter.frames` gives them) under their full tensor names ``frame/<key>.A|B``."""
    return {f"frame/{key}.{part}": tensor for key, parts in frames.items() for part, tensor in parts.items()}
