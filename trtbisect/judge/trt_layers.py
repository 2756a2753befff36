"""What trtbisect knows about TensorRT engines without importing TensorRT.

TensorRT fuses ONNX nodes into engine layers ("Conv_0 + Relu_1", "PWN(PWN(A), B)",
"{ForeignNode[first...last]}", Myelin kernels), so a precision plan written on ONNX node names
must be read back through the engine inspector. Everything here is pure and tested on JSON
fixtures: inspector parsing, layer -> node mapping and the verification of the final engine (the
"emulator first, TensorRT to verify" search that reads them is search/refine.py).
`backends/trt.py` is the only module that talks to TensorRT itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import onnx

from trtbisect.graph import node_names

log = logging.getLogger(__name__)

# The ONNX parser writes one "[ONNX Layer: <node> | <caller> (<function>) ...]" entry per source
# node; TensorRT joins the entries of fused layers with an ASCII separator: the unit separator
# (\x1f) or the record separator (\x1e). Both are split on: an entry read whole would be one
# unknown name and the mapping would fall back to a ForeignNode's whole range.
METADATA_SEPARATOR = "\x1f"
METADATA_SEPARATORS = re.compile("[\x1e\x1f]")
_ONNX_LAYER = "[ONNX Layer: "
_FOREIGN = re.compile(r"^\{ForeignNode\[(?P<body>.*)\]\}$", re.DOTALL)
_TOKEN_SPLIT = re.compile(r" \+ | \|\| |PWN\(|\)|, ")
_UNIQUE_SUFFIX = re.compile(r"^(?P<base>.+)_\d+$")
_FLOAT = ("fp32", "fp16", "bf16", "fp8")
_DTYPES = [  # order matters: bf16 before fp16, uint8 before int8
    (re.compile(r"\bbf(?:loat)?16\b"), "bf16"),
    (re.compile(r"\bfp16\b|\bhalf\b"), "fp16"),
    (re.compile(r"\bfp32\b|\bfloat\b"), "fp32"),
    (re.compile(r"\bfp8\b|\be4m3\b"), "fp8"),
    (re.compile(r"\buint8\b"), "uint8"),
    (re.compile(r"\bint8\b"), "int8"),
    (re.compile(r"\bint32\b"), "int32"),
    (re.compile(r"\bint64\b"), "int64"),
    (re.compile(r"\bbool\b"), "bool"),
]


# ---------------------------------------------------------------------------------- naming

def _as_set(names: Iterable[str]) -> AbstractSet[str]:
    return names if isinstance(names, (set, frozenset)) else set(names)


def parser_aliases(model: onnx.ModelProto) -> dict[str, str]:
    """Names the TensorRT ONNX parser gives unnamed nodes (`node_of_<first output>`) ->
    trtbisect's names (`graph.node_names`).

    Our engines are built on `graph.with_node_names(model)`, so the parser's layer names and
    `[ONNX Layer: ...]` metadata already use our names; this is for layer info exported by a
    user's own trtexec run on the unrenamed model.
    """
    names = node_names(model)
    return {f"node_of_{n.output[0]}": names[i]
            for i, n in enumerate(model.graph.node) if not n.name and n.output}


# ------------------------------------------------------------------------- inspector JSON

@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # fp32, fp16, bf16, int8, int32, ... or "" when the inspector did not say
    format: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "format": self.format}


@dataclass(frozen=True)
class EngineLayer:
    """One layer of a built engine and the ONNX nodes it computes."""

    name: str
    layer_type: str
    nodes: tuple[str, ...]  # topological order
    source: str  # how `nodes` was found: metadata | range | name | none
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    tactic: str = ""

    @property
    def float_dtypes(self) -> set[str]:
        return {t.dtype for t in (*self.inputs, *self.outputs) if t.dtype in _FLOAT}

    @property
    def output_float_dtypes(self) -> set[str]:
        """What the layer writes: an FP32 request asks FP32 outputs (`set_output_type`)."""
        return {t.dtype for t in self.outputs if t.dtype in _FLOAT}

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.layer_type, "nodes": list(self.nodes),
                "source": self.source, "tactic": self.tactic,
                "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EngineLayer:
        def tensors(key: str) -> tuple[TensorInfo, ...]:
            return tuple(TensorInfo(t["name"], t["dtype"], t.get("format", ""))
                         for t in d.get(key, []))
        return cls(d["name"], d.get("type", ""), tuple(d.get("nodes", [])),
                   d.get("source", "none"), tensors("inputs"), tensors("outputs"),
                   d.get("tactic", ""))


def parse_layer_info(info: str | Mapping[str, Any] | Sequence[Any]) -> list[dict]:
    """The layer records of `IEngineInspector.get_engine_information(JSON)` or trtexec's
    `--exportLayerInfo`, for TensorRT 10 and 11, at any profiling verbosity.

    With LAYER_NAMES_ONLY the layers are bare strings; they become `{"Name": s}`.
    """
    data = json.loads(info) if isinstance(info, str) else info
    if isinstance(data, Mapping):
        data = data.get("Layers", [])
    out = []
    for layer in data:
        if isinstance(layer, str):
            out.append({"Name": layer})
        elif isinstance(layer, Mapping):
            out.append(dict(layer))
    return out


def dtype_of(text: str) -> str:
    """Normalize an inspector datatype ("Half", "Row major linear FP32", ...) to fp16/fp32/..."""
    low = text.lower()
    for pattern, name in _DTYPES:
        if pattern.search(low):
            return name
    return ""


def tensor_info(desc: Mapping[str, Any]) -> TensorInfo:
    """TensorRT 10 writes one "Format/Datatype" string; TensorRT 11 splits it in two keys."""
    combined = str(desc.get("Format/Datatype", ""))
    dtype = str(desc.get("DataType", desc.get("Datatype", "")))
    fmt = str(desc.get("Format", combined))
    return TensorInfo(str(desc.get("Name", "")), dtype_of(dtype or combined), fmt)


def metadata_nodes(metadata: str, known: Iterable[str] = ()) -> list[str]:
    """ONNX node names in a layer's Metadata, one per `[ONNX Layer: ...]` entry.

    An entry may carry the call stack of ONNX local functions (`inner | caller (Func)`); the
    outermost name found in `known` (the top-level graph) is used, else the entry's own name.
    """
    known_set = _as_set(known)
    text = metadata.replace("][ONNX Layer: ", "]" + METADATA_SEPARATOR + _ONNX_LAYER)
    out = []
    for piece in METADATA_SEPARATORS.split(text):
        piece = piece.strip()
        if not (piece.startswith(_ONNX_LAYER) and piece.endswith("]")):
            continue
        chain = [p.strip() for p in piece[len(_ONNX_LAYER):-1].split(" | ")]
        chain = [chain[0]] + [re.sub(r" \([^()]*\)$", "", c) for c in chain[1:]]
        inside = [c for c in chain if c in known_set]
        out.append(inside[-1] if inside else chain[0])
    return list(dict.fromkeys(out))


def foreign_range(name: str, known: Iterable[str]) -> tuple[str, str] | None:
    """(first, last) of a `{ForeignNode[first...last]}` layer, split where both are known."""
    m = _FOREIGN.match(name)
    if not m:
        return None
    body, known_set = m.group("body"), _as_set(known)
    if body in known_set:
        return body, body
    for cut in [i for i in range(len(body)) if body.startswith("...", i)]:
        first, last = body[:cut], body[cut + 3:]
        if first in known_set and last in known_set:
            return first, last
    return None


def name_nodes(name: str, known: Iterable[str]) -> list[str]:
    """Fallback when Metadata is absent: read node names out of a fused layer name.

    Handles `A + B`, `A || B`, `PWN(PWN(A, B), C)` and the `_N` suffix the parser adds when one
    node makes several layers. Tokens that are not known node names are dropped.
    """
    known_set = _as_set(known)
    if name.startswith("Reformatting CopyNode"):
        return []
    out = []
    for token in (t.strip() for t in _TOKEN_SPLIT.split(name)):
        if token in known_set:
            out.append(token)
        elif (m := _UNIQUE_SUFFIX.match(token)) and m.group("base") in known_set:
            out.append(m.group("base"))
    return list(dict.fromkeys(out))


def layer_owner(metadata: str, name: str, known: Iterable[str]) -> str | None:
    """The ONNX node a *network* layer came from (TensorRT 10 path, before fusion)."""
    known_set = _as_set(known)
    found = [n for n in metadata_nodes(metadata, known_set) if n in known_set]
    found = found or name_nodes(name, known_set)
    return found[0] if found else None


def map_layers(info: str | Mapping[str, Any] | Sequence[Any], order: Sequence[str],
               aliases: Mapping[str, str] | None = None) -> list[EngineLayer]:
    """Every engine layer with the set of ONNX nodes it contains.

    Metadata first; else a ForeignNode's topological range between its first and last node in
    `order` (graph order); else the node names readable in the layer name.
    """
    aliases = dict(aliases or {})
    position = {n: i for i, n in enumerate(order)}
    known = set(order) | set(aliases)
    layers = []
    for rec in parse_layer_info(info):
        name = str(rec.get("Name", ""))
        nodes = [aliases.get(n, n) for n in metadata_nodes(str(rec.get("Metadata", "")), known)]
        nodes, source = [n for n in nodes if n in position], "metadata"
        if not nodes and (rng := foreign_range(name, known)):
            ends = [position.get(aliases.get(x, x)) for x in rng]
            if None not in ends:
                lo, hi = sorted(e for e in ends if e is not None)
                nodes, source = list(order[lo:hi + 1]), "range"
        if not nodes:
            nodes, source = [aliases.get(n, n) for n in name_nodes(name, known)], "name"
        nodes = sorted(dict.fromkeys(n for n in nodes if n in position), key=position.__getitem__)
        layers.append(EngineLayer(
            name, str(rec.get("LayerType", "")), tuple(nodes), source if nodes else "none",
            tuple(tensor_info(t) for t in rec.get("Inputs", []) if isinstance(t, Mapping)),
            tuple(tensor_info(t) for t in rec.get("Outputs", []) if isinstance(t, Mapping)),
            str(rec.get("TacticName", rec.get("TacticValue", "")))))
    return layers


def layer_groups(layers: Sequence[EngineLayer], candidates: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Engine layer name -> the candidate nodes it computes (layers with none are left out)."""
    cand = set(candidates)
    groups: dict[str, tuple[str, ...]] = {}
    for layer in layers:
        nodes = tuple(n for n in layer.nodes if n in cand)
        if nodes and nodes not in groups.values():
            groups[layer.name] = nodes
    return groups


