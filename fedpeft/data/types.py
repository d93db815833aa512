"""The in-memory shape of a federated dataset.

Examples are plain dicts so they pickle cheaply and cross process boundaries (Flower, Ray):
- classification: ``{"text": str, "text_pair": str | None, "label": int, "group": str}``
- generation:     ``{"prompt": str, "response": str, "group": str}``
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, SupportsIndex

from fedpeft.core.errors import UserError

Example = dict[str, Any]
TaskKind = Literal["classification", "generation"]
POOLS = ("seen", "unseen")


class RemoteExamples(list[Example]):
    """A client's examples that live on its site, not in this process: their number is known (weights, update
    checks, summaries), and reading one is an error that says where they are (site-local data, ``data.sites``)."""

    def __init__(self, size: int, where: str) -> None:
        super().__init__()
        self.size = size
        self.where = where

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def _refuse(self) -> NoReturn:
        raise RuntimeError(f"the examples of {self.where} stay on its site; only its node reads them")

    def __iter__(self) -> Iterator[Example]:
        self._refuse()

    def __getitem__(self, index: SupportsIndex | slice) -> NoReturn:
        self._refuse()

    def __repr__(self) -> str:
        return f"RemoteExamples({self.size}, {self.where!r})"


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
        info: descriptive facts reported in the summary (group sizes, resource levels, generator settings): values
            JSON holds, as the synthetic-data cache writes them.
    """

    name: str
    task: TaskKind
    label_names: list[str] | None
    groups: list[str]
    clients: list[ClientData]
    base_train: list[Example] = field(default_factory=list)
    info: Mapping[str, object] = field(default_factory=dict)
    _positions: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_labels(self) -> int:
        return len(self.label_names or [])

    def pool(self, name: str) -> list[ClientData]:
        """Clients of one pool (``"seen"``, ``"unseen"``) or all of them (``"all"``)."""
        if name == "all":
            return list(self.clients)
        return [c for c in self.clients if c.pool == name]

    def client(self, client_id: str) -> ClientData:
        """The client ``client_id`` (a dict look-up: an index of the clients, built again where they changed).

        Raises:
            KeyError: no client has that id.
        """
        # getattr: a federation unpickled from a cache written before the index existed has no ``_positions``
        position = getattr(self, "_positions", {}).get(client_id)
        if position is None or position >= len(self.clients) or self.clients[position].client_id != client_id:
            self._positions = {c.client_id: i for i, c in enumerate(self.clients)}
            position = self._positions.get(client_id)
        if position is None:
            raise KeyError(client_id)
        return self.clients[position]

    @property
    def site_local(self) -> bool:
        """Whether the clients' examples live on their sites (the server's view of site-local data)."""
        return any(isinstance(c.train, RemoteExamples) for c in self.clients)

    def corpus(self) -> list[str]:
        """Every text of the federation (for training a tokenizer)."""
        if self.site_local:
            raise UserError(
                "The model's tokenizer is trained on the dataset's texts, which stay on their sites with data.sites; "
                "use a model with its own tokenizer (a hub id, a local checkpoint or minilm)."
            )
        texts: list[str] = []
        for ex in self.base_train + [e for c in self.clients for e in c.train + c.test]:
            for key in ("text", "text_pair", "prompt", "response"):
                if ex.get(key):
                    texts.append(ex[key])
        return texts
