"""The methods fedpeft ships, declared in :data:`~fedpeft.core.registry.METHODS` without importing any of them.

Every module of ``fedpeft/methods/`` (one per method) registers its class with ``@METHODS.register(name,
aliases=..., description=...)``. This catalogue reads those decorators from the modules' source (their syntax
tree, not their import), so a new method module is listed and found by name with nothing else to edit.
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


def declarations(directory: Path = METHODS_DIR) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    """(name, module, one-line description, aliases) of every method registered by a module of ``directory``.

    The description is the decorator's ``description``, else the first line of the class docstring.
    """
    for path in sorted(directory.glob("*.py")):
        if path.stem in NOT_METHODS:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
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
                )


for _name, _module, _description, _aliases in declarations():
    METHODS.declare(_name, _module, _description, aliases=_aliases)
