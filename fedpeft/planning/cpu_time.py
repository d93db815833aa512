"""This CPU's time for each phase of a plan (docs/plan.md, "Time on this CPU").

A phase's time is the sum of what it spends, each part counted from the plan's phase (:class:`~.plan.Phase`):

- **training**: its optimizer steps, each a fixed part (:func:`step_fixed_s`: the Python and dispatch work of one
  forward, backward and AdamW step, whatever the batch) and its examples at the seconds per example of a LoRA step
  of the model at the depth the config runs; a full fine-tuning step costs its FLOPs' share more (6 N against
  4 N + 6 N_LoRA) and, per client training, :data:`FULL_TRAINING_BYTES` per base parameter of memory traffic
  (AdamW's moments, gradients, the copy the client restores, the update's checks and aggregation);
- **hypergradients** (FedL2P): each meta-step's passes beyond its fine-tuning, as training steps of their batch
  (:data:`~.plan.HYPERGRADIENT_PASSES`, :data:`~.plan.HYPERGRADIENT_PER_NEUMANN` per Neumann step);
- **per-sample gradients** (Potara, Fisher merging): each :data:`SAMPLE_GRADIENT_PASSES` training examples,
  each vectorized call a training step's fixed part;
- **forward passes**: evaluation's and FedP2EFT's / FedL2P's client statistics, each example at
  :data:`FORWARD_SHARE` of a training example (statistics stop at the last adapted layer: a causal LM's output
  layer is not run), each batch at a fixed part;
- **generation**: the prompt's forward pass (the output layer for its last position only) and every decoding
  step one read of the weights at this CPU's memory bandwidth;
- **experts' LoRA**: a LoRA on a mixture of experts' fused expert tensors forms every expert's adapted weight at each
  forward pass, whatever its batch: :data:`EXPERT_LORA_S` per adapted expert weight once for each client's
  evaluation (a prediction forms them once: fedpeft.models.weights.parameter_adapters_formed) and for each forward
  batch and decoding step outside training and evaluation (a training step's is in its measured rate);
- **client units** (a training, a personalization at a budget, an evaluation): :data:`CLIENT_FIXED_S` each for
  installing the client's model, saving its adapter and its records;
- **a phase that trains the base weights**: its checkpoint each round and the exported base model,
  :data:`FULL_PHASE_BYTES` per base parameter.

The seconds per example of a LoRA step come from a rehearsal when one is given (:mod:`.rehearsed`: the measured
step at the depth the config runs), else from the FLOPs at this CPU's measured matmul rate times
:data:`TRAINING_EFFICIENCY` of the dtype. The constants were measured on the 2-core Intel Xeon (AVX-512, AMX-bf16)
this project's rehearsals ran on (docs/results/paper-scale.md, "The plan against a rehearsal"); another CPU
keeps the structure, and a rehearsal there recalibrates the part that dominates (the step).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fedpeft.planning.architecture import (
    Architecture,
    active_parameters,
    extra_forward_flops,
    forward_flops_per_token,
    parameters,
)
from fedpeft.planning.shapes import CpuTimes, ModelRow, PhaseData, PlanData, TimedModel

if TYPE_CHECKING:
    from fedpeft.core.config import ExperimentConfig

STEP_FIXED_BASE_S = 0.003
STEP_FIXED_PER_LAYER_S = 0.003
"""A training step's fixed part on this CPU: 3 ms plus 3 ms per layer (module calls, autograd bookkeeping, AdamW's
per-tensor loop), one thread. Measured: tiny-bert (2 layers, 64 wide) 11 to 14 ms a step in the smoke's trainings,
its FLOPs included (about 3 ms a step at the rate below); mBERT cut to one layer 8 to 15 ms (the intercept of its
step over batches 1 to 8)."""

STEP_FIXED_EXAMPLES = 1.0
"""A step's (and a forward batch's) part that does not shrink with its batch, in examples' worth: a batch of b costs
b + 1 examples. Measured here: mBERT (one layer, float32) trained a batch of one at 0.48 to 0.63 of the time of a
batch of four in its rehearsals (2 to 4 examples' worth), 0.3 on an idle moment; Llama-3.2-1B (one layer,
bfloat16) a batch of four in 0.37 s an example against 0.45 to 0.48 s an example in batches of 32, and a batch of
one in 1.85 s. The part depends on the load of this shared machine and on the kernels' batch; 1 splits the
difference."""

FORWARD_SHARE = 0.37
"""A forward pass's share of a LoRA training step, per example: measured 0.34 to 0.39 for mBERT (float32) and 0.30
to 0.41 for Llama-3.2-1B (bfloat16), both cut to one layer, at batches 1 and 4 (the FLOPs say 0.5: the backward
pass runs below the forward's rate here)."""

EVAL_BATCH_FIXED_S = 0.004
"""An evaluation batch's fixed part (tokenizing, the model call, the metric): 4 ms (tiny-bert 4 to 5 ms a client)."""

CLIENT_FIXED_S = 0.01
"""A client unit's fixed part: installing its model (a fresh or received adapter), saving its adapter, its
records. Measured 8 to 15 ms per client and budget in the smoke (tiny-bert) and the mBERT rehearsal."""

FULL_TRAINING_BYTES = 500.0
"""One client's full fine-tuning (FedAvg of the whole model, DEPT) beside its FLOPs, in bytes per base parameter at
the measured memory bandwidth: AdamW's two moments created and updated, the gradients, the copy of the weights the
client restores afterwards, the update's finiteness and norm checks, its aggregation, each a pass over every
parameter (about 120 bytes a parameter of traffic), and the fresh tensors' first touch. An effective figure, from
the idle machine: a one-round, one-client base stage of mBERT (one layer, 100 M parameters, 92 M of them its
embeddings) took 5.3 s with nothing else running, of which under 0.1 s the step's FLOPs, at 13 GB/s measured by
numpy (500 here and :data:`FULL_PHASE_BYTES` give 5.2 s); other jobs' memory traffic made the same stage 8.7 to 24 s
in three rehearsals on the shared machine."""

FULL_PHASE_BYTES = 85.0
"""Per base parameter and round (and once more for the exported base model), what a phase that trains the base
weights writes and reads besides its clients: its server state checkpointed, the base model exported (an effective
figure from the same idle rehearsal, with :data:`FULL_TRAINING_BYTES`)."""

DEFAULT_BANDWIDTH = 13e9
"""This CPU's memory bandwidth (bytes/s) for the parts that read or write every weight (full fine-tuning's passes,
a decoding step's read of the weights): numpy's copy of 64 MiB reached 13 GB/s on the 2-core machine above when
its cores were free. Not measured at each plan: on this shared machine the same copy gave 4 to 30 GB/s minutes
apart (other jobs' traffic, and the cache for smaller copies), which would move those parts 4-fold."""

TRAINING_EFFICIENCY = {"float32": 0.25, "bfloat16": 2.0, "float16": 2.0}
"""The FLOPs rate a LoRA training step reaches, as a share of numpy's float32 matmul rate
(:func:`~.devices.measure_cpu_flops`, 250 to 300 GFLOP/s on the machine above), without a rehearsal: mBERT's float32
step reached 0.1 to 0.3 of it in the rehearsals (the machine shared), 0.8 on an idle moment; Llama-3.2-1B's
bfloat16 step 0.7 to 3.5 (batches of one to four; AMX's bfloat16 products outrun numpy's float32 ones). The
examples' tokens are ``max_length``, an upper bound: the SNI prompts of the generation rehearsal held about 150 of
its 512, so there the FLOPs count three times the work."""


@dataclass(frozen=True)
class ModelRate:
    """One model's seconds per example of a LoRA training step (its compute, without the step's fixed part) at the
    depth the config runs, and where that number comes from."""

    label: str
    seconds_per_example: float
    source: str  # "rehearsal" or "FLOPs"
    layers: int
    logit_share: float | None = None  # the share of its step's positions with logits, where a rehearsal measured it
    lora_params: float = 0.0  # the adapter its step trained (a rehearsal's: rank 8 on every linear layer)


@dataclass(frozen=True)
class Machine:
    """How the run uses this machine: its worker processes, the torch threads of each, its cores."""

    processes: int  # worker processes (1: the clients run in the run's own process)
    threads: int  # torch threads per process
    cores: int
    bandwidth: float

    @property
    def compute_share(self) -> float:
        """The share of the cores one process computes on (the step's rate was measured on all of them)."""
        return min(1.0, self.threads / max(self.cores, 1))


def step_fixed_s(architecture: Architecture) -> float:
    """A training step's fixed part (:data:`STEP_FIXED_BASE_S`)."""
    return STEP_FIXED_BASE_S + STEP_FIXED_PER_LAYER_S * architecture.layers


def lora_train_flops_per_example(architecture: Architecture, tokens: float, lora_params: float = 0.0) -> float:
    """FLOPs of one example's LoRA training step: 4 N + 6 N_LoRA per token (docs/plan.md)."""
    return tokens * (2.0 * forward_flops_per_token(architecture) + 6.0 * lora_params)


def at_depth(architecture: Architecture, layers: int) -> Architecture:
    """``architecture`` with ``layers`` layers (the same width)."""
    return replace(architecture, layers=layers)


def flops_rate(architecture: Architecture, dtype: str, cpu_flops: float | None) -> float | None:
    """The FLOPs/s a LoRA training step of ``architecture`` in ``dtype`` reaches here without a rehearsal."""
    if not cpu_flops:
        return None
    return cpu_flops * TRAINING_EFFICIENCY.get(dtype, 1.0)


def logit_positions(architecture: Architecture, tokens: float, share: float | None = None) -> float:
    """The positions of an example of ``tokens`` whose logits a training step computes: the text's of a LLaVA model
    (never its image tokens, those of ``padded_images`` pictures in a padded batch; at least 2, as
    :func:`~.architecture.activation_bytes` counts); a text model's from
    the first its loss reads on (fedpeft.training.labelled_tail), ``share`` of them where a rehearsal measured that
    share on its step's batches (:class:`ModelRate`), else every one (an upper bound)."""
    if architecture.extra_tokens:
        return max(tokens - architecture.extra_tokens * architecture.padded_images, 2)
    if share is not None:
        return max(tokens * share, 1.0)
    return max(tokens, 1)


def forward_flops(architecture: Architecture, tokens: float, share: float | None = None) -> tuple[float, float, float]:
    """FLOPs of a training step's forward pass on an example of ``tokens``: the language model's blocks, its output
    layer at :func:`logit_positions`, a frozen vision tower's (LLaVA's; 0 for other models)."""
    head = output_parameters(architecture)
    blocks = 2.0 * (active_parameters(architecture) - head) * max(tokens, 1)
    return blocks, 2.0 * head * logit_positions(architecture, tokens, share), extra_forward_flops(architecture)


def step_flops(architecture: Architecture, tokens: float, share: float | None = None) -> float:
    """FLOPs of a LoRA training step on one example of ``tokens``: its forward and backward through the language
    model (twice the forward's), a frozen vision tower's forward (:func:`forward_flops`)."""
    blocks, logits, vision = forward_flops(architecture, tokens, share)
    return 2.0 * (blocks + logits) + vision


def output_parameters(architecture: Architecture) -> int:
    """The output layer's weights of a causal LM (vocabulary x hidden; none for an encoder's)."""
    return architecture.vocab * architecture.hidden if architecture.kind != "encoder" else 0


def head_share(architecture: Architecture, tokens: float = 1, share: float | None = None) -> float:
    """The share of a causal LM's training forward FLOPs on an example of ``tokens`` in its output layer, at the
    positions :func:`logit_positions` gives (0 for an encoder): for a text model without a measured ``share`` the
    output layer's share of the active parameters; far less for a LLaVA model, whose image tokens and vision tower
    compute no logits, and for a text model whose loss reads its answers' positions only."""
    blocks, logits, vision = forward_flops(architecture, tokens, share)
    return logits / max(blocks + logits + vision, 1.0)


def forward_share(architecture: Architecture, tokens: float, share: float | None = None) -> float:
    """A forward pass's share of a training example's time on an example of ``tokens``: :data:`FORWARD_SHARE` of
    the part a training step also runs backward through, and all of a frozen vision tower's (LLaVA's runs forward
    only in both), the two parts' times in the ratio of their FLOPs."""
    blocks, logits, vision = forward_flops(architecture, tokens, share)
    if not vision:
        return FORWARD_SHARE
    part = vision / (vision + (blocks + logits) / FORWARD_SHARE)
    return part + (1.0 - part) * FORWARD_SHARE


def token_seconds(architecture: Architecture, tokens: float, per_example: float, share: float | None = None) -> float:
    """One sequence's token of a decoding step: one position through the language model's blocks and the output
    layer over the whole vocabulary, at the FLOPs rate of the training example's forward pass (``per_example``
    seconds a training example, its forward pass :func:`forward_share` of them)."""
    blocks, logits, vision = forward_flops(architecture, tokens, share)
    seconds_per_flop = per_example * forward_share(architecture, tokens, share) / max(blocks + logits + vision, 1.0)
    return seconds_per_flop * (blocks / max(tokens, 1) + 2.0 * output_parameters(architecture))


def machine_of(cfg: ExperimentConfig, clients: int, bandwidth: float | None = None) -> Machine:
    """The worker processes and threads a local-engine run of ``cfg`` uses on this machine, as the engine resolves
    them (fedpeft/engine/resources.py; memory aside): a number of ``engine.workers`` as given, ``auto`` one process
    per ``threads`` cores (or ``FEDPEFT_WORKERS``), one where clients train in batches; at most the clients."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    engine, processes = cfg.engine, 1
    if engine.name == "local" and cfg.device == "cpu":
        if engine.workers != "auto":
            processes = int(engine.workers)
        elif engine.batch_clients < 2:
            given = os.environ.get(WORKERS_VARIABLE, "").strip()
            processes = int(given) if given.isdigit() and int(given) >= 1 else max(1, cores // (cfg.threads or 1))
        processes = max(1, min(processes, max(clients, 1)))
    threads = cfg.threads or (max(1, cores // processes) if processes > 1 else cores)
    return Machine(processes, threads, cores, bandwidth or DEFAULT_BANDWIDTH)


SAMPLE_GRADIENT_PASSES = 1.0
"""One example's per-sample gradient (``torch.func``'s gradient of its own loss, vectorized over the sample:
fedpeft/adapters/gradients.py), in training examples' worth of the method's step: its forward and backward, and
every adapter tensor's gradient kept per example rather than summed."""

