"""Aggregation of adapters by model merging: operators on tensors, and the spaces LoRA adapters merge in.

- :mod:`fedpeft.merging.operators`: mean, task_arithmetic, ties, dare_linear, dare_ties, iso_c as pure
  functions (list of tensors + weights + options -> one tensor).
- :mod:`fedpeft.merging.lora`: merging whole LoRA state dicts in ``ab`` or ``knots`` space, truncated SVD back
  to rank r, and :class:`MergeConfig`, the config block any method can embed (``guided``, ``fedit``).

See docs/merging.md.
"""

from fedpeft.merging.lora import (
    MergeConfig,
    knots_factors,
    lora_delta,
    lora_factors,
    lora_pairs,
    low_rank_svd,
    merge_lora_states,
    tsvd,
)
from fedpeft.merging.operators import (
    OPERATOR_NAMES,
    OPERATORS,
    apply_operator,
    dare_linear,
    dare_ties,
    iso_c,
    isotropic,
    mean,
    operator_weights,
    task_arithmetic,
    ties,
)

__all__ = [
    "OPERATORS",
    "OPERATOR_NAMES",
    "MergeConfig",
    "apply_operator",
    "dare_linear",
    "dare_ties",
    "iso_c",
    "isotropic",
    "knots_factors",
    "lora_delta",
    "lora_factors",
    "lora_pairs",
    "low_rank_svd",
    "mean",
    "merge_lora_states",
    "operator_weights",
    "task_arithmetic",
    "ties",
    "tsvd",
]
