"""Where a run keeps what its workers write beside the records: the base model in Hugging Face format that saved
adapters name as their base (``base_model/``, one per architecture of a heterogeneous federation), and the
personalized adapters (``adapters/<label>/...``, :class:`SavedAdapters`), each directory written whole or not at
all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from fedpeft.core.io import relative_path, staged_dir, staged_files
from fedpeft.federation import Federation
from fedpeft.methods.base import Budget
from fedpeft.models.runtime import ModelRuntime

SHARED_ADAPTER_DIR = "global"  # the one adapter every client of a method keeps
OWN_ADAPTERS_DIR = "clients"  # budget-less methods' per-client adapters: adapters/<label>/clients/<client>/


BASE_MODEL_DIR = "base_model"


def base_model_dir(run_dir: Path, architecture: str | None = None) -> Path:
    """Where a run keeps a base model in Hugging Face format, the base its saved adapters name: ``base_model/``,
    or ``base_model/<architecture>/`` for each architecture of a heterogeneous federation."""
    root = Path(run_dir) / BASE_MODEL_DIR
    return root / architecture if architecture is not None else root


def adapter_dir(run_dir: Path, label: str, budget: Budget, client_id: str | None) -> Path:
    """Where a run keeps an adapter of method ``label``.

    ``client_id`` ``None`` is the adapter every client keeps: ``adapters/<label>/global/`` (budget-less) or
    ``adapters/<label>/r<budget>/global/``. A client's own adapter: ``adapters/<label>/r<budget>/<client>/`` (a tier
    name instead of ``r<budget>``), or ``adapters/<label>/clients/<client>/`` for a budget-less method.
    """
    root = Path(run_dir) / "adapters" / label
    if budget is not None:
        root = root / (f"r{budget}" if isinstance(budget, int) else str(budget))  # rank or tier
    if client_id is None:
        return root / SHARED_ADAPTER_DIR
    return (root / OWN_ADAPTERS_DIR if budget is None else root) / client_id


def write_base_model(
    runtime: ModelRuntime, tensors: dict[str, torch.Tensor], directory: Path, label_names: list[str] | None
) -> None:
    """Write ``tensors`` as ``runtime``'s model in Hugging Face format to ``directory`` (its config naming the
    classes after ``label_names``, its tokenizer or image processor beside it), whole or not at all."""
    config = labelled_config(runtime.base_model.config, label_names)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with staged_dir(directory) as target:  # written whole, then renamed into place
        config.save_pretrained(target)
        save_file(
            {k: v.detach().contiguous() for k, v in tensors.items()},
            str(target / "model.safetensors"),
            metadata={"format": "pt"},
        )
        for processor in (runtime.tokenizer, getattr(runtime.loaded, "image_processor", None)):
            if processor is not None:
                processor.save_pretrained(target)


def labelled_config(config: Any, label_names: list[str] | None) -> Any:
    """A copy of a model config that names its classes (``id2label``, ``label2id``) after the dataset's labels,
    when it has one output per label; otherwise the config itself."""
    if not label_names or getattr(config, "num_labels", None) != len(label_names):
        return config
    import copy

    named = copy.deepcopy(config)
    named.id2label = dict(enumerate(label_names))
    named.label2id = {name: index for index, name in enumerate(label_names)}
    return named


class SavedAdapters:
    """The personalized adapters a worker writes in PEFT format (loadable with ``PeftModel.from_pretrained``), each
    naming as its base the run's base model of its client's architecture (:func:`base_model_dir`).

    Args:
        run_dir: the run directory (``adapters/`` and ``base_model/`` under it).
        federation: the worker's architectures (the runtime of each client's).
    """

    def __init__(self, run_dir: Path, federation: Federation) -> None:
        self.run_dir = Path(run_dir)
        self.federation = federation
        self._shared_saved: set[Path] = set()  # shared adapters this process wrote (written once)

    def base_model_of(self, client_id: str) -> Path:
        """The directory of the base model the client's adapters load onto (its architecture's, in a heterogeneous
        federation)."""
        federation = self.federation
        return base_model_dir(self.run_dir, federation.architecture_of(client_id) if federation.heterogeneous else None)

    def save(self, label: str, budget: Budget, client_id: str, *, shared: bool = False) -> Path:
        """Write the active adapter of ``client_id``'s runtime; returns its directory.

        A client's own adapter goes to :func:`adapter_dir`; a ``shared`` one (the global adapter every client keeps)
        goes to ``adapters/<label>/global/`` (``adapters/<label>/<budget>/global/`` at a budget), written once by
        this process however many clients keep it.
        """
        runtime = self.federation.runtime_of(client_id)
        assert runtime.active is not None and runtime.peft is not None
        target = adapter_dir(self.run_dir, label, budget, None if shared else client_id)
        if shared and target in self._shared_saved:
            return target
        # Relative to the adapter directory (``../../../base_model`` for adapters/<label>/global/), so it still
        # holds after the run is moved.
        config = runtime.saved_adapter_config(relative_path(self.base_model_of(client_id), target))
        tensors = {k: v.contiguous() for k, v in runtime.adapter_state().items()}
        with staged_files(target) as staging:  # each file written whole, then renamed into place
            config.save_pretrained(str(staging))
            save_file(tensors, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        if shared:
            self._shared_saved.add(target)
        return target
