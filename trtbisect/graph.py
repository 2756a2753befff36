"""ONNX facade: loading with clear errors, node names, float tensors, producers and consumers.

The input model is never mutated; everything that rewrites a graph works on a copy.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from .errors import TrtBisectError

log = logging.getLogger(__name__)

FLOAT = TensorProto.FLOAT
# Nodes that move or retype data but compute nothing in floating point: they keep their
# declared types (the mixed model never retypes a user's Cast) and are never FP16 candidates.
PASS_THROUGH_OPS = frozenset({"Constant", "ConstantOfShape", "Shape", "Size", "Cast", "CastLike"})
PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike, min_opset: int = 1,
               shapes: Mapping[str, Sequence[int]] | None = None,
               notes: list[str] | None = None) -> onnx.ModelProto:
    """Load and validate an ONNX file, weights left where they are, as trtbisect's own copy
    (repair.py: what ONNX Runtime runs but the checker or the run's copies refuse is mended;
    `notes` gets a phrase per change). `min_opset`: the opset the copies need (13 for BF16).

    External data stays on disk (the returned proto points at it; `Graph.from_path` maps it), so
    a model of any size, beyond protobuf's 2 GiB too, loads in the memory of its graph alone.
    Every failure is a one-line TrtBisectError.
    """
    p = Path(path)
    if not p.is_file():
        raise TrtBisectError(f"model file not found: {p}")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, UnicodeDecodeError) as exc:
        raise TrtBisectError(f"{p} is not a readable ONNX model (truncated or corrupt?): "
                             f"{_first_line(exc)}")
    except OSError as exc:
        raise TrtBisectError(f"cannot read {p}: {exc.strerror or exc}")
    if not model.graph.node and not model.graph.output:
        raise TrtBisectError(f"{p} is not a readable ONNX model (empty graph: truncated?)")
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    for t in external:
        _check_external(p, t)
    check_weight_sizes(p, external)  # before anything reads (or hashes) the data
    problem = None
    try:
        # by path: the checker reads the file itself and never needs the weights in one proto
        onnx.checker.check_model(str(p))
    except (onnx.checker.ValidationError, ValueError, OSError) as exc:
        problem = _first_line(exc)
    from .repair import own_copy
    model, changed = own_copy(model, p, min_opset, shapes, problem)
    if notes is not None:
        notes.extend(changed)
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_external(model_path: Path, t: TensorProto) -> None:
    info = {e.key: e.value for e in t.external_data}
    where = info.get("location", "")
    data = model_path.parent / where
    need = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
    if not where or Path(where).is_absolute() or ".." in Path(where).parts:
        raise TrtBisectError(f"{model_path}: initializer {t.name!r} has an unsafe external-data "
                             f"location {where!r}; keep the data files beside the model")
    if not data.is_file() or data.stat().st_size < need:
        raise TrtBisectError(f"{model_path} keeps weights in external data that could not be read "
                             f"({where!r} for {t.name!r} is missing or too short); keep the data "
                             "files beside the model")


def physical_memory() -> int:
    """Bytes of this machine's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 34


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def tensor_bytes(t: TensorProto) -> int:
    """Bytes a tensor holds, from its declared dims and element type."""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 1
    return math.prod(int(d) for d in t.dims) * itemsize


def check_weight_sizes(path: Path, external: list[TensorProto]) -> None:
    """Refuse, before 100 GB are hashed or mapped, external weights this machine cannot hold:
    ONNX Runtime copies every initializer it is given, so each must fit in memory, and so must
    all of them together. The error names the tensor and its size."""
    if not external:
        return
    memory = physical_memory()
    sizes = sorted(((tensor_bytes(t), t) for t in external), key=lambda x: -x[0])
    biggest, t = sizes[0]
    where = next((e.value for e in t.external_data if e.key == "location"), "?")
    total = sum(n for n, _ in sizes)
    if biggest > memory:
        raise TrtBisectError(f"{path}: initializer {t.name!r} holds {_gib(biggest)} of external "
                             f"data (in {where!r}), more than this machine's {_gib(memory)} of "
                             "memory; ONNX Runtime copies every weight it is given, so this model "
                             "cannot be judged here")
    if total > memory:
        raise TrtBisectError(f"{path}: its external weights total {_gib(total)} (the largest, "
                             f"{t.name!r}, {_gib(biggest)} in {where!r}), more than this "
                             f"machine's {_gib(memory)} of memory; ONNX Runtime copies every "
                             "weight it is given, so this model cannot be judged here")


