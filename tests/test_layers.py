"""The import layers of docs/architecture.md: every import of a fedpeft module points down (or sideways within a
layer), function-level imports included, and no package has an import cycle at module level."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedpeft"

# Bottom to top; a module may import from its own layer and the layers below it. The layer of a module is the one
# of its first package below fedpeft (fedpeft.methods.families.tiered -> "methods").
LAYERS: list[set[str]] = [
    {"core"},
    {"settings"},
    {"analysis"},
    {"catalog", "data"},
    {"training", "evaluation"},
    {"models"},
    {"planning"},
    {"adapters", "merging", "guidance", "hypergradient", "base_models", "federation", "continual"},
    {"methods"},
    {"report"},
    {"worker"},
    {"engine"},
    {"rundir"},
    {"runner", "personalize"},
    {"rehearsal"},
    {"apps"},
    {"cli"},
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """The top-level part of fedpeft a module belongs to (``fedpeft`` itself for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fedpeft"


def fedpeft_imports(path: Path, *, module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) of every import of a fedpeft module in ``path``."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("fedpeft"):
            module = str(node.module)
            for alias in node.names:  # `from fedpeft import report` imports the module fedpeft.report
                candidate = f"{module}.{alias.name}"
                is_module = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").is_file() or (
                    PACKAGE.parent / candidate.replace(".", "/")
                ).is_dir()
                found.append((node.lineno, candidate if is_module else module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("fedpeft")]
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_fedpeft_has_a_layer():
    parts = {part_of(module_name(path)) for path in SOURCES} - {"fedpeft"}
    assert parts <= set(LEVEL), f"parts without a layer in tests/test_layers.py: {sorted(parts - set(LEVEL))}"


def test_imports_point_down():
    upward = []
    for path in SOURCES:
        source = part_of(module_name(path))
        if source == "fedpeft":
            continue
        for line, target in fedpeft_imports(path):
            target_part = part_of(target)
            if target_part != "fedpeft" and LEVEL[target_part] > LEVEL[source]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({source}) imports {target}")
    assert not upward, "upward imports:\n" + "\n".join(upward)


@pytest.mark.parametrize("package", sorted({part_of(module_name(p)) for p in SOURCES if p.parent != PACKAGE}))
def test_no_import_cycle_within_a_package(package):
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        module = module_name(path)
        if part_of(module) != package:
            continue
        targets = {t for _, t in fedpeft_imports(path) if part_of(t) == package and t != module}
        # Importing a name from a package means importing its __init__; treat a submodule of it as that module.
        graph[module] = {t for t in targets if not module.startswith(t + ".")}

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*trail, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = [c for m in sorted(graph) if (c := cycle_from(m))]
    assert not cycles, f"import cycle in fedpeft.{package}: {' -> '.join(cycles[0])}"


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def part_named(text: str) -> str:
    """The part of fedpeft a name of the picture stands for: ``worker.py`` -> worker, ``engine/`` -> engine."""
    return text.removesuffix(".py").removesuffix("/")


def pictures() -> tuple[list[list[str]], dict[str, set[str]]]:
    """docs/architecture.md's two pictures: the stack (the parts named on each row, top to bottom) and the arrows
    (each part drawn with the parts it has an arrow to)."""
    blocks = ARCHITECTURE.read_text().split("```")[1::2]
    stack = [[part_named(n) for n in line[:30].split()] for line in blocks[0].splitlines() if line.strip()]
    arrows: dict[str, set[str]] = {}
    for line in next(b for b in blocks if "──►" in b).splitlines():
        if line.strip():
            source, _, targets = line.partition("►")
            arrows[part_named(source.strip(" ─"))] = {part_named(t) for t in targets.split()}
    return stack, arrows


def part_imports() -> dict[str, set[str]]:
    """Every part of fedpeft with the other parts its modules import."""
    graph: dict[str, set[str]] = {}
    for path in SOURCES:
        source = part_of(module_name(path))
        if source != "fedpeft":
            graph.setdefault(source, set()).update(part_of(t) for _, t in fedpeft_imports(path))
    return {part: targets - {part, "fedpeft"} for part, targets in graph.items()}


def test_the_architecture_picture_shows_every_part_in_its_layer_top_to_bottom():
    stack, _ = pictures()
    drawn = [part for row in stack for part in row if part in LEVEL]
    missing = sorted(set(part_imports()) - set(drawn))
    assert not missing, f"parts of fedpeft missing from docs/architecture.md's picture: {missing}"
    levels = [LEVEL[part] for part in drawn]
    assert levels == sorted(levels, reverse=True), f"the picture's rows are not in the layers' order: {drawn}"


def test_the_architecture_arrows_are_the_imports():
    _, arrows = pictures()
    imports = part_imports()
    assert set(arrows) == set(imports), f"parts without a row of arrows: {sorted(set(imports) ^ set(arrows))}"
    wrong = sorted(f"{a} -> {b}" for a, targets in arrows.items() for b in targets if b not in imports[a])
    assert not wrong, f"arrows of docs/architecture.md that are no import: {wrong}"

    def reached(part: str) -> set[str]:
        seen, todo = set(), [part]
        while todo:
            for nxt in arrows.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    unshown = sorted(f"{a} -> {b}" for a, targets in imports.items() for b in targets - reached(a))
    assert not unshown, f"imports that no path of arrows in docs/architecture.md shows: {unshown}"
