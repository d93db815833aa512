"""Typed experiment configuration: YAML files, packaged presets and ``--set key=value`` overrides.

Parse once at the boundary: everything past :func:`load_config` receives typed objects.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
import types
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, cast, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from fedpeft.core.errors import UserError
from fedpeft.core.faults import FaultConfig, check_fault_methods
from fedpeft.core.jsontypes import JSONMapping, JSONObject, JSONValue
from fedpeft.core.method_class import MethodConfig, ServerStepSettings
from fedpeft.core.textfiles import codec_of, read_text

if TYPE_CHECKING:
    from fedpeft.core.registry import Registry

BASE_STAGE_LABEL = "base-stage"
"""The label of a federated base stage's rounds (its checkpoints, client states and ``faults.*.methods``)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InvalidConfigError(UserError):
    """Every problem found in a config (or in one method entry), one sentence each; the message is the one sentence
    of a single problem, else a first line counting them and one line per problem."""

    def __init__(self, problems: list[str], subject: str = "The config") -> None:
        self.problems, self.subject = problems, subject
        if len(problems) == 1:
            super().__init__(problems[0])
        else:
            super().__init__(f"{subject} has {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems))

    def __reduce__(self) -> tuple[type[InvalidConfigError], tuple[list[str], str]]:
        # Raised in a worker process, it comes back pickled: rebuilt from its problems, not from its message (whose
        # characters would each count as a problem).
        return type(self), (self.problems, self.subject)


_PROBLEMS = "config_problems"
"""The type of the pydantic error a validator raises to carry finished sentences (:func:`_problems_error`)."""


def _problems_error(problems: list[str]) -> PydanticCustomError:
    """A pydantic error carrying finished problem sentences: raised inside a validator, it joins the other fields'
    errors (a :class:`UserError` raised there would end the validation at the first problem)."""
    return PydanticCustomError(_PROBLEMS, " ".join(problems), {"problems": problems})


def method_config(entry: object, where: str | None = None) -> MethodConfig:
    """Validate one entry of ``methods`` (or ``base.method``) into its method's typed config.

    The method's config class is looked up in the registry (a shipped method's lives in :mod:`fedpeft.settings`, so
    neither the method's module nor torch is imported), and the entry validated by it: misspelt or invalid settings
    are an :class:`InvalidConfigError` (a :class:`UserError`) naming every one of them, before anything runs. An
    alias as ``name`` becomes the canonical name, with the alias as ``label`` (unless one is given).

    Args:
        entry: the entry as given (a mapping with a ``name``), or a config already validated.
        where: the entry's key path in the config (``methods.0``, ``base.method``), named in the problems.

    Returns:
        The method's typed config.
    """
    if isinstance(entry, MethodConfig):
        return entry
    at = f" ({where})" if where else ""
    if not isinstance(entry, dict) or "name" not in entry:
        raise UserError(f"Every entry of `methods` needs a `name`{at}; e.g. `- name: lora`.")
    from fedpeft.core.registry import METHODS

    name = METHODS.canonical(str(entry["name"]))
    config_class = METHODS.config_class(name)
    if not issubclass(config_class, MethodConfig):
        raise TypeError(f"the config class of method {name!r}, {config_class!r}, is not a MethodConfig")
    try:
        cfg = config_class.model_validate({**entry, "name": name})
    except ValidationError as err:
        method = f"method {entry['name']!r}"

        def sentence(path: str, what: str) -> str:
            return _method_problem(path, what, method, where)

        problems = _problems_of(err, config_class, where or "", method, sentence)
        raise InvalidConfigError(problems, f"Method {entry['name']!r}{at}") from None
    if "label" not in entry and entry["name"] != name:
        cfg.label = str(entry["name"])
    _check_server_rule(cfg)
    return cfg


def _method_problem(path: str, explained: str, method: str, where: str | None) -> str:
    if not path:  # a check across the method's settings
        return _sentence(f"Invalid settings of {method}{f' ({where})' if where else ''}: {explained}")
    return _sentence(f"Invalid setting {path!r} of {method}{f' ({where}.{path})' if where else ''}: {explained}")


def _method_configs(entries: list[tuple[str, object]]) -> list[MethodConfig]:
    """The typed configs of method ``entries`` (key path, entry); every problem of every entry in one pydantic
    error."""
    configs: list[MethodConfig] = []
    problems: list[str] = []
    for where, entry in entries:
        try:
            configs.append(method_config(entry, where))
        except InvalidConfigError as err:
            problems += err.problems
        except UserError as err:
            problems.append(str(err))
    if problems:
        raise _problems_error(problems)
    return configs


_FEW_KEYS = 12
"""Up to this many keys, the message of an unknown key lists the known keys of its place."""

_BOUNDS = {
    "greater_than": ("gt", "above"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "below"),
    "less_than_equal": ("le", "at most"),
}
"""Pydantic's errors of numeric bounds: error type -> (its context key, the words for the bound)."""


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?")) else f"{text}."


def _problems_of(
    err: ValidationError, model: type[BaseModel], prefix: str, root: str, sentence: Callable[[str, str], str]
) -> list[str]:
    """Every problem of ``err`` (from validating ``model``) as a sentence, one per key path: a value that fails
    each member of a union is one problem.

    Args:
        err: the validation error.
        model: the class validated.
        prefix: the key path of ``model`` in the config (``methods.0``; '' for the config itself).
        root: how a message names ``model``'s own place ("the config", "method 'lora'").
        sentence: the sentence of one problem, from its key path under ``model`` and what is wrong.
    """
    problems: list[str] = []
    seen: set[str] = set()
    for error in err.errors():
        if error["type"] == _PROBLEMS:  # finished sentences (method entries, checks that name their own keys)
            problems += [p for p in error.get("ctx", {}).get("problems", []) if p not in problems]
            continue
        keys, holder = _locate(model, error["loc"])
        path = ".".join(keys)
        if path in seen and path:
            continue
        seen.add(path)
        problems.append(sentence(path, _explain(error, keys, holder, prefix, root)))
    return problems


def _explain(error: ErrorDetails, keys: list[str], holder: type[BaseModel] | None, prefix: str, root: str) -> str:
    """What is wrong at ``keys`` (under the config place ``prefix``) and, where it can tell, how to fix it."""
    kind, ctx, given = error["type"], error.get("ctx", {}), error["input"]
    full = ".".join([prefix, *keys] if prefix else keys)
    if kind == "extra_forbidden" and keys:
        parent = ".".join([prefix, *keys[:-1]] if prefix else keys[:-1])
        place = f"`{parent}`" if keys[:-1] else root
        return _unknown_key(keys[-1], list(holder.model_fields) if holder is not None else [], place)
    if kind in _BOUNDS:
        bound, words = _BOUNDS[kind]
        limit = ctx[bound]
        limit = int(limit) if isinstance(limit, float) and limit.is_integer() else limit  # 0, not 0.0
        return f"must be {words} {limit}, not {given}"
    if kind == "list_type" and keys:
        items = _list_items(given, holder, keys[-1])
        if items is None:  # neither the value in brackets nor the key's default is a valid list
            return f"expected a list, not {given!r}"
        example = f"--set {_shell_word(f'{full}=[{items}]')}"
        return f"expected a list, not {given!r}; e.g. `{example}` (in a file: `{keys[-1]}: [{items}]`)"
    if kind == "missing":
        return "required, and not given"
    return str(error["msg"]).removeprefix("Value error, ")


def _list_items(given: object, holder: type[BaseModel] | None, key: str) -> str | None:
    """The items of a list to suggest for ``key`` of ``holder``, given ``given`` instead of a list: ``given`` itself
    where ``[given]`` is valid there, else the key's default list; ``None`` when neither is known to be valid."""
    from pydantic import TypeAdapter

    items = given if isinstance(given, str) else _inline(given)
    field = holder.model_fields.get(key) if holder is not None else None
    if field is None or field.annotation is None:
        return items
    adapter: TypeAdapter[object] = TypeAdapter(field.annotation)
    try:
        adapter.validate_python(yaml.safe_load(f"[{items}]"))
        return items
    except (ValidationError, yaml.YAMLError):
        pass
    default = field.get_default(call_default_factory=True)
    if isinstance(default, list) and default:
        return _inline(default)[1:-1]
    return None


def _unknown_key(key: str, known: list[str], place: str) -> str:
    close = _close_to(key, known)
    if close:
        return f"{place} has no such key; did you mean `{close[0]}`?"
    if 0 < len(known) <= _FEW_KEYS:
        return f"{place} has no such key; its keys are {', '.join(known)}"
    return f"{place} has no such key"


def _close_to(word: str, known: list[str]) -> list[str]:
    """The word of ``known`` closest to a misspelt ``word``, if one is close (a list of it, else empty)."""
    return difflib.get_close_matches(word, known, n=1)


def _inline(value: object) -> str:
    """``value`` as YAML on one line (``[0, 1]``, ``{name: lora}``, ``4``)."""
    return str(yaml.safe_dump(value, default_flow_style=True, width=10**6)).strip().removesuffix("...").strip()


def _shell_word(text: str) -> str:
    """``text`` quoted for a shell: in double quotes where nothing in it expands there, else as shlex quotes it."""
    return f'"{text}"' if re.fullmatch(r'[^"$`\\!]*', text) else shlex.quote(text)


def _members(annotation: object) -> list[object]:
    """The types ``annotation`` admits: unions and ``Optional`` unpacked, ``Annotated`` unwrapped, ``None`` left out."""
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return [member for arg in get_args(annotation) for member in _members(arg)]
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    return [] if annotation is type(None) else [annotation]


def _locate(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[list[str], type[BaseModel] | None]:
    """The key path of a pydantic error's location under ``model`` (the tags pydantic adds for the members of a
    union, such as ``int``, left out), and the model class whose key is the path's last."""
    keys: list[str] = []
    holder: type[BaseModel] | None = None
    current: list[object] = [model]
    for part in loc:
        models = [c for c in current if isinstance(c, type) and issubclass(c, BaseModel)]
        owner = next((m for m in models if part in m.model_fields), None)
        lists = [c for c in current if get_origin(c) in (list, tuple)]
        mappings = [c for c in current if get_origin(c) is dict]
        if owner is not None:
            keys.append(str(part))
            holder, current = owner, _members(owner.model_fields[str(part)].annotation)
        elif isinstance(part, int) and lists:
            keys.append(str(part))
            current = _members(get_args(lists[0])[0])
        elif mappings:
            keys.append(str(part))
            current = _members(get_args(mappings[0])[-1])
        elif len(current) > 1:  # the tag of a union member
            current = [c for c in current if getattr(c, "__name__", None) == part]
        else:  # a key the model does not know
            keys.append(str(part))
            holder, current = (models[0] if models else None), []
    return keys, holder


def _check_server_rule(cfg: MethodConfig) -> None:
    """Refuse ``aggregation`` (a robust rule), ``dp`` and ``server_optimizer`` for a method whose server step is not
    a weighted mean (``cfg`` names those it sets)."""
    refused = cfg.refused_server_settings() if isinstance(cfg, ServerStepSettings) else []
    if refused:
        raise UserError(
            f"Method {cfg.name!r} cannot use {' or '.join(refused)}: its server step is not a weighted mean of the "
            "clients' uploads."
        )


class DataColumns(_Strict):
    """Which columns of a user's own data (datasets ``files`` and ``hub``) hold what.

    Each value is a column name; ``None`` means the data has no such column. ``text``, ``text_pair`` and
    ``label`` are read for classification, ``prompt`` and ``response`` for generation; ``client`` names each
    row's client (the ``natural`` partition) and ``split`` marks each row ``train`` or ``test``.
    """

    text: str | None = "text"
    text_pair: str | None = "text_pair"
    label: str | None = "label"
    prompt: str | None = "prompt"
    response: str | None = "response"
    client: str | None = "client"
    split: str | None = "split"


class DataConfig(_Strict):
    """Which federated dataset to build and how to split it.

    Synthetic benchmarks use the size fields; real loaders read ``path`` (a local directory, file or glob; in a
    config file, relative to the file's folder, :func:`resolve_file_paths`) or
    ``hub_id`` (a Hugging Face dataset id, read from the local cache when offline).

    The generic datasets ``files`` and ``hub`` (a user's own data, docs/real-data.md) also read ``task``,
    ``columns``, ``label_names``, ``num_clients``, ``test_fraction``, ``unseen_fraction`` (or ``unseen_clients``,
    the ids of the unseen pool), for ``files`` ``encoding`` (of its text files; ``utf-8`` reads them with or
    without a byte order mark), and for ``hub`` ``subset`` and ``revision``; every other dataset ignores these
    keys.

    ``sites``: the data lives on the sites of a deployment, never on the server (docs/flower.md, "Each site's own
    data"): each of ``sites`` SuperNodes reads its clients' data from the directory in its node config's
    ``data-path`` (as ``path``, or ``hub_id`` for ``hub``), and the server learns the clients' ids and sizes from
    them when the run starts.
    """

    name: str = "synthetic-xnli"
    path: str | None = None
    hub_id: str | None = None
    seed: int = 0
    groups: list[str] | None = None
    clients_per_group: int = Field(default=20, ge=1)
    train_per_group: int = Field(default=2000, ge=1)
    test_per_group: int = Field(default=500, ge=1)
    partition: Literal["dirichlet", "iid", "natural"] = "dirichlet"
    dirichlet_alpha: float = Field(default=0.5, gt=0)
    unseen_pool: bool = True
    base_samples: int | None = Field(default=None, ge=0)
    options: dict[str, Any] = Field(default_factory=dict)
    task: Literal["classification", "generation"] | None = None
    columns: DataColumns = Field(default_factory=DataColumns)
    label_names: list[str] | None = None
    num_clients: int | None = Field(default=None, ge=1)
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    unseen_fraction: float = Field(default=0.0, ge=0, lt=1)
    subset: str | None = None
    revision: str | None = None
    unseen_clients: list[str] | None = None
    sites: int | None = Field(default=None, ge=1)
    encoding: str = "utf-8"

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, encoding: str) -> str:
        try:
            codec_of(encoding, "data.encoding")
        except UserError as err:
            raise _problems_error([str(err)]) from None
        return encoding


class ModelConfig(_Strict):
    """Which base model to load: a registry name (``tiny-bert``), a hub id or a local path, and how to run it.

    LLM-scale settings (docs/models.md, "Training at LLM scale"): ``dtype`` of the base weights (adapters stay in
    float32; forward passes run under autocast in that dtype), ``gradient_checkpointing`` (recompute each layer's
    activations in the backward pass), ``quantization`` of the base weights through bitsandbytes (``4bit``: NF4
    with double quantization, the QLoRA recipe; ``8bit``: LLM.int8; CUDA only), and ``chat_template``: format
    generation prompts (and training responses) with the tokenizer's chat template, for instruct models.
    """

    name: str = "tiny-bert"
    revision: str | None = None
    max_length: int = Field(default=64, ge=1)
    overrides: dict[str, Any] = Field(default_factory=dict)
    vocab_size: int = Field(default=2000, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gradient_checkpointing: bool = False
    quantization: Literal["4bit", "8bit"] | None = None
    chat_template: bool = False


class BaseStageConfig(_Strict):
    """How the model that personalization starts from is obtained.

    ``kind``: ``pretrained`` (use the loaded weights as they are), ``centralized`` (train on the benchmark's
    base corpus, standing in for pretraining: trained once from ``seed`` and shared by every run seed; with
    ``per_seed``, once per run seed s, from ``seed + s``, so that the spread over seeds includes the base stage's
    draw, docs/results/machines.md) or
    ``federated`` (run ``method`` on the seen pool and keep its
    global model; e.g. ``fedavg_full`` is the papers' "Standard FL" base model).

    ``router_aux_loss``: in a centralized base stage of a mixture-of-experts model, the coefficient of the router
    load-balancing loss added to the language-model loss, as in MoE pretraining (``0``, the default: none;
    ``None``: the model config's own ``router_aux_loss_coef``, 0.01 for OLMoE). Dense models ignore it.

    Federated base methods: ``fedavg_full``, ``fedit_merged`` (LoRA merged into the weights), and ``feddpa`` and
    ``dept_spec``, which give every client a base model of its own (docs/base-models.md).
    """

    kind: Literal["pretrained", "centralized", "federated"] = "pretrained"
    seed: int = 0
    per_seed: bool = False
    epochs: float = Field(default=1.0, gt=0)
    lr: float = Field(default=1e-3, gt=0)
    batch_size: int = Field(default=32, ge=1)
    router_aux_loss: float | None = Field(default=0.0, ge=0.0)
    method: SerializeAsAny[MethodConfig] = Field(default_factory=lambda: method_config({"name": "fedavg_full"}))

    @field_validator("method", mode="before")
    @classmethod
    def _typed_method(cls, entry: object) -> MethodConfig:
        return _method_configs([("base.method", entry)])[0]

    @model_validator(mode="after")
    def _per_seed_trains(self) -> BaseStageConfig:
        if self.per_seed and self.kind != "centralized":
            raise ValueError(
                "`per_seed` trains a centralized base stage once per run seed; a federated one runs per seed "
                "already and a pretrained one trains nothing: drop it or use kind centralized"
            )
        return self

    @property
    def shared(self) -> bool:
        """Whether one base model serves every run seed: a centralized base stage trained once."""
        return self.kind == "centralized" and not self.per_seed


class SecAggConfig(_Strict):
    """Secure aggregation with Flower's SecAgg+ (docs/privacy.md): the server learns only the sum of a round's
    updates. ``num_shares``: the neighbours each node shares its secret keys with (an int above 2, or a fraction
    of the round's nodes); ``reconstruction_threshold``: shares needed to rebuild a key (an int, or a fraction of
    ``num_shares``), so a round survives up to ``num_shares - reconstruction_threshold`` nodes dropping out after
    the key exchange; ``clipping_range``, ``quantization_range``, ``modulus_range``: the quantization (every
    uploaded value is clipped to +-clipping_range); ``timeout``: seconds to wait for the replies of each stage."""

    num_shares: int | float = 1.0
    reconstruction_threshold: int | float = 0.5
    clipping_range: float = Field(default=8.0, gt=0)
    quantization_range: int = Field(default=2**22, gt=0)
    modulus_range: int = Field(default=2**32, gt=0)
    timeout: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_protocol(self) -> SecAggConfig:
        if isinstance(self.num_shares, int) and self.num_shares <= 2:
            raise ValueError("`num_shares` as an integer must be above 2 (or a fraction of the nodes, e.g. 1.0)")
        if isinstance(self.num_shares, float) and self.num_shares <= 0:
            raise ValueError("`num_shares` as a fraction must be above 0")
        threshold = self.reconstruction_threshold
        if isinstance(threshold, float) and not 0 < threshold <= 1:
            raise ValueError("`reconstruction_threshold` as a fraction must be in (0, 1]")
        if isinstance(threshold, int) and isinstance(self.num_shares, int) and threshold >= self.num_shares:
            raise ValueError("`reconstruction_threshold` must be below `num_shares`")
        if self.modulus_range <= self.quantization_range or self.modulus_range & (self.modulus_range - 1):
            raise ValueError("`modulus_range` must be a power of 2 above `quantization_range`")
        return self


class EngineConfig(_Strict):
    """Where clients run: ``local`` (in-process) or ``flower`` (Flower simulation engine); ``secagg``: secure
    aggregation of every federated round (Flower engine only).

    ``concurrent_methods``: on the Flower engine, how many methods of a seed run at once (their rounds
    interleave; every number stays what it is when they run one after the other). ``None``: every method of a
    seed in a deployment (``flwr run``, ``fedpeft launch``), where a node otherwise idles in Flower's poll
    between one message and the next, and one at a time in simulation; always one with ``secagg``. The local
    engine with 2 or more worker processes runs that many methods at once too (``None``: 2), beside the base
    model's evaluations, of every seed that shares one base model (a pretrained one, or a centralized base stage
    trained once), for processes that one method's rounds leave idle (a round of fewer clients than processes, its
    server step); each keeps its server state in the run's process. With one process it runs one unit at a time.

    ``workers``: on the local engine, how many worker processes run the clients of a round (and of
    personalization and evaluation) side by side; 1 runs every client in this process. ``auto`` (the default): one
    per ``threads`` CPU cores this process may use (one per core where ``threads`` is not set), or, where the run's
    device is ``cuda`` (or ``auto`` on a machine with GPUs), ``workers_per_gpu`` per visible GPU; never more than
    the run has clients, nor more than fit in the free memory (the run's first line says what it chose:
    :class:`fedpeft.engine.resources.EngineSettings`). Each worker process runs ``threads`` torch threads, else
    the cores shared out among the processes; a run's records are the same for any number of processes with the
    same threads per process. With 2 or more processes, per-client state lives on disk whatever ``state`` says.
    On GPUs each worker process is pinned to one visible GPU, round-robin; ``workers_per_gpu`` is how many may
    share one (``workers`` above the GPUs times ``workers_per_gpu`` is refused).

    ``batch_clients``: on the local engine, how many clients of a batchable method (``fedit``, ``local``, ``lora``)
    train their LoRA together in one forward/backward, each example through its own client's adapter.

    ``ray_address``: on the Flower simulation engine, the Ray cluster to run the clients on (``auto``: the cluster
    this machine belongs to, as ``ray start`` left it; or ``HOST:PORT`` of its head node) instead of a Ray instance
    started in this process with this machine's cores and at most one GPU. ``client_cpus`` and ``client_gpus``: the
    Ray resources one client's work takes (``client_gpus`` ``None``: none on a CPU run; on a ``cuda`` run, a share
    of this machine's GPU without a cluster and ``1 / workers_per_gpu`` of a GPU on a cluster), so a cluster runs
    as many clients at once as its nodes' resources hold.
    """

    name: Literal["local", "flower"] = "local"
    state: Literal["memory", "disk"] = "memory"
    num_supernodes: int = 2
    secagg: SecAggConfig | None = None
    concurrent_methods: int | None = Field(default=None, ge=1)
    workers: int | Literal["auto"] = "auto"
    workers_per_gpu: int = Field(default=1, ge=1)
    batch_clients: int = Field(default=1, ge=1)
    ray_address: str | None = None
    client_cpus: float = Field(default=1.0, gt=0)
    client_gpus: float | None = Field(default=None, ge=0)

    @field_validator("workers", mode="before")
    @classmethod
    def _check_workers(cls, value: object) -> object:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"got {value!r}; give a number of worker processes, 1 or more, or `auto` (one per CPU core)")


class EvalConfig(_Strict):
    """Evaluation settings.

    ``every``: also evaluate every client's current model every N rounds of a federated phase (and after its
    last round): ``split: test`` on the client's own test data seen so far, ``split: others`` on the other
    clients' test data (``others_per_client`` examples of each); the records carry the round. ``None``: only
    the final evaluation.

    ``others_clients``: how many other clients' samples each client's model is scored on as Others, a fixed draw
    per evaluated client; with every other client the evaluation costs time quadratic in the clients (each
    model on every other client's sample), with this cap linear. A federation of at most ``others_clients + 1``
    clients scores every other client, as does ``None``.

    ``max_batches``: score each evaluation on its first ``max_batches`` batches only (``None``: every example); a
    rehearsal (docs/rehearsal.md) sets it, a result never should.
    """

    batch_size: int = Field(default=64, ge=1)
    max_new_tokens: int = Field(default=32, ge=1)
    every: int | None = Field(default=None, ge=1)
    others_per_client: int = Field(default=16, ge=1)
    others_clients: int | None = Field(default=32, ge=1)
    max_batches: int | None = Field(default=None, ge=1)


class ValidationConfig(_Strict):
    """The server's checks of client updates (docs/privacy.md): keys, shapes, finite values and example counts are
    always checked; ``max_norm`` also bounds an update's norm (its distance from what the server sent; ``None``:
    no bound). A round with fewer than ``min_updates`` valid updates keeps the previous server state. A run whose
    final results cover fewer than ``min_result_fraction`` of the clients (with test data) for a method, seed and
    budget ends with exit code 1 once its outputs are written (1.0: every client must have results)."""

    max_norm: float | None = Field(default=None, gt=0)
    min_updates: int = Field(default=1, ge=1)
    min_result_fraction: float = Field(default=1.0, ge=0, le=1)


class LogConfig(_Strict):
    """Live metrics for TensorBoard (``tensorboard``: a directory, relative to the run directory unless
    absolute) and Weights & Biases (``wandb``: a project name); needs ``pip install 'fedpeft[log]'``."""

    tensorboard: str | None = None
    wandb: str | None = None


class TrainConfig(_Strict):
    """Local training settings that apply to every method.

    ``grad_accum_steps``: each optimizer step accumulates the gradients of this many micro-batches of the
    method's ``batch_size``, weighted so that the step equals one step on a batch ``grad_accum_steps`` times as
    large (the same examples, the same loss); epochs count these larger steps.

    ``max_steps``: cut every training call (a client's local work, a base stage, a fine-tuning) to at most this
    many optimizer steps, whatever its epochs or steps say (``None``: no cap); a rehearsal (docs/rehearsal.md)
    sets it, a result never should.

    ``max_statistics_batches``: compute every client's feature statistics (FedL2P's, FedP2EFT's inputs) from its
    first this many batches only (``None``: every training example); a rehearsal sets it, a result never should.
    """

    grad_accum_steps: int = Field(default=1, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    max_statistics_batches: int | None = Field(default=None, ge=1)


class OutputConfig(_Strict):
    """What a run writes besides its records: adapters, and plots in each of ``plot_formats``."""

    save_adapters: bool = True
    plots: bool = True
    plot_formats: list[Literal["png", "pdf", "svg"]] = Field(default=["png"], min_length=1)  # copied per config

    @field_validator("plot_formats")
    @classmethod
    def _distinct_formats(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


class ModelAssignmentConfig(_Strict):
    """Which architecture of ``models`` each client gets, in a heterogeneous federation.

    Rules, first match wins: ``clients`` (client id -> architecture), ``groups`` (client group -> architecture),
    ``counts`` (architecture -> number of clients, given out in mapping order to the clients in sorted id order,
    e.g. ``{small: 4, large: 6}``), then ``default``.
    """

    clients: dict[str, str] = Field(default_factory=dict)
    groups: dict[str, str] = Field(default_factory=dict)
    counts: dict[str, int] = Field(default_factory=dict)
    default: str | None = None


SPEED_DRAW_BOUND = 10.0
"""The standard deviations of the largest lognormal speed draw :class:`SpeedConfig` allows for (odds below 1e-22)."""
SPEED_LOG_LIMIT = 300.0
"""The largest log of a speed factor (either way) a config may reach: far from a float's 709, so that durations
times work, summed over a run, stay finite."""


class SpeedConfig(_Strict):
    """How fast each client trains, relative to 1 (``clients.speed``): a client's work takes its duration times
    its factor on the virtual clock of an asynchronous schedule.

    Attributes:
        distribution: ``none`` (every client 1), or ``lognormal`` (factor exp(sigma z), z standard normal, drawn
            once per client from the seed).
        sigma: the lognormal's sigma.
        groups: a fixed factor per client group, multiplying the distribution's.
        round_robin: fixed factors by the number at the end of the client's id, ``round_robin[i % len]`` (the way
            FLAME's tiers take clients: ``[1, 2, 4, 8]`` makes the tier of a quarter of the compute 4x slower),
            multiplying the others.
    """

    distribution: Literal["none", "lognormal"] = "none"
    sigma: float = Field(default=1.0, ge=0)
    groups: dict[str, float] = Field(default_factory=dict)
    round_robin: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _positive(self) -> SpeedConfig:
        fixed = {f"groups.{group}": factor for group, factor in self.groups.items()}
        fixed.update({f"round_robin[{i}]": factor for i, factor in enumerate(self.round_robin)})
        factors = [f"{key}={factor}" for key, factor in fixed.items() if not 0 < factor < math.inf]
        if factors:
            raise ValueError(f"speed factors must be above 0 and finite ({', '.join(factors)})")
        # The largest and smallest factor a client may get (a lognormal draw within SPEED_DRAW_BOUND standard
        # deviations): a duration beyond a float's range would overflow, or round to no time at all.
        spread = self.sigma * SPEED_DRAW_BOUND if self.distribution == "lognormal" else 0.0
        largest = spread + math.log(max(self.groups.values(), default=1.0)) + math.log(max(self.round_robin or [1.0]))
        smallest = -spread + math.log(min(self.groups.values(), default=1.0)) + math.log(min(self.round_robin or [1.0]))
        if not math.isfinite(self.sigma) or max(largest, -smallest) > SPEED_LOG_LIMIT:
            raise ValueError(
                f"the speed factors it gives reach e^{max(largest, -smallest):.0f} (sigma={self.sigma}), beyond what "
                f"a virtual clock can count; keep sigma times {SPEED_DRAW_BOUND:g}, plus the log of the largest fixed "
                f"factor, within {SPEED_LOG_LIMIT:g} (a sigma of 1 to 2 spreads speeds widely already)"
            )
        return self

    @property
    def varies(self) -> bool:
        """Whether any client's factor may differ from 1."""
        return self.distribution != "none" or bool(self.groups) or bool(self.round_robin)


class ClientsConfig(_Strict):
    """The clients as devices (``clients``): their speed."""

    speed: SpeedConfig = Field(default_factory=SpeedConfig)


class RehearseConfig(_Strict):
    """A rehearsal of the run on this machine (``fedpeft run CONFIG --rehearse``, docs/rehearsal.md): every phase
    at its true shape (clients, pools, widths, adapters) with its compute cut, on stand-in data and a random-weight
    model; its numbers are never results.

    Attributes:
        layers: the depth the models are cut to (``None``: their true depth).
        rounds: the most rounds of every federated phase (and of any other count of rounds a method has).
        steps: the most optimizer steps of every training call (``train.max_steps``).
        eval_batches: the most batches of every evaluation (``eval.max_batches``) and of every client's feature
            statistics (``train.max_statistics_batches``).
        batch_size: the most examples of every batch of the run, training and evaluation (``None``: the
            config's); the per-depth step measurements use the config's own batch.
        new_tokens: the most tokens generated per answer (``eval.max_new_tokens``).
        max_length: the most tokens of every example in the run (each model's ``max_length``; ``None``: the
            config's): a client's work grows with its tokens, its shapes do not; the per-depth step measurements
            use the config's own length.
        seeds: how many of the config's seeds to run (seeds share their shapes).
        device: where the rehearsal runs.
        measure_steps: time one training step per depth after the run (the per-layer cost); off, the run only.
        check_full_depth: also time one training step of each model at its true depth, to check the step the
            per-layer measurements extrapolate to (needs the whole model's memory).
        models: set by the rehearsal: each stand-in checkpoint and the model it stands in for.
        data: set by the rehearsal: what stands in for the dataset (``None``: the real data was read).
    """

    layers: int | None = Field(default=2, ge=1)
    rounds: int = Field(default=2, ge=1)
    steps: int = Field(default=1, ge=1)
    eval_batches: int = Field(default=1, ge=1)
    batch_size: int | None = Field(default=4, ge=1)
    new_tokens: int = Field(default=4, ge=1)
    max_length: int | None = Field(default=32, ge=1)
    seeds: int = Field(default=1, ge=1)
    device: str = "cpu"
    measure_steps: bool = True
    check_full_depth: bool = False
    models: dict[str, str] = Field(default_factory=dict)
    data: str | None = None


class ExperimentConfig(_Strict):
    """A whole experiment: data, model, base stage, the methods to compare and their budgets.

    ``models`` (architecture name -> model) with ``assign`` makes the federation heterogeneous: each client runs
    the base model of its architecture; ``model`` is then not used.

    ``plugins`` names modules imported before anything else is read (their ``register`` calls add methods,
    datasets or models; installed packages can publish them through entry points instead, docs/contributing.md).
    ``device``: where the models run: ``cpu`` (the default), ``cuda``, ``cuda:N`` (the N-th GPU), ``mps`` (Apple
    GPUs) or ``auto`` (cuda if available, else mps, else cpu). ``train`` holds local training settings that apply
    to every method (gradient accumulation). ``validation`` sets the server's checks of client updates;
    ``faults`` injects faults into clients' work (:mod:`fedpeft.core.faults`), on either engine, to test a
    method's robustness. ``clients`` describes the clients as devices (their speed on an asynchronous schedule's
    virtual clock, docs/async.md). ``rehearse``: the run is a rehearsal (stand-in data, random weights, compute cut;
    docs/rehearsal.md), whose numbers are never results.
    """

    name: str = "experiment"
    plugins: list[str] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0])
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    base: BaseStageConfig = Field(default_factory=BaseStageConfig)
    budgets: list[int] = Field(default_factory=lambda: [2, 8])
    methods: list[SerializeAsAny[MethodConfig]] = Field(default_factory=lambda: [method_config({"name": "lora"})])
    engine: EngineConfig = Field(default_factory=EngineConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    device: str = "cpu"
    threads: int | None = None
    train: TrainConfig = Field(default_factory=TrainConfig)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    assign: ModelAssignmentConfig = Field(default_factory=ModelAssignmentConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    faults: list[FaultConfig] = Field(default_factory=list)
    log: LogConfig = Field(default_factory=LogConfig)
    clients: ClientsConfig = Field(default_factory=ClientsConfig)
    rehearse: RehearseConfig | None = None

    @field_validator("methods", mode="before")
    @classmethod
    def _typed_methods(cls, entries: object) -> list[MethodConfig]:
        if not isinstance(entries, list) or not entries:
            raise _problems_error(["`methods` must list at least one method; e.g. `methods: [{name: lora}]`."])
        return _method_configs([(f"methods.{i}", entry) for i, entry in enumerate(entries)])

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if not re.fullmatch(r"cpu|mps|auto|cuda(:\d+)?", device):
            raise _problems_error([f"`device` must be cpu, cuda, cuda:N, mps or auto, not {device!r}."])
        return device

    @field_validator("seeds")
    @classmethod
    def _some_seeds(cls, seeds: list[int]) -> list[int]:
        if not seeds:
            raise _problems_error(["`seeds` must list at least one seed; e.g. `seeds: [0]`."])
        return seeds

    @field_validator("budgets")
    @classmethod
    def _positive_budgets(cls, budgets: list[int]) -> list[int]:
        bad = [b for b in budgets if b <= 0]
        if bad:
            raise _problems_error([f"`budgets` must be positive ranks; {bad} are not."])
        return budgets

    @model_validator(mode="after")
    def _check_fault_methods(self) -> ExperimentConfig:
        labels = [entry.label or entry.name for entry in self.methods]
        if self.base.kind == "federated":
            check_fault_methods(self.faults, [*labels, BASE_STAGE_LABEL])
        else:
            why = f"the rounds of a federated base stage, and base.kind is {self.base.kind}"
            check_fault_methods(self.faults, labels, {BASE_STAGE_LABEL: why})
        return self

    @model_validator(mode="after")
    def _check_architectures(self) -> ExperimentConfig:
        if not self.models:
            if self.assign != ModelAssignmentConfig():
                raise ValueError("`assign` needs `models` (architecture name -> model) to assign clients to")
            return self
        if self.model != ModelConfig():
            raise ValueError("set either `model` (one base model) or `models` (one per architecture), not both")
        if self.base.kind == "federated":
            raise ValueError("a heterogeneous federation (`models`) needs base.kind pretrained or centralized")
        named = [*self.assign.clients.values(), *self.assign.groups.values(), *self.assign.counts]
        named += [self.assign.default] if self.assign.default is not None else []
        unknown = sorted({name for name in named if name not in self.models})
        if unknown:
            raise ValueError(f"`assign` names architectures {unknown} that `models` does not define")
        return self


def _unknown_preset(name: str, alternative: str = "") -> str:
    """The sentence refusing an unknown preset ``name``: the closest preset if one is close, else all of them."""
    names = preset_names()
    close = _close_to(name, names)
    if close:
        return f"Unknown preset {name!r}; did you mean {close[0]!r} (`fedpeft list presets` lists every preset)?"
    tail = f", {alternative}" if alternative else ""
    return f"Unknown preset {name!r}; choose one of: {', '.join(names)}{tail}."


def preset_names() -> list[str]:
    """Names of the packaged presets."""
    root = resources.files("fedpeft") / "presets"
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def preset_description(name: str) -> str:
    """A packaged preset's one-line description: the first line of the file, a comment ('' if it is not one)."""
    if name not in preset_names():
        raise UserError(_unknown_preset(name))
    first = (resources.files("fedpeft") / "presets" / f"{name}.yaml").read_text().split("\n", 1)[0]
    return first[1:].strip() if first.startswith("#") else ""


# The end of the sentence refusing a config file that is not UTF-8 (see fedpeft.core.textfiles.decode_text).
CONFIG_ENCODING_FIX = "a config file must be UTF-8 (a UTF-8 byte order mark is accepted), so save it as UTF-8"


def _read_yaml(text: str, source: str) -> JSONObject:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{source} is not valid YAML{where}; fix its syntax.") from None
    if raw is None:  # no document: an empty file, or only comments
        raise UserError(
            f"{source} is empty (it holds no settings, at most comments); a config names at least the methods to "
            "compare, e.g. `methods: [{name: lora}]`, or give a preset such as `smoke` instead."
        )
    if not isinstance(raw, dict):
        raise UserError(f"{source} must hold a mapping of config keys, not a {type(raw).__name__}.")
    return raw


_YAML_OPENERS = ("[", "{", '"', "'")
"""How a value opens that is YAML and nothing else: a flow list or mapping, or a quoted string."""


def parse_value(text: str, assignment: str | None = None) -> JSONValue:
    """Parse the right-hand side of ``--set key=value`` as YAML (numbers, lists, booleans, strings).

    Text YAML cannot read stays a string (``data.path=*.csv``), unless it opens as only YAML does (``[``, ``{``
    or a quote): then it is a YAML syntax error, a :class:`UserError` naming ``assignment`` (the whole ``--set``
    item) and, where closing its brackets and quotes makes it YAML, the item so closed.
    """
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        if not text.strip().startswith(_YAML_OPENERS):
            return text
        item = assignment if assignment is not None else text
        problem = getattr(err, "problem", None) or "it cannot be parsed"
        closed = _closed(text)
        if closed is None:
            fix = "check its brackets and quotes."
        else:
            fix = f"did you mean `--set {_shell_word(item[: len(item) - len(text)] + closed)}`?"
        raise UserError(f"`--set {item}` is a YAML syntax error ({problem}); {fix}") from None


def _closed(text: str) -> str | None:
    """``text`` with its open brackets (or its open quote) closed, if that makes it YAML (else ``None``)."""
    closers = {"[": "]", "{": "}"}
    expected: list[str] = []
    quote: str | None = None
    for char in text:
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in closers:
            expected.append(closers[char])
        elif expected and char == expected[-1]:
            expected.pop()
    if quote is not None and expected:  # where the quote ends is anyone's guess
        return None
    closed = text + (quote or "") + "".join(reversed(expected))
    if closed == text:
        return None
    try:
        yaml.safe_load(closed)
    except yaml.YAMLError:
        return None
    return closed


def apply_override(raw: JSONObject, assignment: str) -> None:
    """Apply one ``dotted.key=value`` override in place; list items are addressed by index."""
    if "=" not in assignment:
        raise UserError(f"Override {assignment!r} must look like key=value, e.g. data.seed=3.")
    key, value = assignment.split("=", 1)
    parsed = parse_value(value, assignment)
    parts = key.strip().split(".")
    node: JSONValue = raw
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise UserError(f"Override {key!r}: {part!r} is not an index of a list of {len(node)} items.")
            if last:
                node[int(part)] = parsed
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = parsed
            else:
                node = node.setdefault(part, {})
        else:
            raise UserError(f"Override {key!r}: {'.'.join(parts[:i])!r} is not a mapping or a list.")


def load_raw(source: str, *, resolve_paths: bool = True) -> dict[str, Any]:
    """The raw mapping of a preset name or a YAML file path.

    Args:
        resolve_paths: make the relative paths of a YAML file absolute from the file's folder
            (:func:`resolve_file_paths`), so that the file names the same data from any working directory. A run's
            own ``config.yaml`` holds them absolute already (an earlier version's holds them as typed, from the
            working directory of its run: read it with ``False``). Presets hold no paths of the user.
    """
    path = Path(source)
    # A preset name wins over a directory of that name (a run's output directory, say, under the working directory).
    if source.endswith((".yaml", ".yml")) or path.is_file() or (path.exists() and source not in preset_names()):
        if not path.is_file():
            raise UserError(f"Config file {source} does not exist; give a preset name or an existing YAML path.")
        raw = _read_yaml(read_text(path, "utf-8", CONFIG_ENCODING_FIX), str(path))
        if resolve_paths:
            resolve_file_paths(raw, path.parent.resolve())
        return raw
    if source not in preset_names():
        raise UserError(_unknown_preset(source, "or a YAML path"))
    text = (resources.files("fedpeft") / "presets" / f"{source}.yaml").read_text()
    return _read_yaml(text, f"preset {source}")


def resolve_file_paths(raw: JSONObject, folder: Path) -> None:
    """Make the relative paths of a config file's mapping ``raw`` absolute from the file's ``folder``, in place.

    ``data.path`` always (a file, directory or glob; one that starts with ``~`` is the user's home's); ``data.hub_id``
    and the ``name`` of ``model`` and of each of ``models`` only where ``folder`` holds what they name: else they
    stay a hub id or a registered model name. ``log.tensorboard`` stays as given: it is relative to the run
    directory. Values of ``--set`` are applied after, as typed, so they resolve from the working directory.
    """
    from fedpeft.core.registry import MODELS

    def absolute(value: JSONValue, *, if_exists: bool) -> JSONValue:
        if not isinstance(value, str) or not value or value.startswith("~") or Path(value).is_absolute():
            return value
        joined = folder / value
        return os.path.normpath(joined) if not if_exists or joined.exists() else value

    data = raw.get("data")
    if isinstance(data, dict):
        if "path" in data:
            data["path"] = absolute(data["path"], if_exists=False)
        if "hub_id" in data:
            data["hub_id"] = absolute(data["hub_id"], if_exists=True)
    models = raw.get("models")
    named = [raw.get("model"), *(models.values() if isinstance(models, dict) else [])]
    for model in named:
        if isinstance(model, dict) and isinstance(model.get("name"), str) and model["name"] not in MODELS:
            model["name"] = absolute(model["name"], if_exists=True)


def validate(raw: JSONMapping) -> ExperimentConfig:
    """Validate a raw mapping into an :class:`ExperimentConfig`; the config's ``plugins`` are imported first, so that
    the methods, datasets and models they register are known.

    Raises:
        InvalidConfigError: every problem of the config at once (each section's and each method entry's), one sentence
            each naming its key path, with a "did you mean" for a misspelt key. Unknown method and dataset names
            are reported alone, before any method's module (and torch) is imported.
    """
    plugins = raw.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise UserError("`plugins` must list module names, e.g. `plugins: [my_methods]`.")
    from fedpeft.core.registry import import_plugins

    import_plugins(cast(list[str], plugins))
    _check_names(raw)
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise InvalidConfigError(_problems_of(err, ExperimentConfig, "", "the config", _config_problem)) from None


def _config_problem(path: str, what: str) -> str:
    return _sentence(f"Invalid config at {path}: {what}" if path else f"Invalid config: {what}")


def _check_names(raw: JSONMapping) -> None:
    """Refuse unknown method and dataset names from the catalogues, before validating the entries imports the
    methods' modules (and torch with them): misspelt names are reported at once, all of them."""
    from fedpeft.core.registry import DATASETS, METHODS

    base = raw.get("base")
    methods = raw.get("methods")
    entries = list(enumerate(methods)) if isinstance(methods, list) else []
    named: list[tuple[Registry[Any], str, JSONValue | None]] = [
        (METHODS, f"methods.{i}.name", entry) for i, entry in entries
    ]
    if isinstance(base, dict):
        named.append((METHODS, "base.method.name", base.get("method")))
    named.append((DATASETS, "data.name", raw.get("data")))
    problems = [
        _unknown_name(registry, str(entry["name"]), where)
        for registry, where, entry in named
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"] not in registry
    ]
    if problems:
        raise InvalidConfigError(problems)


def _unknown_name(registry: Registry[Any], name: str, where: str) -> str:
    known = registry.names()
    close = _close_to(name, known)
    tail = f"; did you mean {close[0]!r} at {where}?" if close else f" (at {where})."
    return f"Unknown {registry.kind} {name!r}; choose one of: {', '.join(known)}{tail}"


def load_config(source: str, overrides: list[str] | None = None, *, resolve_paths: bool = True) -> ExperimentConfig:
    """Load a preset or YAML file (its relative paths resolved from its folder unless ``resolve_paths`` is False,
    :func:`load_raw`), apply ``key=value`` overrides and validate."""
    raw = load_raw(source, resolve_paths=resolve_paths)
    for assignment in overrides or []:
        apply_override(raw, assignment)
    return validate(raw)


def dump_config(cfg: ExperimentConfig) -> str:
    """The fully resolved configuration as YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def dump_given(cfg: ExperimentConfig) -> str:
    """The configuration as given (keys left at their defaults omitted), as YAML.

    Datasets read "not given" as "use the benchmark's own default" (a MasakhaNEWS-style benchmark has its own
    client count, Fed-Aya its natural partition). A config rebuilt from this text in another process has the same
    given keys, so it builds the same data; one rebuilt from :func:`dump_config` would mark every key as given.
    """
    return yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True), sort_keys=False)


EXECUTION_KEYS: dict[str, tuple[str, ...]] = {
    "engine": ("workers", "workers_per_gpu", "concurrent_methods", "state", "ray_address", "client_cpus", "client_gpus")
}
"""Keys, by section, that decide where a run's work happens and never its numbers: a run may resume with others."""


def same_run(config_text: str, other_text: str) -> bool:
    """Whether two resolved configs (:func:`dump_config`) describe the same run: equal but for
    :data:`EXECUTION_KEYS` (e.g. a run started on two worker processes may resume on one). Both are read through
    today's schema first, so a run written before a key existed compares with that key at its default."""
    if config_text == other_text:
        return True

    def numbers(text: str) -> JSONValue:
        config = yaml.safe_load(text)
        if not isinstance(config, dict):
            return config
        try:
            config = validate(config).model_dump(mode="json")
        except UserError:
            pass  # not a config today's schema reads: compared as written
        for section, keys in EXECUTION_KEYS.items():
            if isinstance(config.get(section), dict):
                config[section] = {k: v for k, v in config[section].items() if k not in keys}
        return config

    try:
        return bool(numbers(config_text) == numbers(other_text))
    except yaml.YAMLError:
        return False


GIVEN_CONFIG_FILE = "config.given.yaml"
"""Beside a run's ``config.yaml``: its configuration as given (:func:`dump_given`), from which the run's data and
model are rebuilt in a later process (``fedpeft personalize``)."""


def load_run_config(run_dir: Path) -> ExperimentConfig:
    """The configuration of the run in ``run_dir``, with the keys it was given marked as given.

    Reads ``config.given.yaml`` (written by runs since it exists) so that datasets with defaults of their own
    rebuild the run's data; older runs have only the resolved ``config.yaml``.
    """
    given = Path(run_dir) / GIVEN_CONFIG_FILE
    # Its paths are absolute, or (written by an earlier version) relative to the working directory of its run.
    return load_config(str(given if given.is_file() else Path(run_dir) / "config.yaml"), resolve_paths=False)
