"""The config of a rehearsal: the run's config with its compute cut and its model and data stood in for.

Everything that gives the run its shape stays: the clients, pools, groups and per-client sizes, the methods and
their settings (ranks, tiers, budgets, fractions, aggregation), the engine, the evaluation's splits, the outputs.
What is cut, by :class:`~fedpeft.core.config.RehearseConfig`: the rounds of every federated phase (every method key
that counts rounds), the optimizer steps of every training call (``train.max_steps``), the batches of every
evaluation (``eval.max_batches``) and the public examples a distilling client answers each round (``kd_samples``,
to one evaluation's), FedMosaic's public examples for its alignment (``align_samples``, to the fewest that still
fill its draw of rows), the examples of every batch (training and evaluation), the tokens generated
per answer, the seeds, and the models' depth. The step at the config's own batch is measured apart
(:mod:`fedpeft.rehearsal.steps`). The device is
the rehearsal's (this CPU by default); float16, which needs a GPU, becomes bfloat16 on the CPU, and quantization,
which needs CUDA, is dropped (both said in the rehearsal's notes).
"""

from __future__ import annotations

import math

from fedpeft.core.config import ExperimentConfig, ModelConfig, RehearseConfig
from fedpeft.core.method_class import MethodConfig
from fedpeft.models.paper_configs import model_config
from fedpeft.planning.architecture import UnsupportedArchitectureError, from_config
from fedpeft.planning.plan import STATISTICS_EVERY_TIME, STATISTICS_ONCE


def is_round_count(key: str, value: object) -> bool:
    """Whether a method setting counts rounds (``rounds``, ``local_rounds``, ``svd_warmup_rounds``, ...)."""
    return (key == "rounds" or key.endswith("_rounds")) and isinstance(value, int) and not isinstance(value, bool)


def is_batch(key: str, value: object) -> bool:
    """Whether a method setting is a training batch's size (``batch_size``, ``outer_batch_size``, ...); a pass
    over a client's data without training (``stats_batch_size``) keeps its batch, since it reads every example
    however it is cut."""
    return (
        key.endswith("batch_size")
        and not key.startswith("stats")
        and isinstance(value, int)
        and not isinstance(value, bool)
    )


PUBLIC_SAMPLE_KEYS = frozenset({"kd_samples"})
"""Method keys that count the public examples every client answers each round (distillation): an evaluation's
work, cut as evaluations are."""

ALIGNMENT_SAMPLE_KEYS = frozenset({"align_samples"})
"""Method keys that count the public examples an alignment of architectures reads (FedMosaic): forward passes over
them (their rows counted, then captured once per group of sites), of which it keeps a draw of
:data:`ALIGNMENT_ROWS` rows."""

ALIGNMENT_ROWS = 20_000
"""The rows FedMosaic's alignment draws from its public examples' positions
(:attr:`fedpeft.adapters.alignment.AlignmentSettings.max_rows`; a test checks they agree)."""


def cut_method(
    entry: MethodConfig,
    rounds: int,
    batch_size: int | None = None,
    public: int | None = None,
    aligned: int | None = None,
) -> MethodConfig:
    """``entry`` with every round count at most ``rounds``, its ``batch_size`` at most ``batch_size``, its
    public examples a round (``kd_samples``) at most ``public`` and the public examples of its alignment
    (``align_samples``) at most ``aligned`` (an entry's own nested configs included)."""
    updates: dict[str, object] = {}
    for key, value in entry:
        if is_round_count(key, value) and value > rounds:
            updates[key] = rounds
        elif is_batch(key, value) and batch_size is not None and value > batch_size:
            updates[key] = batch_size
        elif key in PUBLIC_SAMPLE_KEYS and public is not None and isinstance(value, int) and value > public:
            updates[key] = public
        elif key in ALIGNMENT_SAMPLE_KEYS and aligned is not None and isinstance(value, int) and value > aligned:
            updates[key] = aligned
        elif isinstance(value, MethodConfig):
            updates[key] = cut_method(value, rounds, batch_size, public, aligned)
    return entry.model_copy(update=updates) if updates else entry


