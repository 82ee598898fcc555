"""The import graph keeps its layers (DESIGN.md, "Layout"): plain values and the client side sit below the
methods and the engines, and no module imports itself back through others."""

import ast
from pathlib import Path

import hetfl

SRC = Path(hetfl.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, top_level_only: bool) -> set[str]:
    """The hetfl modules ``path`` imports (every import, or only those run when it is imported)."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (base if node.level else node.module)
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import convnet` imports a module
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("hetfl")}


MODULES = {module_name(p): p for p in SRC.rglob("*.py")}


def graph(top_level_only: bool) -> dict[str, set[str]]:
    return {m: {i for i in imports_of(p, top_level_only) if i in MODULES and i != m} for m, p in MODULES.items()}


def reachable(start: str, edges: dict[str, set[str]], parents: bool = True) -> set[str]:
    """Every module imported, directly or not, by ``start``; with ``parents``, importing a module counts as
    importing its packages too (their __init__ runs first)."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for nxt in edges.get(m, ()):
            chain = [".".join(nxt.split(".")[:i]) for i in range(2, nxt.count(".") + 2)] if parents else [nxt]
            for step in chain:
                if step in MODULES and step not in seen:
                    seen.add(step)
                    todo.append(step)
    return seen


def test_config_sits_below_the_methods_and_engines():
    below = reachable("hetfl.config", graph(top_level_only=False))
    assert not {m for m in below if m.startswith(("hetfl.methods", "hetfl.sim", "hetfl.bench", "hetfl.cli"))}, below


def test_the_client_side_imports_no_server_code():
    edges = graph(top_level_only=False)
    client_side = ("hetfl.client", "hetfl.task", "hetfl.recipes", "hetfl.updates", "hetfl.memory", "hetfl.models.cache",
                   "hetfl.trainers", "hetfl.trainers.sgd", "hetfl.trainers.blockwise", "hetfl.trainers.objectives",
                   "hetfl.trainers.schedule", "hetfl.trainers.step")
    for side in client_side:
        below = reachable(side, edges)
        server = ("hetfl.methods", "hetfl.aggregation", "hetfl.sim", "hetfl.bench", "hetfl.cli", "hetfl.config",
                  "hetfl.data", "hetfl.splits", "hetfl.devices", "hetfl.costs")
        assert not {m for m in below if m.startswith(server)}, (side, below)


def test_the_clientapp_imports_no_server_code():
    """A SuperNode runs hetfl's ClientApp: the client side plus the node's data and state, nothing of the server."""
    below = reachable("hetfl.flower.client_app", graph(top_level_only=False))
    server = ("hetfl.methods", "hetfl.aggregation", "hetfl.sim", "hetfl.bench", "hetfl.cli", "hetfl.config",
              "hetfl.splits", "hetfl.devices", "hetfl.costs", "hetfl.flower.deployment", "hetfl.flower.server_app",
              "hetfl.flower.deploy", "hetfl.flower.federation")
    assert "hetfl.client" in below and "hetfl.flower.node" in below
    assert not {m for m in below if any(m == s or m.startswith(s + ".") for s in server)}, below


def test_no_import_cycles():
    edges = graph(top_level_only=True)  # imports run at import time; a package importing its modules is no cycle
    for module in MODULES:
        assert module not in reachable(module, edges, parents=False), module
