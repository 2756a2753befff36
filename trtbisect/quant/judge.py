"""The quantized judge: a plan (layers un-quantized) is a model, run on ONNX Runtime's CPU
provider under the one judging configuration (backends/ort.py `session_options`: graph
optimizations off, so every QuantizeLinear/DequantizeLinear runs as written, int8, uint8 and
float8 alike, and no QDQ pattern is fused into an integer kernel), and judged against the
reference outputs by the run's criteria (judge/criteria.py). The search's check and the
written file's check are this one function: the file is judged bit for bit as the search
judged its plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from ..backends.ort import model_session as session  # every session: backends/ort.py's
from ..judge.compare import Tolerance
from ..judge.criteria import Criteria, Judgement, Verdict
from . import half
from .qdq import Layer, dequantized_weights, unquantize

FP32_PREFIX = "fp32:"  # a search unit that keeps an FP16 node in FP32 (a layer's is its name)


def run_outputs(sess, sample: Mapping[str, np.ndarray], names: Sequence[str]
                ) -> dict[str, np.ndarray]:
    from ..backends.ort import run_session

    fed = {i.name: sample[i.name] for i in sess.get_inputs()}
    return {n: np.asarray(v) for n, v in zip(names, run_session(sess, fed, list(names)))}


class QuantJudge:
    """Judges plans (sets of layer names run un-quantized) on every sample; memoized."""

    def __init__(self, model: onnx.ModelProto, layers: Sequence[Layer],
                 samples: Sequence[Mapping[str, np.ndarray]],
                 references: Sequence[Mapping[str, np.ndarray]], criteria: Criteria,
                 tolerance: Tolerance, threads: int | None = None,
                 half_nodes: Sequence[str] = (), semantics: str = "trt",
                 tf32: bool = False) -> None:
        """`half_nodes`: FP16 nodes of the file that plans may keep in FP32 (half.py); their
        units are named FP32_PREFIX + node name (`units`). `semantics`: where the FP16 side
        rounds (`trt`: once per fused TensorRT layer, half.fused_internal; `strict`: every
        node)."""
        self.model, self.layers = model, list(layers)
        self.semantics, self.tf32 = semantics, tf32
        self.half: dict[str, str] = {}
        for n in half_nodes:
            unit = FP32_PREFIX + n
            while unit in self.by_name_set(layers) or unit in self.half:
                unit = FP32_PREFIX + unit
            self.half[unit] = n
        # under trt semantics, the FP16 nodes of one certain fused layer switch as one unit
        # (TensorRT gives a layer one precision, and the layer rounds only its output: keeping
        # one of its nodes in FP32 alone would store the value the layer keeps inside)
        self.fused: dict[str, tuple[str, ...]] = {}
        if semantics == "trt" and half_nodes:
            self.fused = self._fused_units(model, layers)
        self.types = half.types(model)
        self.emulated = any(t in half.HALF for t in self.types.values())
        self.by_name = {layer.name: layer for layer in self.layers}
        self.samples, self.references = samples, references
        self.criteria, self.tolerance, self.threads = criteria, tolerance, threads
        self.weights = dequantized_weights(model, [e for la in self.layers for e in la.edges])
        self.verdicts: dict[frozenset[str], Verdict] = {}  # each plan's latest (the search's)
        self._memo: dict[tuple[tuple[int, ...] | None, frozenset[str]], Verdict] = {}
        self.active: list[int] | None = None  # the search's samples (judge/subset.py); None: all
        self.runs = 0  # inferences

    def narrow(self, subset: Sequence[int] | None) -> None:
        """The search judges its plans (`measure`) on these samples only, as the FP16 road's
        --search-samples (judge/subset.py); None: on every sample. `judge_model` and
        `judgements`, the written file's judge, always judge every sample."""
        self.active = sorted(subset) if subset is not None else None

    @staticmethod
    def by_name_set(layers: Sequence[Layer]) -> set[str]:
        return {la.name for la in layers}

    def _fused_units(self, model: onnx.ModelProto, layers: Sequence[Layer]
                     ) -> dict[str, tuple[str, ...]]:
        """A search unit per certain fused layer of two or more FP16 nodes (semantics.py's
        find_layers, as half.fused_internal rounds them), named FP32_PREFIX + its TensorRT
        name; its members are their per-node units."""
        from ..judge.semantics import find_layers

        unit_of = {n: u for u, n in self.half.items()}
        taken = {la.name for la in layers} | set(self.half)
        out: dict[str, tuple[str, ...]] = {}
        for fl in find_layers(model):
            members = tuple(unit_of[n] for n in fl.nodes if n in unit_of)
            if fl.certain and len(members) > 1:
                unit = FP32_PREFIX + fl.name
                while unit in taken or unit in out:
                    unit = FP32_PREFIX + unit
                out[unit] = members
        return out

    @property
    def units(self) -> list[str]:
        """Every search unit: the quantized layers, then the FP16 nodes (in graph order), a
        fused layer's as one unit (`fused`) where its first node is."""
        grouped = {m: u for u, ms in self.fused.items() for m in ms}
        half = [grouped.get(u, u) for u in self.half]
        return [la.name for la in self.layers] + list(dict.fromkeys(half))

    def expand(self, plan) -> list[str]:
        """The plan with each fused unit replaced by its per-node units (quantized layers
        first, then the FP16 nodes in graph order)."""
        chosen = {m for u in plan for m in self.fused.get(u, (u,))}
        return ([la.name for la in self.layers if la.name in chosen]
                + [u for u in self.half if u in chosen])

    def model_for(self, plan: frozenset[str] | Sequence[str],
                  base: onnx.ModelProto | None = None) -> onnx.ModelProto:
        """The model (or `base`, a variant of it with the same layers: fixes.py) with `plan`'s
        layers un-quantized and its FP16 nodes in FP32."""
        chosen = set(self.expand(plan))
        m = unquantize(base if base is not None else self.model,
                       [la for la in self.layers if la.name in chosen], self.weights)
        nodes = [n for u, n in self.half.items() if u in chosen]
        return half.to_fp32(m, nodes, self.types) if nodes else m

    def judged_model(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """What runs for `model`: itself, or for a file with float16 values, its emulation
        (half.emulate: FP16 stores made explicit); under --tf32 the operands of its FP32 inner
        products (not a quantized layer's: TensorRT runs those in INT8/FP8) TF32-rounded, as
        the FP16 road's emulator rounds them (semantics.TF32_INPUTS)."""
        if not self.emulated and not self.tf32:
            return model
        types = half.types(model)
        out = model
        if self.emulated:
            fused = (half.fused_internal(model, types) if self.semantics == "trt"
                     else frozenset())
            out = half.emulate(model, types, fused)
        return tf32_rounded(out, model, types) if self.tf32 else out

    def judge_model(self, model: onnx.ModelProto | str | Path) -> Verdict:
        """Any model (a plan's, or a written file) on every sample under the criteria."""
        return self.criteria.verdict(self.judgements(model))

    def judgements(self, model: onnx.ModelProto | str | Path,
                   pairs: Sequence[tuple[Mapping[str, np.ndarray],
                                         Mapping[str, np.ndarray]]] | None = None
                   ) -> list[Judgement]:
        """Per sample (or per (sample, reference) of `pairs`: the validation's), the model
        judged under the criteria, as `judge_model` judges it."""
        if self.emulated or self.tf32:
            if not isinstance(model, onnx.ModelProto):
                model = onnx.load(str(model))
            model = self.judged_model(model)
        sess = session(model, self.threads)
        judged = []
        for sample, ref in (pairs if pairs is not None
                            else zip(self.samples, self.references)):
            got = run_outputs(sess, sample, list(ref))
            judged.append(self.criteria.judge(ref, got, sample, self.tolerance))
            self.runs += 1
        return judged

    def measure(self, plan: frozenset[str]) -> Verdict:
        """The search's verdict of `plan`, on its samples (`narrow`), memoized."""
        key = frozenset(plan)
        on = tuple(self.active) if self.active is not None else None
        if (on, key) not in self._memo:
            pairs = None if on is None else [(self.samples[k], self.references[k]) for k in on]
            self._memo[on, key] = self.criteria.verdict(
                self.judgements(self.model_for(key), pairs))
        self.verdicts[key] = self._memo[on, key]
        return self.verdicts[key]

    def measure_all(self, plan: frozenset[str]) -> tuple[Verdict, list[Judgement]]:
        """`plan` on every sample, with its per-sample judgements (what the search's subset
        is chosen and widened by); its verdict is `measure`'s on every sample."""
        key = frozenset(plan)
        judged = self.judgements(self.model_for(key))
        self._memo[None, key] = self.verdicts[key] = self.criteria.verdict(judged)
        return self._memo[None, key], judged

    def check(self, plan: frozenset[str]) -> bool:
        return self.measure(plan).passed


def tf32_rounded(model: onnx.ModelProto, given: onnx.ModelProto,
                 types: Mapping[str, int]) -> onnx.ModelProto:
    """`model` (the given file or its emulation) with the operands of the given file's FP32
    inner products (MatMul, Gemm, Conv, ConvTranspose writing float32; none reading a
    DequantizeLinear, a quantized layer's) rounded to TF32 first (semantics.tf32_round_nodes,
    bit-identical to TensorRT's TF32 operand rounding under the judge's session options)."""
    from ..judge.semantics import TF32_INPUTS, tf32_round_nodes

    dq = {o for n in given.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    chosen = {n.name for n in given.graph.node if n.op_type in TF32_INPUTS
              and all(types.get(o) == onnx.TensorProto.FLOAT for o in n.output if o)
              and not any(t in dq for t in n.input if t)}
    if not chosen:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    rounded: dict[str, str] = {}
    for node in out.graph.node:
        if node.name in chosen:
            for k in TF32_INPUTS[node.op_type]:
                if k < len(node.input) and node.input[k]:
                    src = node.input[k]
                    if src not in rounded:
                        rounded[src] = f"{src}__tf32"
                        nodes += tf32_round_nodes(src, rounded[src], f"{src}__tf32_")
                    node.input[k] = rounded[src]
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
