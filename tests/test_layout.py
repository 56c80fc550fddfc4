"""The package layout holds: no import cycles, a Django-free runtime, pipeline never importing dashboard.

Imports are read from the source (every `import`, top-level or inside a function), so a lazy
import that only hides a cycle from the interpreter still counts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "dashboard", "config")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                modules[module_name(path)] = path
    return modules


def imported_names(path: Path, module: str) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports (a `from package import module` counts as the module)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(path, module):
            # `import a.b.c` also runs a and a.b, packages' __init__ modules: only the named module
            # is an edge (a package importing its own modules, as pipeline.admin does, is no cycle).
            if name in modules and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def runtime_side(module: str) -> bool:
    """What runs in an agent's process: the runtime and what it shares with the server."""
    return module.startswith(("pipeline.runtime", "pipeline.tokens")) or module == "pipeline.semconv"


def test_the_runtime_imports_nothing_of_django_or_the_server():
    server = ("pipeline.models", "pipeline.ingest", "pipeline.receivers", "pipeline.artifacts", "pipeline.export",
              "pipeline.conf", "pipeline.admin", "pipeline.signals", "dashboard", "config")
    offenders = {}
    for module, path in project_modules().items():
        if not runtime_side(module):
            continue
        bad = sorted(
            name for name in imported_names(path, module)
            if name.split(".")[0] in {"django", "rest_framework", "channels", "daphne", "drf_spectacular"}
            or any(name == s or name.startswith(s + ".") for s in server)
        )
        if bad:
            offenders[module] = bad
    assert offenders == {}


def test_the_runtime_source_never_names_django():
    """The acceptance check `grep -rn "django\\|pipeline.models" pipeline/runtime`, comments included."""
    pattern = re.compile(r"django|pipeline\.models")
    hits = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "pipeline" / "runtime").rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_pipeline_never_imports_dashboard():
    graph = import_graph()
    assert {m: sorted(t for t in targets if t.startswith("dashboard")) for m, targets in graph.items()
            if m.startswith("pipeline") and any(t.startswith("dashboard") for t in targets)} == {}
