"""The plan of a config: what each phase of a run trains, computes, holds, writes and sends (docs/plan.md).

One :class:`Phase` per base stage, method phase (federated rounds, personalization, evaluation) and the base
model's evaluation, each for one seed and counted ``times`` (the seeds it runs for). The counts follow the
config's fields: ``rounds``, ``fraction`` (the sampler's ``ceil(fraction x seen clients)``), ``local_steps`` or
``local_epochs``, ``batch_size`` x ``train.grad_accum_steps``, ``epochs`` / ``finetune_epochs`` / ``local_rounds`` of
personalization, the budgets of a method that uses them; tokens are ``max_length`` per example (an upper bound)
or a ViT's fixed patches. Beside the training, a phase counts what its time on a CPU needs
(:mod:`fedpeft.planning.cpu_time`): the forward passes of FedP2EFT's and FedL2P's client statistics, the
evaluation's batches, the client units (each a model installed, evaluated, its adapter saved) and whether it trains
the base weights, the public examples distillation answers, the compute-matched local steps of FedMosaic and its
baselines (``compute_scale``), FedDAT's teacher passes, FedMosaic's relevance gradients and FedL2P's meta-steps (each a
fine-tuning and a hypergradient). Work a method adds beyond these (FedMosaic's alignment, FedP2EFT's PSG steps) is not
counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from fedpeft.core.config import ExperimentConfig, ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.method_class import MethodConfig
from fedpeft.models.paper_configs import cut_depth, model_config
from fedpeft.planning.architecture import (
    Architecture,
    UnsupportedArchitectureError,
    activation_bytes,
    extra_forward_flops,
    forward_flops_per_token,
    from_config,
    kv_cache_bytes,
    lora_shapes,
    parameters,
    targeted_roles,
    weight_bytes,
)
from fedpeft.planning.cpu_time import machine_of
from fedpeft.planning.devices import CUDA_CONTEXT_BYTES
from fedpeft.planning.federation import Federation, federation_of
from fedpeft.planning.shapes import MachineUse, PhaseData

# The methods' class facts the plan needs (fedpeft/methods; tests/test_plan.py checks them against the classes):
# those without a federated phase, those that personalize once per budget, those with one federation per budget,
# those that train the base model's weights (full fine-tuning) and those that train twice a round.
NOT_FEDERATED = frozenset({"lora", "adalora", "bayestune_lora", "local"})
USES_BUDGET = frozenset({"lora", "adalora", "bayestune_lora", "fedl2p", "fedp2eft"})
FEDERATED_PER_BUDGET = frozenset({"fedl2p"})
TRAINS_BASE_WEIGHTS = frozenset({"fedavg_full", "dept_spec"})
NOT_COMMUNICATING = frozenset({"sft_rounds"})
# Methods whose clients train twice a round (the global adapter, then the personal one or the student).
TRAINS_TWICE = frozenset({"ditto", "feddat", "perada"})
# Methods whose every training step also asks a frozen teacher for its logits (no gradient, output layer included):
# FedDAT's mutual distillation, both of its trainings (fedpeft/methods/feddat.py, ``distillation``).
TEACHER_EVERY_STEP = frozenset({"feddat"})
# Methods whose clients take the frozen smallest model's gradient of one weight matrix every ``grad_every`` local
# steps (a forward pass of that model and its output layer's backward): FedMosaic's RELA (``relevance_gradient``).
RELEVANCE_GRADIENTS = frozenset({"fedmosaic"})
# Methods whose client round is ``outer_steps`` meta-steps (FedL2P, fedpeft/methods/fedl2p.py ``meta_step``): each a
# fresh LoRA fine-tuned for the local schedule on the training split less the validation, then the implicit-function
# hypergradient on one batch of ``outer_batch_size`` from each split.
META_LEARNED = frozenset({"fedl2p"})
HYPERGRADIENT_PASSES = 3.5
"""A hypergradient's passes beyond its Neumann series, in training steps of its batch: the validation batch's
forward and backward, the training batch's forward and backward keeping the graph, and the mixed second
derivative. Measured with :data:`HYPERGRADIENT_PER_NEUMANN` (a meta-step with ``neumann_steps`` 0 and 3 against a
LoRA step of the same batch, fedpeft's FedL2P on stand-ins cut to one layer, this 2-core CPU): Llama-3.2-1B at batch
4 x 32 and 8 x 64, mBERT at 8 x 64: the meta-step with no Neumann step took 4.2 to 5.2 steps, one of them its
fine-tuning."""
HYPERGRADIENT_PER_NEUMANN = 1.5
"""A Neumann step of the hypergradient (a Hessian-vector product through the training gradient's graph), in training
steps of its batch: measured 1.2 to 1.9 (with :data:`HYPERGRADIENT_PASSES`)."""
# Methods that merge a client's FedIT and local adapters from per-sample gradients of both on ``merge_samples`` of its
# training examples (fedpeft/adapters/gradients.py ``per_sample_gradients``), and evaluate each of the two beside the
# merge where ``parts`` (Potara, Fisher merging; a ``grid_search`` also each weight of its grid on the test split).
MERGES_FROM_SAMPLE_GRADIENTS = frozenset({"potara", "fisher_merge"})
# Methods whose clients compute feature statistics (a forward pass over every training example, fedpeft/adapters/
# statistics.py): FedP2EFT once per client (kept in its client state), FedL2P at every round and personalization.
STATISTICS_ONCE = frozenset({"fedp2eft"})
STATISTICS_EVERY_TIME = frozenset({"fedl2p"})
# What a round sends of the LoRA, where it is not the whole adapter: FFA-LoRA trains and sends B only, FedSA-LoRA
# shares A only, RoLoRA sends one factor a round (A and B alternating: half of both on average).
PAYLOAD_FACTORS: dict[str, tuple[float, float]] = {"ffa_lora": (0.0, 1.0), "fedsa_lora": (1.0, 0.0),
                                                   "rolora": (0.5, 0.5)}  # fmt: skip

FLOAT32 = 4


@dataclass(frozen=True)
class ModelPlan:
    """One model of the config (``label``: its ``models`` key, or empty) with its sizes."""

    label: str
    name: str
    architecture: Architecture
    dtype: str
    quantization: str | None
    max_length: int
    checkpointing: bool
    share: float  # the share of the clients that hold this model
    padded: float = 0.0  # an image-text example's positions in a batch padded to its longest, where images are known

    @property
    def tokens_per_example(self) -> float:
        return self.architecture.tokens or self.padded or self.max_length

    @property
    def activation_precision(self) -> int:
        return FLOAT32 if self.dtype == "float32" else 2

    @property
    def weights(self) -> float:
        return weight_bytes(self.architecture)[self.quantization or self.dtype]


@dataclass
class Phase:
    """One phase for one seed. ``None`` marks what the plan cannot know (a dataset's unknown size)."""

    method: str
    phase: str
    times: int
    client_trainings: int
    examples: float | None
    tokens: float | None
    steps: float | None
    flops: float | None
    rounds: int = 0
    clients_per_round: int = 0
    bytes_up_per_round: float = 0.0
    bytes_down_per_round: float = 0.0
    peak_memory: float = 0.0
    disk: float = 0.0
    decode_steps: float = 0.0  # generated tokens' forward passes (batches x new tokens), timed by bandwidth
    parallel_clients: int = 1
    forward_examples: float | None = 0.0  # forward passes outside training and evaluation (client statistics)
    forward_batches: float = 0.0  # their batches
    eval_batches: float = 0.0  # evaluation batches (each client's test set in batches of eval.batch_size)
    public_examples: float = 0.0  # public examples the clients answer and score (distillation), 2 passes each
    public_batches: float = 0.0  # their forward batches (predictions and losses)
    decode_batch: float = 0.0  # the sequences of one decoding step of those answers
    teacher_examples: float = 0.0  # training examples a frozen teacher also predicts (a forward pass each)
    pivot_examples: float = 0.0  # examples of relevance gradients on the smallest model (forward, head backward)
    pivot_batches: float = 0.0  # those gradients (one batch each)
    hypergradient_examples: float = 0.0  # FedL2P's hypergradients, in training examples' worth
    hypergradient_batches: float = 0.0  # and in training steps' worth
    sample_gradient_examples: float = 0.0  # examples of per-sample gradients (Potara's merge)
    sample_gradient_calls: float = 0.0  # their vectorized calls (two a client: the FedIT and the local adapter)
    lora_params: list[float] = field(default_factory=list)  # per model, the adapter a LoRA training trains
    expert_weights: list[float] = field(default_factory=list)  # per model, the fused expert weights it adapts
    client_units: int = 0  # clients' units of work: a training, a personalization at a budget, an evaluation
    full: bool = False  # trains the base weights (full fine-tuning)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> PhaseData:
        return cast(PhaseData, asdict(self))


@dataclass
class Plan:
    """The phases of a config, its models and federation."""

    name: str
    seeds: int
    models: list[ModelPlan]
    federation: Federation
    phases: list[Phase]
    workers: int
    workers_per_gpu: int
    notes: list[str] = field(default_factory=list)
    cpu: MachineUse = field(default_factory=MachineUse)  # this machine as the run uses it: processes, threads, cores
    rehearsal: bool = False  # the config is a rehearsal's (its compute cut: docs/rehearsal.md)

    def total(self, key: str) -> float | None:
        """Sum of ``key`` over the phases, times their seeds (None when one of them is unknown)."""
        values = [getattr(p, key) for p in self.phases]
        if any(v is None for v in values):
            return None
        return float(sum(v * p.times for v, p in zip(values, self.phases, strict=True)))

    @property
    def peak_memory(self) -> float:
        return max((p.peak_memory for p in self.phases), default=0.0)

    @property
    def disk(self) -> float:
        return float(sum(p.disk * p.times for p in self.phases))


LOSS_BATCH = 16
"""The batch of a client's losses on the public examples' reference answers (distillation)."""

DISTILS_PER_TEACHER = frozenset({"takfl"})
"""Methods whose server distils each architecture once per teacher architecture (task arithmetic over them)."""


@dataclass(frozen=True)
class PublicWork:
    """A federated phase's distillation on public data: the clients' forward passes over the public examples
    (with their batches and, generating, decoding steps), and the server's distillation training."""

    examples: float = 0.0
    batches: float = 0.0
    decode_steps: float = 0.0
    decode_batch: float = 0.0
    server_examples: float = 0.0
    server_steps: float = 0.0
    flops: float = 0.0


def model_architecture(model: ModelConfig, stands_for: str | None = None, layers: int | None = None) -> Architecture:
    """The architecture of ``model``: its ``config.json`` from a local directory, the shipped configurations or the
    Hugging Face cache, or a registered model's known shape. ``stands_for``: the model a rehearsal's stand-in
    checkpoint ``model.name`` stands for (its ``rehearse.models``), whose configuration cut to ``layers`` is the
    stand-in's when its directory has since been removed (a rehearsal's run folder stays plannable).

    Raises:
        UserError: no configuration is found, or it is not one the formulas model.
    """
    values = model_config(model.name)
    source = "config.json"
    if values is None and stands_for is not None:
        original = model_config(stands_for)
        values = None if original is None else cut_depth(original, layers)
    if values is None:
        values, source = REGISTERED_SHAPES.get(model.name), "registered model"
        if values is not None:
            values = {**values, "vocab_size": values.get("vocab_size", model.vocab_size)}
    if values is None:
        values, source = _hub_cache_config(model.name, model.revision), "hub cache"
    if values is None:
        raise UserError(
            f"No config.json is known for model {model.name}; put the model's config.json in a directory and set "
            "model.name to that directory (--set model.name=DIR) to plan it."
        )
    values = {**values, **model.overrides}
    try:
        return from_config(values, source)
    except (UnsupportedArchitectureError, KeyError, TypeError, ValueError) as err:
        raise UserError(f"The config.json of model {model.name} cannot be planned ({err}); give a transformer "
                        "decoder, encoder, MoE or LLaVA configuration.") from None  # fmt: skip


def _hub_cache_config(name: str, revision: str | None) -> JSONObject | None:
    import json
    from pathlib import Path

    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:  # not a valid hub id
        return None
    return dict(json.loads(Path(path).read_text())) if isinstance(path, str) else None


# The registered tiny and packaged models' shapes (fedpeft/models/tiny.py, vision.py, multimodal.py, packaged.py);
# a tiny model's vocabulary is model.vocab_size (its trained tokenizer may hold fewer).
_TINY_DECODER = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "tie_word_embeddings": False}
REGISTERED_SHAPES: dict[str, JSONObject] = {
    "tiny-bert": {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "intermediate_size": 128, "max_position_embeddings": 128},
    "tiny-llama": {**_TINY_DECODER, "model_type": "llama", "num_key_value_heads": 2, "intermediate_size": 128},
    "tiny-qwen2": {**_TINY_DECODER, "model_type": "qwen2", "num_key_value_heads": 2, "intermediate_size": 128},
    "tiny-olmo": {**_TINY_DECODER, "model_type": "olmo", "num_key_value_heads": 4, "intermediate_size": 256},
    "tiny-olmoe": {**_TINY_DECODER, "model_type": "olmoe", "num_key_value_heads": 4, "intermediate_size": 32,
                   "num_experts": 16, "num_experts_per_tok": 8},
    "tiny-vit": {"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "intermediate_size": 128, "image_size": 32, "patch_size": 4},
    "tiny-llava": {**_TINY_DECODER, "model_type": "llama", "num_key_value_heads": 2, "intermediate_size": 128},
    "minilm": {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
               "intermediate_size": 1536, "vocab_size": 30522, "max_position_embeddings": 512},
    "all-minilm-l6-v2": {"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
                         "intermediate_size": 1536, "vocab_size": 30522, "max_position_embeddings": 512},
    "gemma3-270m": {"model_type": "gemma3_text", "hidden_size": 640, "num_hidden_layers": 18,
                    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048,
                    "vocab_size": 262144, "tie_word_embeddings": True},
}  # fmt: skip


def images_per_example(images: Sequence[Sequence[float]]) -> float:
    """The mean images of a client's training example, over the clients (each client's examples by their images,
    :attr:`~.federation.Federation.images`; one where none is known)."""
    means = [sum(n * c for n, c in enumerate(held)) / sum(held) for held in images if sum(held)]
    return sum(means) / len(means) if means else 1.0


def padded_positions(
    images: Sequence[Sequence[float]], batch: int, length: int, image_tokens: int
) -> tuple[float, float]:
    """(positions, images) of one row of a batch of ``batch`` examples a client draws, padded to the batch's
    longest (means over the clients): an example with n images holds at least n x ``image_tokens`` + 2 positions
    (its image tokens are never cut, fedpeft.models.multimodal) and at most ``length`` otherwise, so a batch holds
    max(``length``, N x ``image_tokens`` + 2) positions a row, N the most images among its examples."""
    positions, most = [], []
    for held in images:
        total = sum(held)
        if not total:
            continue
        share, below, value, expected = 0.0, 0.0, 0.0, 0.0
        for n, count in enumerate(held):
            share += count / total
            at_most = min(share, 1.0) ** batch  # P(the batch's most images <= n)
            value += (at_most - below) * max(length, n * image_tokens + 2)
            expected += (at_most - below) * n
            below = at_most
        positions.append(value)
        most.append(expected)
    if not positions:
        return float(max(length, image_tokens + 2)), 1.0
    return sum(positions) / len(positions), sum(most) / len(most)


def models_of(cfg: ExperimentConfig, federation: Federation | None = None) -> list[ModelPlan]:
    """Every model of ``cfg`` with the share of the clients it serves (``assign.counts``, else equal); an
    image-text model with ``federation``'s images counted: their mean an example and the positions of an example
    padded to its batch's longest, at the batch of the config's first method (the batch a rehearsal times)."""
    entries = dict(cfg.models) if cfg.models else {"": cfg.model}
    images = federation.images if federation is not None else []
    batch = int(_field(cfg.methods[0], "batch_size", 16) or 16) if cfg.methods else 16
    stand_ins = cfg.rehearse.models if cfg.rehearse else {}
    layers = cfg.rehearse.layers if cfg.rehearse else None
    counts = {label: cfg.assign.counts.get(label, 0) for label in entries}
    total = sum(counts.values())
    plans = []
    for label, m in entries.items():
        architecture = model_architecture(m, stand_ins.get(m.name), layers)
        # A LLaVA prompt's image tokens are never cut (fedpeft.models.multimodal): a length shorter than one image
        # still holds it, the begin-of-sequence token and one more.
        length = max(m.max_length, architecture.extra_tokens + 2) if architecture.extra_tokens else m.max_length
        share = counts[label] / total if total else 1 / len(entries)
        padded = 0.0
        if architecture.extra_tokens and images:
            padded, most = padded_positions(images, batch, m.max_length, architecture.extra_tokens)
            architecture = replace(architecture, images=images_per_example(images), padded_images=most)
        plans.append(ModelPlan(label, m.name, architecture, m.dtype, m.quantization, length, m.gradient_checkpointing,
                               share, padded))  # fmt: skip
    return plans


def _field(method: MethodConfig, name: str, default: Any = None) -> Any:
    return getattr(method, name, default)


def matched_steps(method: MethodConfig, local_steps: int) -> int:
    """The local steps of one training call of a compute-matched method (FedMosaic and its baselines, whose config
    has ``compute_scale``): ``max(1, round(local_steps / compute_scale))``, as
    ``fedpeft.methods.families.branched.matched_steps``; ``local_steps`` for every other method."""
    scale = _field(method, "compute_scale")
    if scale is None:
        return int(local_steps)
    return max(1, round(int(local_steps or 1) / float(scale)))


def ranks_of(method: MethodConfig, budgets: Iterable[int]) -> int:
    """The largest LoRA rank ``method`` trains: its ``rank``, tiers, ``r_init`` (BayesTune), else the budgets."""
    tiers = [t.rank for t in _field(method, "tiers", None) or []]
    values = [_field(method, "rank"), _field(method, "r_init"), *tiers]
    numbers = [int(v) for v in values if isinstance(v, int)]
    return max(numbers or list(budgets) or [8])


def adapter_split(model: ModelPlan, method: MethodConfig, budgets: list[int], labels: int | None) -> tuple[int, int]:
    """(A, B) parameters of ``method``'s LoRA on ``model`` at its largest rank (a classification head with B)."""
    a = model.architecture
    rank = ranks_of(method, budgets)
    shapes, roles = lora_shapes(a), method_roles(a, method)
    lora_a = a.layers * sum(rank * shapes[r][0] * shapes[r][2] for r in roles)
    lora_b = a.layers * sum(rank * shapes[r][1] * shapes[r][2] for r in roles)
    head = (
        (a.hidden * labels + labels + (a.hidden * a.hidden + a.hidden if a.model_type == "bert" else 0))
        if labels
        else 0
    )
    return lora_a, lora_b + head


def method_roles(a: Architecture, method: MethodConfig) -> list[str]:
    """The module roles of ``a`` that ``method``'s LoRA targets (``targets``; ``qv``: the query and value
    projections; none: every linear layer of the blocks)."""
    targets = _field(method, "targets")
    targets = ["q_proj", "v_proj"] if targets == "qv" else targets
    return targeted_roles(a, targets if isinstance(targets, list) else None)


def adapted_expert_weights(model: ModelPlan, method: MethodConfig | None) -> float:
    """The weights of ``model``'s fused expert tensors that ``method``'s LoRA adapts (PEFT's ``target_parameters``:
    every expert's update formed at each forward pass); 0 for a model without experts, or no method."""
    a = model.architecture
    if method is None or a.kind != "moe" or method.name in TRAINS_BASE_WEIGHTS:
        return 0.0
    shapes = lora_shapes(a)
    return float(a.layers * sum(shapes[r][0] * shapes[r][1] * shapes[r][2] for r in method_roles(a, method)
                                if shapes[r][2] > 1))  # fmt: skip


def train_flops_per_token(model: ModelPlan, full: bool, lora_params: int) -> float:
    """Training FLOPs per token: full fine-tuning 6 N (forward 2 N, backward 4 N); LoRA 4 N + 6 N_LoRA (forward,
    and a backward that computes activation gradients through the frozen weights but no weight gradients); with
    gradient checkpointing a second forward (+ 2 N)."""
    forward = forward_flops_per_token(model.architecture)
    recompute = forward if model.checkpointing else 0.0
    if full:
        return 3 * forward + recompute
    return 2 * forward + 6.0 * lora_params + recompute


def forward_pass_flops(model: ModelPlan) -> float:
    """FLOPs of one example's forward pass: 2 N per token and a frozen vision tower's."""
    a = model.architecture
    return model.tokens_per_example * forward_flops_per_token(a) + extra_forward_flops(a)


def train_memory(model: ModelPlan, batch: int, trainable: int, full: bool) -> float:
    """Peak bytes of one worker training: weights in their storage, the trainable parameters' float32 weights,
    gradients and two AdamW moments (full fine-tuning: gradients and moments of every weight, and the copy of
    the weights the client replaced), the activations of one micro-batch, the CUDA context."""
    a = model.architecture
    acts = activation_bytes(a, batch, model.max_length, model.activation_precision, model.checkpointing)["total"]
    if full:
        optimizer = parameters(a)["total"] * (FLOAT32 + 2 * FLOAT32) + model.weights
    else:
        optimizer = trainable * 4 * FLOAT32
    return model.weights + optimizer + acts + CUDA_CONTEXT_BYTES


def eval_memory(model: ModelPlan, batch: int, new_tokens: int, generation: bool, formed: float = 0.0) -> float:
    """Peak bytes of one worker evaluating: weights, one layer's activations of a batch (nothing kept for a
    backward pass), the logits and, when generating, the key/value cache; and the ``formed`` adapted expert weights
    a prediction holds (fedpeft.models.weights.parameter_adapters_formed), in the weights' precision."""
    a, p = model.architecture, model.activation_precision
    acts = activation_bytes(a, batch, model.max_length, p, True)["total"]
    cache = kv_cache_bytes(a, batch, model.max_length + new_tokens, p) if generation else 0.0
    return model.weights + acts + cache + formed * p + CUDA_CONTEXT_BYTES


class _Planner:
    """Builds the phases of one config (kept apart from :class:`Plan`, which is data)."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.federation = federation_of(cfg)
        self.models = models_of(cfg, self.federation)
        self.budgets = list(cfg.budgets)
        self.generation = self.federation.task == "generation"
        self.accum = cfg.train.grad_accum_steps
        self.max_steps = cfg.train.max_steps  # a rehearsal's cut of every training call
        self.max_statistics_batches = cfg.train.max_statistics_batches  # and of every client's statistics

    # ------------------------------------------------------------------------------------------ shared sizes
    def tokens(self, examples: float | None) -> float | None:
        return None if examples is None else examples * self.mean(lambda m: m.tokens_per_example)

    def mean(self, value: Callable[[ModelPlan], float]) -> float:
        return sum(m.share * value(m) for m in self.models)

    def pivot(self) -> ModelPlan:
        """The model with the fewest parameters (FedMosaic's W_s; the first on a tie)."""
        return min(self.models, key=lambda m: parameters(m.architecture)["total"])

    def flops(self, examples: float | None, method: MethodConfig, full: bool) -> float | None:
        if examples is None:
            return None
        labels = self.federation.labels
        per_model = [
            m.share * examples * (m.tokens_per_example * train_flops_per_token(m, full, sum(
                adapter_split(m, method, self.budgets, labels))) + extra_forward_flops(m.architecture))
            for m in self.models
        ]  # fmt: skip
        return sum(per_model)

    def peak(self, method: MethodConfig, full: bool) -> float:
        batch = int(_field(method, "batch_size", 16))
        return max(train_memory(m, batch, sum(adapter_split(m, method, self.budgets, self.federation.labels)), full)
                   for m in self.models)  # fmt: skip

    def lora_params(self, method: MethodConfig) -> list[float]:
        """Per model, the parameters of ``method``'s adapter (at its largest rank, with a classification head)."""
        labels = self.federation.labels
        return [float(sum(adapter_split(m, method, self.budgets, labels))) for m in self.models]

    def expert_weights(self, method: MethodConfig | None) -> list[float]:
        """Per model, the fused expert weights ``method``'s LoRA adapts (:func:`adapted_expert_weights`)."""
        return [adapted_expert_weights(m, method) for m in self.models]

    def adapter_bytes(self, method: MethodConfig) -> float:
        return sum(m.share * p for m, p in zip(self.models, self.lora_params(method), strict=True)) * FLOAT32

    def call(self, examples: float, batch: int) -> float:
        """The examples one training call of ``examples`` processes under ``train.max_steps``."""
        return examples if self.max_steps is None else min(examples, float(self.max_steps * batch))

    def examples_per_client_round(self, method: MethodConfig, per_client: float | None) -> float | None:
        batch = int(_field(method, "batch_size", 16)) * self.accum
        examples = self._examples_per_client_round(method, per_client, batch)
        return None if examples is None else self.call(examples, batch)

    def _examples_per_client_round(self, method: MethodConfig, per_client: float | None, batch: int) -> float | None:
        steps = _field(method, "local_steps")
        if steps is not None:
            return float(matched_steps(method, steps) * batch)
        epochs = _field(method, "local_epochs")
        if epochs is None and _field(method, "r_init"):  # FedP2EFT: a client's round trains its BayesTune scales
            stage1_steps = _field(method, "stage1_steps")
            if stage1_steps:
                return float(stage1_steps * batch)
            epochs = _field(method, "stage1_epochs")
        if epochs is None or per_client is None:
            return None
        return float(epochs * per_client)

    # ------------------------------------------------------------------------------------------------ phases
    def federated(self, method: MethodConfig, label: str, times: int, base: bool = False) -> Phase | None:
        name = method.name
        rounds = int(_field(method, "rounds", 0) or 0)
        if name in NOT_FEDERATED or rounds <= 0:
            return None
        seen = self.federation.clients.get("seen", 0)
        fraction = float(_field(method, "fraction", 1.0))
        k = min(seen, max(int(_field(method, "min_clients", 1)), math.ceil(fraction * seen - 1e-9)))
        repeats = len(self.budgets) if name in FEDERATED_PER_BUDGET and self.budgets else 1
        train_seen = self.federation.train_per_client("seen")
        meta_steps = int(_field(method, "outer_steps", 1) or 1) if name in META_LEARNED else 0
        if meta_steps and train_seen is not None:  # a meta-step fine-tunes on the training split less the validation
            train_seen *= 1.0 - float(_field(method, "val_fraction", 0.0) or 0.0)
        per_round = self.examples_per_client_round(method, train_seen)
        trainings = 2 if name in TRAINS_TWICE else max(meta_steps, 1)
        examples = None if per_round is None else per_round * trainings * k * rounds * repeats
        batch = int(_field(method, "batch_size", 16)) * self.accum
        full = name in TRAINS_BASE_WEIGHTS
        if full:
            payload = self.mean(lambda m: parameters(m.architecture)["total"]) * FLOAT32
            up = down = payload
        else:
            lora_a = self.mean(lambda m: adapter_split(m, method, self.budgets, self.federation.labels)[0])
            lora_b = self.mean(lambda m: adapter_split(m, method, self.budgets, self.federation.labels)[1])
            share_a, share_b = PAYLOAD_FACTORS.get(name, (1.0, 1.0))
            up = down = (share_a * lora_a + share_b * lora_b) * FLOAT32
        if name in NOT_COMMUNICATING:
            up = down = 0.0
        statistics: float | None = 0.0
        statistics_batches = 0.0
        if name in STATISTICS_ONCE:  # each sampled client once, its statistics kept for the later rounds
            sampled = self.sampled_clients(seen, k, rounds)
            once = self.statistics_examples(method, train_seen)
            statistics = None if once is None else sampled * once
            statistics_batches = sampled * self.statistics_batches(method, once)
        elif name in STATISTICS_EVERY_TIME:  # every client round, over its training split less the validation
            per_client = self.statistics_examples(method, train_seen)
            statistics = None if per_client is None else k * rounds * repeats * per_client
            statistics_batches = k * rounds * repeats * self.statistics_batches(method, per_client)
        public = self.public_work(method, k * rounds * repeats, rounds * repeats)
        steps = None if examples is None else examples / batch + public.server_steps
        teacher = (examples or 0.0) if name in TEACHER_EVERY_STEP else 0.0
        gradients = 0.0
        if name in RELEVANCE_GRADIENTS and per_round is not None:  # at steps 0, m, 2m, ... of every training call
            gradients = math.ceil(per_round / batch / int(_field(method, "grad_every", 1)) - 1e-9) * k * rounds
        pivot = self.pivot()
        extra = teacher * self.mean(forward_pass_flops) + gradients * batch * forward_pass_flops(pivot)
        hyper_batches = (
            meta_steps
            * k
            * rounds
            * repeats
            * (HYPERGRADIENT_PASSES + HYPERGRADIENT_PER_NEUMANN * int(_field(method, "neumann_steps", 0) or 0))
        )
        hyper = hyper_batches * self.hypergradient_batch(method, train_seen)
        extra += self.flops(hyper, method, False) or 0.0
        if examples is not None:
            examples += public.server_examples
        # A checkpoint of the server state, and (upper bound) one adapter of its own per client on disk.
        state = (self.mean(lambda m: m.weights) + payload) if full else self.adapter_bytes(method) * (1 + seen)
        return Phase(
            method=label,
            phase="base stage" if base else "federated",
            times=times,
            client_trainings=k * rounds * repeats,
            examples=examples,
            tokens=self.tokens(examples),
            steps=steps,
            flops=None if examples is None else (self.flops(examples, method, full) or 0.0) + public.flops + extra,
            rounds=rounds * repeats,
            clients_per_round=k,
            bytes_up_per_round=k * up,
            bytes_down_per_round=k * down,
            peak_memory=self.peak(method, full),
            disk=state,
            parallel_clients=k,
            forward_examples=statistics,
            forward_batches=statistics_batches,
            decode_steps=public.decode_steps,
            public_examples=public.examples,
            public_batches=public.batches,
            decode_batch=public.decode_batch,
            teacher_examples=teacher,
            pivot_examples=gradients * batch,
            pivot_batches=gradients,
            hypergradient_examples=hyper,
            hypergradient_batches=hyper_batches,
            lora_params=[] if full else self.lora_params(method),
            expert_weights=[] if full else self.expert_weights(method),
            client_units=k * rounds * repeats,
            full=full,
            notes=[f"one federation per budget ({repeats})"] if repeats > 1 else [],
        )

    def hypergradient_batch(self, method: MethodConfig, train: float | None) -> float:
        """The examples of one batch of a hypergradient: ``outer_batch_size``, at most the validation split of a
        client of ``train`` examples (its training split less the validation)."""
        batch = float(int(_field(method, "outer_batch_size", 16) or 16))
        if train is None:
            return batch
        share = float(_field(method, "val_fraction", 0.0) or 0.0)
        validation = train * share / (1.0 - share) if share < 1.0 else train
        return min(batch, float(max(round(validation), 1)))

    def public_work(self, method: MethodConfig, client_rounds: int, rounds: int) -> PublicWork:
        """Distillation on public data (PerAda, TAKFL, FedMKT, ``kd_samples`` > 0): every client round answers the
        round's ``kd_samples`` public examples (predictions in batches of ``eval.batch_size``, generated where the
        task generates, and the loss on each reference answer in batches of 16: two forward passes an example), and
        every round the server distils each architecture's adapter, ``kd_steps`` steps of ``kd_batch_size`` (TAKFL
        once per teacher architecture)."""
        samples = int(_field(method, "kd_samples", 0) or 0)
        if not samples:
            return PublicWork()
        prediction_batches = math.ceil(samples / self.cfg.eval.batch_size)
        batches = client_rounds * (prediction_batches + math.ceil(samples / LOSS_BATCH))
        new_tokens = self.cfg.eval.max_new_tokens if self.generation else 0
        kd_batch = int(_field(method, "kd_batch_size", 4))
        per_distillation = self.call(float(int(_field(method, "kd_steps", 0)) * kd_batch), kd_batch)
        distillations = rounds * len(self.models) * (len(self.models) if method.name in DISTILS_PER_TEACHER else 1)
        server = per_distillation * distillations
        flops = 2 * client_rounds * samples * self.mean(
            lambda m: (m.tokens_per_example + new_tokens) * forward_flops_per_token(m.architecture)
            + extra_forward_flops(m.architecture))  # fmt: skip
        return PublicWork(
            examples=float(samples * client_rounds),
            batches=float(batches),
            decode_steps=float(client_rounds * prediction_batches * new_tokens),
            decode_batch=float(min(samples, self.cfg.eval.batch_size)),
            server_examples=server,
            server_steps=server / kd_batch,
            flops=flops,
        )

    def statistics_examples(self, method: MethodConfig, per_client: float | None) -> float | None:
        """The examples of one client's statistics over ``per_client`` under ``train.max_statistics_batches``."""
        if per_client is None or self.max_statistics_batches is None:
            return per_client
        return min(per_client, float(self.max_statistics_batches * self.stats_batch(method)))

    @staticmethod
    def stats_batch(method: MethodConfig) -> int:
        """The examples of one forward batch of a client's statistics (``stats_batch_size``, else 64)."""
        return int(_field(method, "stats_batch_size", 64) or 64)

    @staticmethod
    def statistics_batches(method: MethodConfig, per_client: float | None) -> float:
        """The forward batches of one client's statistics over ``per_client``."""
        if not per_client:
            return 0.0
        return float(math.ceil(per_client / _Planner.stats_batch(method) - 1e-9))

    @staticmethod
    def sampled_clients(seen: int, k: int, rounds: int) -> float:
        """The clients of a pool of ``seen`` that ``rounds`` rounds of ``k`` drawn at random sample at least once
        (expected)."""
        return seen * (1.0 - (1.0 - k / seen) ** rounds) if seen else 0.0

    def personal_examples(self, method: MethodConfig, per_client: float | None) -> float | None:
        """Training examples of one client's personalization (every budget of a method that uses them)."""
        batch = int(_field(method, "batch_size", 16)) * self.accum
        budgets = len(self.budgets) if method.name in USES_BUDGET and self.budgets else 1
        total = 0.0
        local_rounds = _field(method, "local_rounds")
        call = self.call
        if method.name == "local":
            total += int(_field(method, "rounds", 0)) * call(int(_field(method, "local_steps", 0)) * batch, batch)
        if local_rounds:
            total += int(local_rounds) * call(int(_field(method, "local_steps") or 1) * batch, batch)
        if _field(method, "finetune_steps"):
            total += call(int(_field(method, "finetune_steps")) * batch, batch)
        epochs = float(_field(method, "epochs", 0.0) or 0.0)
        finetune = float(_field(method, "finetune_epochs", 0.0) or 0.0)
        # BayesTune's stage 1 in personalization: BayesTune-LoRA's own; FedP2EFT's PSG predicts the scales instead
        # (its stage 1 runs in the federated rounds).
        own_stage1 = _field(method, "r_init") and method.name not in STATISTICS_ONCE
        stage1 = float(_field(method, "stage1_epochs", 0.0) or 0.0) if own_stage1 else 0.0
        stage1_steps = _field(method, "stage1_steps") if own_stage1 else None
        if epochs or finetune or stage1:
            if per_client is None:
                return None
            for length in (epochs, finetune):
                total += call(length * per_client, batch) * budgets if length else 0.0
            if stage1_steps or stage1:
                total += call(stage1_steps * batch if stage1_steps else stage1 * per_client, batch)
        return total

    def personalization(self, method: MethodConfig, label: str, times: int) -> Phase | None:
        clients = self.federation.total_clients
        per_client = self._mean_train_per_client()
        one = self.personal_examples(method, per_client)
        if one == 0.0:
            return None
        examples = None if one is None else one * clients
        batch = int(_field(method, "batch_size", 16)) * self.accum
        budgets = len(self.budgets) if method.name in USES_BUDGET and self.budgets else 1
        saved = self.adapter_bytes(method) * clients * budgets if self.cfg.output.save_adapters else 0.0
        statistics = self.personal_statistics(method)
        stats_per_client = self.statistics_examples(method, per_client)
        gradients, calls = self.sample_gradients(method, per_client)
        gradients *= clients
        # a per-sample gradient is a training example's forward and backward
        flops = self.flops(None if examples is None else examples + gradients, method, False)
        return Phase(
            method=label,
            phase="personalization",
            times=times,
            client_trainings=clients * budgets,
            examples=examples,
            tokens=self.tokens(examples),
            steps=None if examples is None else examples / batch,
            flops=flops,
            peak_memory=self.peak(method, False),
            disk=saved,
            parallel_clients=clients,
            forward_examples=None if stats_per_client is None else statistics * stats_per_client,
            forward_batches=statistics * self.statistics_batches(method, stats_per_client),
            sample_gradient_examples=gradients,
            sample_gradient_calls=calls * clients,
            lora_params=self.lora_params(method),
            expert_weights=self.expert_weights(method),
            client_units=clients * budgets,
        )

    @staticmethod
    def sample_gradients(method: MethodConfig, per_client: float | None) -> tuple[float, float]:
        """(examples, calls) of one client's per-sample gradients in a personalization that merges from them
        (:data:`MERGES_FROM_SAMPLE_GRADIENTS`): ``merge_samples`` of its training examples at each of its two adapters
        (at most its training split; its mean size where known, else ``merge_samples``)."""
        if method.name not in MERGES_FROM_SAMPLE_GRADIENTS:
            return 0.0, 0.0
        samples = float(int(_field(method, "merge_samples", 30)))
        if per_client is not None:
            samples = min(samples, per_client)
        return 2.0 * samples, 2.0

    def evaluations(self, method: MethodConfig) -> int:
        """Passes over every client's test set of ``method``'s evaluation: one a budget (methods that use them), and
        a merge's parts beside it (its FedIT and its local adapter; a ``grid_search``'s chosen weight and every
        weight of its grid)."""
        passes = len(self.budgets) if method.name in USES_BUDGET and self.budgets else 1
        if method.name in MERGES_FROM_SAMPLE_GRADIENTS:
            passes += 2 if _field(method, "parts", True) else 0
            if _field(method, "grid_search", False):
                passes += 1 + len(_field(method, "grid", []) or [])
        return passes

    def personal_statistics(self, method: MethodConfig) -> float:
        """How many client statistics personalization computes: FedP2EFT's for every client the federated rounds
        did not sample (theirs are kept), FedL2P's for every client and budget."""
        clients = self.federation.total_clients
        if method.name in STATISTICS_ONCE:
            seen = self.federation.clients.get("seen", 0)
            fraction = float(_field(method, "fraction", 1.0))
            k = min(seen, max(int(_field(method, "min_clients", 1)), math.ceil(fraction * seen - 1e-9)))
            return clients - self.sampled_clients(seen, k, int(_field(method, "rounds", 0) or 0))
        if method.name in STATISTICS_EVERY_TIME:
            return float(clients * (len(self.budgets) if self.budgets else 1))
        return 0.0

    def evaluation(
        self, label: str, times: int, evaluations: int, rounds: int = 0, method: MethodConfig | None = None
    ) -> Phase:
        """``evaluations`` passes over every client's test set (a budget each), and round evaluations: every
        ``eval.every`` rounds and after the last, each over every client's test set and its sample of the other
        clients' (``split: others``); with ``method``'s adapter (none: the base model)."""
        clients = self.federation.total_clients
        every = self.cfg.eval.every
        round_passes = math.ceil(rounds / every) if every and rounds else 0
        passes = evaluations + round_passes
        test = self.federation.test_rows
        known = all(v is not None for v in test.values())
        examples = float(sum(v or 0 for v in test.values())) * passes if known else None
        cut = self.cfg.eval.max_batches  # a rehearsal's cut: each client's evaluation on its first batches
        if examples is not None and cut is not None and clients:
            examples = min(examples, float(cut * self.cfg.eval.batch_size * clients * passes))
        new_tokens = self.cfg.eval.max_new_tokens if self.generation else 0
        batch = self.cfg.eval.batch_size
        batches = self.eval_batches(passes)
        others, others_batches = self.others_per_evaluation()
        if examples is not None:
            examples += others * clients * round_passes
        batches += others_batches * clients * round_passes
        tokens = None if examples is None else examples * self.mean(lambda m: m.tokens_per_example + new_tokens)
        flops = None if examples is None else examples * self.mean(
            lambda m: (m.tokens_per_example + new_tokens) * forward_flops_per_token(m.architecture)
            + extra_forward_flops(m.architecture))  # fmt: skip
        decode = 0.0 if examples is None else batches * new_tokens
        return Phase(
            method=label,
            phase="evaluation",
            times=times,
            client_trainings=0,
            examples=examples,
            tokens=tokens,
            steps=0.0,
            flops=flops,
            peak_memory=max(
                eval_memory(m, batch, new_tokens, self.generation, adapted_expert_weights(m, method))
                for m in self.models
            ),
            decode_steps=decode,
            parallel_clients=clients,
            eval_batches=batches,
            expert_weights=self.expert_weights(method),
            client_units=clients * passes,
            notes=[f"{passes} pass(es) over every client's test set"]
            + ([f"{round_passes} with a sample of the other clients' (Others)"] if round_passes and others else []),
        )

    def others_per_evaluation(self) -> tuple[float, float]:
        """(examples, batches) of one client's "Others" score in a round evaluation: ``eval.others_per_client``
        test examples of each of at most ``eval.others_clients`` other clients, in batches of ``eval.batch_size``,
        at most ``eval.max_batches`` of them."""
        ev = self.cfg.eval
        others = max(self.federation.total_clients - 1, 0)
        if ev.others_clients is not None:
            others = min(others, ev.others_clients)
        examples = float(others * ev.others_per_client)
        batches = float(math.ceil(examples / ev.batch_size - 1e-9)) if examples else 0.0
        if ev.max_batches is not None:
            batches = min(batches, float(ev.max_batches))
            examples = min(examples, float(ev.max_batches * ev.batch_size))
        return examples, batches

    def eval_batches(self, passes: int) -> float:
        """The batches of ``passes`` evaluations of every client: each client's test set in batches of
        ``eval.batch_size`` (its mean size where only a pool's total is known), at most ``eval.max_batches``."""
        batch, cut = self.cfg.eval.batch_size, self.cfg.eval.max_batches
        total = 0.0
        for pool, count in self.federation.clients.items():
            per_client = self.federation.test_per_client(pool)
            if per_client is None or not count:
                continue
            each = math.ceil(per_client / batch - 1e-9) if per_client else 0
            total += count * (each if cut is None else min(each, cut))
        return total * passes

    def _mean_train_per_client(self) -> float | None:
        rows = self.federation.train_rows
        if any(v is None for v in rows.values()) or not self.federation.total_clients:
            return None
        return sum(v or 0 for v in rows.values()) / self.federation.total_clients

    def base_stage(self) -> list[Phase]:
        base, seeds = self.cfg.base, len(self.cfg.seeds)
        times = seeds if base.per_seed else 1
        if base.kind == "federated":
            phase = self.federated(base.method, f"base: {base.method.name}", times, base=True)
            return [phase] if phase else []
        if base.kind == "centralized":
            examples = self.call(base.epochs * self.federation.base_rows, base.batch_size)
            method = base.method.model_copy(update={"batch_size": base.batch_size}) if hasattr(
                base.method, "batch_size") else base.method  # fmt: skip
            return [Phase(
                method="base: centralized", phase="base stage", times=times, client_trainings=1,
                examples=examples, tokens=self.tokens(examples), steps=examples / base.batch_size,
                flops=self.flops(examples, method, True), peak_memory=self.peak(method, True),
                disk=self.mean(lambda m: m.weights), parallel_clients=1, client_units=1, full=True,
            )]  # fmt: skip
        return []

    def phases(self) -> list[Phase]:
        seeds = len(self.cfg.seeds)
        phases = self.base_stage()
        phases.append(self.evaluation("base model", seeds, 1))
        for method in self.cfg.methods:
            label = method.label or method.name
            federated = self.federated(method, label, seeds)
            personal = self.personalization(method, label, seeds)
            phases += [p for p in (federated, personal) if p is not None]
            rounds = federated.rounds if federated else 0
            phases.append(self.evaluation(label, seeds, self.evaluations(method), rounds, method))
        return phases


def make_plan(cfg: ExperimentConfig) -> Plan:
    """The plan of ``cfg`` (see the module docstring).

    Raises:
        UserError: a model without a known configuration, or data the plan cannot shape.
    """
    planner = _Planner(cfg)
    workers = cfg.engine.workers if isinstance(cfg.engine.workers, int) else 0
    notes = list(planner.federation.notes)
    machine = machine_of(cfg, planner.federation.total_clients, None)
    cpu: MachineUse = {"processes": machine.processes, "threads": machine.threads, "cores": machine.cores}
    return Plan(cfg.name, len(cfg.seeds), planner.models, planner.federation, planner.phases(), workers,
                cfg.engine.workers_per_gpu, notes, cpu, cfg.rehearse is not None)  # fmt: skip
