"""Several clients' LoRA trainings on one base model in one forward/backward (``engine.batch_clients``).

Multi-LoRA serving systems (Punica, S-LoRA) batch the requests of many adapters over one base model; here the same
is done for training. The clients' batches are joined into one (padded on the right to a common length, under the
attention mask), the frozen base model computes once with its PEFT adapters disabled, and forward hooks add to the
output of every LoRA-wrapped layer each example's own client's LoRA term (batched matmuls over the clients' stacked
factors) and replace the task head's output by each client's own head copy. Each client's task loss is the mean over
its own examples (or predicted tokens), and :func:`fedpeft.training.train_clients_loop` steps each client's own
AdamW with its own gradient clipping, so a client's adapter ends as training it alone
(:meth:`fedpeft.models.runtime.ModelRuntime.train`) leaves it, within float rounding.

That holds where a forward pass draws nothing at random (no dropout in the model or the LoRA) and examples do not
interact (no batch statistics, no sparse-expert capacity): :func:`batching_refusal` says where it does not.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own name for it)
from peft.tuners.lora import LoraLayer

from fedpeft.core.errors import UserError
from fedpeft.core.types import Metrics, StateDict
from fedpeft.data.types import Example
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.training import Batch, TrainArgs, logits_cut, train_clients_loop

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ForwardHook = Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]
"""A forward hook that replaces a module's output: ``(module, args, output) -> output``."""


@dataclass
class LoraTraining:
    """One client's training of one LoRA adapter: what a batchable method's client does
    (:attr:`fedpeft.methods.base.Method.batchable_clients`), alone or together with other clients'.

    Attributes:
        model: installed before training (fresh LoRA weights from ``args.seed`` where it gives no adapter); only
            its ``lora`` and ``adapter`` may be set.
        examples: the training examples.
        args: how it trains (:meth:`ModelRuntime.train`'s); its seed also draws the fresh LoRA weights.
    """

    model: ClientModel
    examples: list[Example]
    args: TrainArgs

    @property
    def seed(self) -> int:
        """The seed of the fresh LoRA weights and of the minibatch order."""
        return self.args.seed


def train_alone(runtime: ModelRuntime, job: LoraTraining) -> tuple[StateDict, Metrics]:
    """Run ``job`` on its own: install its model, train its adapter; returns the trained adapter's tensors
    (:meth:`ModelRuntime.adapter_state`) and the training metrics."""
    runtime.install(job.model, seed=job.seed)
    metrics = runtime.train(job.examples, job.args)
    return runtime.adapter_state(), metrics


def train_together(runtime: ModelRuntime, jobs: Sequence[LoraTraining]) -> list[tuple[StateDict, Metrics]]:
    """Run ``jobs`` together, one forward/backward per step for the jobs of each adapter shape; returns each job's
    trained adapter and metrics, as :func:`train_alone` gives them within float rounding.

    Raises:
        UserError: the model or an adapter cannot be routed per client (:func:`batching_refusal`).
        ValueError: a job has no examples or hooks (:attr:`TrainArgs.hooked`), or its model sets more than a LoRA
            adapter.
    """
    problem = batching_refusal(runtime)
    if problem is not None:
        raise UserError(problem)
    results: dict[int, tuple[StateDict, Metrics]] = {}
    shapes: dict[LoraSpec, list[int]] = {}
    for index, job in enumerate(jobs):
        model = job.model
        if model.lora is None or model.base is not None or model.routing is not None or model.extension is not None:
            raise ValueError("a client trained together with others installs a LoRA adapter and nothing else")
        if job.args.hooked:
            raise ValueError("a client trained together with others runs the plain loop, without hooks")
        if not job.examples:
            raise ValueError("no training examples")
        shapes.setdefault(model.lora, []).append(index)
    for spec, indices in shapes.items():
        trained = _train_shape(runtime, spec, [jobs[i] for i in indices])
        results.update(zip(indices, trained, strict=True))
    return [results[index] for index in range(len(jobs))]


