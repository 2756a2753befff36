"""Criteria as data: what "this plan agrees with FP32" means, per output and per sample.

A `Criterion` judges one output of one sample and gives a `Score` (the number its pass rule
reads, the bound it is held to, the verdict); a `Hook` (a user's `--check FILE.py:FUNCTION`)
judges a whole sample. `Criteria` holds the run's criteria and says, sample by sample, whether
a plan passes (`judge`) and, over samples, whether it passes as a whole (`verdict`: every
sample, or at least a fraction `pass_rate` of them). The judge of the search and the judge of
a written file (stages/written.py), precision.json, the tables, the report and the renderings
all read these objects; the search only ever sees pass or fail.

Adding a criterion is one `Entry` in `REGISTRY`: how to read its arguments, score an output,
whether it fits an output, and how Polygraphy says it (or why it cannot).

Without any criterion flag every output is judged by trtbisect's own criterion (`range`,
compare.py): finite where FP32 is finite and max|fp16 - fp32| <= rtol * max|fp32| + atol,
rtol relative to the output's range. Its numbers are compare.py's, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import TrtBisectError
from .compare import OutputError, Tolerance, compare_output, from_json_float, worst

Arrays = Mapping[str, np.ndarray]


TIMEOUT = "eval-timeout"  # a Score's criterion when the inference was stopped (limits.py)


@dataclass(frozen=True)
class Score:
    """One criterion's result on one sample: `value` held to `bound` by the entry's rule."""

    criterion: str  # as the user wrote it, without the output prefix: "cosine:0.999"
    output: str | None  # None: the whole sample (a --check hook)
    value: float  # the number the pass rule reads (a statistic, a metric, a hook's score)
    bound: float  # what it is held to (nan where there is none: a hook without a score)
    passed: bool
    higher_is_better: bool = False
    detail: tuple[tuple[str, float], ...] = ()  # further numbers: ("rel", 0.2), ("rtol", 0.01)
    unit: str = ""  # "dB": value and bound are decibels

    @property
    def severity(self) -> float:
        """How badly it misses, comparable across criteria: above 1 it fails, 0 is perfect
        (orders samples and outputs from worst to best)."""
        if not self.passed and not math.isfinite(self.value):
            return math.inf
        if self.criterion == "check" or not math.isfinite(self.bound):
            return 0.0 if self.passed else 2.0
        if self.higher_is_better and self.unit == "dB":  # SNR: the ratio of noise powers
            r = 10.0 ** min((self.bound - self.value) / 10.0, 300.0)
        elif self.higher_is_better:  # metrics up to 1 (cosine, IoU, top-K agreement)
            r = _ratio(1.0 - self.value, 1.0 - self.bound)
        else:
            r = _ratio(self.value, self.bound)
            d = dict(self.detail)
            if "rel" in d and "rtol" in d:  # Polygraphy's statistics fail only when both exceed
                r = min(r, _ratio(d["rel"], d["rtol"]))
        return min(r, 1.0) if self.passed else max(r, 1.0)

    def to_json(self) -> dict:
        d: dict[str, Any] = {"criterion": self.criterion, "value": _num(self.value),
                             "bound": _num(self.bound), "passed": self.passed}
        if self.output is not None:
            d["output"] = self.output
        d.update({k: _num(v) for k, v in self.detail})
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], entries: Mapping[str, Entry]) -> Score:
        """Back from its `to_json`: which way is better and the unit are its entry's, found
        in `entries` (metrics.entries()) by the criterion's name as written ("cosine:0.999":
        cosine); a hook's, a stopped inference's or a criterion given for a missing shape
        have none."""
        entry = entries.get(d["criterion"].split(":")[0])
        unit = "s" if d["criterion"] == TIMEOUT else entry.unit if entry is not None else ""
        fixed = ("criterion", "value", "bound", "passed", "output")
        return cls(d["criterion"], d.get("output"), from_json_float(d["value"]),
                   from_json_float(d["bound"]), d["passed"],
                   entry.higher_is_better if entry is not None else False,
                   tuple((k, from_json_float(v)) for k, v in d.items() if k not in fixed), unit)

    def text(self) -> str:
        """For tables: `quantile(0.99) |d| 7e-06 <= atol 0 or rel 0.2 <= rtol 0.01`."""
        rel = "<=" if not self.higher_is_better else ">="
        if self.criterion == "check":
            return "check" + ("" if math.isnan(self.value) else f" score {self.value:.6g}")
        if self.criterion == TIMEOUT:
            return f"stopped after --eval-timeout {self.bound:g} s (never finished)"
        d = dict(self.detail)
        if "rel" in d and "rtol" in d:  # Polygraphy's statistics
            name = f"{self.criterion} {d['quantile']:g}" if "quantile" in d else self.criterion
            if "mismatches" in d:
                return (f"elemwise: {d['mismatches']:.0f} element(s) beyond atol "
                        f"{self.bound:.3g} and rtol {d['rtol']:.3g}")
            return (f"{name} |d| {self.value:.3g} (atol {self.bound:.3g}), "
                    f"rel {d['rel']:.3g} (rtol {d['rtol']:.3g})")
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.criterion}: {self.value:.6g}{unit} (need {rel} {self.bound:.6g}{unit})"


def _ratio(x: float, bound: float) -> float:
    if math.isnan(x):
        return math.inf
    if bound > 0:
        return max(x, 0.0) / bound
    return 0.0 if x <= 0 else math.inf


def _num(x: float) -> float | str:
    x = float(x)
    return x if math.isfinite(x) else str(x)


# ---------------------------------------------------------------- the registry

Parse = Callable[[Sequence[str]], tuple]
ScoreFn = Callable[[tuple, np.ndarray, np.ndarray, float, float], tuple]


@dataclass(frozen=True)
class Entry:
    """One kind of criterion.

    `score(args, ref, got, rtol, atol)` returns (value, bound, passed, detail) for one output
    of one sample; `fits(args, ref)` says why the criterion cannot judge an output of that
    shape (None: it can); `polygraphy(args, output)` gives Polygraphy's words for it per
    output, or is None with `why_not_polygraphy` saying why."""

    name: str
    family: str  # "range" (the default), "stat" (--check-error-stat), "metric" (--metric)
    syntax: str
    summary: str
    parse: Parse
    score: ScoreFn
    higher_is_better: bool = False
    unit: str = ""
    fits: Callable[[tuple, np.ndarray], str | None] = lambda args, ref: None
    polygraphy: Callable[[tuple], dict[str, str]] | None = None
    why_not_polygraphy: str = ""


def _no_args(name: str) -> Parse:
    def parse(args: Sequence[str]) -> tuple:
        if args:
            raise ValueError(f"{name} takes no arguments")
        return ()
    return parse


def _range_score(args: tuple, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float
                 ) -> tuple:
    e = compare_output(ref, got, rtol, atol)
    return e.max_abs, e.bound, e.passed, ()


RANGE = Entry(
    "range", "range", "(default)",
    "finite where FP32 is finite and max|fp16-fp32| <= rtol*max|fp32| + atol (rtol relative "
    "to the output's range)",
    _no_args("range"), _range_score,
    polygraphy=lambda args: {"check_error_stat": "max"},  # with atol = the bound (render.py)
)

REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    REGISTRY[entry.name] = entry
    return entry


# ---------------------------------------------------------------- criteria

@dataclass(frozen=True)
class Criterion:
    """An entry with its arguments, for one output (or, before resolution, `output` None:
    every output no other criterion of its family names)."""

    entry: Entry
    args: tuple = ()
    output: str | None = None
    label: str = ""  # the criterion as written, without the output prefix

    @property
    def name(self) -> str:
        return self.label or self.entry.name

    def failed(self, output: str) -> Score:
        """The score of an output whose shape moved (a data-dependent shape): it fails, no
        value; written like every score of this criterion (its name without the output
        prefix, its direction and unit), so reading it back finds its entry."""
        return Score(self.name, output, math.inf, math.nan, False, self.entry.higher_is_better,
                     (), self.entry.unit)

    def score(self, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> Score:
        value, bound, passed, detail = self.entry.score(self.args, ref, got, rtol, atol)
        return Score(self.name, self.output, float(value), float(bound), bool(passed),
                     self.entry.higher_is_better, tuple(detail), self.entry.unit)

    def spec(self) -> str:
        """As a flag value: `[OUTPUT:]LABEL`."""
        return f"{self.output}:{self.name}" if self.output is not None else self.name


@dataclass(frozen=True)
class Judgement:
    """One sample: per output its error numbers and verdict, and the hooks' scores."""

    errors: dict[str, OutputError]
    scores: tuple[Score, ...] = ()

    @property
    def passed(self) -> bool:
        return all(e.passed for e in self.errors.values()) and all(s.passed for s in self.scores)

    @property
    def severity(self) -> float:
        return max([e.severity for e in self.errors.values()]
                   + [s.severity for s in self.scores], default=0.0)


