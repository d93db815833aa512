"""Named registries of methods, datasets and models, with loud failures and lazy imports.

An entry of a registry is either *registered*, its object attached at once (``@REGISTRY.register(name)`` or
``REGISTRY.add(name, obj)``), or *declared* (``REGISTRY.declare``), which costs nothing: its name, where its object
is (a module whose ``register`` call fills the declaration, or the object itself as ``module:Name``), a one-line
description, its aliases and, for a method, its config class and its reporting hooks as ``module:name``. ``get``
imports a declared entry's module on first use. Names, aliases, descriptions and membership come from the
declarations alone, so listing what exists imports no method, dataset or model code (nor torch); ``config_class``
imports only the module of a declared config class (a method's: ``fedpeft/methods/<name>_config.py``), so a config
is checked without torch too, and a report imports a declared hook without the method.

:data:`METHODS`, :data:`DATASETS` and :data:`MODELS` read their catalogue (``fedpeft.catalog.methods``,
``.datasets``, ``.models``: declarations only) on first use, so every shipped entry is known wherever the registry
is used, whatever has been imported, and then the entries installed packages declare through the entry-point
groups ``fedpeft.methods``, ``fedpeft.datasets`` and ``fedpeft.models`` (plugins). A config's ``plugins`` list
names modules to import before its methods are read (:func:`import_plugins`).
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedpeft.core.errors import UserError
from fedpeft.core.method_class import MethodClass

T = TypeVar("T")


Hook = str | Callable[..., object]
"""A reporting hook of a method: the function, or where it is as ``module:name`` (imported when it is called)."""


@dataclass(frozen=True)
class Entry:
    """What a registry knows of a name before (or without) importing it."""

    name: str
    module: str | None
    """The module to import for the object; None for an object registered directly (undeclared)."""
    description: str
    aliases: tuple[str, ...] = ()
    plugin: str | None = None
    """The distribution whose entry point declared it (its registration may add aliases); None for fedpeft's own."""
    config: str | None = None
    """Its config class as ``module:Name``, importable without importing ``module``; None: read off the object."""
    attribute: str | None = None
    """The object's name in ``module`` (declared as ``module:Name``); None: ``module``'s ``register`` call gives it."""
    report_sections: Hook | None = None
    """A method's ``report_sections`` hook: (records, run_dirs) -> markdown blocks of ``summary.md``."""
    report_plots: Hook | None = None
    """A method's ``report_plots`` hook: (records, run_dirs, out_dir) -> the plot files it wrote."""