def _train_shape(runtime: ModelRuntime, spec: LoraSpec, jobs: list[LoraTraining]) -> list[tuple[StateDict, Metrics]]:
    starts = []
    for job in jobs:  # each client's starting weights, installed exactly as training it alone installs them
        runtime.install(job.model, seed=job.seed)
        starts.append({name: p.detach().clone() for name, p in runtime.adapter_parameters().items()})
    routed = RoutedLora(runtime, spec, starts)
    streams = [runtime.batches(job.examples, job.args.batch_size, job.seed) for job in jobs]
    steps = [runtime.steps_for(len(job.examples), job.args.batch_size, job.args.epochs, job.args.steps) for job in jobs]
    with routed.attached(), torch.random.fork_rng(devices=[]):
        metrics = train_clients_loop(
            routed.losses,
            streams,
            routed.params,
            [job.args for job in jobs],
            steps=steps,
            autocast=None if runtime.dtype == torch.float32 else runtime.autocast,
        )
    runtime.activate(spec)
    trained = []
    for own, client_metrics in zip(routed.params, metrics, strict=True):
        with torch.no_grad():
            for name, param in runtime.adapter_parameters().items():
                param.copy_(own[name])
        trained.append((runtime.adapter_state(), client_metrics))
    return trained


class RoutedLora:
    """Each client's own copy of one adapter shape on a runtime's model, and the routing of each example through its
    own client's copy while the model's PEFT adapters are disabled.

    Args:
        runtime: the runtime, with the adapter of shape ``spec`` created on its model.
        spec: the adapter shape every client trains.
        starts: each client's starting tensors, by PEFT parameter name (:meth:`ModelRuntime.adapter_parameters`).
    """

    def __init__(self, runtime: ModelRuntime, spec: LoraSpec, starts: list[dict[str, torch.Tensor]]) -> None:
        if spec.dropout:
            raise UserError(
                f"engine.batch_clients needs LoRA dropout 0 (each client draws its own masks), not {spec.dropout}; "
                "set the method's dropout to 0 or engine.batch_clients=1."
            )
        assert runtime.peft is not None
        self.model = runtime.peft
        self.task = runtime.task
        self.config = runtime.base_model.config
        self.pad_token_id = runtime.tokenizer.pad_token_id if runtime.tokenizer is not None else 0
        own: list[dict[str, torch.nn.Parameter]] = [{} for _ in starts]
        # (base layer, each client's A and B, scaling) per LoRA layer; (original head, each client's head) per head
        self._layers: list[tuple[torch.nn.Module, list[torch.nn.Parameter], list[torch.nn.Parameter], float]] = []
        self._heads: list[tuple[torch.nn.Module, list[torch.nn.Module]]] = []
        key = spec.key
        for name, module in self.model.named_modules():
            if isinstance(module, LoraLayer) and key in module.lora_A:
                self._layers.append(_client_factors(name, module, key, starts, own))
            to_save = getattr(module, "modules_to_save", None)
            if isinstance(to_save, torch.nn.ModuleDict) and key in to_save:
                original = module.original_module
                assert isinstance(original, torch.nn.Module)
                heads = []
                for start, params in zip(starts, own, strict=True):
                    head = copy.deepcopy(to_save[key])
                    for pname, param in head.named_parameters():
                        full = f"{name}.modules_to_save.{key}.{pname}"
                        with torch.no_grad():
                            param.copy_(start[full])
                        params[full] = param
                    heads.append(head)
                self._heads.append((original, heads))
        unrouted = sorted(set(starts[0]) - set(own[0]))
        if unrouted:
            raise UserError(
                f"engine.batch_clients routes LoRA on linear layers and task heads, not {unrouted[0]}; "
                "set engine.batch_clients=1."
            )
        # In the order of the runtime's adapter parameters, as training alone hands them to its optimizer.
        self.params = [{name: params[name] for name in start} for start, params in zip(starts, own, strict=True)]
        for params in self.params:
            for param in params.values():
                param.requires_grad_(True)
        self._active: list[int] = []
        self._rows: list[int] = []

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """The model in training mode with its base weights frozen, its PEFT adapters disabled and the clients'
        adapters routed in; everything as it was on exit."""
        model = self.model
        flags = {name: p.requires_grad for name, p in model.named_parameters()}
        handles = [base.register_forward_hook(self._lora_hook(a, b, scaling)) for base, a, b, scaling in self._layers]
        handles += [original.register_forward_hook(self._head_hook(heads)) for original, heads in self._heads]
        try:
            for param in model.parameters():
                param.requires_grad_(False)
            model.train()
            with model.disable_adapter():
                yield
        finally:
            for handle in handles:
                handle.remove()
            for name, param in model.named_parameters():
                param.requires_grad_(flags.get(name, False))
            model.eval()

    def losses(self, clients: list[int], batches: list[Batch]) -> list[torch.Tensor]:
        """The task loss of each of ``clients`` on its batch, from one forward pass over the batches joined."""
        self._active = clients
        self._rows = [int(batch["labels"].shape[0]) for batch in batches]
        inputs = join_batches([{k: v for k, v in b.items() if k != "labels"} for b in batches], self.pad_token_id)
        if self.task == "generation":  # each row's labels to the joined length, its padding -100
            width = inputs["input_ids"].shape[1]
            labels = torch.cat([F.pad(b["labels"], (0, width - b["labels"].shape[1]), value=-100) for b in batches])
            keep, labels = logits_cut(self.model, labels)  # logits only where a loss reads them (labelled_tail)
            if keep is not None:
                inputs["logits_to_keep"] = keep  # type: ignore[assignment]
        else:
            labels = torch.cat([b["labels"] for b in batches])
        logits = self.model(**inputs).logits
        losses = []
        for part, rows in zip(logits.split(self._rows), labels.split(self._rows), strict=True):
            losses.append(task_loss(self.task, part, rows, self.config))
        return losses

    def _lora_hook(self, a: list[torch.nn.Parameter], b: list[torch.nn.Parameter], scaling: float) -> ForwardHook:
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            delta = routed_lora_delta(args[0], [a[k] for k in self._active], [b[k] for k in self._active], self._rows)
            return output + (delta * scaling).to(output.dtype)

        return hook

    def _head_hook(self, heads: list[torch.nn.Module]) -> ForwardHook:
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            parts = args[0].split(self._rows)
            return torch.cat([heads[k](part) for k, part in zip(self._active, parts, strict=True)])

        return hook


