"""``fedpeft personalize``: a client's personalized LoRA from a run's trained FedP2EFT PSG, in PEFT format.

A run with a ``fedp2eft`` method keeps its trained PSG under ``psg/<method>/seed<k>.safetensors``. Given that run
directory, a client's training data and a rank budget r, this rebuilds the run's base model, computes the
client's statistics, lets the PSG choose the rank structure, fine-tunes it on the data and writes a LoRA adapter that
``PeftModel.from_pretrained`` loads with no fedpeft code. The client is either a file of examples in the
dataset's schema (JSONL or CSV: ``text``, optional ``text_pair``, ``label`` as index or name; or ``prompt``,
``response`` for generation) or a client of the run's own dataset (``--client``). A file of examples is read as
UTF-8 (with or without a byte order mark) unless ``--encoding`` names its encoding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from fedpeft.adapters.bayestune import check_budget
from fedpeft.adapters.psg import load_generator
from fedpeft.core.config import ExperimentConfig, load_run_config
from fedpeft.core.errors import UserError
from fedpeft.core.io import ADAPTER_MARKER, check_output_dir, make_output_dir, relative_path, staged_files
from fedpeft.core.seeds import client_seed
from fedpeft.data.files import Table, check_scalar
from fedpeft.data.real.readers import read_rows
from fedpeft.data.types import ClientData, Example, FederatedData
from fedpeft.federation import assign_architectures
from fedpeft.methods.families.per_architecture import ArchitectureGroups
from fedpeft.methods.fedp2eft import PSG_DIR, FedP2EFT, FedP2EFTState, psg_path
from fedpeft.models.text import warn_unknown_text
from fedpeft.rundir import refuse_run_files

log = logging.getLogger("fedpeft")

ADAPTER_FILES = (ADAPTER_MARKER, "adapter_config.json", "adapter_model.safetensors", "README.md")
"""What ``personalize`` writes into its ``--out``: with ``--force`` into another directory, none may be there."""


# The files ``--data`` reads.
CLIENT_FILE_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv")


@dataclass
class PersonalizedAdapter:
    """What ``fedpeft personalize`` wrote."""

    path: Path
    client: str
    budget: int
    ranks: dict[str, int]
    accuracy: float | None = None


def find_psg(run_dir: Path, method: str | None, seed: int | None) -> tuple[str, int]:
    """The method label and seed of a PSG in ``run_dir`` (defaults: the only method, its first seed); a
    heterogeneous federation keeps one PSG per architecture (``psg/<label>/<architecture>/``)."""
    found = sorted((run_dir / PSG_DIR).glob("*/seed*.safetensors")) + sorted(
        (run_dir / PSG_DIR).glob("*/*/seed*.safetensors")
    )
    if not found:
        raise UserError(f"Run {run_dir} has no trained PSG; run it with a `fedp2eft` method to completion first.")
    label_of = {p: p.relative_to(run_dir / PSG_DIR).parts[0] for p in found}
    labels = sorted(set(label_of.values()))
    if method is None:
        if len(labels) > 1:
            raise UserError(f"Run {run_dir} has several PSGs ({', '.join(labels)}); choose one with --method.")
        method = labels[0]
    elif method not in labels:
        raise UserError(f"Run {run_dir} has no PSG of method {method!r}; choose one of: {', '.join(labels)}.")
    seeds = sorted({int(p.stem[4:]) for p in found if label_of[p] == method and p.stem[4:].isdigit()})
    if seed is None:
        seed = seeds[0]
    elif seed not in seeds:
        raise UserError(f"Method {method!r} has no PSG of seed {seed}; choose one of: {seeds}.")
    return method, seed


def client_architecture(
    cfg: ExperimentConfig, clients: list[ClientData], client_id: str | None, architecture: str | None
) -> str | None:
    """The architecture whose PSG and base model personalize the client: ``None`` in a homogeneous federation; a
    client of the run's own has its assigned one; a file of examples needs ``architecture`` named."""
    if not cfg.models:
        if architecture is not None:
            raise UserError("The run has one architecture; leave out --architecture.")
        return None
    names = list(cfg.models)
    if architecture is not None and architecture not in names:
        raise UserError(f"The run has no architecture {architecture!r}; choose one of: {', '.join(names)}.")
    if client_id is None:
        if architecture is None:
            raise UserError(
                f"The run federates several architectures ({', '.join(names)}); name the one to personalize with "
                "--architecture."
            )
        return architecture
    assigned = assign_architectures(cfg, clients)[client_id]
    if architecture is not None and architecture != assigned:
        raise UserError(f"Client {client_id!r} runs architecture {assigned!r}, not {architecture!r}.")
    return assigned


