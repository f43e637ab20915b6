"""The house's rules, read from the code's imports: no import circle, Ray
kept out of ``runtime/``, and ``runtime/``'s packages in layers.

Every import counts, wherever it stands: at the top of a module, inside a
function, under ``TYPE_CHECKING``. Only the project's own packages are
followed (``runtime``, ``actors``, ``device``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "actors", "device")

# runtime's packages, lowest first: each may import only those before it (and
# itself). The entry modules at runtime's top (config excepted) may import all.
LAYERS = ("runtime.time", "runtime.config", "runtime.store", "runtime.llm",
          "runtime.memories", "runtime.recall", "runtime.mind")
ENTRY_MODULES = {"runtime", "runtime.__main__", "runtime.memory", "runtime.turn",
                 "runtime.user_config"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def imported(name: str, path: Path, known: set[str],
             packages: tuple[str, ...] = PACKAGES) -> Iterator[str]:
    """The project modules ``name`` imports (a ``from pkg import mod`` names the
    module ``pkg.mod``, a ``from mod import thing`` the module ``mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known
                       else source for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in (*packages, "ray"):
                yield target


def graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    found = modules(root, packages)
    known = set(found)
    return {name: {t for t in imported(name, path, known, packages) if t != name}
            for name, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(name: str) -> int | None:
    for i, prefix in enumerate(LAYERS):
        if name == prefix or name.startswith(prefix + "."):
            return i
    return None


def test_no_import_circle() -> None:
    assert circles(graph()) == []


def test_runtime_never_imports_ray_nor_the_actors() -> None:
    wrong = {(name, target) for name, targets in graph().items() if name.startswith("runtime")
             for target in targets if target.split(".")[0] in ("ray", "actors")}
    assert wrong == set()


def test_runtime_packages_import_only_the_layers_below() -> None:
    wrong = set()
    for name, targets in graph().items():
        if not name.startswith("runtime") or name in ENTRY_MODULES:
            continue
        own = layer(name)
        assert own is not None, f"{name} is in no layer: add its package to LAYERS"
        for target in targets:
            theirs = layer(target)
            if target.startswith("runtime") and (theirs is None or theirs > own):
                wrong.add((name, target))
    assert wrong == set()


def test_runtime_top_holds_only_entry_modules() -> None:
    top = {name for name in modules() if name.count(".") == 1 and name.startswith("runtime.")
           and not (ROOT / name.replace(".", "/")).is_dir()}
    assert top <= ENTRY_MODULES | {"runtime.config"}


@pytest.mark.parametrize("source, expected", [
    ({"a/__init__.py": "", "a/x.py": "from a import y", "a/y.py": "def f():\n import a.x"},
     [["a.x", "a.y"]]),
    ({"a/__init__.py": "", "a/x.py": "from a.y import f", "a/y.py": "f = 1"}, []),
])
def test_the_circle_finder_sees_a_circle_inside_a_function(
        tmp_path: Path, source: dict[str, str], expected: list[list[str]]) -> None:
    for rel, text in source.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert circles(graph(tmp_path, ("a",))) == expected
