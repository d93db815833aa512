"""The shapes of the JSON the planning reads and writes: a plan as ``fedpeft plan --json`` prints it
(:func:`~fedpeft.planning.render.plan_json`) and a rehearsal's ``rehearsal.json`` (docs/rehearsal.md), as typed
dicts. At run time they are plain dicts; a file written by an older fedpeft may lack the keys its readers ``get``.
"""

from __future__ import annotations

from typing import TypedDict

# ----------------------------------------------------------------------------------------------------------
# A plan (fedpeft/planning/render.py)


class ArchitectureData(TypedDict):
    """An :class:`~fedpeft.planning.architecture.Architecture` as a dict (``Architecture(**data)`` rebuilds it)."""

    kind: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int
    top_k: int
    tokens: int
    positions: int
    extra_params: int
    extra_tokens: int
    model_type: str
    source: str
    vision: dict[str, int]
    images: float
    padded_images: float


class ModelRow(TypedDict):
    """One model of a plan (``label``: its ``models`` key, or empty) with its sizes."""

    label: str
    name: str
    dtype: str
    quantization: str | None
    max_length: int
    share: float
    source: str
    weights_bytes: float
    architecture: ArchitectureData
    tokens_per_example: float


class TimedModel(ModelRow):
    """A model of a plan with the tokens of one of its examples, as the CPU time counts them."""


class FederationData(TypedDict):
    """A :class:`~fedpeft.planning.federation.Federation` as a dict, with its clients in all."""

    dataset: str
    clients: dict[str, int]
    train_rows: dict[str, int | None]
    test_rows: dict[str, int | None]
    task: str
    rule: str
    source: str
    labels: int | None
    base_rows: int
    notes: list[str]
    images: list[list[float]]
    total_clients: int


class PhaseData(TypedDict):
    """A :class:`~fedpeft.planning.plan.Phase` as a dict (``None``: a size the plan cannot know)."""

    method: str
    phase: str
    times: int
    client_trainings: int
    examples: float | None
    tokens: float | None
    steps: float | None
    flops: float | None
    rounds: int
    clients_per_round: int
    bytes_up_per_round: float
    bytes_down_per_round: float
    peak_memory: float
    disk: float
    decode_steps: float
    parallel_clients: int
    forward_examples: float | None
    forward_batches: float
    eval_batches: float
    public_examples: float
    public_batches: float
    decode_batch: float
    teacher_examples: float
    pivot_examples: float
    pivot_batches: float
    hypergradient_examples: float
    hypergradient_batches: float
    sample_gradient_examples: float
    sample_gradient_calls: float
    lora_params: list[float]
    expert_weights: list[float]
    client_units: int
    full: bool
    notes: list[str]


class PhaseRow(PhaseData):
    """A phase of a plan with its hours of one seed on the GPUs and on this CPU (``None``: unknown or not timed)."""

    gpu_hours: float | None
    cpu_hours: float | None


class CpuTimes(TypedDict):
    """A plan's time on this CPU (:func:`~fedpeft.planning.cpu_time.timed`): each phase's seconds of one seed and
    their parts (``None``: a size is unknown), the run's start and report, the whole run's seconds."""

    seconds: list[float | None]
    parts: list[dict[str, float] | None]
    start_s: float
    report_s: float
    total_s: float
    unknown_phases: int
    rates: list[dict[str, object]]
    machine: dict[str, object]


class MachineUse(TypedDict, total=False):
    """This machine as a run uses it: its worker processes, the torch threads of each, its cores."""

    processes: int
    threads: int
    cores: int


class _CpuData(MachineUse):
    bandwidth: float
    flops_per_s: float | None


class CpuData(_CpuData, total=False):
    """This machine as the run uses it, and the plan timed on it where its FLOPs rate was measured (``timed``)."""

    timed: CpuTimes


class Totals(TypedDict):
    """A plan's totals over its phases, each times its seeds (``unknown_phases``: those left out of the counts)."""

    client_trainings: float
    examples: float
    tokens: float
    steps: float
    flops: float
    bytes_up: float
    bytes_down: float
    peak_memory: float
    disk: float
    gpu_hours: float
    cpu_hours: float | None
    unknown_phases: int


class GpuData(TypedDict):
    """A :class:`~fedpeft.planning.devices.Gpu` as a dict."""

    name: str
    bf16_flops: float
    memory_gib: float
    bandwidth: float
    source: str


class DeviceData(TypedDict):
    """The device a plan is timed on."""

    gpu: GpuData
    gpus: int
    cpu_flops_per_s: float | None


class Fits(TypedDict):
    """The workers the config asks for, and how many of the plan's peak fit on a GPU of each memory (GiB)."""

    workers: int
    workers_per_gpu: int
    workers_per_gpu_that_fit: dict[str, int]
    configured_fits: bool


class Assumptions(TypedDict):
    """What a plan assumes rather than measures."""

    mfu: float
    generation_bandwidth_share: float
    measured: bool


class RehearsedStep(TypedDict):
    """A rehearsal's measured step of one model at its true depth, as the plan counts it."""

    model: str
    batch_size: int
    layers: int
    step_s: float
    peak_rss_bytes: float