def layer_map_json(layers: Sequence[EngineLayer]) -> dict:
    """The mapping both ways, as written next to the final engine."""
    by_node: dict[str, list[str]] = {}
    for layer in layers:
        for n in layer.nodes:
            by_node.setdefault(n, []).append(layer.name)
    return {"layers": [layer.to_json() for layer in layers], "nodes": by_node}


# ------------------------------------------------------------- reading the final engine back

@dataclass(frozen=True)
class PrecisionCheck:
    """Did TensorRT run an FP32-requested node in FP32?"""

    node: str
    status: str  # honoured | not-honoured | unknown
    layers: tuple[str, ...]
    dtypes: tuple[str, ...]

    def to_json(self) -> dict:
        return {"node": self.node, "status": self.status, "layers": list(self.layers),
                "dtypes": list(self.dtypes)}


def check_precisions(layers: Sequence[EngineLayer], fp32_nodes: Iterable[str]) -> list[PrecisionCheck]:
    """Compare the plan with the output types of the layers that compute each node.

    trtbisect asks FP32 precision and FP32 outputs, so a node is honoured when every layer
    computing it writes only FP32 floats, not honoured when one of them writes a lower
    precision (a Myelin fusion that swallowed the request; an FP32 tensor it merely reads
    proves nothing), unknown when no layer or no output datatype was reported. The inspector
    JSON has no per-layer precision field, so output types are the evidence.
    """
    out = []
    for node in fp32_nodes:
        mine = [layer for layer in layers if node in layer.nodes]
        typed = [layer.output_float_dtypes for layer in mine if layer.output_float_dtypes]
        dtypes = sorted(set().union(*typed)) if typed else []
        status = ("unknown" if not typed else
                  "honoured" if all(t == {"fp32"} for t in typed) else "not-honoured")
        out.append(PrecisionCheck(node, status, tuple(x.name for x in mine), tuple(dtypes)))
    return out


