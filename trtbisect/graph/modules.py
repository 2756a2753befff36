"""PyTorch's vocabulary for ONNX nodes: which nn.Module a node came from (pure; no torch).

Exporters leave the module path in one of three places, and `module_of` reads all of them:

* the dynamo exporter (`torch.onnx.export(..., dynamo=True)`) writes node metadata:
  `pkg.torch.onnx.name_scopes` (full dotted paths, outermost first, the aten op last) and
  `pkg.torch.onnx.class_hierarchy` (the matching classes);
* the TorchScript exporter (`dynamo=False`) names nodes after the module scopes:
  `/blocks/blocks.3/ln2/Pow`. Each scope is an *unqualified* name (the path from the last
  non-numeric atom on: `blocks.3.ln2` -> `ln2`, `layers.0.seq.0.0` -> `seq.0.0`), and a module
  called twice gets `_1`, `_2` appended, so the path is rebuilt, exactly when the model carries
  `trtbisect export`'s table of modules and as a best guess when it does not;
* `trtbisect export` adds the model-level metadata `trtbisect.torch_modules`: a JSON object
  {dotted path: class}, for the classes and the exact rebuild.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterable, Mapping

import onnx

MODULES_KEY = "trtbisect.torch_modules"  # model metadata: {"blocks.3.ln2": "torch.nn...LayerNorm"}
NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"
_CALL_SUFFIX = re.compile(r"_\d+$")


def module_of(node_name: str, model: onnx.ModelProto | None = None
              ) -> tuple[str, str | None] | None:
    """(dotted module path, short class name or None) of an ONNX node, or None when the node
    carries no module scope (or belongs to the root module)."""
    node = _find_node(model, node_name) if model is not None else None
    if node is not None:
        found = _from_node_metadata(node)
        if found is not None:
            return found
    scopes = scope_components(node_name)
    if not scopes:
        return None
    table = module_table(model) if model is not None else {}
    path = _rebuild_exact(scopes, table) if table else None
    if path is None:
        path = rebuild_path(scopes)
    cls = table.get(path)
    return path, short_class(cls) if cls else None


def module_label(node_name: str, model: onnx.ModelProto | None = None) -> str | None:
    """`blocks.3.ln2 (LayerNorm)`, `blocks.3.ln2` when the class is unknown, or None."""
    found = module_of(node_name, model)
    if found is None:
        return None
    path, cls = found
    return f"{path} ({cls})" if cls else path


def scope_components(node_name: str) -> list[str]:
    """`/blocks/blocks.3/ln2/Pow` -> ["blocks", "blocks.3", "ln2"]; [] for unscoped names."""
    if not node_name.startswith("/"):
        return []
    return [p for p in node_name.split("/")[1:-1] if p]


def unqualified(path: str) -> str:
    """The TorchScript exporter's scope name for a module path: from the last non-numeric
    atom on (`layers.0.seq.0.0` -> `seq.0.0`, `blocks.3` -> `blocks.3`)."""
    atoms = path.split(".")
    for i in range(len(atoms) - 1, -1, -1):
        if not atoms[i].isnumeric():
            return ".".join(atoms[i:])
    return path


def rebuild_path(scopes: Iterable[str]) -> str:
    """Best guess of the dotted path from TorchScript scope names alone.

    A scope that extends the previous one (`seq` then `seq.0`) is its child inside a container;
    any other scope is a child of the previous module. Modules reached through a ModuleDict or a
    nested container lose an atom here (`layers.0.d.a` reads `/layers.0/a`): `module_table`
    gives the exact path when the model has one.
    """
    path, prev = "", ""
    for c in scopes:
        if prev and c.startswith(prev + "."):
            path = path + c[len(prev):]
        else:
            path = f"{path}.{c}" if path else c
        prev = c
    return path


def module_table(model: onnx.ModelProto | None) -> dict[str, str]:
    """{dotted path: qualified class} from the model metadata `trtbisect export` writes."""
    if model is None:
        return {}
    for p in model.metadata_props:
        if p.key == MODULES_KEY:
            return _parse_table(p.value)
    return {}


def modules_metadata(table: Mapping[str, str]) -> onnx.StringStringEntryProto:
    """The model metadata entry that records every module's path and class."""
    return onnx.StringStringEntryProto(key=MODULES_KEY, value=json.dumps(dict(table)))


def short_class(qualified: str) -> str:
    return qualified.rsplit(".", 1)[-1]


def within(path: str, regions: Iterable[str]) -> bool:
    """True when module `path` is one of `regions` or lies inside one of them."""
    return any(path == r or path.startswith(r + ".") or r == "" for r in regions)


def ancestors(path: str) -> list[str]:
    """`a.b.c` -> ["a.b", "a"] (nearest first; the root "" is not listed)."""
    atoms = path.split(".")
    return [".".join(atoms[:i]) for i in range(len(atoms) - 1, 0, -1)]


@functools.lru_cache(maxsize=8)
def _parse_table(text: str) -> dict[str, str]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _find_node(model: onnx.ModelProto, name: str) -> onnx.NodeProto | None:
    for node in model.graph.node:
        if node.name == name:
            return node
    return None


def _from_node_metadata(node: onnx.NodeProto) -> tuple[str, str | None] | None:
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = _literal_list(meta.get(NAME_SCOPES))
    if len(scopes) < 2:
        return None
    path = scopes[-2]  # the last entry is the aten op itself
    if not path:
        return None
    classes = _literal_list(meta.get(CLASS_HIERARCHY))
    cls = short_class(classes[-2]) if len(classes) == len(scopes) else None
    return path, cls


def _literal_list(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def _rebuild_exact(scopes: list[str], table: Mapping[str, str]) -> str | None:
    """Walk the scopes down the module table: each scope is the unqualified name of a strict
    descendant of the module before it (a `_N` suffix marks the N-th extra call)."""
    parent = ""
    for c in scopes:
        match = _descendant(parent, c, table)
        if match is None and _CALL_SUFFIX.search(c):
            match = _descendant(parent, _CALL_SUFFIX.sub("", c), table)
        if match is None:
            return None
        parent = match
    return parent


def _descendant(parent: str, scope: str, table: Mapping[str, str]) -> str | None:
    prefix = parent + "." if parent else ""
    found = [p for p in table if p and p.startswith(prefix) and unqualified(p) == scope]
    return min(found, key=lambda p: (p.count("."), p)) if found else None