class RehearsedModel(TypedDict):
    """One model's seconds per training example from a rehearsal, and how they were found."""

    model: str
    layers: int
    seconds_per_example: float
    how: str
    measured: str | None


class AgainstRow(TypedDict):
    """A phase's planned seconds beside the seconds the rehearsal measured (``None``: unknown)."""

    method: str
    phase: str
    planned_s: float | None
    measured_s: float | None


class RehearsedCpu(TypedDict):
    """A plan timed on this CPU by a rehearsal's measurements (:func:`~fedpeft.planning.rehearsed.rehearsed_cpu`)."""

    source: str
    models: list[RehearsedModel]
    steps: list[RehearsedStep]
    phases: list[float | None]
    parts: list[dict[str, float] | None]
    start_s: float
    report_s: float
    total_s: float
    cpu_hours: float
    peak_rss_bytes: float
    against: list[AgainstRow]
    processes: int  # the worker processes the planned run uses (several: its phases run side by side)


class _PlanData(TypedDict):
    name: str
    rehearsal: bool
    seeds: int
    models: list[ModelRow]
    federation: FederationData
    phases: list[PhaseRow]
    cpu: CpuData
    total: Totals
    device: DeviceData
    fits: Fits
    assumptions: Assumptions
    notes: list[str]


class PlanData(_PlanData, total=False):
    """A plan as JSON-ready values (``fedpeft plan --json``); ``rehearsed``: its time from a rehearsal, where one
    was given."""

    rehearsed: RehearsedCpu


# ----------------------------------------------------------------------------------------------------------
# A rehearsal's measurements (fedpeft/rehearsal/steps.py and driver.py)


class _DepthStep(TypedDict):
    layers: int
    step_s: float
    peak_rss_mb: float
    weights_mb: float


class DepthStep(_DepthStep, total=False):
    """One depth's timed training step of a stand-in model: its seconds, the peak resident memory of its process
    and its weights' (MB), and what its batches held: the share of their positions whose logits the step computed
    (a causal LM's from the first its loss reads on; 1 where it keeps every position's), their positions a row
    (each batch padded to its longest) and a multimodal model's pictures a row."""

    logit_share: float
    positions: float
    images: float


class CutStep(TypedDict):
    """The step the rehearsal's clients took: at its own (cut) batch and length (``None`` for images), at the
    rehearsed depth."""

    batch_size: int
    length: int | None
    depths: list[DepthStep]


class _StepMeasurement(TypedDict):
    model: str
    true_layers: int
    timed_steps: int
    batch_size: int
    length: int | None
    depths: list[DepthStep]


class StepMeasurement(_StepMeasurement, total=False):
    """One model's training step measured at several depths (``length``: its tokens, ``None`` for images), the
    per-layer cost and the step at its true depth from the two shallowest (where two were measured), their errors
    against a measurement at the true depth (where there is one; why not, where it failed), and the step the
    rehearsal's clients took (``cut``)."""

    per_layer_s: float | None
    per_layer_mb: float
    full_step_s: float
    full_peak_mb: float
    full_step_error: float
    full_peak_error: float
    full_depth_failed: str
    cut: CutStep


class _PhaseMeasurement(TypedDict):
    method: str
    seed: int
    phase: str


class PhaseMeasurement(_PhaseMeasurement, total=False):
    """The wall seconds and peak resident memory (MB) of one method's phase of a rehearsal, from its
    ``costs.jsonl`` (the main process's; ``workers_peak_rss_mb``: the largest of its worker processes', where it
    had any); a federated phase also the seconds its server state took to build before the first round
    (``server_init_s``, outside ``wall_s``)."""

    wall_s: float
    peak_rss_mb: float
    workers_peak_rss_mb: float
    server_init_s: float


class RehearseSection(TypedDict, total=False):
    """A rehearsal config's ``rehearse`` section as a dict (:class:`~fedpeft.core.config.RehearseConfig`)."""

    layers: int | None
    rounds: int
    steps: int
    eval_batches: int
    batch_size: int | None
    new_tokens: int
    max_length: int | None
    seeds: int
    device: str
    measure_steps: bool
    check_full_depth: bool
    models: dict[str, str]
    data: str | None


class _Sittings(TypedDict, total=False):
    sittings: int  # how many sittings of a resumed rehearsal its ``total_s`` sums (absent: one)


class RehearsalSummary(_Sittings):
    """A rehearsal's ``rehearsal.json``: its config's name and cut, its notes, each phase's measurements, its wall
    seconds in all (summed over the sittings that ended with a summary, ``sittings``: 1 when absent) and in the run's
    phases, the largest peak memory of a phase in the main process and in a worker
    process (None: the clients ran in the main process), and its steps' measurements."""

    what: str
    config: str
    rehearse: RehearseSection
    notes: list[str]
    phases: list[PhaseMeasurement]
    total_s: float
    wall_s: float
    peak_rss_mb: float
    workers_peak_rss_mb: float | None
    steps: list[StepMeasurement]


class MeasuredRehearsal(RehearsalSummary):
    """A ``rehearsal.json`` as the plan reads it: only the steps measured at two depths, and the file it is."""

    source: str