def precision_warnings(checks: Iterable[PrecisionCheck]) -> list[str]:
    return [f"FP32 request for {c.node} not honoured: {', '.join(c.layers)} wrote "
            f"{', '.join(c.dtypes)} (a fusion such as Myelin swallowed it)"
            for c in checks if c.status == "not-honoured"]


_SHOWN = 8


def describe_culprits(fp32_nodes: Sequence[str], layers: Sequence[EngineLayer]) -> list[str]:
    """Each culprit both ways: the engine layer a user sees in a profile, and the ONNX nodes."""
    plan, lines, seen = list(fp32_nodes), [], set()
    for layer in layers:
        mine = [n for n in layer.nodes if n in plan]
        if not mine:
            continue
        seen.update(mine)
        shown = ", ".join(layer.nodes[:_SHOWN])
        if len(layer.nodes) > _SHOWN:
            shown += f", ... ({len(layer.nodes)} nodes)"
        lines.append(f"engine layer `{layer.name}` contains ONNX node"
                     f"{'s' if len(layer.nodes) > 1 else ''} {shown}; "
                     f"{', '.join(mine)} must stay FP32")
    lines += [f"ONNX node {n} (in no engine layer: folded or fused away) must stay FP32"
              for n in plan if n not in seen]
    return lines