class Registry(Generic[T]):
    """A name -> object map that refuses duplicates, explains unknown names and imports declared entries lazily.

    Args:
        kind: what the entries are, for messages ("method").
        catalog: a module of ``declare`` calls read on first use of the registry, or None.
        entry_points: the entry-point group through which installed packages declare entries of their own
            (plugins): each entry point ``name = module`` declares ``name`` as registered by importing ``module``.
        config_of: the config class of a registered object (for :meth:`config_class` where no config is declared);
            None: the entries have no config class.
    """

    def __init__(
        self,
        kind: str,
        *,
        catalog: str | None = None,
        entry_points: str | None = None,
        config_of: Callable[[T], type] | None = None,
    ) -> None:
        self.kind = kind
        self._config_of = config_of
        self._group = entry_points
        self._catalog = catalog
        self._catalog_done = catalog is None
        self._catalog_loading = False
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._objects: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    # -------------------------------------------------------------------------------------------- filling

    def declare(
        self,
        name: str,
        module: str,
        description: str,
        *,
        aliases: tuple[str, ...] = (),
        config: str | None = None,
        report_sections: str | None = None,
        report_plots: str | None = None,
    ) -> None:
        """Declare ``name`` without importing anything: ``module`` is the module whose import registers it (with
        exactly these aliases), or ``module:Name``, the object itself, which ``get`` reads there. ``config``
        (``module:Name``) names its config class where it is known without importing ``module``; a method's
        ``report_sections`` and ``report_plots`` (``module:name``) name its reporting hooks (:class:`Entry`)."""
        for what, reference in (
            ("config", config),
            ("report_sections", report_sections),
            ("report_plots", report_plots),
        ):
            if reference is not None and not _is_reference(reference):
                raise ValueError(
                    f"the {what} of {self.kind} {name!r} must be given as 'module:Name', not {reference!r}"
                )
        module, _, attribute = module.partition(":")
        self._load_catalog()
        with self._lock:
            self._claim(name, aliases)
            self._entries[name] = Entry(
                name,
                module,
                description,
                tuple(aliases),
                config=config,
                attribute=attribute or None,
                report_sections=report_sections,
                report_plots=report_plots,
            )
            for alias in aliases:
                self._aliases[alias] = name

    def register(
        self,
        name: str,
        *,
        aliases: tuple[str, ...] = (),
        description: str = "",
        report_sections: Hook | None = None,
        report_plots: Hook | None = None,
    ) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` (and optional aliases); a method's reporting hooks with it."""

        def decorator(obj: T) -> T:
            self.add(
                name,
                obj,
                aliases=aliases,
                description=description,
                report_sections=report_sections,
                report_plots=report_plots,
            )
            return obj

        return decorator

    def add(
        self,
        name: str,
        obj: T,
        *,
        aliases: tuple[str, ...] = (),
        description: str = "",
        report_sections: Hook | None = None,
        report_plots: Hook | None = None,
    ) -> None:
        """Register ``obj`` under ``name``: it fills the declaration of ``name`` or becomes a new entry.

        Raises:
            ValueError: ``name`` or an alias is taken (registered, or declared for another name), or the aliases
                differ from the declared ones.
        """
        self._load_catalog()
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None and entry.plugin is not None and name not in self._objects:
                self._objects[name] = obj  # a plugin's entry point names the module, its register call the rest
                self._entries[name] = dataclasses.replace(
                    entry,
                    description=description,
                    aliases=tuple(aliases),
                    report_sections=report_sections,
                    report_plots=report_plots,
                )
                for alias in aliases:
                    self._claim(alias, ())
                    self._aliases[alias] = name
                return
            if entry is not None and entry.module is not None and name not in self._objects:
                if set(aliases) != set(entry.aliases):
                    raise ValueError(
                        f"{self.kind} {name!r} is registered with aliases {sorted(aliases)} but declared (by "
                        f"{entry.module}) with {sorted(entry.aliases)}; make the catalogue and the registration agree"
                    )
                self._objects[name] = obj
                return
            self._claim(name, aliases)
            self._entries[name] = Entry(
                name, None, description, tuple(aliases), report_sections=report_sections, report_plots=report_plots
            )
            self._objects[name] = obj
            for alias in aliases:
                self._aliases[alias] = name

    def _claim(self, name: str, aliases: tuple[str, ...]) -> None:
        if len(set(aliases) | {name}) != len(aliases) + 1:
            raise ValueError(f"{self.kind} {name!r} repeats a name among its aliases {list(aliases)}")
        for key in (name, *aliases):
            if key in self._entries or key in self._aliases:
                raise ValueError(f"{self.kind} {key!r} is already registered")

    def _load_catalog(self) -> None:
        if self._catalog_done:
            return
        with self._lock:  # the catalogue's own declare calls re-enter here while it loads
            if self._catalog_done or self._catalog_loading:
                return
            self._catalog_loading = True
            try:
                importlib.import_module(str(self._catalog))
                self._declare_plugins()
                self._catalog_done = True
            finally:
                self._catalog_loading = False

    def _declare_plugins(self) -> None:
        """Declare the entries installed packages publish under this registry's entry-point group."""
        if self._group is None:
            return
        from importlib.metadata import entry_points

        for point in entry_points(group=self._group):
            if point.name in self._entries or point.name in self._aliases:
                raise UserError(
                    f"The plugin {point.value!r} declares the {self.kind} {point.name!r}, which already exists; "
                    "rename it in the plugin's entry points."
                )
            dist = point.dist.name if point.dist is not None else point.value
            self._entries[point.name] = Entry(point.name, point.module, f"(plugin: {dist})", (), dist)

    # -------------------------------------------------------------------------------------------- looking up

    def canonical(self, name: str) -> str:
        """The registered name behind ``name`` (resolving aliases)."""
        self._load_catalog()
        if name in self._entries:
            return name
        if name in self._aliases:
            return self._aliases[name]
        known = ", ".join(sorted(self._entries))
        raise UserError(f"Unknown {self.kind} {name!r}; choose one of: {known}.")

    def get(self, name: str) -> T:
        """The object of ``name`` (or an alias), importing the module that registers it (or holds it) on first use."""
        name = self.canonical(name)
        if name not in self._objects:
            entry = self._entries[name]
            module = importlib.import_module(str(entry.module))
            with self._lock:
                if entry.attribute is not None and name not in self._objects:
                    if entry.attribute not in vars(module):
                        raise LookupError(
                            f"the {self.kind} {name!r} is declared as {entry.module}:{entry.attribute}, which does not "
                            "exist; fix its declaration"
                        )
                    self._objects[name] = vars(module)[entry.attribute]
            if name not in self._objects:
                raise LookupError(
                    f"{entry.module} is declared to register the {self.kind} {name!r}, but importing it did not; "
                    "fix its register call or its declaration"
                )
        return self._objects[name]

    def config_class(self, name: str) -> type:
        """The config class of ``name`` (or an alias): imported from the module its declaration names, without
        importing the module that registers ``name``; else (no config declared) read off the registered object,
        which imports that module.

        Raises:
            UserError: nothing is registered or declared as ``name``.
            LookupError: the registry has no config classes, or the declared one does not exist.
        """
        entry = self.entry(name)
        if entry.config is not None:
            found = imported(entry.config)
            if not isinstance(found, type):
                raise LookupError(
                    f"the {self.kind} {entry.name!r} declares the config {entry.config}, which is no class"
                )
            return found
        if self._config_of is None:
            raise LookupError(f"a {self.kind} has no config class")
        return self._config_of(self.get(entry.name))

    def describe(self, name: str) -> str:
        """The one-line description of ``name`` (or an alias); empty if it was registered without one."""
        return self._entries[self.canonical(name)].description

    def entry(self, name: str) -> Entry:
        """The declaration (or registration) of ``name`` (or an alias), without importing anything."""
        return self._entries[self.canonical(name)]

    def names(self) -> list[str]:
        """Every registered or declared name, sorted (aliases left out), from the declarations alone."""
        self._load_catalog()
        return sorted(self._entries)

    def aliases_of(self, name: str) -> list[str]:
        """The aliases of the canonical ``name``, sorted (empty for an alias or an unknown name)."""
        self._load_catalog()
        return sorted(a for a, n in self._aliases.items() if n == name)

    def __contains__(self, name: object) -> bool:
        self._load_catalog()
        return name in self._entries or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def imported(reference: str) -> object:
    """What ``module:name`` names, importing ``module``; None where ``module`` has no ``name``."""
    module, _, attribute = reference.partition(":")
    return vars(importlib.import_module(module)).get(attribute)


def _is_reference(text: str) -> bool:
    """Whether ``text`` has the form ``module:Name``."""
    module, colon, attribute = text.partition(":")
    return bool(colon) and all(part.isidentifier() for part in module.split(".")) and attribute.isidentifier()


def _method_config(cls: MethodClass) -> type:
    return cls.Config


METHODS: Registry[MethodClass] = Registry(
    "method", catalog="fedpeft.catalog.methods", entry_points="fedpeft.methods", config_of=_method_config
)
# Dataset builders (DataConfig -> FederatedData) and model specs are types of the layers above core.
DATASETS: Registry[Any] = Registry("dataset", catalog="fedpeft.catalog.datasets", entry_points="fedpeft.datasets")
MODELS: Registry[Any] = Registry("model", catalog="fedpeft.catalog.models", entry_points="fedpeft.models")


def import_plugins(modules: list[str]) -> None:
    """Import the ``plugins`` modules of a config, whose ``register`` calls add methods, datasets or models."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise UserError(
                f"The plugin module {module!r} could not be imported ({err}); install it or fix `plugins`."
            ) from None
