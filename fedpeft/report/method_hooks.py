"""Which method class wrote a report's records, and the calls of its reporting hooks.

The classes come from the runs' ``config.yaml`` (``methods``: entries with ``name`` and optional ``label``, the
label defaulting to the name) looked up in :data:`fedpeft.core.registry.METHODS`. The report never builds a
method: it calls the class's reporting classmethods (``Method.report_sections``, ``Method.report_plots``), or
what they are made of. A shipped class whose hook is set with :func:`fedpeft.methods.base.reporting_hook`
(``report_plots = reporting_hook(rank_scale_plots)``, itself or in a base class) is read from its source
(:func:`source_hook`) and the function it names is called without importing the method: a report imports no
method, nor torch, for those (:mod:`fedpeft.analysis`). Other classes are imported to call their hook, and only
those whose source may implement one (:func:`may_implement`), so methods without hooks of their own import none.
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedpeft.catalog.methods import imported_names
from fedpeft.core.errors import UserError
from fedpeft.report.records import CONFIG_FILE, Record, first_seen

if TYPE_CHECKING:
    from fedpeft.methods.base import Method


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


class _Source:
    """A fedpeft module's source: the names its top-level ``from M import X`` bind (``M:X``) and its classes."""

    def __init__(self, path: Path) -> None:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        self.imported = imported_names(tree)
        self.classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


@functools.cache
def _source(module: str) -> _Source | None:
    path = _module_file(module)
    return None if path is None else _Source(path)


UNKNOWN = "?"
"""What :func:`source_hook` answers when the source cannot tell: the class is then imported to look."""
_REPORTING_HOOK = f"{_DEFAULT_HOOKS}:reporting_hook"
_NO_HOOKS = {f"{_DEFAULT_HOOKS}:Method", "typing:Generic"}  # bases that add no hook: Method's are empty


def _registered_class(source: _Source, name: str) -> str | None:
    """The class of ``source`` decorated with ``@METHODS.register(name, ...)``."""
    for class_name, node in source.classes.items():
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "register"
                and isinstance(decorator.func.value, ast.Name)
                and decorator.func.value.id == "METHODS"
                and decorator.args
                and isinstance(decorator.args[0], ast.Constant)
                and decorator.args[0].value == name
            ):
                return class_name
    return None


def _binding(node: ast.ClassDef, hook: str) -> ast.stmt | None:
    """The last statement of the class body that binds ``hook`` (a ``def`` or an assignment)."""
    found: ast.stmt | None = None
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [statement.name]
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        found = statement if hook in names else found
    return found


def _reference(statement: ast.stmt, imported: dict[str, str]) -> str:
    """``M:F`` of a ``hook = reporting_hook(F)`` statement whose module imports ``reporting_hook`` and ``F``;
    :data:`UNKNOWN` for any other statement."""
    value = statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and imported.get(value.func.id) == _REPORTING_HOOK
        and len(value.args) == 1
        and not value.keywords
        and isinstance(value.args[0], ast.Name)
    ):
        return imported.get(value.args[0].id, UNKNOWN)
    return UNKNOWN


@functools.cache
def _class_hook(module: str, class_name: str, hook: str, depth: int = 0) -> str | None:
    """:func:`source_hook` of the class ``class_name`` of ``module``, following its bases through their source."""
    if f"{module}:{class_name}" in _NO_HOOKS:
        return None
    source = _source(module)
    node = None if source is None else source.classes.get(class_name)
    if source is None or node is None or depth > 20:
        return UNKNOWN
    statement = _binding(node, hook)
    if statement is not None:
        return _reference(statement, source.imported)
    found: set[str | None] = set()
    for base in node.bases:
        target = base.value if isinstance(base, ast.Subscript) else base  # Potara[FederatedLocalConfig]
        if not isinstance(target, ast.Name):
            return UNKNOWN
        if target.id in source.classes:
            found.add(_class_hook(module, target.id, hook, depth + 1))
        elif target.id in source.imported:
            base_module, _, base_name = source.imported[target.id].partition(":")
            found.add(_class_hook(base_module, base_name, hook, depth + 1))
        else:
            return UNKNOWN
    found.discard(None)  # bases without a hook of their own, whatever their order (Method's comes last)
    return found.pop() if len(found) == 1 else (UNKNOWN if found else None)


def source_hook(name: str, hook: str) -> str | None:
    """The function (``module:name``) that the class of the shipped method ``name`` sets as ``hook`` with
    :func:`~fedpeft.methods.base.reporting_hook`, itself or in a base class, told from the source without
    importing the class; ``None`` where the class has ``Method``'s empty hook; :data:`UNKNOWN` where the source
    cannot tell (a hook defined otherwise, a plugin's class, a base the source does not resolve)."""
    from fedpeft.core.registry import METHODS

    if name not in METHODS:
        return None
    entry = METHODS.entry(name)
    if entry.module is None or entry.plugin is not None:
        return UNKNOWN
    if not _defines_hook(entry.module, hook):
        return None
    source = _source(entry.module)
    class_name = None if source is None else _registered_class(source, entry.name)
    return UNKNOWN if class_name is None else _class_hook(entry.module, class_name, hook)


def hook_function(name: str, hook: str) -> Callable[..., Any] | None:
    """What a report calls for ``hook`` of the method ``name``: the function its class sets with
    :func:`~fedpeft.methods.base.reporting_hook` (imported from :func:`source_hook`'s answer, without the class
    where the source tells), else the class's own hook (importing the class); ``None`` for ``Method``'s empty
    default and a name that is not registered. Both take the hook's arguments after ``cls``."""
    reference = source_hook(name, hook)
    if reference is None:
        return None
    if reference != UNKNOWN:
        module, _, attribute = reference.partition(":")
        return getattr(importlib.import_module(module), attribute)
    cls = method_class(name) if may_implement(name, hook) else None
    if cls is None:
        return None
    from fedpeft.methods.base import Method

    bound = getattr(cls, hook)
    if bound.__func__ is getattr(Method, hook).__func__:
        return None
    own = getattr(bound.__func__, "reporting_function", None)  # set by reporting_hook
    return own if callable(own) else bound


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
    ``config.yaml``, a method no longer registered) and classes with ``Method``'s empty default are left out.
    A hook set with ``reporting_hook`` is called as the function it names, found without importing the class
    where the source tells (:func:`hook_function`).

    Returns:
        ``(hook, its records)`` pairs, in the first-seen order of the methods in ``records``; each hook takes the
        hook's arguments after ``cls``.
    """
    names = method_names(run_dirs)
    calls: dict[Any, tuple[Callable[..., Any], set[str]]] = {}
    for label in first_seen(record["method"] for record in records):
        name = names.get(label)
        function = hook_function(name, hook) if name is not None else None
        if function is not None:  # a bound classmethod is the same implementation as its function
            calls.setdefault(getattr(function, "__func__", function), (function, set()))[1].add(label)
    return [(function, [r for r in records if r["method"] in labels]) for function, labels in calls.values()]
