"""The data package's modules import one way (tokenizer/shards <- prepare <- loader), counting imports
inside functions too: a cycle hidden in a function body is still a cycle."""

import ast

from nvfp4train.data.paths import REPO_ROOT

DATA = REPO_ROOT / "nvfp4train" / "data"


def imports_of(path) -> set[str]:
    """Sibling modules of nvfp4train.data that `path` imports, anywhere in the file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.update([node.module] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nvfp4train.data."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("nvfp4train.data."))
    return out


def test_data_modules_have_no_import_cycle():
    graph = {p.stem: imports_of(p) for p in DATA.glob("*.py") if p.stem != "__init__"}
    assert graph["prepare"] and "loader" not in graph["prepare"]
    done, path = set(), []

    def visit(module):
        assert module not in path, "import cycle: " + " -> ".join(path[path.index(module) :] + [module])
        if module in done:
            return
        path.append(module)
        for dep in graph.get(module, ()):
            visit(dep)
        path.pop()
        done.add(module)

    for module in graph:
        visit(module)
