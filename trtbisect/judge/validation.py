"""Validation: the written plan judged on samples the search never saw.

A plan is searched and certified on some samples; on those alone it can be fitted to them (a
detector's plan that passes its one page fails the same page seen another way at 2.4x the
bound). So before the search the run sets some samples aside, and the written file, judged by
the very judge `check` runs, must pass them too before the plan is called `fixed`:

- **held out** (two samples or more): `HOLD_OUT_SHARE` of them, at least one, chosen by
  `--seed` (`--validation-share` sets the share; 0 turns validation off). The search, its
  certificate and the renderings never see them.
- **perturbed** (one sample): `PERTURB_COPIES` copies of it, each input changed in a way that
  fits its type (`perturb`): float inputs get Gaussian noise of `PERTURB_SCALE` times their
  own standard deviation; integer inputs (token ids, bytes, masks) get `PERTURB_INT_SHARE` of
  their positions replaced by values the sample itself holds, so every value stays one the
  model was given; booleans, integer inputs of fewer than `SHAPE_LIKE` elements (shapes,
  sample rates, lengths: values the graph branches or reshapes on) and inputs the graph reads
  as a shape, a count or a branch (`shape_like_inputs`: Reshape's shape, Slice's bounds,
  If's condition, ..., directly or through integer arithmetic and Casts) stay as they are. The
  seed is `--seed`. Their FP32 reference is the model's own.
- **none**: validation turned off; the run says the plan is unvalidated.

A plan that passes its search samples but fails validation is written and called
`unvalidated` (exit 9), never `fixed`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from .compare import worst
from .criteria import Entry, Judgement, Verdict, error_from_json

HOLD_OUT_SHARE = 0.25  # of two samples or more, this share (at least one) validates
PERTURB_COPIES = 2  # one sample: this many perturbed copies validate
PERTURB_SCALE = 0.02  # float inputs: Gaussian noise of this many standard deviations
PERTURB_INT_SHARE = 0.05  # integer inputs: this share of positions takes another own value
SHAPE_LIKE = 8  # integer inputs with fewer elements stay as they are (shapes, rates, lengths)

Kind = Literal["held_out", "perturbed", "none"]
Arrays = Mapping[str, np.ndarray]


def split(count: int, share: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of `count` samples: those the search judges, those held out (`share` of them,
    at least one when `share` > 0 and `count` >= 2, never all), chosen by `seed`."""
    if count < 2 or share <= 0:
        return list(range(count)), []
    held = min(count - 1, max(1, int(round(share * count))))
    chosen = np.random.default_rng(seed).choice(count, size=held, replace=False)
    out = sorted(int(i) for i in chosen)
    return [i for i in range(count) if i not in out], out


# Per op, the operands a graph reads as a shape, a size, a count, an axis or a branch: an input
# that reaches one keeps its values in a perturbed copy (a moved value would change what the
# model computes, not how precisely).
SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4), "Range": (0, 1, 2), "TopK": (1,), "Resize": (1, 2, 3),
    "Upsample": (1,), "Pad": (1, 3), "Squeeze": (1,), "Unsqueeze": (1,), "OneHot": (1,),
    "Split": (1,), "Trilu": (1,), "CumSum": (1,), "If": (0,), "Loop": (0, 1),
    "NonMaxSuppression": (2,), "CenterCropPad": (1,), "DFT": (1, 2), "STFT": (1, 3),
    **{f"Reduce{r}": (1,) for r in ("Sum", "Mean", "Max", "Min", "Prod", "L1", "L2",
                                     "LogSum", "LogSumExp", "SumSquare")}}
_FLOATS = (1, 10, 11, 16)  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


