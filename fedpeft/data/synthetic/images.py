"""``synthetic-images``: small generated images whose class is shape x colour x texture, with label skew.

Each image is ``image_size`` x ``image_size`` RGB (uint8): a noisy grey background and one shape (circle,
square, triangle, cross) of random size and position, filled in one colour (red, green, blue, yellow; each
drawn with jitter) and one texture (solid, or stripes of random width and direction): 4 x 4 x 2 = 32 classes,
so a model must see all three properties (no one of them decides the class). The pool of ``num_clients x
(train_per_group + test_per_group)`` images is split over clients by flwr-datasets' DirichletPartitioner
(``dirichlet_alpha``, 0.5) with train and test partitioned together, so each client's test split follows its own
label distribution, as in the paper's personalized CIFAR-100. The base corpus (the tiny ViT's base stage) is a
separate, class-balanced set (``base_samples``, 20 per class).
"""

from __future__ import annotations

import numpy as np

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.label_skew import label_skewed_clients
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.synthetic.common import cached
from fedpeft.data.types import ClientData, Example, FederatedData

NAME = "synthetic-images"
SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = {"red": (200, 40, 40), "green": (40, 170, 60), "blue": (50, 70, 210), "yellow": (220, 200, 40)}
TEXTURES = ("solid", "stripes")
LABELS = [f"{c}-{t}-{s}" for s in SHAPES for c in COLOURS for t in TEXTURES]
DEFAULT_TRAIN, DEFAULT_TEST, BASE_PER_CLASS = 100, 50, 20


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-images``."""

    num_clients: int = 10
    image_size: int = 32


def _mask(shape: str, size: int, rng: np.random.Generator) -> np.ndarray:
    half = rng.uniform(0.2, 0.38) * size
    cy, cx = rng.uniform(half, size - half, 2)
    y, x = np.mgrid[0:size, 0:size].astype(float)
    dy, dx = y - cy, x - cx
    if shape == "circle":
        return dy**2 + dx**2 <= half**2
    if shape == "square":
        return (np.abs(dy) <= half * 0.85) & (np.abs(dx) <= half * 0.85)
    if shape == "triangle":
        return (dy <= half) & (dy >= -half) & (np.abs(dx) <= (dy + half) / 2)
    arm = half * 0.35
    return ((np.abs(dy) <= arm) & (np.abs(dx) <= half)) | ((np.abs(dx) <= arm) & (np.abs(dy) <= half))


def draw(label: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """One ``size`` x ``size`` x 3 uint8 image of class ``label`` (an index into :data:`LABELS`)."""
    colour, texture, shape = LABELS[label].split("-")
    image = rng.normal(128, 18, (size, size, 3))
    mask = _mask(shape, size, rng)
    if texture == "stripes":
        width = int(rng.integers(2, 4))
        y, x = np.mgrid[0:size, 0:size]
        mask &= ((y if rng.random() < 0.5 else x) // width) % 2 == 0
    rgb = np.asarray(COLOURS[colour], float) + rng.normal(0, 15, 3)
    image[mask] = rgb + rng.normal(0, 10, (int(mask.sum()), 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _examples(labels: np.ndarray, size: int, rng: np.random.Generator, group: str) -> list[Example]:
    return [{"image": draw(int(y), size, rng), "label": int(y), "group": group} for y in labels]


def _generate(cfg: DataConfig) -> FederatedData:
    options = parse_options(cfg, Options)
    num_clients, size = options.num_clients, options.image_size
    if num_clients < 1 or not 16 <= size <= 512:
        raise UserError("data.options.num_clients must be at least 1 and image_size between 16 and 512.")
    if cfg.partition == "natural":
        raise UserError(f"{NAME} has no natural client ids; set data.partition to dirichlet or iid.")
    n_train = int(setting(cfg, "train_per_group", DEFAULT_TRAIN))
    n_test = int(setting(cfg, "test_per_group", DEFAULT_TEST))
    rng = np.random.default_rng(derive_seed(cfg.seed, NAME, "pool", stream="synthetic"))
    train = _examples(rng.integers(0, len(LABELS), n_train * num_clients), size, rng, "pool")
    test = _examples(rng.integers(0, len(LABELS), n_test * num_clients), size, rng, "pool")
    shards = label_skewed_clients(
        train,
        test,
        num_clients,
        cfg.partition,
        cfg.dirichlet_alpha,
        derive_seed(cfg.seed, NAME, "split", stream="synthetic"),
        NAME,
    )
    clients = []
    for index, (client_train, client_test) in enumerate(shards):
        group = f"client-{index:02d}"
        client_train = [{**ex, "group": group} for ex in client_train]
        client_test = [{**ex, "group": group} for ex in client_test]
        clients.append(ClientData(f"{group}", group, "seen", client_train, client_test))
    per_class = cfg.base_samples // len(LABELS) if cfg.base_samples is not None else BASE_PER_CLASS
    base_rng = np.random.default_rng(derive_seed(cfg.seed, NAME, "base", stream="synthetic"))
    base_train = _examples(np.repeat(np.arange(len(LABELS)), per_class), size, base_rng, "base")
    info = {
        "classes": f"{len(LABELS)} = {len(SHAPES)} shapes x {len(COLOURS)} colours x {len(TEXTURES)} textures",
        "label_skew": f"Dirichlet({cfg.dirichlet_alpha}) over labels, train and test partitioned together",
        "train_per_client": {c.group: len(c.train) for c in clients},
        "test_per_client": {c.group: len(c.test) for c in clients},
        "base_per_class": per_class,
    }
    groups = [c.group for c in clients]
    return FederatedData(NAME, "classification", list(LABELS), groups, clients, base_train, info)


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) ``synthetic-images``.

    Args:
        cfg: ``train_per_group`` / ``test_per_group`` (mean images per client, 100 / 50), ``dirichlet_alpha``
            (0.5), ``partition`` (dirichlet or iid), ``seed``, ``base_samples`` (20 per class); ``options``:
            ``num_clients`` (10), ``image_size`` (32).

    Returns:
        Image classification clients (group = client, so tables have a column per client) and the base corpus.
    """
    return cached(NAME, cfg, _generate)
