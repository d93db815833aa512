"""Splitting a group's examples over clients with flwr-datasets partitioners.

``datasets`` and flwr-datasets are imported where a partitioner is built (a second or two), so that splitting a
client's examples into train and test sets, and reading a user's files, imports neither.
"""

from __future__ import annotations

import contextlib
import io
import random
from typing import TYPE_CHECKING, Literal

from fedpeft.data.types import Example

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

Scheme = Literal["iid", "dirichlet", "natural"]


def make_partitioner(
    scheme: Scheme,
    num_partitions: int,
    *,
    label_column: str = "label",
    alpha: float = 0.5,
    natural_column: str = "client_id",
    min_partition_size: int = 2,
    seed: int = 0,
) -> Partitioner:
    """Build the flwr-datasets partitioner for ``scheme``."""
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, NaturalIdPartitioner

    if scheme == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if scheme == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by=label_column,
            alpha=alpha,
            min_partition_size=min_partition_size,
            self_balancing=True,
            seed=seed,
        )
    if scheme == "natural":
        return NaturalIdPartitioner(partition_by=natural_column)
    raise ValueError(f"unknown partition scheme {scheme!r}")


def partition_examples(
    examples: list[Example],
    num_partitions: int,
    scheme: Scheme = "iid",
    *,
    label_column: str = "label",
    alpha: float = 0.5,
    natural_column: str = "client_id",
    min_partition_size: int = 2,
    seed: int = 0,
) -> list[list[Example]]:
    """Split ``examples`` into ``num_partitions`` client shards.

    For ``scheme="natural"`` the number of partitions is the number of distinct values of ``natural_column``
    and ``num_partitions`` is ignored; partitions come back sorted by that value.
    """
    if not examples:
        return [[] for _ in range(num_partitions)]
    if scheme == "iid":
        # IidPartitioner shards in order; shuffle first so shards do not follow the generation order.
        examples = list(examples)
        random.Random(seed).shuffle(examples)
    import datasets

    dataset = datasets.Dataset.from_list(examples)
    partitioner = make_partitioner(
        scheme,
        num_partitions,
        label_column=label_column,
        alpha=alpha,
        natural_column=natural_column,
        min_partition_size=min_partition_size,
        seed=seed,
    )
    partitioner.dataset = dataset
    if scheme == "natural":
        # The partitioner draws a tqdm progress bar while it indexes the rows (on the first load_partition).
        with contextlib.redirect_stderr(io.StringIO()):
            _ = partitioner.num_partitions  # builds the id map
            ids = partitioner.partition_id_to_natural_id
            order = sorted(ids, key=lambda pid: str(ids[pid]))
            return [partitioner.load_partition(pid).to_list() for pid in order]
    return [partitioner.load_partition(pid).to_list() for pid in range(partitioner.num_partitions)]


def split_train_test(examples: list[Example], test_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Shuffle with ``seed`` and cut off ``test_fraction`` (at least one example each side when possible)."""
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    n_test = round(len(shuffled) * test_fraction)
    if len(shuffled) >= 2:
        n_test = min(max(n_test, 1), len(shuffled) - 1)
    return shuffled[n_test:], shuffled[:n_test]