EXPERT_LORA_S = 1.5e-9
"""A forward pass of a model whose fused expert tensors carry a LoRA (PEFT's ``target_parameters``: each expert's
W + s B A formed by one batched product over every expert, before any token is routed), beyond the same pass
without it: seconds per adapted expert weight on all of this CPU's cores, whatever the pass's batch and the rank.
A prediction pays it once (the weights formed at its first pass, fedpeft.models.weights.parameter_adapters_formed:
a decoding step of 4 sequences then 0.09 s where 1.4 s); other passes outside training pay it each.
Measured by benchmarks/expert_lora_passes.py (OLMoE-1B-7B's width at two layers, bfloat16, 805 M expert weights):
1.41 to 1.54 ns at ranks 8 and 20 on the 2 cores, for a decoding step of 4 sequences (0.06 s bare, 1.2-1.3 s with
the LoRA) and a prompt of 4 x 64 alike; 2.7 ns on one thread, so compute, not the memory bandwidth, bounds it.
OLMoE-1B-7B's 6.4 G expert weights cost 9.7 s a pass here (docs/benchmarks.md, "Experts' LoRA at each forward
pass")."""


WORKERS_VARIABLE = "FEDPEFT_WORKERS"
"""What ``engine.workers: auto`` resolves to where set (the engine's variable of the same name)."""