def cut_model(model: ModelConfig, device: str, notes: list[str], max_length: int | None = None) -> ModelConfig:
    """``model`` as it can run on ``device`` (float16 and quantization need a GPU), its examples at most
    ``max_length`` tokens."""
    updates: dict[str, object] = {}
    if max_length is not None and model.max_length > max_length:
        updates["max_length"] = max_length
    if device == "cpu" and model.dtype == "float16":
        updates["dtype"] = "bfloat16"
        notes.append(f"{model.name}: model.dtype float16 needs a GPU; rehearsed in bfloat16 (the same bytes).")
    if device == "cpu" and model.quantization is not None:
        updates["quantization"] = None
        notes.append(
            f"{model.name}: model.quantization {model.quantization} needs CUDA; rehearsed unquantized in "
            f"{model.dtype} (the plan gives the quantized memory)."
        )
    return model.model_copy(update=updates) if updates else model


def example_positions(model: ModelConfig, max_length: int | None) -> int:
    """The most positions an example of ``model`` holds at the cut length: its tokens, and for a LLaVA model one
    image's patches (its shipped or local ``config.json``; the class token is dropped, as LLaVA's default feature
    selection does). An alignment at the token level draws its rows from these positions."""
    length = model.max_length if max_length is None else min(model.max_length, max_length)
    values = model_config(model.name)
    if values is None or values.get("model_type") != "llava":
        return length
    try:
        vision = from_config(values).vision
    except (UnsupportedArchitectureError, KeyError, TypeError, ValueError):
        return length
    return length + max(int(vision.get("tokens", 1)) - 1, 0)


def alignment_examples(cfg: ExperimentConfig, max_length: int | None) -> int:
    """The public examples that fill the alignment's draw of :data:`ALIGNMENT_ROWS` rows when each holds the most
    positions (:func:`example_positions`) of the federation's shortest model; a rehearsal reads no more of them."""
    models = list(cfg.models.values()) if cfg.models else [cfg.model]
    return math.ceil(ALIGNMENT_ROWS / max(min(example_positions(m, max_length) for m in models), 1))


def train_cut(cfg: ExperimentConfig, rehearse: RehearseConfig) -> dict[str, int]:
    """The ``train`` keys a rehearsal cuts: every training call's steps, and, where a method computes its clients'
    feature statistics (FedL2P, FedP2EFT), their batches (other configs keep the key unset, so that a rehearsal
    started before the key existed resumes as the same run)."""
    cut = {"max_steps": rehearse.steps}
    if any(entry.name in STATISTICS_ONCE | STATISTICS_EVERY_TIME for entry in cfg.methods):
        cut["max_statistics_batches"] = rehearse.eval_batches
    return cut


def rehearsal_config(cfg: ExperimentConfig, rehearse: RehearseConfig, notes: list[str]) -> ExperimentConfig:
    """``cfg`` with its compute cut as ``rehearse`` says (models and data are stood in for by the caller);
    ``notes`` collects what had to change beyond the cut."""
    device, batch = rehearse.device, rehearse.batch_size
    # The public examples a client answers each round: as many as one evaluation of the rehearsal scores (a LLaVA
    # client's 32 answers took 53 s of each PerAda round in the HFLB rehearsal, its evaluation batch 7 s).
    public = rehearse.eval_batches * min(cfg.eval.batch_size, batch or cfg.eval.batch_size)
    # FedMosaic's alignment: the fewest public examples that still fill its draw of rows, so that its captured rows
    # and fits keep their true size while its forward passes shrink (5,000 LLaVA examples took 22 minutes of HFLB's
    # rehearsal before the first of its captures was half done).
    aligned = alignment_examples(cfg, rehearse.max_length)
    base = cfg.base.model_copy(
        update={
            "method": cut_method(cfg.base.method, rehearse.rounds, batch),
            "batch_size": min(cfg.base.batch_size, batch or cfg.base.batch_size),
        }
    )
    return cfg.model_copy(
        update={
            "seeds": cfg.seeds[: rehearse.seeds],
            "device": device,
            # A federation of architectures leaves `model` at its default (the config refuses both).
            "model": cut_model(cfg.model, device, notes, None if cfg.models else rehearse.max_length),
            "models": {name: cut_model(m, device, notes, rehearse.max_length) for name, m in cfg.models.items()},
            "methods": [cut_method(entry, rehearse.rounds, batch, public, aligned) for entry in cfg.methods],
            "base": base,
            "train": cfg.train.model_copy(update=train_cut(cfg, rehearse)),
            "eval": cfg.eval.model_copy(
                update={
                    "max_batches": rehearse.eval_batches,
                    "batch_size": min(cfg.eval.batch_size, batch or cfg.eval.batch_size),
                    "max_new_tokens": min(cfg.eval.max_new_tokens, rehearse.new_tokens),
                }
            ),
            "rehearse": rehearse,
        }
    )