def _client_factors(
    name: str,
    module: LoraLayer,
    key: str,
    starts: list[dict[str, torch.Tensor]],
    own: list[dict[str, torch.nn.Parameter]],
) -> tuple[torch.nn.Module, list[torch.nn.Parameter], list[torch.nn.Parameter], float]:
    """One LoRA layer's base layer, each client's own A and B (added to ``own``) and the scaling."""
    plain = (
        isinstance(module.lora_A[key], torch.nn.Linear)
        and module.lora_A[key].bias is None
        and module.lora_B[key].bias is None
        and not module.use_dora.get(key, False)
    )
    if not plain:
        raise UserError(
            f"engine.batch_clients routes plain LoRA on linear layers, not the adapter of {name}; "
            "set engine.batch_clients=1."
        )
    a_name, b_name = f"{name}.lora_A.{key}.weight", f"{name}.lora_B.{key}.weight"
    a_list, b_list = [], []
    for start, params in zip(starts, own, strict=True):
        params[a_name] = torch.nn.Parameter(start[a_name].clone())
        params[b_name] = torch.nn.Parameter(start[b_name].clone())
        a_list.append(params[a_name])
        b_list.append(params[b_name])
    return module.get_base_layer(), a_list, b_list, float(module.scaling[key])


def routed_lora_delta(x: torch.Tensor, a: list[torch.Tensor], b: list[torch.Tensor], rows: list[int]) -> torch.Tensor:
    """The LoRA term ``B_k A_k x`` of each example's own client (unscaled): ``x`` holds the clients' rows one
    client after the other (``rows`` of each, along the first dimension), ``a`` and ``b`` their factors
    (``(r, d_in)`` and ``(d_out, r)``). Equal row counts compute as two batched matmuls over the stacked factors."""
    x = x.to(a[0].dtype)
    if len(set(rows)) == 1:
        stacked_a, stacked_b = torch.stack(a), torch.stack(b)
        grouped = x.reshape(len(rows), -1, x.shape[-1])
        out = torch.bmm(torch.bmm(grouped, stacked_a.transpose(1, 2)), stacked_b.transpose(1, 2))
        return out.reshape(*x.shape[:-1], out.shape[-1])
    parts = x.split(rows)
    return torch.cat([(part @ a_k.T) @ b_k.T for part, a_k, b_k in zip(parts, a, b, strict=True)])


