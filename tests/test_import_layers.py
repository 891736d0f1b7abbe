"""The packages' imports read top-down: no module imports itself back through others (a loop), and the
privacy package — mechanisms, accountants and the disclosure policy — imports none of the layers
built on it.

Every ``import`` statement counts, those inside functions too (a deferred import is still a
dependency); a package's ``__init__`` run on the way to a submodule does not (Python runs it for every
import of a submodule, which would make every package a loop).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_gpate", "datamodules", "callbacks")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports (anywhere in its body)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [resolve(alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                # ``from pkg import mod`` imports the submodule; ``from mod import name`` the module
                targets = [resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules else resolve(base)
                           for alias in node.names]
            else:
                continue
            graph[module].update(t for t in targets if t is not None and t != module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop as ``[a, b, …, a]``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_reports_a_loop():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_packages_have_no_import_loop():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import loop: " + " -> ".join(cycle)


def test_the_privacy_package_imports_no_layer_above_it():
    """Mechanisms, accountants and the disclosure policy import only each other (and the errors):
    models, the release artifact, callbacks, DataModules and the command line are built on them."""
    graph = import_graph()
    allowed = ("lightning_gpate.privacy", "lightning_gpate.errors")
    upward = {m: sorted(t for t in targets if not t.startswith(allowed))
              for m, targets in graph.items() if m.startswith("lightning_gpate.privacy")}
    assert not {m: t for m, t in upward.items() if t}


def test_callbacks_import_no_model_and_the_release_no_callback():
    """Callbacks report what the disclosure policy returns: they import no model. The release artifact is
    built by lightning_gpate.release from that policy: it imports no callback. The one edge from a model to
    a callback is Lightning's ``configure_callbacks`` of a private model (its reporter, PrivacyBudget)."""
    graph = import_graph()
    assert not {m: sorted(t) for m, t in graph.items()
                if m.startswith("callbacks") and any(x.startswith("lightning_gpate.models") for x in t)}
    assert not any(t.startswith("callbacks") for t in graph["lightning_gpate.release"])
    to_callbacks = {(m, t) for m, targets in graph.items() if m.startswith("lightning_gpate.models")
                    for t in targets if t.startswith("callbacks")}
    assert to_callbacks == {("lightning_gpate.models.private", "callbacks.privacy")}