def read_examples(path: Path, encoding: str = "utf-8") -> Table:
    """The examples of a JSONL, JSON, CSV or TSV file, decoded from ``encoding`` (``utf-8`` with or without a byte
    order mark), as a table of rows; a file that cannot be read is a ``UserError`` naming the line to fix."""
    if not path.is_file():
        raise UserError(f"Client data file {path} does not exist; give a JSONL or CSV file of examples.")
    if path.suffix.lower() not in CLIENT_FILE_EXTENSIONS:
        raise UserError(f"Client data file {path} must end in {', '.join(CLIENT_FILE_EXTENSIONS)}.")
    columns, rows, lines = read_rows(path, encoding, "set --encoding to {encoding}", option="--encoding")
    return Table(str(path), columns, rows, lines=lines)


def client_from_examples(examples: Table, data: FederatedData) -> ClientData:
    """A client of ``data``'s task and label set from a file's examples (every example is training data)."""
    path, rows = Path(examples.source), examples.rows
    if not rows:
        raise UserError(f"Client data file {path} holds no examples.")
    client: list[Example] = []
    if data.task == "generation":
        for index, row in enumerate(rows):
            fields = {key: _text(row, key, examples.where(index)) for key in ("prompt", "response")}
            if not fields["prompt"] or not fields["response"]:
                raise UserError(
                    f"{examples.where(index)} lacks `prompt` or `response`; every example of this generation run "
                    "needs both."
                )
            client.append({"prompt": fields["prompt"], "response": fields["response"], "group": "local"})
        return ClientData(path.stem, "local", "local", client, [])
    names = list(data.label_names or [])
    raw_labels = [check_scalar(row.get("label"), "label", examples.where(i), "a label") for i, row in enumerate(rows)]
    by_name = {name: index for index, name in enumerate(names)}
    labels = []
    for value in raw_labels:
        text = str(value).strip() if value is not None else ""
        if text in by_name:
            labels.append(by_name[text])
        elif text.lstrip("-").isdigit() and 0 <= int(text) < len(names):
            labels.append(int(text))
        else:
            unknown = sorted({str(v) for v in raw_labels if str(v).strip() not in by_name})[:5]
            raise UserError(
                f"Labels {unknown} of {path} are not the run's label set ({', '.join(names)}); "
                f"use those names or indices 0-{len(names) - 1}."
            )
    for index, (row, label) in enumerate(zip(rows, labels, strict=True)):
        text = _text(row, "text", examples.where(index))
        if not text:
            raise UserError(
                f"{examples.where(index)} has no `text`; every example needs one (and optionally `text_pair`)."
            )
        pair = _text(row, "text_pair", examples.where(index)) or None
        client.append({"text": text, "text_pair": pair, "label": label, "group": "local"})
    return ClientData(path.stem, "local", "local", client, [])


def _text(row: dict[str, Any], key: str, where: str) -> str:
    """The text of ``key`` in ``row`` (a number as its digits; ``""`` when missing)."""
    value = check_scalar(row.get(key), key, where, "text")
    return "" if value is None else str(value)