def error_from_json(d: Mapping[str, Any], entries: Mapping[str, Entry]) -> OutputError:
    """An output's error back from its `to_json`, its criteria's scores with it."""
    return OutputError.from_json(d, tuple(Score.from_json(s, entries)
                                          for s in d.get("scores", ())))


def timed_out(ref: Arrays, seconds: float) -> Judgement:
    """A sample whose inference was stopped at --eval-timeout (limits.py): every output
    failed, with no numbers (there are no outputs to measure)."""
    inf = math.inf
    return Judgement({name: OutputError(inf, math.nan, inf, inf, inf, math.nan, 0, False,
                                        (Score(TIMEOUT, name, inf, seconds, False, unit="s"),))
                      for name in ref})


@dataclass(frozen=True)
class Verdict:
    """Over the samples: the plan's verdict, per output its worst error, per hook its worst
    score, and how each sample fared."""

    passed: bool
    errors: dict[str, OutputError]
    scores: tuple[Score, ...]
    samples: tuple[bool, ...]  # per sample: passed
    severities: tuple[float, ...]  # per sample: how badly it misses (Score.severity)
    required: int  # samples that must pass

    @classmethod
    def from_json(cls, d: Mapping[str, Any], errors: dict[str, OutputError],
                  entries: Mapping[str, Entry]) -> Verdict:
        """Back from its `to_json`, with its `errors` (written beside it) read back."""
        per = d["per_sample"]
        return cls(d["passed"], errors,
                   tuple(Score.from_json(s, entries) for s in d.get("checks", ())),
                   tuple(p["passed"] for p in per),
                   tuple(from_json_float(p["severity"]) for p in per), d["required"])

    def to_json(self) -> dict:
        d: dict[str, Any] = {
            "samples": len(self.samples), "passed_samples": sum(self.samples),
            "required": self.required, "passed": self.passed,
            "per_sample": [{"passed": ok, "severity": _num(v)}
                           for ok, v in zip(self.samples, self.severities)]}
        if self.scores:
            d["checks"] = [s.to_json() for s in self.scores]
        return d


