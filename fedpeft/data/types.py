"""The in-memory shape of a federated dataset.

Examples are plain dicts so they pickle cheaply and cross process boundaries (Flower, Ray):
- classification: ``{"text": str, "text_pair": str | None, "label": int, "group": str}``
- generation:     ``{"prompt": str, "response": str, "group": str}``
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Example = dict[str, Any]
TaskKind = Literal["classification", "generation"]
POOLS = ("seen", "unseen")


@dataclass
class ClientData:
    """One client's local data.

    Attributes:
        client_id: stable identifier (``"<group>-<pool>-<index>"`` for synthetic data, the natural id otherwise).
        group: the client's group (language or task) used for per-group tables; for clients with several
            languages, the predominant one.
        pool: ``"seen"`` (takes part in federated training) or ``"unseen"`` (evaluated only).
        train: training examples.
        test: test examples.
    """

    client_id: str
    group: str
    pool: str
    train: list[Example]
    test: list[Example]


@dataclass
class FederatedData:
    """A whole federation: every client of every pool plus the corpus of the base-model stage.

    Attributes:
        name: dataset registry name.
        task: ``"classification"`` or ``"generation"``.
        label_names: class names for classification, ``None`` for generation.
        groups: every group (language or task), in display order.
        clients: every client of every pool.
        base_train: examples of the base-model stage (the "pretraining" corpus, with the resource imbalance of the
            real pretrained models); empty when the benchmark has none.
        info: descriptive facts reported in the summary (group sizes, resource levels, generator settings).
    """

    name: str
    task: TaskKind
    label_names: list[str] | None
    groups: list[str]
    clients: list[ClientData]
    base_train: list[Example] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_labels(self) -> int:
        return len(self.label_names or [])

    def pool(self, name: str) -> list[ClientData]:
        """Clients of one pool (``"seen"``, ``"unseen"``) or all of them (``"all"``)."""
        if name == "all":
            return list(self.clients)
        return [c for c in self.clients if c.pool == name]

    def client(self, client_id: str) -> ClientData:
        for c in self.clients:
            if c.client_id == client_id:
                return c
        raise KeyError(client_id)

    def corpus(self) -> list[str]:
        """Every text of the federation (for training a tokenizer)."""
        texts: list[str] = []
        for ex in self.base_train + [e for c in self.clients for e in c.train + c.test]:
            for key in ("text", "text_pair", "prompt", "response"):
                if ex.get(key):
                    texts.append(ex[key])
        return texts
