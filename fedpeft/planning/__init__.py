"""What a run costs before it runs, computed from its config without torch, weights or data.

- :mod:`.architecture`: a model's sizes from its ``config.json`` and the formulas on them: parameters per kind,
  LoRA parameters per target, weight bytes per dtype and quantization, activation bytes, FLOPs per token;
- :mod:`.federation`: the federation's shape (clients per pool, examples per client) from the dataset's published
  sizes and its loader's partition rules, or from the synthetic data built at once;
- :mod:`.devices`: the GPUs a plan names (peak dense bf16 FLOPs, memory, bandwidth) and a measured CPU rate;
- :mod:`.plan`: the phases of a config (base stage, federated rounds, personalization, evaluation, per seed) and
  their totals; :mod:`.render`: its table.

``fedpeft plan`` prints it (docs/plan.md); ``benchmarks/memory_estimate.py`` reads the same formulas.
"""