def phase_seconds(
    phase: PhaseData, models: Sequence[TimedModel], rates: list[ModelRate], machine: Machine, generation: bool
) -> dict[str, float] | None:
    """Seconds of one seed of ``phase`` (a row of :func:`~.render.plan_json`) by part, on one worker process
    (``None``: its size is unknown). ``models``: the plan's models (their architecture, dtype, share, tokens per
    example, weights), ``rates``: their seconds per training example."""
    if phase["examples"] is None or phase.get("forward_examples") is None:
        return None
    parts = {"training": 0.0, "forward": 0.0, "generation": 0.0, "experts": 0.0, "fixed": 0.0, "memory": 0.0}
    compute_share = machine.compute_share
    adapters = phase.get("lora_params") or []
    experts = phase.get("expert_weights") or []
    for index, (model, rate) in enumerate(zip(models, rates, strict=True)):
        weight = model["share"]
        a = Architecture(**model["architecture"])
        per_example = rate.seconds_per_example / compute_share
        fixed = step_fixed_s(a)
        params = parameters(a)["total"]
        tokens = max(model["tokens_per_example"], 1)
        share = rate.logit_share
        # The experts' adapted weights formed at each forward pass outside training (expert_pass_seconds).
        per_pass = expert_pass_seconds(experts[index] if experts else 0.0, compute_share)
        if phase["phase"] == "evaluation":
            examples, batches = phase["examples"] * weight, phase["eval_batches"] * weight
            parts["experts"] += phase["client_units"] * weight * per_pass  # once a client's prediction
            passes = (examples + STEP_FIXED_EXAMPLES * batches) * per_example * forward_share(a, tokens, share)
            parts["fixed"] += batches * EVAL_BATCH_FIXED_S
            if not generation:
                parts["forward"] += passes
                continue
            # The prompt's forward pass, its output layer at the last position only, and one read of the
            # weights per decoding step (each also one token's compute for the batch).
            head = head_share(a, tokens, share)
            parts["forward"] += passes * (1.0 - head * (1.0 - 1.0 / logit_positions(a, tokens, share)))
            decode = phase["decode_steps"] * weight
            token = token_seconds(a, tokens, per_example, share)
            parts["generation"] += decoding_seconds(decode, examples / max(batches, 1.0), model, token, machine)
            continue
        examples, steps = phase["examples"] * weight, (phase["steps"] or 0.0) * weight
        # The method's adapter against the one the rate's step trained, by the step's FLOPs.
        adapter = adapter_factor(a, tokens, share, adapters[index], rate.lora_params) if adapters else 1.0
        full_factor = 1.0
        if phase.get("full"):
            forward = forward_flops_per_token(a)
            full_factor = 3.0 * forward / (2.0 * forward)
            parts["memory"] += phase["client_trainings"] * weight * params * FULL_TRAINING_BYTES / machine.bandwidth
            rounds = max(phase.get("rounds") or 0, 1)
            parts["memory"] += (rounds + 1) * weight * params * FULL_PHASE_BYTES / machine.bandwidth
        trained = per_example * full_factor * adapter
        parts["training"] += steps * fixed + (examples + STEP_FIXED_EXAMPLES * steps) * trained
        # FedL2P's hypergradients, in training steps' worth of their batches (plan.HYPERGRADIENT_PASSES).
        hyper, hyper_steps = phase.get("hypergradient_examples", 0.0), phase.get("hypergradient_batches", 0.0)
        parts["training"] += weight * (hyper_steps * fixed + (hyper + STEP_FIXED_EXAMPLES * hyper_steps) * trained)
        # Potara's and Fisher merging's per-sample gradients (SAMPLE_GRADIENT_PASSES), a vectorized call each.
        samples, calls = phase.get("sample_gradient_examples", 0.0), phase.get("sample_gradient_calls", 0.0)
        parts["training"] += weight * (
            calls * fixed + (samples * SAMPLE_GRADIENT_PASSES + STEP_FIXED_EXAMPLES * calls) * trained
        )
        statistics = (phase.get("forward_examples") or 0.0) * weight
        batches = phase.get("forward_batches", 0.0) * weight
        parts["forward"] += (
            (statistics + STEP_FIXED_EXAMPLES * batches)
            * per_example
            * forward_share(a, tokens, share)
            * (1.0 - head_share(a, tokens, share))
        )
        # Distillation's public examples: a prediction and a loss each (output layer included), and, generating,
        # each decoding step one read of the weights and one token of compute per sequence.
        public = phase.get("public_examples", 0.0) * weight
        public_batches = phase.get("public_batches", 0.0) * weight
        parts["forward"] += (
            (2.0 * public + STEP_FIXED_EXAMPLES * public_batches) * per_example * forward_share(a, tokens, share)
        )
        decode = phase.get("decode_steps", 0.0) * weight
        if decode:
            token = token_seconds(a, tokens, per_example, share)
            parts["generation"] += decoding_seconds(decode, phase.get("decode_batch", 1.0), model, token, machine)
        parts["experts"] += (batches + public_batches + decode) * per_pass
        # A frozen teacher's logits on every training example (FedDAT): a forward pass each, output layer included.
        parts["forward"] += phase.get("teacher_examples", 0.0) * weight * per_example * forward_share(a, tokens, share)
    parts["forward"] += relevance_seconds(phase, models, rates, compute_share)
    parts["fixed"] += phase.get("client_units", 0) * CLIENT_FIXED_S
    return parts


