"""Detected causes in words: the summary of a culprit group, each node's `why`, and the fixes.

detect.py finds the cause, the pattern and the numbers; this module only phrases them, in the
words a deployment engineer uses, with the fix that makes FP32 fallback needless. The words
are those of the run's low precision (`Facts.p`: FP16 or BF16, its name, range and spacing);
fixes that only bring values into FP16's range are not offered under BF16, whose range is
FP32's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..judge.precision import FP16, Precision
from ..search.prior import SMALL_CONSTANT
from .detect import attention_scale, flushed_at, node_numbers
from .facts import Evidence, Facts

DOMAIN_OPS = {"Sqrt": "Max(x, 0)", "Log": "Max(x, eps)", "Div": "denominator + eps",
              "Reciprocal": "x + eps", "Pow": "Max(x, eps)"}


@dataclass(frozen=True)
class RewriteAdvice:
    """Whether `run --rewrite` does a fix here (diagnosis/advice.py): the rule, "matches",
    "refused" (and why) or "no_match", and the words the fix's text gets."""

    rule: str
    status: str
    words: str
    reason: str | None = None  # "refused": the rule's or the run's reason

    def to_json(self) -> dict:
        return {"rule": self.rule, "status": self.status,
                **({"reason": self.reason} if self.reason is not None else {}),
                "words": self.words}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RewriteAdvice:
        return cls(d["rule"], d["status"], d["words"], d.get("reason"))


