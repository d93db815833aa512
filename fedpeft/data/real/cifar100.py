"""CIFAR-100 split over clients with Dirichlet label skew, each client's test split following its own labels.

The personalized CIFAR-100 of Potara (paper 001): images of the train and test splits are pooled per split and
partitioned together by flwr-datasets' DirichletPartitioner over the 100 fine labels (``dirichlet_alpha``), so a
client's test images follow the label distribution of its training images. Read from ``data.path`` (a
``DatasetDict.save_to_disk`` directory, or ``train`` / ``test`` files with an image column ``img`` or ``image`` and
a label column ``fine_label`` or ``label``; images as PNG/JPEG bytes, ``{"bytes": ...}`` structs or arrays) or
from ``data.hub_id`` (default ``uoft-cs/cifar100``). Examples hold the image as a 32 x 32 x 3 uint8 array; the
model's image processor resizes it (224 x 224 for ViT-B/16).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.label_skew import label_skewed_clients
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.real.sources import (
    check_hub_splits,
    check_local_splits,
    load_hub_splits,
    load_local_splits,
    require_directory,
)
from fedpeft.data.types import ClientData, Example, FederatedData

if TYPE_CHECKING:
    import datasets

DEFAULT_HUB_ID = "uoft-cs/cifar100"
IMAGE_COLUMNS = ("img", "image")
LABEL_COLUMNS = ("fine_label", "label")
EXPECTED = "an image column (img or image) and a label column (fine_label or label)"


class Options(DatasetOptions):
    """``data.options`` of ``cifar100``."""

    num_clients: int = 10
    revision: str | None = None


LAYOUT = (
    "<path> saved with DatasetDict.save_to_disk, or <path>/{train,test}.{parquet,jsonl,...} with an image column "
    "(img or image) and a label column (fine_label or label)"
)


def to_array(value: object) -> np.ndarray:
    """An image cell (PIL image, ``{"bytes": ...}``, raw bytes or nested lists) as an H x W x 3 uint8 array."""
    from PIL import Image

    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        value = Image.open(io.BytesIO(value))
    elif isinstance(value, str):
        value = Image.open(value)
    if isinstance(value, Image.Image):
        value = value.convert("RGB")
    array = np.asarray(value, dtype=np.uint8)
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    return array


def _split_examples(ds: datasets.Dataset, count: int, seed: int, where: str) -> tuple[list[Example], list[str] | None]:
    image_column = next((c for c in IMAGE_COLUMNS if c in ds.column_names), None)
    label_column = next((c for c in LABEL_COLUMNS if c in ds.column_names), None)
    if image_column is None or label_column is None:
        raise UserError(f"{where} needs {EXPECTED}.")
    feature = ds.features.get(label_column)
    names = list(feature.names) if hasattr(feature, "names") else None
    order = np.random.default_rng(seed).permutation(len(ds))[: min(count, len(ds))]
    rows = ds.select(order.tolist())
    examples = [
        {"image": to_array(row[image_column]), "label": int(row[label_column]), "group": "pool"} for row in rows
    ]
    return examples, names


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading an image: the options, the directory, its split files
    and their columns (or, offline, a hub id the ``datasets`` cache lacks)."""
    _options(cfg)
    schema = (IMAGE_COLUMNS, LABEL_COLUMNS)
    if cfg.path:
        folder = require_directory(cfg.path, LAYOUT)
        check_local_splits(folder, ("train", "test"), "CIFAR-100", LAYOUT, [schema], EXPECTED)
    else:
        check_hub_splits(cfg.hub_id or DEFAULT_HUB_ID, None, ("train", "test"), [schema], EXPECTED)


def _options(cfg: DataConfig) -> Options:
    opts = parse_options(cfg, Options)
    if opts.num_clients < 1:
        raise UserError("data.options.num_clients must be at least 1.")
    if cfg.partition == "natural":
        raise UserError("CIFAR-100 has no natural client ids; set data.partition to dirichlet or iid.")
    return opts


@DATASETS.register("cifar100")
def build(cfg: DataConfig) -> FederatedData:
    """Build personalized CIFAR-100 from ``cfg.path`` or ``cfg.hub_id``.

    Args:
        cfg: ``train_per_group`` / ``test_per_group``: mean images per client (default: the whole splits,
            50,000 / 10,000, divided by the number of clients), ``dirichlet_alpha`` (0.5), ``partition``,
            ``seed``; ``options``: ``num_clients`` (10), ``revision``.

    Returns:
        Clients ``client-00`` ... (group = client, so tables have a column per client), no base corpus.
    """
    opts = _options(cfg)
    num_clients = opts.num_clients
    if cfg.path:
        path = require_directory(cfg.path, LAYOUT)
        splits, _ = load_local_splits(path, ("train", "test"), LAYOUT)
        source = str(path)
    else:
        source = cfg.hub_id or DEFAULT_HUB_ID
        splits = load_hub_splits(source, None, ("train", "test"), opts.revision)
    sizes = {
        split: per_client * num_clients if per_client is not None else len(splits[split])
        for split, per_client in (
            ("train", setting(cfg, "train_per_group", None)),
            ("test", setting(cfg, "test_per_group", None)),
        )
    }
    train, names = _split_examples(
        splits["train"], sizes["train"], derive_seed(cfg.seed, "cifar", "train", stream="files"), "train"
    )
    test, _ = _split_examples(
        splits["test"], sizes["test"], derive_seed(cfg.seed, "cifar", "test", stream="files"), "test"
    )
    label_names = names or [str(i) for i in range(100)]
    shards = label_skewed_clients(
        train,
        test,
        num_clients,
        cfg.partition,
        cfg.dirichlet_alpha,
        derive_seed(cfg.seed, "cifar", stream="files"),
        "CIFAR-100",
    )
    clients = []
    for index, (client_train, client_test) in enumerate(shards):
        group = f"client-{index:02d}"
        clients.append(
            ClientData(
                group,
                group,
                "seen",
                [{**ex, "group": group} for ex in client_train],
                [{**ex, "group": group} for ex in client_test],
            )
        )
    info = {
        "source": source,
        "label_skew": f"Dirichlet({cfg.dirichlet_alpha}) over the fine labels, train and test together",
        "train_per_client": {c.group: len(c.train) for c in clients},
        "test_per_client": {c.group: len(c.test) for c in clients},
    }
    return FederatedData("cifar100", "classification", label_names, [c.group for c in clients], clients, [], info)
