"""Instruction-tuning data shared by Dolly-15k, AlpaGasus and ``synthetic-instructions``: the Alpaca prompt
template and the split of a pool of categorized instructions over clients.

The split follows FLAME (paper 004): flwr-datasets' ``DirichletPartitioner`` over the instruction categories
(concentration ``alpha``, 5 or 0.5 in the paper) gives every client a shard with its own category mix (``iid``
spreads the examples evenly instead); then each client's shard is cut 80 / 10 / 10 into train, validation and
test, so a client's test split has its own category mix. The validation split is not used by the methods; its
size is reported. Client ids are ``client-00``, ``client-01``, ...: the number at the end assigns compute tiers
round-robin (see :mod:`fedpeft.methods.families.tiered`). A client's group is its most frequent category.
"""

from __future__ import annotations

import warnings
from collections import Counter

from fedpeft.core.errors import UserError
from fedpeft.data.partition import partition_examples, split_train_test
from fedpeft.data.types import ClientData, Example

PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
SPLIT = (0.8, 0.1, 0.1)


def alpaca_prompt(instruction: str, context: str | None = None) -> str:
    """The Alpaca prompt of an instruction and its optional input (context)."""
    if context and context.strip():
        return PROMPT_WITH_INPUT.format(instruction=instruction.strip(), input=context.strip())
    return PROMPT_NO_INPUT.format(instruction=instruction.strip())


def instruction_example(instruction: str, context: str | None, response: str, category: str) -> Example:
    """A generation example (``prompt`` in the Alpaca template, ``response``, ``group`` = category)."""
    return {"prompt": alpaca_prompt(instruction, context), "response": response.strip(), "group": category}


def category_clients(
    examples: list[Example],
    num_clients: int,
    *,
    scheme: str,
    alpha: float,
    seed: int,
    split: tuple[float, float, float] = SPLIT,
    where: str = "the dataset",
) -> tuple[list[ClientData], dict[str, object]]:
    """Split categorized examples (``group`` = category) over ``num_clients`` clients, then 80/10/10 each.

    Returns the clients and facts for ``FederatedData.info`` (validation examples per client, category counts
    per client).
    """
    if scheme not in ("dirichlet", "iid"):
        raise UserError(f"{where} is split over categories; set data.partition to dirichlet or iid.")
    if num_clients < 1:
        raise UserError("data.options.num_clients must be at least 1.")
    rows = [{"index": i, "category": ex["group"]} for i, ex in enumerate(examples)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the partitioner warns whenever it resamples
            shards = partition_examples(
                rows,
                num_clients,
                "dirichlet" if scheme == "dirichlet" else "iid",
                label_column="category",
                alpha=alpha,
                seed=seed,
                min_partition_size=3,
            )
    except ValueError as err:
        raise UserError(
            f"Cannot split the {len(examples)} examples of {where} over {num_clients} clients ({err}); lower "
            "data.options.num_clients or raise data.dirichlet_alpha."
        ) from None
    clients: list[ClientData] = []
    validation: dict[str, int] = {}
    mix: dict[str, dict[str, int]] = {}
    train_share, val_share, _ = split
    for index, shard in enumerate(shards):
        client_id = f"client-{index:02d}"
        shard_examples = [examples[row["index"]] for row in shard]
        rest, test = split_train_test(shard_examples, 1.0 - train_share - val_share, seed + 7919 * (index + 1))
        train, val = split_train_test(rest, val_share / (train_share + val_share), seed + 104729 * (index + 1))
        counts = Counter(ex["group"] for ex in shard_examples)
        group = min(counts, key=lambda c: (-counts[c], c))
        clients.append(ClientData(client_id, group, "seen", train, test))
        validation[client_id] = len(val)
        mix[client_id] = dict(sorted(counts.items()))
    return clients, {"validation_examples": validation, "categories_per_client": mix}
