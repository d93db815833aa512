"""Named registries of methods, datasets, models and presets, with loud failures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from fedpeft.core.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object map that refuses duplicates and explains unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *, aliases: tuple[str, ...] = ()) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` (and optional aliases)."""

        def decorator(obj: T) -> T:
            self.add(name, obj, aliases=aliases)
            return obj

        return decorator

    def add(self, name: str, obj: T, *, aliases: tuple[str, ...] = ()) -> None:
        for key in (name, *aliases):
            if key in self._items or key in self._aliases:
                raise ValueError(f"{self.kind} {key!r} is already registered")
        self._items[name] = obj
        for alias in aliases:
            self._aliases[alias] = name

    def canonical(self, name: str) -> str:
        """The registered name behind ``name`` (resolving aliases)."""
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        known = ", ".join(sorted(self._items))
        raise UserError(f"Unknown {self.kind} {name!r}; choose one of: {known}.")

    def get(self, name: str) -> T:
        return self._items[self.canonical(name)]

    def names(self) -> list[str]:
        return sorted(self._items)

    def aliases_of(self, name: str) -> list[str]:
        return sorted(a for a, n in self._aliases.items() if n == name)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


METHODS: Registry = Registry("method")
DATASETS: Registry = Registry("dataset")
MODELS: Registry = Registry("model")
