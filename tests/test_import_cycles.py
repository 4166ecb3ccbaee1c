"""The import picture: no module of nvfp4train imports, at import time, a module that imports it back (directly
or through others). Imports inside functions (deferred on purpose) and under `if TYPE_CHECKING:` do not count.
A cycle fails with its modules in order, each with the line that imports the next."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "nvfp4train"


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(REPO).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _import_time_imports(tree: ast.Module, module: str, is_package: bool):
    """(imported module, line) for every import that runs when `module` is imported."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append((target, child.lineno))
                # `from pkg import sub` imports the submodule pkg.sub too
                found.extend((f"{target}.{alias.name}", child.lineno) for alias in child.names)
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports at import time: line}, over nvfp4train's own modules."""
    files = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    modules = {name for name, _ in files}
    graph: dict[str, dict[str, int]] = {}
    for (module, is_package), path in files.items():
        edges = graph.setdefault(module, {})
        for target, line in _import_time_imports(ast.parse(path.read_text()), module, is_package):
            # importing a.b.c runs a and a.b first
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                if name in modules and name != module and not module.startswith(name + "."):
                    edges.setdefault(name, line)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := dfs(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


def test_no_module_imports_itself_back_at_import_time():
    graph = import_graph()
    assert len(graph) > 100 and "nvfp4train.train.trainer" in graph
    cycle = find_cycle(graph)
    if cycle:
        steps = " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:]))
        raise AssertionError(f"an import cycle: {steps} -> {cycle[-1]}")


def test_the_cycle_finder_finds_a_cycle_and_its_lines():
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}}) is None