def personalize_client(
    run_dir: Path,
    budget: int,
    out: Path,
    *,
    data_file: Path | None = None,
    client_id: str | None = None,
    method: str | None = None,
    seed: int | None = None,
    force: bool = False,
    encoding: str = "utf-8",
    architecture: str | None = None,
) -> PersonalizedAdapter:
    """Personalize one client from a run's trained PSG and write its adapter in PEFT format to ``out``.

    ``out`` must be a new or empty directory or one written by an earlier call (its marker file); ``force``
    writes into any other directory beside its files, and refuses one that holds a file of :data:`ADAPTER_FILES`.
    In a heterogeneous federation the client's ``architecture`` (its own for a client of the run) chooses the PSG
    and the base model.
    """
    from fedpeft.worker import Worker, base_model_dir, build_data

    run_dir = Path(run_dir)
    out = Path(out)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} holds no run (no config.yaml); pass a directory written by `fedpeft run`.")
    refuse_run_files(out, "--out")
    check_output_dir(out, "personalize", ADAPTER_MARKER, writes=ADAPTER_FILES, force=force)
    if (data_file is None) == (client_id is None):
        raise UserError("Give exactly one of --data (a file of examples) and --client (a client of the run).")
    # A file of examples is read before the run's model and data are built, so that its problems show at once.
    examples = read_examples(Path(data_file), encoding) if data_file is not None else None
    label, seed = find_psg(run_dir, method, seed)
    cfg = load_run_config(run_dir)
    data = build_data(cfg)
    if client_id is not None and client_id not in {c.client_id for c in data.clients}:
        raise UserError(f"Run {run_dir} has no client {client_id!r}; see its results.jsonl for client ids.")
    architecture = client_architecture(cfg, data.clients, client_id, architecture)
    path = psg_path(run_dir, label, seed, architecture)
    if not path.is_file():
        raise UserError(f"Run {run_dir} has no PSG of method {label!r}, seed {seed} for architecture {architecture!r}.")
    tensors, meta = load_generator(path)
    check_budget(budget, int(meta["config"]["r_max"]))
    client = data.client(client_id) if client_id is not None else client_from_examples(examples, data)  # type: ignore[arg-type]
    worker = Worker(cfg, run_dir, data=data)
    if label not in worker.methods:
        raise UserError(f"Method {label!r} is not in the config of run {run_dir}.")
    fedp2eft = worker.methods[label]
    if isinstance(fedp2eft, ArchitectureGroups):  # its per-architecture wrapper: the PSG is one architecture's
        fedp2eft = fedp2eft.inner
    if not isinstance(fedp2eft, FedP2EFT):
        raise UserError(f"Method {label!r} of run {run_dir} is not fedp2eft.")
    worker.bases.use_base(seed)
    runtime = worker.runtime if architecture is None else worker.federation.runtime(architecture)
    model_name = (cfg.models[architecture] if architecture is not None else cfg.model).name
    warn_unknown_text(runtime.text, [client], model_name)
    if meta["modules"] != [name for name, _ in runtime.target_modules]:
        raise UserError(f"The PSG of {path} was trained for other LoRA modules than the run's model has.")
    state = FedP2EFTState(tensors=tensors, round=int(meta["rounds"]), modules=list(meta["modules"]))
    # The seed the run used for this client and budget: a client of the run gets the adapter the run saved.
    pseed = client_seed(seed, fedp2eft.name, "personalize", budget, client.client_id)
    scales = fedp2eft.client_scales(runtime, client, state, None, pseed)
    model = fedp2eft.personalize(runtime, client, state, scales, budget, pseed)
    runtime.install(model, seed=pseed)
    accuracy = None
    if client.test and runtime.task == "classification":
        accuracy = runtime.evaluate(client.test)["accuracy"]
    assert model.lora is not None
    base = base_model_dir(run_dir, architecture)
    make_output_dir(out, ADAPTER_MARKER, "personalize")
    # Like a run's adapters, it names the run's base model relative to its own directory.
    write_adapter(runtime, out, relative_path(base, out) if base.is_dir() else model_name)
    return PersonalizedAdapter(out, client.client_id, budget, dict(model.lora.rank_pattern), accuracy)


def write_adapter(runtime: Any, target: Path, base_model: str) -> Path:
    """Write the runtime's active adapter in PEFT format (``adapter_config.json``, ``adapter_model.safetensors``),
    each file through a temporary file and a rename."""
    config = runtime.saved_adapter_config(base_model)
    tensors = {k: v.contiguous() for k, v in runtime.adapter_state().items()}
    with staged_files(target) as staging:
        config.save_pretrained(str(staging))
        save_file(tensors, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
    return target
