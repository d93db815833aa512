"""The methods fedpeft ships, declared in :data:`~fedpeft.core.registry.METHODS` without importing any of them.

Every module of ``fedpeft/methods/`` (one per method) registers its class with ``@METHODS.register(name,
aliases=..., description=...)``. This catalogue reads those decorators from the modules' source (their syntax
tree, not their import), so a new method module is listed and found by name with nothing else to edit.

It reads the class's config too: a ``Config = XConfig`` line in the registered class whose ``XConfig`` the module
imports with ``from M import XConfig`` declares the config class ``M:XConfig`` (a shipped method's lives beside
it, in ``fedpeft/methods/<name>_config.py``, which imports no torch), so a config is validated without importing
the method (nor torch). A config class the module defines itself, or one it inherits, is left undeclared: the
registry then reads it off the imported class.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from fedpeft.core.registry import METHODS

METHODS_DIR = Path(__file__).resolve().parents[1] / "methods"
NOT_METHODS = {"__init__", "base"}


def _register_call(decorator: ast.expr) -> ast.Call | None:
    """The ``METHODS.register(...)`` call a decorator is, if it is one."""
    if not isinstance(decorator, ast.Call) or not isinstance(decorator.func, ast.Attribute):
        return None
    target = decorator.func
    if target.attr != "register" or not isinstance(target.value, ast.Name) or target.value.id != "METHODS":
        return None
    return decorator


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Each name the module's top-level ``from M import X`` (or ``... import X as Y``) statements bind -> ``M:X``."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return names


def config_reference(node: ast.ClassDef, imported: dict[str, str]) -> str | None:
    """``M:X`` of the class's ``Config = X`` (or ``Config: ClassVar[...] = X``) line, where ``X`` is imported from
    ``M``; None when the class sets no ``Config`` of its own or sets one the module defines."""
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "Config":
            return imported.get(value.id) if isinstance(value, ast.Name) else None
    return None


def declarations(directory: Path = METHODS_DIR) -> Iterator[tuple[str, str, str, tuple[str, ...], str | None]]:
    """(name, module, one-line description, aliases, config class) of every method registered by a module of
    ``directory``.

    The description is the decorator's ``description``, else the first line of the class docstring; the config
    class is :func:`config_reference` (``module:Name``, or None).
    """
    for path in sorted(directory.glob("*.py")):
        if path.stem in NOT_METHODS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = imported_names(tree)
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for decorator in node.decorator_list:
                call = _register_call(decorator)
                if call is None or not call.args:
                    continue
                keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
                docstring = (ast.get_docstring(node) or "").strip().split("\n", 1)[0]
                yield (
                    str(ast.literal_eval(call.args[0])),
                    f"fedpeft.methods.{path.stem}",
                    str(keywords.get("description") or docstring),
                    tuple(keywords.get("aliases", ())),
                    config_reference(node, imported),
                )


for _name, _module, _description, _aliases, _config in declarations():
    METHODS.declare(_name, _module, _description, aliases=_aliases, config=_config)
