"""Per-node rounding beside TensorRT's semantics: the pessimistic bound (`--semantics strict`)
measured on a trt run, and the nodes only per-node rounding blames.

TensorRT computes some of a model's FP16 candidates in FP32 at build time (BatchNorms folded
into a Conv or turned into an FP32 scale/shift, constant subgraphs folded): a plan that holds
under trt and fails per node names them, so the user knows which answer depends on the build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..context import Context, JudgeOptions
from ..graph import Graph
from ..judge import semantics
from ..judge.verdict import VerdictName
from ..result import StrictError
from .evaluator import Evaluator
from .written import worst_of

STRICT_NARROW_LIMIT = 16  # absorbed nodes tried one by one when strict disagrees


@dataclass(frozen=True)
class Strict:
    """What per-node rounding says beside TensorRT's (`compare_with_strict`): all-FP16's
    error per output, the nodes only per-node rounding blames, and the words for them."""
    errors_before: dict[str, StrictError]  # precision.json's "errors_before_strict"
    only_culprits: list[str] | None = None  # "strict_only_culprits"; None: none looked for
    notes: dict[str, str] = field(default_factory=dict)  # node -> why (note_semantics)


def compare_with_strict(plan: frozenset[str], verdict: VerdictName, ctx: Context,
                        judge: JudgeOptions) -> Strict:
    """Under trt semantics: all-FP16 judged per node too ("errors_before_strict"), and, when
    the plan (`verdict`: the run's so far) holds under trt but not per node, the BatchNorms /
    folded constants it takes."""
    strict = Evaluator(strict_context(ctx), judge, {}, None)
    absorbed = absorbed_nodes(ctx)
    strict.emulator.ensure(plan | set(absorbed))
    _, before, _ = strict.measure(frozenset())
    errors = {k: StrictError(v) for k, v in worst_of(before).items()}
    if verdict not in ("fixed", "fp16_ok") or not absorbed \
            or strict.measure(plan)[0] or not strict.measure(plan | set(absorbed))[0]:
        return Strict(errors)
    needed = list(absorbed)
    if len(needed) <= STRICT_NARROW_LIMIT:
        for n in list(needed):
            if strict.measure(plan | (set(needed) - {n}))[0]:
                needed.remove(n)
    return Strict(errors, needed,
                  {n: "fails only under per-node rounding: " + absorbed[n] for n in needed})


def strict_context(ctx: Context) -> Context:
    """The same model, samples and reference, judged per node (nothing prepared)."""
    return replace(ctx, search=None, prepared=None,
                   rules=semantics.Rules(precision=ctx.rules.precision))


def absorbed_nodes(ctx: Context) -> dict[str, str]:
    """Candidates of the model as given that TensorRT's build-time rewrites take out of FP16
    (node -> why): BatchNorms as FP32 scale/shift or folded, constant subgraphs."""
    assert ctx.prepared is not None
    g, out = ctx.graph, {}
    cands = set(g.candidates())
    for n in g.candidates():
        op = g.node(n).op_type
        carrier = ctx.prepared.renamed.get(n)
        if op == "BatchNormalization" and carrier is not None:
            out[n] = (f"TensorRT folds this BatchNorm into {carrier}'s weights in FP32 at "
                      "build time")
        elif op == "BatchNormalization" and n in ctx.judged.index and any(
                t.endswith("::scale") for t in ctx.judged.node(n).input):
            out[n] = "TensorRT precomputes this BatchNorm's scale and shift in FP32"
        elif carrier is not None:
            out[n] = "TensorRT folds this constant computation in FP32 at build time"
    return {n: w for n, w in out.items() if n in cands}


def semantics_notes(fp32_nodes: Sequence[str], g: Graph) -> dict[str, str]:
    """A strict run whose culprit is something TensorRT computes in FP32 at build time:
    node -> the note (diagnose.note_semantics)."""
    notes = {}
    for n in fp32_nodes:
        node = g.node(n)
        consts = [t for t in node.input[1:] if t in g.initializers and t not in g.producer]
        if node.op_type == "BatchNormalization" and len(consts) == len(node.input) - 1 >= 4:
            notes[n] = ("may fail only under per-node rounding (--semantics strict): TensorRT "
                        "precomputes this BatchNorm's scale in FP32 or folds it into the Conv; "
                        "try --semantics trt")
        elif node.input and all(t in g.initializers and t not in g.producer
                                for t in node.input if t):
            notes[n] = ("may fail only under per-node rounding (--semantics strict): TensorRT "
                        "folds this constant computation in FP32; try --semantics trt")
    return notes