def shape_like_inputs(graph) -> frozenset[str]:
    """The graph inputs whose values reach an operand read as a shape, count, axis or branch
    (SHAPE_OPERANDS), directly or through Casts and integer-typed tensors (`seq_len + 1`
    feeding a Range). `graph`: a graph.Graph (its flattened nodes, consumers and types)."""
    out = set()
    for v in graph.inputs():
        seen, todo = {v.name}, [v.name]
        while todo and v.name not in out:
            t = todo.pop()
            for i in graph.consumers.get(t, ()):
                node = graph.nodes[i]
                slots = SHAPE_OPERANDS.get(node.op_type, ())
                if any(k < len(node.input) and node.input[k] == t for k in slots):
                    out.add(v.name)
                    break
                for o in node.output:
                    if o and o not in seen and (node.op_type == "Cast" or graph.types.get(
                            o, 1) not in _FLOATS):
                        seen.add(o)
                        todo.append(o)
    return frozenset(out)


def perturb(sample: Arrays, seed: int, keep: frozenset[str] = frozenset()
            ) -> dict[str, np.ndarray]:
    """One perturbed copy of `sample` (module docstring: what each input type gets); the
    inputs named in `keep` (`shape_like_inputs`) stay as they are."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name in sorted(sample):
        a = np.asarray(sample[name])
        if name in keep:
            out[name] = a.copy()
        elif a.dtype.kind == "f" and a.size:
            x = a.astype(np.float64)
            finite = np.isfinite(x)
            std = float(np.std(x[finite])) if finite.any() else 0.0
            noisy = x + rng.standard_normal(a.shape) * PERTURB_SCALE * std
            out[name] = np.where(finite, noisy, x).astype(a.dtype)
        elif a.dtype.kind in "iu" and a.size >= SHAPE_LIKE:
            flat = a.reshape(-1).copy()
            k = max(1, int(round(PERTURB_INT_SHARE * flat.size)))
            where = rng.choice(flat.size, size=k, replace=False)
            flat[where] = rng.choice(flat, size=k)  # values the sample itself holds
            out[name] = flat.reshape(a.shape)
        else:
            out[name] = a.copy()
    return out


@dataclass
class Holdout:
    """The samples a run validates its written plan on, and their FP32 references (made on
    first use: a run that writes no passing plan never pays for them)."""

    kind: Kind
    samples: Sequence[Arrays]
    indices: list[int] = field(default_factory=list)  # held out: the user's sample numbers
    reference: Callable[[Sequence[Arrays]], list[dict[str, np.ndarray]]] | None = field(default=None, repr=False)
    references: Sequence[Arrays] | None = field(default=None, repr=False)

    def pairs(self) -> list[tuple[Arrays, Arrays]]:
        """Each validation sample with its FP32 reference; perturbed copies whose reference is
        not finite are dropped (they ask nothing of FP16)."""
        if self.references is None:
            assert self.reference is not None
            self.references = self.reference(self.samples)
            keep = [k for k, r in enumerate(self.references)
                    if all(np.isfinite(np.asarray(v, np.float64)).all()
                           for v in r.values() if np.asarray(v).dtype.kind == "f")]
            self.samples = [self.samples[k] for k in keep]
            self.references = [self.references[k] for k in keep]
            self.reference = None
        return list(zip(self.samples, self.references))

    def describe(self) -> str:
        if self.kind == "held_out":
            return (f"{len(self.samples)} held-out sample(s) "
                    f"(#{', #'.join(str(i) for i in self.indices)})")
        if self.kind == "perturbed":  # how: the module docstring, docs/trust.md
            return f"{len(self.samples)} perturbed copies of the sample"
        return "no samples"


@dataclass(frozen=True)
class Validation:
    """The written plan's verdict on the validation samples (a run's `validation` record:
    precision.json writes its `to_json`)."""

    kind: Kind
    described: str
    # each validation sample's judgement (stages/written.py); not written, nor read back
    judgements: list[Judgement] = field(default_factory=list, repr=False, compare=False)
    verdict: Verdict | None = None
    indices: list[int] = field(default_factory=list)
    # held out: the criteria over every sample given (their --pass-rate counts them all)
    overall: bool | None = None

    @property
    def passed(self) -> bool | None:
        """True or False when judged; None when there was nothing to judge on. Held-out
        samples pass when the plan meets the criteria on every sample the user gave (so
        `--pass-rate` lets a held-out sample fail where it lets a searched one)."""
        if self.kind == "none" or self.verdict is None:
            return None
        return self.overall if self.overall is not None else self.verdict.passed

    def to_json(self) -> dict:
        d: dict = {"kind": self.kind, "samples": self.described, "passed": self.passed}
        if self.indices:
            d["indices"] = list(self.indices)
        if self.verdict is not None:
            d["judged"] = self.verdict.to_json()
            d["errors"] = {o: e.to_json() for o, e in self.verdict.errors.items()}
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], entries: Mapping[str, Entry]) -> Validation:
        """Back from its `to_json` (`entries`: metrics.entries(), for the scores). A held-out
        validation's "passed" is the run's over every sample given (`overall`: stages/
        written.py sets it whenever held-out samples were judged)."""
        verdict = (Verdict.from_json(d["judged"], {o: error_from_json(e, entries)
                                                   for o, e in d["errors"].items()}, entries)
                   if "judged" in d else None)
        overall = d["passed"] if d["kind"] == "held_out" and verdict is not None else None
        return cls(d["kind"], d["samples"], [], verdict, list(d.get("indices", [])), overall)


def hold_out(samples: Sequence[Arrays], references: Sequence[Arrays], share: float,
             seed: int, reference: Callable[[Sequence[Arrays]], list[dict[str, np.ndarray]]],
             keep: frozenset[str] = frozenset()) -> tuple[list[int], Holdout | None]:
    """The indices of the samples the search keeps, and what validates the written plan
    (None: `share` 0): of two samples or more the held-out ones, of one its perturbed copies
    (their references by `reference`, on first use; the inputs in `keep` unchanged)."""
    if share <= 0:
        return list(range(len(samples))), None
    if len(samples) >= 2:
        kept, held = split(len(samples), share, seed)
        return kept, Holdout("held_out", [samples[i] for i in held], held,
                             references=[references[i] for i in held])
    copies = [perturb(samples[0], seed * 7919 + k + 1, keep) for k in range(PERTURB_COPIES)]
    return [0], Holdout("perturbed", copies, reference=reference)


def judged(held: Holdout | None,
           judge: Callable[[list[tuple[Arrays, Arrays]]], list[Judgement]],
           verdict: Callable[[list[Judgement]], Verdict]) -> Validation:
    """The validation of a written file: `judge` runs it on the validation pairs, as the
    run's judge runs it on its samples; `verdict` is the run's criteria's."""
    if held is None:
        return unvalidated("validation turned off (--validation-share 0)")
    pairs = held.pairs()
    if not pairs:
        return unvalidated("every perturbed copy's FP32 reference is not finite")
    js = judge(pairs)
    v = verdict(js)
    if held.indices:  # its numbers said in the user's sample numbers
        v = replace(v, errors=worst((j.errors for j in js), held.indices))
    return Validation(held.kind, held.describe(), js, v, list(held.indices))


def unvalidated(reason: str) -> Validation:
    """No validation samples: the plan is called what it is (unvalidated, not wrong)."""
    return Validation("none", reason)


def line(record: Validation | None) -> str | None:
    """The console's and the reports' one line on validation."""
    if record is None:
        return None
    if record.kind == "none":
        return f"validation: none ({record.described}): the plan is unvalidated"
    errors = list(record.verdict.errors.items()) if record.verdict is not None else []
    worst = ", ".join(f"{o} max|d| {_g(e.max_abs)}"
                      + (f" on sample {e.sample}" if e.sample is not None else "")
                      + f" (bound {_g(e.bound)}"
                      + (f" of sample {e.bound_sample}" if e.bound_sample is not None
                         else "") + ")"
                      for o, e in errors[:2] if e.max_abs is not None)
    ok = "passes" if record.passed else "FAILS"
    return f"validation on {record.described}: {ok}" + (f"; {worst}" if worst else "") + (
        f" (+{len(errors) - 2} outputs)" if len(errors) > 2 else "")


def _g(x) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else str(x)
