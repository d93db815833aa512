"""Every public function, class and method of the documented packages has a docstring.

Public means a module-level function or class, or a method of a public class, whose name does not start with ``_``;
``typing.overload`` stubs are left out (the implementation carries the docstring)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedpeft"
DOCUMENTED = ["core", "engine", "methods/base.py", "report"]


def documented_files() -> list[Path]:
    """The Python files of ``DOCUMENTED``, a package's subpackages included."""
    found: list[Path] = []
    for target in DOCUMENTED:
        path = PACKAGE / target
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return found


def is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        (isinstance(decorator, ast.Name) and decorator.id == "overload")
        or (isinstance(decorator, ast.Attribute) and decorator.attr == "overload")
        for decorator in node.decorator_list
    )


def undocumented(body: list[ast.stmt], prefix: str = "") -> Iterator[str]:
    """``line: qualified name`` of each public definition in ``body``, or in its public classes, lacking a docstring."""
    for node in body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        if not isinstance(node, ast.ClassDef) and is_overload(node):
            continue
        if ast.get_docstring(node) is None:
            yield f"{node.lineno}: {prefix}{node.name}"
        if isinstance(node, ast.ClassDef):
            yield from undocumented(node.body, f"{prefix}{node.name}.")


def test_the_documented_packages_exist() -> None:
    assert all((PACKAGE / target).exists() for target in DOCUMENTED)
    assert len(documented_files()) > 10


@pytest.mark.parametrize("path", documented_files(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_public_definitions_have_docstrings(path: Path) -> None:
    missing = list(undocumented(ast.parse(path.read_text()).body))
    assert not missing, f"{path.relative_to(PACKAGE.parent)} has public definitions without a docstring: " + ", ".join(
        missing
    )