@dataclass(frozen=True)
class Fix:
    """One way out; `kind` is stable (tests, reports), `text` is for people."""

    kind: str
    text: str
    rewrite: RewriteAdvice | None = None  # whether `run --rewrite` does it here (advice.py)

    def to_json(self) -> dict:
        return {"kind": self.kind, "text": self.text,
                **({"rewrite": self.rewrite.to_json()} if self.rewrite else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Fix:
        rewrite = d.get("rewrite")
        return cls(d["kind"], d["text"],
                   RewriteAdvice.from_json(rewrite) if rewrite is not None else None)


def num(x: float | int | None) -> str:
    """3 significant digits, exponent without padding: 5.54e6, 965, 0.00034."""
    if x is None:
        return "?"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    s = f"{x:.3g}"
    if "e" in s:
        mant, exp = s.split("e")
        s = f"{mant}e{int(exp)}"
    return s


# ---------------------------------------------------------------- fixes and words

def fixes_for(f: Facts, group: Sequence[str], cause: str, pattern: str | None,
              ev: Evidence) -> list[Fix]:
    """Keeping FP32 first (what the plan does), then the model changes that make it needless."""
    keep = Fix("keep_fp32", f"keep {_nodes(len(group))} in FP32")  # listed in "nodes"
    return [keep, *_model_fixes(f, group, cause, pattern, ev)]


def _model_fixes(f: Facts, group: Sequence[str], cause: str, pattern: str | None,
                 ev: Evidence) -> list[Fix]:
    by_pattern = {
        "layernorm_decomposed": _layernorm_fix(f.g.opset),
        "rmsnorm_decomposed": Fix("prescale_norm", f"{'multiply' if cause == 'underflow' else 'divide'}"
                                  " x by a power of two before squaring (RMSNorm is scale "
                                  "invariant apart from eps), or fuse it into RMSNormalization "
                                  "(opset 23) where the runtime keeps its statistics in FP32"),
        "attention_logits": _attention_fix(f, group),
        "attention_mask": Fix("clamp_mask_fill", "clamp the mask fill to -1e4 or "
                              "torch.finfo(torch.float16).min (-65504) instead of "
                              f"{num(_f(ev.get('value')))}, so FP16 holds it"),
        "batchnorm_statistics": Fix("fold_batchnorm", "fold BatchNormalization into the "
                                    f"preceding Conv in FP32 before the {f.p.label} build"),
        "large_reduction": Fix("mean_before_sum", "divide by the element count before summing "
                               "(ReduceMean, or scale the input by 1/N), so the sum stays in range"),
        "power_spectrum": Fix("normalize_spectrum", "normalise the frames (divide by n_fft or "
                              "the window sum) before squaring, so |X|^2 stays below 65504"),
        "exp": Fix("subtract_max_before_exp", "subtract the running max before Exp (as Softmax "
                   "does), or use a fused Softmax/LogSoftmax/Softplus"),
        "cancellation": Fix("reorder_arithmetic", f"avoid cancelling large terms in {f.p.label}: "
                            "compute a variance as mean((x - mean)^2), not mean(x^2) - mean^2, "
                            "and fold constant offsets that are added and removed"),
    }
    fixes = [by_pattern[pattern]] if pattern in by_pattern else []
    if not f.p.narrow_range:  # BF16: rescaling into FP16's range helps nothing
        fixes = [fx for fx in fixes if fx.kind not in RANGE_FIXES]
    fixes += _cause_fixes(f, cause, ev)
    return fixes


# fixes whose only effect is to keep values inside FP16's range (or above its subnormals)
RANGE_FIXES = frozenset({"clamp_mask_fill", "mean_before_sum", "normalize_spectrum",
                         "scale_before_matmul", "prescale_norm", "subtract_max_before_exp"})


def _nodes(n: int) -> str:
    return "this node" if n == 1 else f"these {n} nodes"


def pct(x: float | None) -> str:
    """A relative error as a percentage of the output's range."""
    if x is None or not math.isfinite(x):
        return str(x)
    return f"{num(100 * x)}%"


def _f(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _layernorm_fix(opset: int) -> Fix:
    if opset < 17:
        return Fix("reexport_opset17", f"re-export at opset >= 17 (this model is opset {opset}) "
                   "so LayerNormalization is one op whose statistics TensorRT keeps in FP32")
    return Fix("fuse_layernorm", "fuse the chain into one LayerNormalization op (opset >= 17) "
               "so TensorRT keeps its statistics in FP32")


def _attention_fix(f: Facts, group: Sequence[str]) -> Fix:
    scale = attention_scale(f, group)
    what = f"the {scale[0]} by {num(scale[1])}" if scale else "the 1/sqrt(d) scale"
    return Fix("scale_before_matmul", f"move {what} before the MatMul (scale Q, or Q and K by "
               "d^-1/4) so the logits never exceed 65504")


def _cause_fixes(f: Facts, cause: str, ev: Evidence) -> list[Fix]:
    p = f.p
    if cause == "underflow":
        out = [Fix("rescale_input", f"rescale the values so they stay above {p.label}'s "
                   f"smallest normal {num(p.min_normal)} (subnormals end at {num(p.tiny)})")]
        if ev.get("constant") is not None and _is_eps(ev):
            out.insert(0, Fix("raise_eps", f"raise eps {ev.get('constant')} = "
                              f"{num(_f(ev.get('constant_value')))} to at least 1e-5"))
        return out
    if cause == "non_finite_origin" and str(ev.get("op")) in DOMAIN_OPS:
        guard = DOMAIN_OPS[str(ev["op"])]
        return [Fix("guard_domain", f"guard the argument of {ev['op']} ({guard}) so "
                    f"{p.label} rounding cannot leave its domain")]
    if cause == "constant_out_of_range":
        return [Fix("clip_constant", f"clip {ev.get('constant')} into {p.label}'s range "
                    f"(|x| <= {p.max_text}) before export, if the model tolerates it")]
    if cause == "precision_loss" and f.relax:  # "": loosening would not help (NaN/inf)
        return [Fix("loosen_tolerance", f.relax)]
    return []


def summarize(f: Facts, group: Sequence[str], cause: str, pattern: str | None, ev: Evidence,
              fixes: Sequence[Fix], scope: str | None) -> str:
    """One sentence: where, what, the numbers, what to do."""
    where = f"{scope}: " if scope else ""
    what = _what(f, cause, pattern, ev)
    alt = next((fx.text for fx in fixes if fx.kind != "keep_fp32"), None)
    todo = f"keep {_nodes(len(group))} in FP32" + (f", or {alt}" if alt else "")
    return f"{where}{what}; {todo}."


def _what(f: Facts, cause: str, pattern: str | None, ev: Evidence) -> str:
    g = lambda k: num(_f(ev.get(k)))  # noqa: E731 - a formatter, local to the sentence
    p, low = f.p, f.p.label
    if cause == "constant_out_of_range":
        nan = ev.get(f"output_nonfinite_{p.name}") or 0
        tail = f"; {nan} of {ev.get('output_size')} values turn NaN/inf" if nan else ""
        zero = " (0 * -inf = NaN)" if ev.get("op") == "Mul" and nan else ""
        return (f"{ev['op']} {ev['node']} reads constant {ev['constant']} = {g('value')}, which "
                f"{_converts(ev, p)} {ev[p.key('value')]}{zero}{tail}")
    if cause == "overflow":
        return _overflow_words(pattern, ev, g, p)
    if cause == "underflow":
        return _underflow_words(ev, g, p)
    if cause == "non_finite_origin":
        fed = "" if ev.get("in_group") else f", fed by these nodes' {low} outputs"
        return (f"{ev['op']} {ev['node']} is where {low} first turns NaN/inf ({ev['nonfinite']} "
                f"of {ev['size']} values) while FP32 stays finite (max {g('fp32_absmax')}){fed}, "
                f"with no value out of {low}'s range")
    spacing = (f"; values reach {g('magnitude')} where {low} spacing is "
               f"{g(p.key('spacing'))}, then cancel to {g('result_absmax')}"
               if pattern == "cancellation" else "")
    # where the values are largest (the group's entry or inside it) its spacing is coarsest
    top = max(_f(ev.get("magnitude")) or 0.0, _f(ev.get("input_absmax")) or 0.0)
    at = "" if spacing else f"; spacing {num(p.spacing(top))} at {num(top)}"
    bits = ("" if p.narrow_range else
            f" ({low} keeps {p.fraction_bits + 1} significant bits: each rounding moves a value "
            f"by up to 2^-{p.fraction_bits + 1} = {pct(2.0 ** -(p.fraction_bits + 1))} of it{at})")
    return (f"no value leaves {low}'s range, but {_trend(ev, low)} over "
            f"{_count(ev['chain_length'], 'node')}{spacing}{bits}")


def _trend(ev: Evidence, low: str) -> str:
    """How the error moves across the group, in the words its two numbers allow."""
    before, after = _f(ev.get("input_rel_err")), _f(ev.get("rel_err"))
    span = f"{pct(before)} to {pct(after)} of the tensor's range"
    if before is None or after is None or not (math.isfinite(before) and math.isfinite(after)):
        return f"the {low} error goes from {span}"
    if after > 1.05 * before:
        return f"the {low} error grows from {span}"
    if after < before / 1.05:  # each rounding still counts: the search needed these nodes
        return f"the {low} error, already {pct(before)} where the values enter, falls to " \
               f"{pct(after)} and still adds to what the outputs miss by"
    return f"the {low} error stays near {pct(after)} of the tensor's range"


def _count(n: object, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _overflow_words(pattern: str | None, ev: Evidence, g, p: Precision = FP16) -> str:
    factor = _f(ev.get("factor"))
    if pattern in ("layernorm_decomposed", "rmsnorm_decomposed") and _f(ev.get("square_absmax")):
        factor = (_f(ev.get("square_absmax")) or 0.0) / p.max  # the square's own overflow
    over = f"overflows {p.label} (max {p.max_text}, {num(factor)}x over)"
    peak_over = f"overflows {p.label} (max {p.max_text}, {num(_f(ev.get('peak_factor')))}x over)"
    # the square's own input and output where detect.py found it (the group's first overflow
    # may be a later tensor: the mean of the squares)
    into = "squared_absmax" if ev.get("squared_absmax") is not None else "input_absmax"
    out = "square_absmax" if ev.get("square_absmax") is not None else "fp32_absmax"
    if pattern == "layernorm_decomposed":
        return f"the decomposed LayerNorm squares values of {g(into)}: " \
               f"(x - mean)^2 = {g(out)} {over}"
    if pattern == "rmsnorm_decomposed":
        return f"the decomposed RMSNorm squares values of {g(into)}: " \
               f"x^2 = {g(out)} {over}"
    if pattern == "attention_logits":
        back = f", scaled back to {g('back_in_range')}" if ev.get("back_in_range") else ""
        return f"attention logits Q.K^T reach {g('peak')} before the scale{back}; that {peak_over}"
    if pattern == "power_spectrum":
        return f"the power spectrum squares DFT values of {g('input_absmax')}: |X|^2 = " \
               f"{g('fp32_absmax')} {over}"
    if pattern == "exp":
        return f"Exp {ev['node']} of inputs up to {g('input_absmax')} gives {g('fp32_absmax')}, " \
               f"which {over}"
    if pattern == "large_reduction":
        return f"{ev['op']} {ev['node']} sums values of up to {g('input_absmax')} into " \
               f"{g('fp32_absmax')}, which {over}"
    if not ev.get("written_by_group"):
        return f"{ev['op']} {ev['node']} reads {ev['tensor']} of {g('fp32_absmax')}, which {over}"
    return f"{ev['op']} {ev['node']} writes {g('fp32_absmax')} from inputs of at most " \
           f"{g('input_absmax')}, which {over}"


def _is_eps(ev: Evidence) -> bool:
    """A small constant (a scalar, per-head values) is an epsilon; a weight tensor with a few
    tiny values is not, and raising it is no fix."""
    size = ev.get("constant_size")
    return not isinstance(size, int) or size <= SMALL_CONSTANT


def _underflow_words(ev: Evidence, g, p: Precision = FP16) -> str:
    parts, low = [], p.label
    if ev.get("flushed"):
        parts.append(f"{ev['flushed']} of {ev['size']} values of {ev['tensor']} (max "
                     f"{g('fp32_absmax')}) flush to zero in {low} (smallest subnormal "
                     f"{p.tiny_text})")
    what = "eps" if _is_eps(ev) else "a value of weight"
    raised = f"constant_{p.name}"
    if ev.get("constant") and ev.get(raised):  # TensorRT raises it to the smallest subnormal
        parts.append(f"{what if parts else 'constant'} {ev['constant']} = "
                     f"{g('constant_value')} is below {low}'s smallest subnormal: TensorRT's "
                     f"{low} conversion raises it to {g(raised)}")
    elif ev.get("constant"):
        parts.append(f"{what} {ev['constant']} = {g('constant_value')} flushes to zero too"
                     if parts else f"constant {ev['constant']} = {g('constant_value')} flushes "
                     f"to zero in {low}")
    if ev.get("consequence_op"):
        op = str(ev["consequence_op"])
        how = {"Div": "divides by zero (x/0 = inf, 0/0 = NaN)", "Log": "takes log(0) = -inf",
               "Reciprocal": "takes 1/0 = inf"}.get(op, "turns non-finite")
        parts.append(f"then {op} {ev['consequence_node']} {how} in "
                     f"{ev['consequence_nonfinite']} values")
    return "; ".join(parts)


# ---------------------------------------------------------------- per node

def node_why(f: Facts, node: str, cause: str, ev: Evidence) -> str:
    """What this one node does wrong, in numbers."""
    nn = node_numbers(f, node)
    op, ins, outs = nn.op, nn.input_absmax, nn.output_absmax
    p, low = f.p, f.p.label
    if cause == "constant_out_of_range" and node == ev.get("node"):
        return (f"{op} reads constant {ev['constant']} = {num(_f(ev.get('value')))}, which "
                f"{_converts(ev, p)} {ev[p.key('value')]}")
    if ins > p.max or outs > p.max:
        return _range_role(op, ins, outs, p)
    if cause == "underflow":
        flushed = flushed_at(f, node)
        if flushed:
            return _flushed_words(op, flushed, p)
    if cause == "non_finite_origin" and node == ev.get("node"):
        return f"{op}: first NaN/inf in {low} ({ev['nonfinite']} of {ev['size']} values), FP32 finite"
    a, b = nn.input_rel_err, nn.output_rel_err
    moves = ("grows from" if b > 1.05 * a else "falls from" if b < a / 1.05 else "stays at")
    return (f"{op}: {low} error {moves} {pct(a)} to {pct(b)} of the "
            f"range (values up to {num(outs)}, {low} spacing {num(nn.fp16_spacing)})"
            if moves != "stays at" else
            f"{op}: {low} error stays near {pct(b)} of the range (values up to {num(outs)}, "
            f"{low} spacing {num(nn.fp16_spacing)})")


def _converts(ev: Evidence, p: Precision = FP16) -> str:
    """How the judge's weight rule turns an out-of-range constant into the low precision."""
    return f"TensorRT's {p.label} conversion clamps to" if ev.get("weight_rule") == "clamp" \
        else f"{p.label} rounds to"


def _range_role(op: str, ins: float, outs: float, p: Precision = FP16) -> str:
    if ins <= p.max:
        return f"{op} writes {num(outs)} ({num(outs / p.max)}x {p.label}'s {p.max_text}) " \
               f"from inputs of at most {num(ins)}"
    if outs > p.max:
        return f"{op} reads {num(ins)} and writes {num(outs)}, both beyond {p.max_text}"
    return f"{op} reads {num(ins)} (> {p.max_text}) and brings it back to {num(outs)}"


def _flushed_words(op: str, fl: Evidence, p: Precision = FP16) -> str:
    low = p.label
    if "constant" in fl and fl.get(p.key("value")):
        return f"{op} reads constant {fl['constant']} = {num(_f(fl['value']))}, which " \
               f"TensorRT's {low} conversion raises to {num(_f(fl[p.key('value')]))}"
    if "constant" in fl:
        return f"{op} reads constant {fl['constant']} = {num(_f(fl['value']))}, which {low} " \
               "flushes to zero"
    verb = "writes" if fl["written"] else "reads"
    return f"{op} {verb} {fl['tensor']}: {fl['flushed']} of {fl['size']} values (max " \
           f"{num(_f(fl['fp32_absmax']))}) flush to zero in {low}"
