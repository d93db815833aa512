"""Label-skewed clients whose test split follows their own label distribution (personalized CIFAR-100 style)."""

from __future__ import annotations

import warnings

import numpy as np

from fedpeft.core.errors import UserError
from fedpeft.data.partition import partition_examples
from fedpeft.data.types import Example


def label_skewed_clients(
    train: list[Example], test: list[Example], num_clients: int, scheme: str, alpha: float, seed: int, where: str
) -> list[tuple[list[Example], list[Example]]]:
    """Split train and test examples over clients together (each client's test follows its own labels).

    Only (index, label) rows go through the partitioner, so images are never copied into arrow tables.
    """
    rows = [{"index": i, "label": int(ex["label"])} for i, ex in enumerate(train + test)]
    np.random.default_rng(seed).shuffle(rows)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the Dirichlet partitioner warns on every re-draw
            shards = partition_examples(rows, num_clients, scheme, alpha=alpha, seed=seed)  # type: ignore[arg-type]
    except ValueError as err:
        raise UserError(
            f"{where}: {len(rows)} images cannot be split over {num_clients} clients ({err}); use fewer clients, "
            "more images per client or a larger data.dirichlet_alpha."
        ) from None
    pool = train + test
    result = []
    for shard in shards:
        indices = [row["index"] for row in shard]
        client_train = [pool[i] for i in indices if i < len(train)]
        client_test = [pool[i] for i in indices if i >= len(train)]
        if not client_test and len(client_train) > 1:
            client_test.append(client_train.pop())
        result.append((client_train, client_test))
    return result
