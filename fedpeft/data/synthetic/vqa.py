"""``synthetic-vqa``: questions about small drawn images, four tasks per client (multi-modal FedMosaic setting).

Images are 16 x 16 RGB arrays with one to three shapes (square, circle, triangle, cross) on a background. Five
task types ask about them: ``color`` ("what color is the shape ?"), ``shape``, ``count`` (one to three shapes),
``position`` (left or right half) and ``size`` (big or small). Like ``synthetic-mosaic``, client i takes four
task types in rotation (``options.tasks_per_client``) that arrive one after another (``options.setting:
dynamic``, ``stage`` = task position) or mixed (``static``); each client also has its own visual domain (a
background tint and a palette of four of the six colours), so clients differ in what they see as well as in
what they are asked. Answers are one word. The base corpus (``base_samples``, default 400) mixes every task and
domain: the public data of alignment and distillation.
"""

from __future__ import annotations

import random
from typing import Literal

import numpy as np

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options
from fedpeft.data.partition import split_train_test
from fedpeft.data.synthetic.common import cached, rng_for
from fedpeft.data.synthetic.mosaic import client_tasks
from fedpeft.data.types import ClientData, Example, FederatedData

NAME = "synthetic-vqa"
SIZE = 16
COLORS = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 80, 230),
    "yellow": (235, 220, 50),
    "white": (245, 245, 245),
    "purple": (150, 60, 200),
}
SHAPES = ("square", "circle", "triangle", "cross")
TASK_TYPES = ("color", "shape", "count", "position", "size")
QUESTIONS = {
    "color": "what color is the shape ?",
    "shape": "what shape is this ?",
    "count": "how many shapes are there ?",
    "position": "is the shape on the left or the right ?",
    "size": "is the shape big or small ?",
}
NUMBERS = ("zero", "one", "two", "three")


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-vqa``."""

    num_clients: int = 10
    tasks_per_client: int = 4
    train_per_task: int = 60
    test_per_task: int = 15
    setting: Literal["dynamic", "static"] = "dynamic"


def shape_mask(shape: str, size: int, top: int, left: int) -> np.ndarray:
    """A boolean SIZE x SIZE mask of ``shape`` in the ``size`` x ``size`` box at (top, left)."""
    rows, cols = np.mgrid[0:size, 0:size]
    if shape == "square":
        box = np.ones((size, size), bool)
    elif shape == "circle":
        centre = (size - 1) / 2
        box = (rows - centre) ** 2 + (cols - centre) ** 2 <= (size / 2) ** 2
    elif shape == "triangle":
        box = np.abs(cols - (size - 1) / 2) <= rows / 2
    elif shape == "cross":
        middle = size // 2
        box = (np.abs(rows - middle) <= max(size // 6, 0)) | (np.abs(cols - middle) <= max(size // 6, 0))
    else:
        raise ValueError(f"unknown shape {shape!r}")
    mask = np.zeros((SIZE, SIZE), bool)
    mask[top : top + size, left : left + size] = box
    return mask


def draw(
    rng: random.Random, background: tuple[int, int, int], shapes: list[tuple[str, str, int, int, int]]
) -> np.ndarray:
    """An image: noisy ``background`` with (shape, colour, size, top, left) shapes painted on it."""
    noise = np.array([[rng.randint(-12, 12) for _ in range(SIZE)] for _ in range(SIZE)])[..., None]
    image = np.clip(np.array(background)[None, None, :] + noise, 0, 255).astype(np.int16)
    for shape, color, size, top, left in shapes:
        image[shape_mask(shape, size, top, left)] = COLORS[color]
    return image.astype(np.uint8)


def make_question(rng: random.Random, task: str, palette: list[str], background: tuple[int, int, int]) -> Example:
    """One image with its question and one-word answer for ``task``."""
    count = rng.randint(1, 3) if task == "count" else 1
    big = rng.random() < 0.5
    size = 8 if big and count == 1 else 5
    color = rng.choice(palette)
    shape = rng.choice(SHAPES)
    shapes = []
    side = rng.choice(("left", "right"))
    slots = [(0, 0), (0, 8), (8, 0), (8, 8)]
    rng.shuffle(slots)
    for index in range(count):
        if count == 1:
            left = rng.randint(0, 8 - size) if side == "left" else rng.randint(8, SIZE - size)
            top = rng.randint(0, SIZE - size)
        else:
            top, left = slots[index][0] + rng.randint(0, 8 - size), slots[index][1] + rng.randint(0, 8 - size)
        shapes.append((shape, color, size, top, left))
    answer = {
        "color": color,
        "shape": shape,
        "count": NUMBERS[count],
        "position": side,
        "size": "big" if big else "small",
    }[task]
    return {"image": draw(rng, background, shapes), "prompt": QUESTIONS[task], "response": answer}


def _domain(seed: int, index: int) -> tuple[list[str], tuple[int, int, int]]:
    rng = rng_for(seed, "vqa-domain", index)
    palette = rng.sample(list(COLORS), 4)
    background = tuple(rng.randint(10, 90) for _ in range(3))
    return palette, background  # type: ignore[return-value]


def _generate(cfg: DataConfig) -> FederatedData:
    options = parse_options(cfg, Options)
    per_client = options.tasks_per_client
    if not 1 <= per_client <= len(TASK_TYPES):
        raise UserError(f"data.options.tasks_per_client must be between 1 and {len(TASK_TYPES)}.")
    dynamic = options.setting == "dynamic"
    clients = []
    tasks_of = {}
    for index in range(options.num_clients):
        client_id = f"client-{index:02d}"
        palette, background = _domain(cfg.seed, index)
        group = f"domain-{index:02d}"
        train: list[Example] = []
        test: list[Example] = []
        types = client_tasks(index, list(TASK_TYPES), per_client)
        for stage, task_type in enumerate(types):
            rng = rng_for(cfg.seed, "vqa", client_id, task_type)
            count = options.train_per_task + options.test_per_task
            rows = [
                {**make_question(rng, task_type, palette, background), "group": group, "task": task_type}
                for _ in range(count)
            ]
            fraction = options.test_per_task / count
            task_train, task_test = split_train_test(
                rows, fraction, derive_seed(cfg.seed, "split", client_id, task_type, stream="synthetic")
            )
            train += [{**ex, "stage": stage if dynamic else 0} for ex in task_train]
            test += [{**ex, "stage": stage if dynamic else 0} for ex in task_test]
        if not dynamic:
            rng_for(cfg.seed, "vqa-static", client_id).shuffle(train)
        tasks_of[client_id] = ", ".join(types)
        clients.append(ClientData(client_id, group, "seen", train, test))
    rng = rng_for(cfg.seed, "vqa-base")
    base_train = []
    for _ in range(cfg.base_samples if cfg.base_samples is not None else 400):
        palette, background = _domain(cfg.seed, rng.randrange(options.num_clients))
        task = rng.choice(TASK_TYPES)
        base_train.append({**make_question(rng, task, palette, background), "group": "public", "task": task})
    info = {
        "setting": options.setting,
        "tasks_per_client": per_client,
        "client_tasks": tasks_of,
        "image_size": SIZE,
        "public_examples": len(base_train),
    }
    return FederatedData(NAME, "generation", None, [c.group for c in clients], clients, base_train, info)


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) the ``synthetic-vqa`` federation described by ``cfg``.

    Args:
        cfg: ``seed``, ``base_samples`` (400); ``options``: ``num_clients`` (10), ``tasks_per_client`` (4),
            ``train_per_task`` (60), ``test_per_task`` (15), ``setting`` (dynamic | static).
    """
    return cached(NAME, cfg, _generate)
