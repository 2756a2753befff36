"""graph/'s modules import one another only downward, in one order, and its `__init__` names
every name the rest of trtbisect, the tests and the scripts import from it."""

from __future__ import annotations

import ast
from pathlib import Path

import trtbisect.graph
from tests.test_imports import PACKAGE, import_graph

# Bottom first: each module may import only the ones before it (docs/architecture.md's row).
ORDER = ["modules", "control_flow", "schema", "names", "inline", "weights", "float_types", "repair", "load",
         "core"]
ROOT = PACKAGE.parent


def test_the_graph_modules_import_only_downward():
    graph = import_graph()
    mods = {m.rpartition(".")[2] for m in graph if m.startswith("trtbisect.graph.")}
    assert mods == set(ORDER), "a graph/ module not placed in ORDER (or gone)"
    wrong = []
    for k, name in enumerate(ORDER):
        for target in graph[f"trtbisect.graph.{name}"]:
            if target.startswith("trtbisect.graph.") and \
                    target.rpartition(".")[2] not in ORDER[:k]:
                wrong.append(f"graph.{name} imports {target}")
    assert not wrong, "\n".join(wrong)


def _imported_from_the_facade(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        absolute = node.level == 0 and node.module == "trtbisect.graph"
        relative = node.level > 0 and node.module == "graph" and \
            not path.is_relative_to(PACKAGE / "graph")
        if absolute or relative:
            names.update(a.name for a in node.names)
    return names


def test_the_facade_names_everything_imported_from_it():
    used = set()
    for folder in ("trtbisect", "tests", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= _imported_from_the_facade(path)
    assert "Graph" in used and "load_model" in used  # the walk found the importers
    missing = sorted(used - set(trtbisect.graph.__all__) - set(ORDER))  # a module by name
    assert not missing, f"imported from trtbisect.graph but not in its __all__: {missing}"
    unknown = [n for n in trtbisect.graph.__all__ if not hasattr(trtbisect.graph, n)]
    assert not unknown, unknown
