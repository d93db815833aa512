"""Which method class wrote a report's records, and the calls of its reporting hooks.

The classes come from the runs' ``config.yaml`` (``methods``: entries with ``name`` and optional ``label``, the
label defaulting to the name) looked up in :data:`fedpeft.core.registry.METHODS`. The report never builds a
method: it calls the class's reporting classmethods (``Method.report_sections``, ``Method.report_plots``). It
imports only the classes whose source may implement a hook (:func:`may_implement`): a report of methods without
hooks of their own imports no method, nor torch.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedpeft.core.errors import UserError
from fedpeft.report.records import Record, first_seen

if TYPE_CHECKING:
    from fedpeft.methods.base import Method

CONFIG_FILE = "config.yaml"


def config_method_entries(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """The ``methods`` entries of the runs' ``config.yaml``, in run and list order (a run without one gives none)."""
    import yaml

    entries = []
    for run_dir in run_dirs:
        config = Path(run_dir) / CONFIG_FILE
        if config.is_file():
            methods = (yaml.safe_load(config.read_text()) or {}).get("methods", [])
            entries += [dict(entry) for entry in methods if isinstance(entry, Mapping)]
    return entries


def method_class(name: Any) -> type[Method] | None:
    """The registered method class of ``name`` (or of an alias); ``None`` for a name that is not registered."""
    import fedpeft.methods  # noqa: F401  (registers the methods)
    from fedpeft.methods.base import method_class as registered_class

    try:
        return registered_class(str(name))
    except UserError:
        return None


def method_classes(run_dirs: Sequence[Path]) -> dict[str, type[Method]]:
    """``label -> method class`` of the runs' method entries with a registered name (others are skipped).

    A later entry replaces an earlier one of the same label, as a later run's records replace an earlier run's.
    """
    classes: dict[str, type[Method]] = {}
    for label, name in method_names(run_dirs).items():
        cls = method_class(name)
        if cls is not None:
            classes[label] = cls
    return classes


def method_names(run_dirs: Sequence[Path]) -> dict[str, str]:
    """``label -> method name`` of the runs' method entries (a later entry replaces an earlier one of its label)."""
    return {str(e.get("label") or e["name"]): str(e["name"]) for e in config_method_entries(run_dirs) if "name" in e}


# ----------------------------------------------------------------------------------------------------------
# Which classes may implement a hook, read from their source


_METHODS_PACKAGE = "fedpeft.methods"
_DEFAULT_HOOKS = "fedpeft.methods.base"  # Method's own hooks, which add nothing


def _module_file(module: str) -> Path | None:
    """The source file of a fedpeft module, found without importing it (nor its package)."""
    parts = module.split(".")
    if parts[0] != "fedpeft":
        return None
    base = Path(__file__).resolve().parents[1].joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _hook_and_imports(path: Path, hook: str) -> tuple[bool, list[str]]:
    """Whether a class in the source ``path`` defines ``hook``, and the modules it imports (``""`` in the list for
    a relative import, which the source alone cannot resolve)."""
    defines, imported = False, []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                names = [t.id for t in getattr(item, "targets", []) if isinstance(t, ast.Name)]
                defines |= getattr(item, "name", None) == hook or hook in names
        elif isinstance(node, ast.ImportFrom):
            # `from fedpeft.methods import potara` imports the module fedpeft.methods.potara.
            imported += [str(node.module), *(f"{node.module}.{a.name}" for a in node.names)] if not node.level else [""]
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    return defines, imported


@functools.cache
def _defines_hook(module: str, hook: str) -> bool:
    """Whether ``module``, or a module of ``fedpeft.methods`` it imports (where every method class and its bases
    live), directly or through others, defines ``hook`` in a class other than ``Method``'s empty default. ``True``
    where the source cannot tell (a relative import, a module it cannot find): the caller then imports the class
    and looks."""
    pending, seen = [module], {module}
    while pending:
        current = pending.pop()
        path = _module_file(current)
        if path is None:
            return True
        defines, imported = _hook_and_imports(path, hook)
        if defines or "" in imported:
            return True
        for name in set(imported) - seen - {_DEFAULT_HOOKS}:
            if name.startswith(f"{_METHODS_PACKAGE}.") and _module_file(name):
                seen.add(name)
                pending.append(name)
    return False


def may_implement(name: str, hook: str) -> bool:
    """Whether the class of the method ``name`` may implement ``hook`` beyond ``Method``'s empty default, told
    without importing it where fedpeft ships it (read from its module's source), so that a report of methods
    without hooks never imports a method, nor torch. Plugins' classes and classes already registered in memory
    are looked at themselves (``True``); an unknown name gives ``False``."""
    from fedpeft.core.registry import METHODS

    if name not in METHODS:
        return False
    entry = METHODS.entry(name)
    if entry.module is None or entry.plugin is not None or entry.module in sys.modules:
        return True
    return _defines_hook(entry.module, hook)


def method_hook_calls(
    records: Sequence[Record], run_dirs: Sequence[Path], hook: str
) -> list[tuple[Callable[..., Any], list[Record]]]:
    """The calls a report makes of one reporting hook (``"report_sections"`` or ``"report_plots"``).

    One call per implementation of the hook among the classes of the methods in ``records``, with the records of
    every method whose class has that implementation: ``potara`` and ``fisher_merge`` (which inherits Potara's
    hooks) share one call, so one mixing-weight table. Methods without a known class (``base``, runs without
    ``config.yaml``, a method no longer registered) and classes with ``Method``'s empty default are left out;
    only the classes that may implement the hook are imported (:func:`may_implement`).

    Returns:
        ``(hook of the class, its records)`` pairs, in the first-seen order of the methods in ``records``.
    """
    names = method_names(run_dirs)
    calls: dict[Any, tuple[Callable[..., Any], set[str]]] = {}
    for label in first_seen(record["method"] for record in records):
        name = names.get(label)
        cls = method_class(name) if name is not None and may_implement(name, hook) else None
        if cls is None:
            continue
        from fedpeft.methods.base import Method

        bound = getattr(cls, hook)
        if bound.__func__ is not getattr(Method, hook).__func__:
            calls.setdefault(bound.__func__, (bound, set()))[1].add(label)
    return [(bound, [r for r in records if r["method"] in labels]) for bound, labels in calls.values()]