def expert_pass_seconds(expert_weights: float, compute_share: float = 1.0) -> float:
    """One forward pass's seconds forming the adapted weights of ``expert_weights`` fused expert weights on
    ``compute_share`` of the cores (:data:`EXPERT_LORA_S` each on all of them; 0 without them)."""
    return expert_weights * EXPERT_LORA_S / compute_share


def adapter_factor(
    architecture: Architecture, tokens: float, share: float | None, trained: float, timed: float
) -> float:
    """A training example with an adapter of ``trained`` parameters against one with the ``timed`` adapter of the
    step its rate comes from: the ratio of their steps' FLOPs (:func:`step_flops` and 6 x the adapter a token)."""
    step = step_flops(architecture, tokens, share)
    return (step + 6.0 * trained * tokens) / (step + 6.0 * timed * tokens)


def relevance_seconds(
    phase: PhaseData, models: Sequence[TimedModel], rates: list[ModelRate], compute_share: float
) -> float:
    """FedMosaic's relevance gradients, on the smallest model whichever model the client holds: each a forward
    pass of its batch and the output layer's backward down to the last layer's weight (the blocks' backward
    beneath it is not needed)."""
    gradients = phase.get("pivot_batches", 0.0)
    if not gradients:
        return 0.0
    sizes = [parameters(Architecture(**m["architecture"]))["total"] for m in models]
    smallest = sizes.index(min(sizes))
    a, tokens = Architecture(**models[smallest]["architecture"]), max(models[smallest]["tokens_per_example"], 1)
    per_example, share = rates[smallest].seconds_per_example / compute_share, rates[smallest].logit_share
    examples = phase.get("pivot_examples", 0.0) + STEP_FIXED_EXAMPLES * gradients
    return examples * per_example * forward_share(a, tokens, share) * (1.0 + head_share(a, tokens, share))