def join_batches(batches: list[Batch], pad_token_id: int) -> Batch:
    """One batch of the clients' batches, one after the other; token tensors padded on the right to the longest
    (``input_ids`` with the pad token, ``labels`` with -100, masks and the rest with 0), which changes nothing
    for the tokens before the padding."""
    joined: Batch = {}
    for key in batches[0]:
        parts = [batch[key] for batch in batches]
        if parts[0].dim() >= 2 and len({part.shape[1:] for part in parts}) > 1:
            if parts[0].dim() != 2:
                raise ValueError(f"cannot join batches whose {key} differ in shape beyond their length")
            width = max(part.shape[1] for part in parts)
            value = pad_token_id if key == "input_ids" else -100 if key == "labels" else 0
            parts = [F.pad(part, (0, width - part.shape[1]), value=value) for part in parts]
        joined[key] = torch.cat(parts)
    return joined


def task_loss(task: str, logits: torch.Tensor, labels: torch.Tensor, config: PretrainedConfig) -> torch.Tensor:
    """The task loss a transformers model computes from ``logits`` and ``labels``: a causal LM's mean over its
    predicted tokens (labels shifted by one, -100 ignored), a sequence classifier's by its ``problem_type``."""
    if task == "generation":
        logits = logits.float()
        targets = F.pad(labels, (0, 1), value=-100)[..., 1:].to(logits.device)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    num_labels = config.num_labels
    problem = config.problem_type or (
        "regression"
        if num_labels == 1
        else "single_label_classification"
        if labels.dtype in (torch.long, torch.int)
        else "multi_label_classification"
    )
    if problem == "regression":
        return F.mse_loss(logits.squeeze(), labels.squeeze()) if num_labels == 1 else F.mse_loss(logits, labels)
    if problem == "single_label_classification":
        assert num_labels is not None  # a classifier's config counts its labels
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits, labels)


DROPOUT_FIELDS = ("dropout", "pdrop")  # config fields with these in their name are dropout probabilities


def batching_refusal(runtime: ModelRuntime) -> str | None:
    """Why the runtime's clients cannot train together exactly as one by one, in one sentence naming the fix;
    ``None`` when they can."""
    fix = "or set engine.batch_clients=1"
    if runtime.dtype == torch.float16:
        return f"engine.batch_clients cannot share float16's one loss scale between clients; use bfloat16 {fix}."
    if runtime.grad_accum_steps > 1:
        return f"engine.batch_clients takes one batch per step; set train.grad_accum_steps=1 {fix}."
    model = runtime.base_model
    config = model.config
    if getattr(config, "vision_config", None) is not None:
        return f"engine.batch_clients runs text and image classifiers and causal LMs, not image-text models; {fix}."
    if getattr(runtime.loaded, "lora_parameters", None):
        return f"engine.batch_clients cannot route LoRA on {runtime.loaded.name}'s fused expert tensors; {fix}."
    fields = {
        key: value
        for key, value in config.to_dict().items()
        if any(part in key for part in DROPOUT_FIELDS)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and value > 0
    }
    if fields:
        shown = ", ".join(f"{key}: 0" for key in fields)
        return (
            f"engine.batch_clients needs a model without dropout (each client draws its own masks), and "
            f"{runtime.loaded.name} has {', '.join(f'{k} {v}' for k, v in fields.items())}; set model.overrides "
            f"{{{shown}}} {fix}."
        )
    dropouts = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Dropout) and module.p > 0 and "lora_dropout" not in name
    ]
    if dropouts:
        return f"engine.batch_clients needs a model without dropout, and {dropouts[0]} drops with p > 0; {fix}."
    return None