@dataclass(frozen=True)
class Criteria:
    """The run's criteria. Empty: trtbisect's default criterion on every output.

    Per output, each family resolves on its own: a criterion naming the output replaces the
    family's unprefixed ones (Polygraphy's rule for `[OUTPUT:]VALUE`). An output left with no
    criterion is judged by the default `range` criterion, unless a `--check` hook judges the
    samples (then the hook alone decides for it)."""

    items: tuple[Criterion, ...] = ()
    hooks: tuple[Any, ...] = ()  # judge.hooks.Hook
    pass_rate: float = 1.0
    # --error-quantile, as Polygraphy resolves it: per output, else the unprefixed value ("")
    quantiles: tuple[tuple[str, float], ...] = ()

    @property
    def default(self) -> bool:
        return not self.items and not self.hooks and self.pass_rate == 1.0

    @property
    def standard(self) -> str:
        """What a plan must meet, in a verdict's words."""
        return "the tolerance" if self.default else "the criteria"

    def for_output(self, name: str) -> tuple[Criterion, ...]:
        """The criteria judging output `name` (empty: the default criterion)."""
        if not self.items:
            return ()
        out: list[Criterion] = []
        for family in ("stat", "metric"):
            mine = [c for c in self.items if c.entry.family == family]
            named = [c for c in mine if c.output == name]
            chosen = named or [c for c in mine if c.output is None]
            out += [replace(c, output=name, args=self._args(c, name)) for c in chosen]
        return tuple(out)

    def _args(self, c: Criterion, output: str) -> tuple:
        if c.entry.name != "quantile":
            return c.args
        q = dict(self.quantiles)
        return (c.args[0], q.get(output, q.get("", c.args[1])))

    def required(self, samples: int) -> int:
        """Samples that must pass: all, or ceil(pass_rate * samples)."""
        if self.pass_rate >= 1.0:
            return samples
        return max(1, math.ceil(self.pass_rate * samples - 1e-9))

    def judge(self, ref: Arrays, got: Arrays, sample: Arrays, tol: Tolerance) -> Judgement:
        """One sample: every output of `ref` against `got`; the hooks on the whole sample."""
        errors: dict[str, OutputError] = {}
        for name, r in ref.items():
            rtol, atol = tol.for_output(name)
            e = compare_output(r, got[name], rtol, atol, tol.ceiling_for(name))
            crits = self.for_output(name)
            if np.shape(r) != np.shape(got[name]):  # a data-dependent shape moved: it fails
                e = replace(e, scores=tuple(c.failed(name) for c in crits))
            elif crits:
                scores = tuple(c.score(r, got[name], rtol, atol) for c in crits)
                e = replace(e, passed=all(s.passed for s in scores), scores=scores)
            elif self.hooks:  # the hook alone judges this output
                e = replace(e, passed=True, scores=(Score("judged by --check", name, math.nan,
                                                          math.nan, True),))
            errors[name] = e
        hooks = tuple(h.score(ref, got, sample) for h in self.hooks)
        return Judgement(errors, hooks)

    def verdict(self, judgements: Sequence[Judgement]) -> Verdict:
        samples = tuple(j.passed for j in judgements)
        need = self.required(len(samples))
        hooks: dict[int, Score] = {}
        for j in judgements:
            for k, s in enumerate(j.scores):
                cur = hooks.get(k)
                if cur is None or (cur.passed, -cur.severity) > (s.passed, -s.severity):
                    hooks[k] = s
        return Verdict(sum(samples) >= need, worst(j.errors for j in judgements),
                       tuple(hooks[k] for k in sorted(hooks)), samples,
                       tuple(j.severity for j in judgements), need)

    def hopeless(self, judgements: Sequence[Judgement], total: int) -> bool:
        """True once so many samples failed that the plan cannot pass on `total` samples."""
        failed = sum(1 for j in judgements if not j.passed)
        return failed > total - self.required(total)

    def validate(self, outputs: Sequence[str]) -> None:
        """Refuse a criterion naming no output of the model (it would be silently ignored)."""
        for c in self.items:
            if c.output is not None and c.output not in outputs:
                flag = "--check-error-stat" if c.entry.family == "stat" else "--metric"
                raise TrtBisectError(f"{flag} {c.spec()!r} names no output of the model; its "
                                     f"outputs: {', '.join(outputs)}")
        for name, q in self.quantiles:
            if name and name not in outputs:
                raise TrtBisectError(f"--error-quantile {name}:{q:g} names no output of the "
                                     f"model; its outputs: {', '.join(outputs)}")

    def check_fit(self, ref: Arrays) -> None:
        """Refuse a criterion that cannot judge an output as the model gives it (top-K of a
        scalar), before any search."""
        for name, value in ref.items():
            for c in self.for_output(name):
                why = c.entry.fits(c.args, np.asarray(value))
                if why:
                    raise TrtBisectError(f"--metric {c.spec()!r}: {why} (output {name!r} has "
                                         f"shape {list(np.shape(value))})")

    def fingerprint(self) -> dict:
        """What a resumed run must share: the criteria as written, the hooks' code."""
        return {"items": [[c.spec(), list(c.args)] for c in self.items],
                "quantiles": [list(q) for q in self.quantiles], "pass_rate": self.pass_rate,
                "hooks": [h.fingerprint() for h in self.hooks]}

    def to_json(self) -> dict:
        return {"criteria": [{"criterion": c.name, "output": c.output,
                              "family": c.entry.family} for c in self.items],
                "error_quantile": {k: v for k, v in self.quantiles},
                "checks": [h.spec for h in self.hooks], "pass_rate": self.pass_rate}

    def describe(self) -> str:
        """One line for the summary."""
        if self.default:
            return "max|d| <= rtol*max|ref| + atol per output (trtbisect's default)"
        parts = [c.spec() for c in self.items]
        parts += [f"--error-quantile {o + ':' if o else ''}{q:g}" for o, q in self.quantiles]
        parts += [f"--check {h.spec}" for h in self.hooks]
        rate = (f", on at least {self.pass_rate:g} of the samples"
                if self.pass_rate < 1.0 else "")
        return ", ".join(parts) + rate


DEFAULT = Criteria()


def worst_of(judged: Iterable[Judgement], numbers: Sequence[int] | None = None
             ) -> dict[str, OutputError]:
    """Per output, the one record over the judged samples (compare.py `worst`); `numbers`:
    the user's number of each sample."""
    return worst((j.errors for j in judged), numbers)


def json_number(x: float) -> float | str:
    """A float JSON can carry: inf and nan as strings."""
    return x if math.isfinite(x) else str(x)
