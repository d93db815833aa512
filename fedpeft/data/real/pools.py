"""Client pools of the real classification datasets: seen and unseen pools, and their split over clients."""

from __future__ import annotations

import random
import warnings
from typing import TYPE_CHECKING, Literal

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.seeds import derive_seed
from fedpeft.data.partition import partition_examples
from fedpeft.data.types import POOLS, ClientData, Example

if TYPE_CHECKING:
    import datasets


def draw_pools(
    ds: datasets.Dataset, labels: list[int | None], n_pools: int, per_pool: int, seed: int
) -> list[list[tuple[dict[str, object], int]]]:
    """``n_pools`` disjoint random blocks of ``per_pool`` labelled rows (row dict, label id)."""
    valid = [i for i, label in enumerate(labels) if label is not None]
    random.Random(seed).shuffle(valid)
    blocks = []
    for p in range(n_pools):
        chosen = valid[p * per_pool : (p + 1) * per_pool]
        rows = ds.select(chosen).to_list() if chosen else []
        blocks.append([(row, int(labels[i] or 0)) for row, i in zip(rows, chosen, strict=True)])
    return blocks


def classification_scheme(cfg: DataConfig, title: str) -> Literal["dirichlet", "iid"]:
    """``cfg.partition`` for a dataset without natural client ids."""
    if cfg.partition == "natural":
        raise UserError(
            f"data.partition=natural needs natural client ids, which {title} does not have; "
            "use dirichlet (label skew) or iid."
        )
    return cfg.partition


def active_pools(cfg: DataConfig) -> tuple[str, ...]:
    """``("seen", "unseen")``, or only ``("seen",)`` when ``cfg.unseen_pool`` is off."""
    return POOLS if cfg.unseen_pool else ("seen",)


def partition_pool(
    train: list[Example],
    test: list[Example],
    num_clients: int,
    scheme: Literal["dirichlet", "iid"],
    alpha: float,
    seed: int,
    where: str,
) -> list[tuple[list[Example], list[Example]]]:
    """Split one group's pool over ``num_clients`` clients, each with its own train and test examples.

    Train and test examples are partitioned together, so every client's test set follows the label
    distribution of its training set (roughly ``len(test) / (len(train) + len(test))`` of its samples are
    test samples). A client left without test (or train) samples gets one moved over from the other side.
    """
    total = len(train) + len(test)
    if total < 2 * num_clients:
        raise UserError(
            f"{where} has {total} samples, too few for {num_clients} clients with at least 2 each; "
            "lower data.clients_per_group or use more samples per group."
        )
    marked = [{**e, "_split": "train"} for e in train] + [{**e, "_split": "test"} for e in test]
    # The Dirichlet partitioner cuts each class's rows in order: shuffle so train and test interleave.
    random.Random(seed).shuffle(marked)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # flwr warns on every Dirichlet re-draw
        try:
            shards = partition_examples(marked, num_clients, scheme, alpha=alpha, seed=seed, min_partition_size=2)
        except ValueError as err:
            raise UserError(
                f"{where} ({total} samples) could not be split over {num_clients} clients with at least "
                f"2 samples each under Dirichlet alpha {alpha}; lower data.clients_per_group, raise "
                "data.dirichlet_alpha or use more samples per group."
            ) from err
    rng = random.Random(seed + 1)
    result = []
    for shard in shards:
        client_train = [_unmark(e) for e in shard if e["_split"] == "train"]
        client_test = [_unmark(e) for e in shard if e["_split"] == "test"]
        if not client_test and len(client_train) >= 2:
            client_test.append(client_train.pop(rng.randrange(len(client_train))))
        if not client_train and len(client_test) >= 2:
            client_train.append(client_test.pop(rng.randrange(len(client_test))))
        result.append((client_train, client_test))
    return result


def _unmark(example: Example) -> Example:
    return {k: v for k, v in example.items() if k != "_split"}


def build_classification_clients(
    pools: dict[str, dict[str, tuple[list[Example], list[Example]]]],
    num_clients: int,
    cfg: DataConfig,
    scheme: Literal["dirichlet", "iid"],
    title: str,
) -> list[ClientData]:
    """Clients ``"<group>-<pool>-<index:02d>"`` for every group and pool of ``pools[group][pool]``."""
    clients: list[ClientData] = []
    for pool in POOLS:
        for group, by_pool in pools.items():
            if pool not in by_pool:
                continue
            train, test = by_pool[pool]
            shards = partition_pool(
                train,
                test,
                num_clients,
                scheme,
                cfg.dirichlet_alpha,
                derive_seed(cfg.seed, title, group, pool, "partition", stream="files"),
                f"The {title} {group} {pool} pool",
            )
            for index, (client_train, client_test) in enumerate(shards):
                clients.append(ClientData(f"{group}-{pool}-{index:02d}", group, pool, client_train, client_test))
    return clients