def model_hash(path: str | os.PathLike) -> str:
    """sha256 of the model file, as `sha256sum` prints it (read in chunks)."""
    return _file_hash(Path(path)).hexdigest()


def external_files(path: str | os.PathLike) -> list[Path]:
    """The external data files the model's initializers name (load_model checked them)."""
    p = Path(path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception:  # the file was validated by load_model; nothing more to name
        return []
    return sorted({p.parent / e.value for t in model.graph.initializer
                   for e in t.external_data if e.key == "location"})


def external_data_hash(path: str | os.PathLike) -> str | None:
    """sha256 over the model's external data files (each file's name, then its bytes); None
    when it keeps none. Apart from `model_hash`, so that the model's hash is its file's."""
    found = external_files(path)
    if not found:
        return None
    h = hashlib.sha256()
    for f in found:
        h.update(f.name.encode())
        h.update(_file_hash(f).digest())
    return h.hexdigest()


def _file_hash(path: Path) -> "hashlib._Hash":
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return h


def check_names(model: onnx.ModelProto) -> None:
    """Names that are not valid UTF-8 (protobuf hands them over as bytes) cannot be rendered
    into a plan, a command line or a mixed model: refuse them up front."""
    names: list = []
    for g in walk_graphs(model.graph):
        values = [*g.input, *g.output, *g.value_info, *g.initializer]
        names += [v.name for v in values] + [g.name]
        for node in g.node:
            names += [node.name, node.op_type, node.domain, *node.input, *node.output]
    for f in model.functions:
        names += [f.name, f.domain, *f.input, *f.output]
        for node in walk(f.node):
            names += [node.name, node.op_type, node.domain, *node.input, *node.output]
    bad = next((n for n in names if not isinstance(n, str)), None)
    if bad is not None:
        raise TrtBisectError(f"the model holds a name that is not valid UTF-8 ({bad!r}); "
                             "rename it (ONNX requires UTF-8 strings)")


def node_names(model: onnx.ModelProto) -> list[str]:
    """The name trtbisect uses for each node, in `flatten`'s order (graph.node first).

    A top-level node's own name, or `<op_type>_<i>` (i: its position) when it has none; a name
    used twice gets `_<i>` appended to its later uses so that every plan entry names exactly one
    node. A node inside a subgraph gets a qualified name (`qualified_name`).
    """
    return flatten(model).names


def subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """The graphs a node holds, by attribute name: If's `then_branch` / `else_branch`, Loop's
    and Scan's `body` (a GRAPHS attribute's k-th graph is `<name>.<k>`)."""
    out: list[tuple[str, onnx.GraphProto]] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append((a.name, a.g))
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend((f"{a.name}.{k}", g) for k, g in enumerate(a.graphs))
    return out


def walk(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Every node, and every node of their subgraphs (any depth)."""
    for n in nodes:
        yield n
        for _, g in subgraphs(n):
            yield from walk(g.node)


def walk_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph inside it (any depth)."""
    yield graph
    for n in graph.node:
        for _, g in subgraphs(n):
            yield from walk_graphs(g)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs, and what its subgraphs take from outer scopes (a
    branch reading a weight of the main graph reads it through the If node)."""
    subs = [g for _, g in subgraphs(node)]
    if not subs:
        return list(dict.fromkeys(t for t in node.input if t))
    inner = list(walk(n for g in subs for n in g.node))
    own = {o for n in inner for o in n.output} | {
        v.name for s in subs for g in walk_graphs(s) for v in [*g.input, *g.initializer]}
    return list(dict.fromkeys([*(t for t in node.input if t),
                               *(t for n in inner for t in n.input if t and t not in own)]))


def qualified_name(holder: str, attr: str, own: str) -> str:
    """The name of a node inside a subgraph: its holder's name, the attribute in brackets, then
    its own name: `If_3[then_branch]/Mul_0`, `/model/If[else_branch]/model/rnn/LSTM`.

    Idempotent: a name that already starts with `holder[attr]` (a file trtbisect wrote) is kept,
    so a written model reads back with the same names.
    """
    prefix = f"{holder}[{attr}]"
    if own.startswith(prefix):
        return own
    return prefix + ("" if own.startswith("/") else "/") + own


@dataclass(frozen=True)
class Flat:
    """Every node of a model, subgraphs included, with the names trtbisect gives them.

    `nodes[:top]` is graph.node in order; the nodes of subgraphs follow, each graph's nodes
    together (holders in graph order, depth first). `where[i]` is None for a top-level node,
    else (holder's index, attribute, position in that graph). `order` lists every index in
    execution order: a holder, then the nodes of its subgraphs. `own[i]`: the node's name
    without its qualification (what the exporter called it).
    """

    nodes: list[onnx.NodeProto]
    names: list[str]
    where: list[tuple[int, str, int] | None]
    order: list[int]
    own: list[str]
    top: int


def flatten(model: onnx.ModelProto) -> Flat:
    nodes = list(model.graph.node)
    names: list[str] = []
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        names.append(name)
    where: list[tuple[int, str, int] | None] = [None] * len(nodes)
    own = list(names)
    children: dict[int, list[int]] = {}

    def add_bodies(i: int) -> None:
        kids: list[int] = []
        for attr, body in subgraphs(nodes[i]):
            prefix = f"{names[i]}[{attr}]"
            for p, node in enumerate(body.node):
                j = len(nodes)
                mine = node.name or f"{node.op_type}_{p}"
                name = qualified_name(names[i], attr, mine)
                if name in seen:
                    name = f"{name}_{j}"
                seen.add(name)
                nodes.append(node)
                names.append(name)
                where.append((i, attr, p))
                own.append(mine[len(prefix):] if mine.startswith(prefix) else mine)
                kids.append(j)
        children[i] = kids
        for j in kids:
            if subgraphs(nodes[j]):
                add_bodies(j)

    top = len(nodes)
    for i in range(top):
        if subgraphs(nodes[i]):
            add_bodies(i)
    order: list[int] = []

    def visit(i: int) -> None:
        order.append(i)
        for j in children.get(i, ()):
            visit(j)

    for i in range(top):
        visit(i)
    return Flat(nodes, names, where, order, own, top)


def with_node_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose nodes, subgraphs' included, carry the names trtbisect uses (so TensorRT
    layers get them too)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    flat = flatten(out)
    for node, name in zip(flat.nodes, flat.names):
        node.name = name
    return out


def named_as_trtbisect_names(model: onnx.ModelProto) -> bool:
    """Does every node of the model (subgraphs' too) already carry trtbisect's name for it?"""
    flat = flatten(model)
    return all(n.name == name for n, name in zip(flat.nodes, flat.names))


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its model-local functions inlined, as TensorRT's ONNX parser imports them
    (onnx-tensorrt's LocalFunctionImporter parses a function's nodes in place of the call).

    onnx's own inliner does the work; its node names are then made readable and stable: each
    node taken from a function body is named `<call node>/<its name in the body>` (unnamed:
    `<op_type>_<position>`), nested calls nesting the prefix.
    """
    import onnx.inliner

    funcs = {(f.domain, f.name): f for f in model.functions}
    out = onnx.inliner.inline_local_functions(model)
    try:
        end = _name_inlined(list(model.graph.node), list(out.graph.node), 0, "", funcs)
        if end != len(out.graph.node):
            raise ValueError("node counts differ")
    except (ValueError, IndexError) as exc:  # keep the inliner's names rather than guess
        log.warning("inlined functions keep onnx's generated node names (%s)", exc)
    return out


def _name_inlined(orig: Sequence[onnx.NodeProto], new: Sequence[onnx.NodeProto], pos: int,
                  prefix: str, funcs: Mapping[tuple[str, str], onnx.FunctionProto]) -> int:
    """Walk `orig` (a graph's or a function body's nodes) against the inliner's output from
    `pos` on, naming the nodes that came from function bodies; returns where `orig` ends."""
    for k, o in enumerate(orig):
        name = prefix + (o.name or f"{o.op_type}_{k}")
        f = funcs.get((o.domain, o.op_type))
        if f is not None:
            pos = _name_inlined(list(f.node), new, pos, f"{name}/", funcs)
            continue
        n = new[pos]
        if n.op_type != o.op_type:
            raise ValueError(f"{n.op_type} where {o.op_type} was expected")
        pos += 1
        if prefix:
            n.name = name
        for (_, og), (_, ng) in zip(subgraphs(o), subgraphs(n)):
            if _name_inlined(list(og.node), list(ng.node), 0, prefix, funcs) != len(ng.node):
                raise ValueError("node counts differ in a subgraph")
    return pos


HALF_TYPES = {TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: None}
STORE_LOCATION = "trtbisect:store"  # marks an initializer whose data a Weights store holds
SMALL_BYTES = 1024  # initializers up to this size stay inside session protos


def initializer_array(t: TensorProto) -> np.ndarray:
    """An embedded tensor's values; data that disagrees with its shape (raw data longer or
    shorter than the shape needs: a damaged or hand-edited file) is a one-line error."""
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError) as exc:
        shape = "x".join(map(str, t.dims)) or "scalar"
        held = f" holds {len(t.raw_data)} bytes of raw data;" if t.raw_data else ""
        raise TrtBisectError(f"initializer {t.name!r} does not match its shape {shape}:{held} "
                             f"{_first_line(exc)} (a damaged or hand-edited model?)") from None


class Weights:
    """Initializer arrays by name: read once, shared by every session, never copied into a proto.

    External data is memory-mapped from its file; embedded data is taken out of the proto when
    the graph owns it (`Graph.from_path`), so the weights are held once.
    """

    def __init__(self, model: onnx.ModelProto, base_dir: Path | None, own: bool,
                 parent: "Weights | None" = None) -> None:
        self.base_dir = base_dir
        self.parent = parent  # holds what this model's store-marked initializers name
        self._protos = {t.name: t for t in model.graph.initializer}
        self._raw: dict[str, np.ndarray] = {}
        self._float: dict[str, np.ndarray] = {}
        if own:
            for t in model.graph.initializer:
                if t.data_location != TensorProto.EXTERNAL and _payload_bytes(t) > SMALL_BYTES:
                    from .data.spill import spill
                    self._raw[t.name] = spill(initializer_array(t))  # on disk, not twice
                    _mark_stored(t)

    def __contains__(self, name: str) -> bool:
        return name in self._protos

    def raw(self, name: str) -> np.ndarray:
        """The initializer's values in its own dtype (memory-mapped when external)."""
        if name not in self._raw:
            t = self._protos[name]
            if self.parent is not None and _is_stored(t) and name in self.parent:
                return self.parent.raw(name)  # held once, by the graph this one derives from
            self._raw[name] = self._map(t) if t.data_location == TensorProto.EXTERNAL \
                else initializer_array(t)
        return self._raw[name]

    def array(self, name: str) -> np.ndarray:
        """The initializer's values; float16/bfloat16 come back as (exact) float32."""
        if self.parent is not None and name not in self._raw and _is_stored(self._protos[name]) \
                and name in self.parent:
            return self.parent.array(name)
        arr = self.raw(name)
        if arr.dtype == np.float16 or arr.dtype.name == "bfloat16":
            if name not in self._float:
                from .data.spill import release_pages, spill
                self._float[name] = spill(arr.astype(np.float32))
                release_pages([arr])
            return self._float[name]
        return arr

    def _map(self, t: TensorProto) -> np.ndarray:
        info = {e.key: e.value for e in t.external_data}
        if info.get("location") == STORE_LOCATION or self.base_dir is None:
            raise TrtBisectError(f"the data of initializer {t.name!r} is not available")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        shape = tuple(t.dims)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.zeros(shape, dtype)
        return np.memmap(self.base_dir / info["location"], dtype=dtype.newbyteorder("<"),
                         mode="c", offset=int(info.get("offset", 0) or 0), shape=shape)

    def nbytes(self, name: str) -> int:
        t = self._protos[name]
        count = int(np.prod(tuple(t.dims), dtype=np.int64))
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize

    def total_bytes(self) -> int:
        return sum(self.nbytes(n) for n in self._protos)


def _payload_bytes(t: TensorProto) -> int:
    return len(t.raw_data) if t.raw_data else 4 * int(np.prod(tuple(t.dims), dtype=np.int64))


def _is_stored(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == STORE_LOCATION for e in t.external_data)


def _mark_stored(t: TensorProto) -> None:
    """Drop a tensor's data from the proto; the store holds it."""
    for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
              "uint64_data", "string_data"):
        t.ClearField(f)
    del t.external_data[:]
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=STORE_LOCATION)


def structure(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model without weight data (for shape inference and session protos)."""
    out = onnx.ModelProto()
    g = model.graph
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, f, getattr(model, f))
    out.doc_string = model.doc_string
    out.opset_import.extend(model.opset_import)
    out.metadata_props.extend(model.metadata_props)
    out.functions.extend(model.functions)
    og = out.graph
    og.name = g.name
    og.node.extend(g.node)
    og.input.extend(g.input)
    og.output.extend(g.output)
    og.value_info.extend(g.value_info)
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL or _payload_bytes(t) > SMALL_BYTES:
            light = og.initializer.add()
            light.name, light.data_type = t.name, t.data_type
            light.dims.extend(t.dims)
            _mark_stored(light)
        else:
            og.initializer.append(t)
    return out


@dataclass
class Graph:
    """Read-only view of a model: names, float typing, data flow and its weights.

    A model with float16/bfloat16 tensors is viewed in FP32 (its upcast): `half_typed` remembers
    which tensors were half, so the emulator can round them where the model itself rounds, and
    `declared` keeps the graph inputs' and outputs' own types for the files trtbisect writes.
    """

    model: onnx.ModelProto
    base_dir: Path | None = None
    own: bool = False
    parent: Weights | None = field(default=None, repr=False)  # store-marked names resolve here
    names: list[str] = field(init=False)
    types: dict[str, int] = field(init=False)
    producer: dict[str, int] = field(init=False)
    consumers: dict[str, list[int]] = field(init=False)
    initializers: dict[str, TensorProto] = field(init=False)
    weights: Weights = field(init=False)
    half_typed: dict[str, int] = field(init=False)
    declared: dict[str, int] = field(init=False)
    static: frozenset[str] = field(init=False)  # tensors whose inferred shape is static
    source: onnx.ModelProto = field(init=False, repr=False)
    repairs: tuple[str, ...] = field(default=(), init=False)  # what load_model's copy changed

    @classmethod
    def from_path(cls, path: str | os.PathLike, min_opset: int = 1,
                  shapes: Mapping[str, Sequence[int]] | None = None) -> "Graph":
        """Load a model file; its weights stay on disk or are held once, in the store.
        `repairs` says what trtbisect's copy changed (repair.py)."""
        p = Path(path)
        notes: list[str] = []
        graph = cls(load_model(p, min_opset, shapes, notes), base_dir=p.parent, own=True)
        graph.repairs = tuple(notes)
        return graph

    def __post_init__(self) -> None:
        check_names(self.model)
        self.weights = Weights(self.model, self.base_dir, self.own, self.parent)
        self.inlined = bool(self.model.functions)
        if self.inlined:  # as TensorRT's parser does (weights are already in the store)
            self.model = inline_functions(self.model)
        self.source = self.model  # as given (half types kept); `model` is its FP32 view
        self.declared = {v.name: v.type.tensor_type.elem_type
                         for v in [*self.model.graph.input, *self.model.graph.output]
                         if v.type.HasField("tensor_type")}
        original, self.static = infer(self.model)
        self.half_typed = {t: ty for t, ty in original.items() if ty in HALF_TYPES}
        if self.half_typed:
            self.model = upcast(self.model)
        self.types = {t: (FLOAT if ty in HALF_TYPES else ty) for t, ty in original.items()}
        flat = flatten(self.model)
        self.nodes, self.names, self.where = flat.nodes, flat.names, flat.where
        self.top, self.order, self.own_names = flat.top, flat.order, flat.own
        self.index = {name: i for i, name in enumerate(self.names)}
        self.initializers = {t.name: t for t in self.model.graph.initializer}
        self.producer, self.consumers = data_flow(self.nodes)

    def array(self, name: str) -> np.ndarray:
        """An initializer's values (float16 ones as exact float32), or a subgraph weight's
        (`inner_weights`)."""
        if name in self.initializers or name not in self.inner_weights:
            return self.weights.array(name)
        return self.inner_weights[name]

    @functools.cached_property
    def inner_weights(self) -> dict[str, np.ndarray]:
        """The float weights stored inside subgraphs (a body's Constant nodes and
        initializers), by value name, as float32: weights like the main graph's (TensorRT
        makes constant layers of them), read by an FP16 node through one converted copy."""
        out: dict[str, np.ndarray] = {}
        for i in range(self.top, len(self.nodes)):
            node = self.nodes[i]
            if node.op_type == "Constant" and len(node.output) == 1 and \
                    self.is_float(node.output[0]):
                value = constant_value(node)
                if value is not None:
                    out[node.output[0]] = value.astype(np.float32)
        for i in range(len(self.nodes)):
            for _, body in subgraphs(self.nodes[i]):
                for t in body.initializer:
                    if self.is_float(t.name) and t.data_location != TensorProto.EXTERNAL:
                        out[t.name] = initializer_array(t).astype(np.float32)
        return out

    def node(self, name: str) -> onnx.NodeProto:
        return self.nodes[self.index[name]]

    def is_inner(self, name: str) -> bool:
        """Does the node live inside a subgraph (an If branch, a Loop or Scan body)?"""
        return self.index[name] >= self.top

    def own_name(self, name: str) -> str:
        """The node's name without the path of its holders (what its exporter called it)."""
        return self.own_names[self.index[name]]

    def holders(self, name: str) -> list[str]:
        """The nodes holding this one, outermost first (empty for a top-level node)."""
        out: list[str] = []
        at = self.where[self.index[name]]
        while at is not None:
            out.append(self.names[at[0]])
            at = self.where[at[0]]
        return out[::-1]

    def body_nodes(self, holder: int, attr: str) -> list[int]:
        """Indices of the nodes of one subgraph of node `holder`, in that graph's order."""
        return self._bodies.get((holder, attr), [])

    @functools.cached_property
    def _bodies(self) -> dict[tuple[int, str], list[int]]:
        out: dict[tuple[int, str], list[int]] = defaultdict(list)
        for j, at in enumerate(self.where):
            if at is not None:
                out[(at[0], at[1])].append(j)
        return dict(out)

    def is_float(self, tensor: str) -> bool:
        return bool(tensor) and self.types.get(tensor) == FLOAT

    def inputs(self) -> list[onnx.ValueInfoProto]:
        """Graph inputs that must be fed (old IR versions also list initializers as inputs)."""
        return [v for v in self.model.graph.input if v.name not in self.initializers]

    def fed_inputs(self) -> list[onnx.ValueInfoProto]:
        """The inputs to feed, with the types the model declares (float16 stays float16)."""
        return [v for v in self.source.graph.input if v.name not in self.initializers]

    def output_names(self) -> list[str]:
        return [v.name for v in self.model.graph.output]

    def all_names(self) -> set[str]:
        """Every tensor and node name in the graph, subgraphs included (internal names must
        avoid all of them)."""
        names = {t for n in self.nodes for t in [*n.input, *n.output]}
        for g in walk_graphs(self.model.graph):
            names.update(v.name for v in [*g.input, *g.output, *g.value_info, *g.initializer])
        return names | set(self.names)

    @property
    def opset(self) -> int:
        return next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 1)

    def is_candidate(self, i: int) -> bool:
        """Can node i (an index of `nodes`: subgraphs' nodes too) be switched between FP16 and
        FP32?

        Not when it only moves or retypes data, holds a subgraph (an If, Loop or Scan computes
        nothing itself: the nodes of its subgraphs are candidates of their own), is outside
        ONNX's default domain (`coverage.unjudged` lists those), or its schema does not accept
        float16.
        """
        node = self.nodes[i]
        if node.op_type in PASS_THROUGH_OPS or node.domain not in ("", "ai.onnx"):
            return False
        if subgraphs(node):
            return False
        if not any(self.is_float(t) for t in [*node.input, *node.output]):
            return False
        return fp16_signature(node, self.opset) is not None

    def fp16_inputs(self, name: str) -> list[str]:
        """Float data inputs that the node reads in FP16 when it runs in FP16.

        Schema permitting, and never an input that parametrises the op rather than carrying data
        (Resize's roi and scales, Range's bounds, ...): TensorRT reads those as shape parameters,
        and rounding them would change the op, not its precision.
        """
        node = self.node(name)
        allowed = fp16_signature(node, self.opset)
        if allowed is None:
            return []
        params = PARAMETER_INPUTS.get(node.op_type, ())
        return [t for k, t in enumerate(node.input)
                if self.is_float(t) and k in allowed and k not in params
                and t not in node.input[:k]]

    @functools.cached_property
    def _candidates(self) -> list[str]:
        """In execution order: a subgraph's nodes where their holder runs."""
        return [self.names[i] for i in self.order if self.is_candidate(i)]

    def candidates(self) -> list[str]:
        return list(self._candidates)

    @functools.cached_property
    def candidate_set(self) -> frozenset[str]:
        """`candidates()` for membership tests (a list's are linear: quadratic over a graph)."""
        return frozenset(self._candidates)

    def float_outputs(self, name: str) -> list[str]:
        return [t for t in self.node(name).output if self.is_float(t)]

    def fp32_outputs(self, name: str) -> list[str]:
        """Float outputs that stay FP32 when the node runs in FP16 (graph.fp32_outputs)."""
        node = self.node(name)
        keep = fp32_outputs(node, self.opset)
        return [t for k, t in enumerate(node.output) if k in keep and self.is_float(t)]

    def float_inputs(self, name: str) -> list[str]:
        return [t for t in dict.fromkeys(self.node(name).input) if self.is_float(t)]

    def stored_tensors(self) -> list[str]:
        """Float tensors written by candidate nodes that a graph output can expose, in
        execution order: every top-level one; inside If branches every one (a branch not
        taken exposes an empty tensor); inside Loop and Scan bodies those of static shape
        (exposed as scan outputs: every iteration's value, stacked), and the bodies' own
        float inputs (a Loop's state as each trip reads it) just before their nodes. Not one
        inside an If inside a Loop or the reverse (the iterations' values could differ)."""
        return list(self._stored)

    @functools.cached_property
    def _stored(self) -> list[str]:
        out: list[str] = []
        for i in self.order:
            for attr, body in subgraphs(self.nodes[i]):
                out += [v.name for v in body.input if self.is_float(v.name)
                        and self.exposable(v.name)]
            if self.names[i] in self.candidate_set:
                out += [t for t in self.float_outputs(self.names[i]) if self.exposable(t)]
        return out

    def scope_of(self, t: str) -> tuple[int, str, int] | None:
        """Where value t is made: None at the top level, else (holder, attribute, position)."""
        if t in self.producer:
            return self.where[self.producer[t]]
        return self._body_inputs.get(t)

    @functools.cached_property
    def _body_inputs(self) -> dict[str, tuple[int, str, int]]:
        return {v.name: (i, attr, -1) for i in range(len(self.nodes))
                for attr, body in subgraphs(self.nodes[i]) for v in body.input}

    def exposable(self, t: str) -> bool:
        at = self.scope_of(t)
        kinds = set()
        while at is not None:
            kinds.add("if" if self.nodes[at[0]].op_type == "If" else "loop")
            at = self.where[at[0]]
        return kinds <= {"if"} or (kinds == {"loop"} and t in self.static)

    def materialize(self) -> onnx.ModelProto:
        """The whole model with its weights in one proto (small models only: TensorRT, tests)."""
        out = onnx.ModelProto()
        out.CopyFrom(self.model)
        for t in out.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL:
                t.CopyFrom(numpy_helper.from_array(np.asarray(self.array(t.name), order="C"),
                                                   t.name))
        return out


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a Constant node (None for sparse, string or external values)."""
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return None if a.t.data_location == TensorProto.EXTERNAL else initializer_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
    return None


def data_flow(nodes) -> tuple[dict[str, int], dict[str, list[int]]]:
    """tensor -> index of the node that writes it, and -> indices of the nodes that read it."""
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for t in node.output:
            if t:
                producer[t] = i
        for t in node_reads(node):  # a node holding subgraphs reads what they read outside
            consumers[t].append(i)
    return producer, consumers


# Inputs that parametrise an op (positions), never rounded: they are not FP16 data.
PARAMETER_INPUTS: dict[str, tuple[int, ...]] = {
    "Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2), "Pad": (2,), "Dropout": (1,),
    "NonMaxSuppression": (3, 4),
}


def upcast(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's structure with every float16/bfloat16 type made float32 (weights untouched:
    the store upcasts arrays when they are read)."""
    out = structure(model)
    for g in walk_graphs(out.graph):  # subgraphs' values, weights and Casts too
        for v in [*g.input, *g.output, *g.value_info]:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in HALF_TYPES:
                v.type.tensor_type.elem_type = FLOAT
        for t in g.initializer:
            if t.data_type in HALF_TYPES:
                if t.data_location == TensorProto.EXTERNAL:
                    t.data_type = FLOAT  # the store hands out float32 for it
                else:
                    t.CopyFrom(numpy_helper.from_array(
                        initializer_array(t).astype(np.float32), t.name))
        for node in g.node:
            for a in node.attribute:
                if (a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT
                        and a.i in HALF_TYPES):
                    a.i = FLOAT
                elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type in HALF_TYPES:
                    a.t.CopyFrom(numpy_helper.from_array(
                        initializer_array(a.t).astype(np.float32), a.t.name))
    return out


def fp16_signature(node: onnx.NodeProto, opset: int) -> frozenset[int] | None:
    """Input positions that may hold float16 when the node runs in FP16, or None when no float
    output can be float16 (the node cannot run in FP16 at all). A node with some outputs that
    cannot be float16 still runs in FP16: those stay FP32 (`fp32_outputs`)."""
    return _signature(node.op_type, node.domain, opset, len(node.input))


def fp32_outputs(node: onnx.NodeProto, opset: int) -> frozenset[int]:
    """Output positions that stay float32 when the node runs in FP16: the schema lets them be
    float but not float16 (opset-17 LayerNormalization's Mean and InvStdDev, type U)."""
    return _fp32_outputs(node.op_type, node.domain, opset, len(node.output))


def _schema_types(op_type: str, domain: str, opset: int):
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None, {}
    return schema, {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}


@functools.lru_cache(maxsize=4096)
def _fp32_outputs(op_type: str, domain: str, opset: int, outputs: int) -> frozenset[int]:
    schema, allowed = _schema_types(op_type, domain, opset)
    if schema is None or not schema.outputs:
        return frozenset()
    formal = list(schema.outputs)
    out = set()
    for k in range(outputs):
        types = allowed.get(formal[min(k, len(formal) - 1)].type_str, set())
        if "tensor(float)" in types and "tensor(float16)" not in types:
            out.add(k)
    return frozenset(out)


@functools.lru_cache(maxsize=4096)
def _signature(op_type: str, domain: str, opset: int, inputs: int) -> frozenset[int] | None:
    schema, allowed = _schema_types(op_type, domain, opset)
    if schema is None:
        return None

    def takes_half(type_str: str) -> bool:
        return "tensor(float16)" in allowed.get(type_str, {type_str})

    floats = [p for p in schema.outputs if "tensor(float)" in allowed.get(p.type_str, {p.type_str})]
    if floats and not any(takes_half(p.type_str) for p in floats):
        return None
    positions: set[int] = set()
    formal = list(schema.inputs)
    for k in range(inputs):
        param = formal[min(k, len(formal) - 1)] if formal else None
        if param is not None and takes_half(param.type_str):
            positions.add(k)
    return frozenset(positions)


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor name we can type (inputs, initializers, node outputs).

    onnx's inference stops at an op whose schema it does not know (a com.microsoft op, a
    custom op): such an op's untyped outputs are taken to have its first typed input's element
    type (FusedMatMul, SkipLayerNormalization, Attention... all keep their input's type), and
    inference runs again from there, so what follows it is typed too.
    """
    return infer(model)[0]


def infer(model: onnx.ModelProto) -> tuple[dict[str, int], frozenset[str]]:
    """`infer_types`, and the names whose shape inference gives fully static dims."""
    work = structure(model)
    types: dict[str, int] = {}
    static: frozenset[str] = frozenset()
    for _ in range(MAX_TYPE_GUESSES):
        types, static = _inferred_types(work)
        guessed = _guess_unknown_outputs(work, types)
        if not guessed:
            break
        for name, elem in guessed.items():
            work.graph.value_info.append(helper.make_tensor_value_info(name, elem, None))
            types[name] = elem
    return types, static


MAX_TYPE_GUESSES = 8  # rounds of inference past unknown ops (each round types a further layer)


def _inferred_types(model: onnx.ModelProto) -> tuple[dict[str, int], frozenset[str]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # inference is best effort: typing falls back to declared infos
        log.warning("ONNX shape inference failed (%s); using declared types only", exc)
        inferred = model
    types: dict[str, int] = {}
    static: set[str] = set()
    for g in walk_graphs(inferred.graph):  # names are unique model-wide (SSA)
        for v in [*g.input, *g.value_info, *g.output]:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                types[v.name] = v.type.tensor_type.elem_type
                tt = v.type.tensor_type
                if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
                    static.add(v.name)
        for t in g.initializer:
            types[t.name] = t.data_type
        for node in g.node:
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        types[node.output[0]] = a.t.data_type
                    elif a.name in ("value_float", "value_floats"):
                        types[node.output[0]] = FLOAT
    return types, frozenset(static)


def _guess_unknown_outputs(model: onnx.ModelProto, types: Mapping[str, int]) -> dict[str, int]:
    guessed: dict[str, int] = {}
    opset = {o.domain: o.version for o in model.opset_import}
    for node in walk(model.graph.node):
        if has_schema(node, opset.get(node.domain, opset.get("", 1))):
            continue
        elem = next((types[t] for t in node.input if t in types), None)
        if elem is None:
            continue
        guessed.update({t: elem for t in node.output if t and t not in types})
    return guessed


def has_schema(node: onnx.NodeProto, opset: int) -> bool:
    """Does onnx know this op (its domain at this opset)?"""
    return _has_schema(node.op_type, node.domain, opset)


@functools.lru_cache(maxsize=4096)
def _has_schema(op_type: str, domain: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset, domain)
        return True
    except onnx.defs.SchemaError:
        return False