def decoding_seconds(decode: float, batch: float, model: TimedModel, token: float, machine: Machine) -> float:
    """``decode`` decoding steps of ``batch`` sequences each: one read of the weights at the memory bandwidth and one
    token's compute per sequence (``token`` seconds: :func:`token_seconds`)."""
    return decode * (model["weights_bytes"] / machine.bandwidth + batch * token)


def client_operations(phases: Sequence[PhaseData]) -> list[float]:
    """Each phase's client operations the engine sends to a worker: a federated phase's client rounds, the base
    model's evaluation of every client, and a method's personalization of every client (its evaluation and budgets
    within: on its personalization row, or its evaluation row where it trains nothing for it)."""
    operations, personalized = [], set()
    for p in phases:
        count = 0.0
        if p["phase"] in ("federated", "base stage"):
            count = float(p["client_trainings"])
        elif p["method"] == "base model" and p["phase"] == "evaluation":
            count = float(p["parallel_clients"])
        elif p["phase"] in ("personalization", "evaluation") and p["method"] not in personalized:
            count = float(p["parallel_clients"])
            personalized.add(p["method"])
        operations.append(count)
    return operations


def run_seconds(
    phases: list[dict[str, float] | None], processes: int, parallel: list[int], operations: list[float]
) -> list[float | None]:
    """Each phase's wall seconds: its parts and, on worker processes, its client operations' messaging, spread over
    the processes (as many as the clients that may run at once)."""
    out: list[float | None] = []
    for parts, clients, count in zip(phases, parallel, operations, strict=True):
        if parts is None:
            out.append(None)
            continue
        spread = max(1, min(processes, clients))
        messaging = count * WORKER_OP_S if processes > 1 else 0.0
        out.append((sum(parts.values()) + messaging) / spread)
    return out