# ------------------------------------------------------------------------------ cache key

def plan_key(model_bytes: bytes, fp32_nodes: Iterable[str], trt_version: str,
             **extra: Any) -> str:
    """Engine-cache key: sha256 of model, sorted FP32 nodes, TensorRT version and build options."""
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps({"fp32": sorted(set(fp32_nodes)), "trt": trt_version,
                         **{k: extra[k] for k in sorted(extra)}}, sort_keys=True,
                        default=str).encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------- search

@dataclass
class TrtPlanResult:
    """Outcome of "search on the emulator, verify on TensorRT, refine where they disagree"."""

    fp32: list[str]
    found: bool
    emulator_fp32: list[str] | None  # None: the emulator was not consulted
    emulator_agreed: bool | None  # the emulator plan passed on TensorRT unchanged
    trt_only: list[str] = field(default_factory=list)  # what TensorRT needed on top
    culprit_layers: list[str] = field(default_factory=list)  # engine layers found in refinement
    trt_checks: int = 0  # distinct plans evaluated on TensorRT (one engine build each)
    one_minimal_on_trt: bool = False
    stopped_early: bool = False
    trials: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class TrtSearchReport:
    """What `run_trt_search` did on TensorRT: the plan, its cost, and how to rebuild it."""

    result: TrtPlanResult
    trt_version: str
    strongly_typed: bool
    builds: int  # engines actually built (cache hits excluded), FP32 reference included
    cache_hits: int
    latency_ms: dict[str, float | None]  # fp32, fp16, final (None: past --eval-timeout)
    culprits: list[str]
    precision: list[PrecisionCheck]
    files: dict[str, str]  # engine, layer_map, onnx (the model the trtexec command reads)
    trtexec: str
    polygraphy: str
    warnings: list[str] = field(default_factory=list)
    latency_clock: str = "cuda-events"  # cuda-events (GPU time) or host (enqueue + sync)
    # --workers N: the GPUs the plans were built on (parallel/trt_pool.py), rounds, speculation
    parallel: dict | None = None
    # what judged the engines when not trtbisect's default (Criteria.describe)
    criterion: str | None = None

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["result"] = self.result.to_json()
        out["precision"] = [p.to_json() for p in self.precision]
        for key in ("parallel", "criterion"):
            if out[key] is None:
                del out[key]
        return out