WORKER_OP_S = 0.1
"""On worker processes (``engine.workers`` of 2 or more, or ``auto`` on several cores), each client's operation (a
round's training, a personalization with its evaluation, the base model's evaluation) is a message to a process
that reads the client's state from disk and writes it back: 0.1 s of a process here. The smoke (tiny-bert, 120
operations) on 2 worker processes took 6 s longer than in one, 0.06 s an operation beside the workers' start, with
nothing else running; 0.15 to 0.5 s an operation when other jobs shared the cores."""

WORKER_START_S = 6.0
"""Starting the worker processes: each imports torch, builds the data and loads the model (about 6 s, side by side
on the cores)."""

START_S = 1.0
"""A run's start on this CPU before its first phase: building the data and loading the model (plus its weights'
bytes at the memory bandwidth; 0.2 to 3.6 s here); Python's and torch's own start (3 to 10 s) comes before the
run's clock."""

REPORT_S = 0.8
REPORT_PER_METHOD_S = 0.15
"""The run's end: merging its parts, the summary and the plots, per method and the base model's rows (the smoke's
6 methods: 1.9 s, two methods 1.0 to 1.9 s)."""


def tokens_of(model: ModelRow) -> float:
    """Tokens of one example of a model of :func:`~.render.plan_json` (its ``tokens_per_example``: a ViT's patches,
    an image-text example's padded positions, else ``max_length``)."""
    return float(model.get("tokens_per_example") or model["architecture"].get("tokens") or model["max_length"])


def flops_rates(models: Sequence[ModelRow], cpu_flops: float | None) -> list[ModelRate] | None:
    """Each model's seconds per training example from its FLOPs at this CPU's measured rate (None: not measured)."""
    rates = []
    for model in models:
        a = Architecture(**model["architecture"])
        rate = flops_rate(a, model["dtype"], cpu_flops)
        if rate is None:
            return None
        seconds = lora_train_flops_per_example(a, tokens_of(model)) / rate
        rates.append(ModelRate(model["label"] or model["name"], seconds, "FLOPs", a.layers))
    return rates


def timed(data: PlanData, rates: list[ModelRate]) -> CpuTimes:
    """Every phase's seconds on this CPU (one seed; None where a size is unknown), its parts, the run's start and
    report, and the whole run's seconds (every phase times its seeds)."""
    cpu = data["cpu"]
    machine = Machine(cpu["processes"], cpu["threads"], cpu["cores"], cpu["bandwidth"])
    generation = data["federation"]["task"] == "generation"
    models: list[TimedModel] = [{**m, "tokens_per_example": tokens_of(m)} for m in data["models"]]
    parts = [phase_seconds(p, models, rates, machine, generation) for p in data["phases"]]
    parallel = [p["parallel_clients"] for p in data["phases"]]
    seconds = run_seconds(parts, machine.processes, parallel, client_operations(data["phases"]))
    start = START_S + max(m["weights_bytes"] for m in models) / machine.bandwidth
    start += WORKER_START_S if machine.processes > 1 else 0.0
    report = REPORT_S + REPORT_PER_METHOD_S * len({p["method"] for p in data["phases"]})
    known = [s * p["times"] for s, p in zip(seconds, data["phases"], strict=True) if s is not None]
    return {
        "seconds": seconds,
        "parts": parts,
        "start_s": start,
        "report_s": report,
        "total_s": sum(known) + start + report,
        "unknown_phases": sum(1 for s in seconds if s is None),
        "rates": [vars(r) for r in rates],
        "machine": vars(machine),
    }
