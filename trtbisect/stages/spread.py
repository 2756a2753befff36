"""The certificate behind `fixed`: a written plan passes by more than the spread of what the
tools may compute.

The judge runs ONNX Runtime with its graph optimizations off on a set number of threads, so
that the search and `check` agree bit for bit. The tools an engineer checks the plan with do
not: Polygraphy's `--onnxrt` and a plain InferenceSession run ORT's default optimizations
(fusions, constant folding, prepacked weights), other thread counts split reductions
differently, and FP32 itself moves by its noise floor. A plan that passes the judge by less
than those variations move the error is a coin toss in the tool and on the engine.

So the written file is also run under each variation (`backends.ort.variants`: optimizations
on with the judge's threads, optimizations off with the other thread count), the FP32
reference beside it under the same variation, as Polygraphy computes both. Per output judged by
trtbisect's default criterion:

- the bound is the one the renderings write: the smallest over every sample given, held-out
  ones included (Polygraphy takes one `--atol` per output for every sample);
- the spread is the largest move of max|d| under a variation, on any sample, or the FP32 noise
  floor (`kernel_noise`: optimized kernels and one-ulp input nudges), whichever is larger;
- the margin is that bound less the judge's worst max|d| over those samples: the very record
  the tables show (compare.py `worst`, with both samples named); the output is certified when
  the margin exceeds the spread.

A criterion with a threshold (`--metric`, `--check-error-stat`, a hook's score) is held to the
same rule in its severity (`ScoreMargin`: 1 at the threshold).

Under every criterion, each variation's verdict must pass too. And the search must not have
stopped on its own noise (search/noise.py: keeping more in FP32 made an output worse by over
SPREAD_SHARE of its bound, from two plans): `Certificate.search_noise`, `fragile` at once. A plan is `fixed` (and FP16
`fp16_ok`) only when certified; else the search aims inside the bound by the spread
(`aim`: a ceiling on each output's bound) and searches again; when no plan can have the
margin, the verdict is `fragile` and the nearest passing plan is still written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..context import Context, JudgeOptions
from ..judge.compare import Tolerance, worst
from ..judge.criteria import Judgement, Score
from ..judge.mixed import Written
from ..result import CertificateRecord, OutputMargin, ScoreMargin
from ..search.minimal import Noisy
from ..search.noise import Rise

AIM_FACTOR = 1.25  # the search aims this many spreads inside the bound: a new plan moves too
AIM_ROUNDS = 2  # searches aimed inside the bound before the verdict says `fragile`
# The certificate decides rather than chases (a borderline output's aimed rounds once took
# 3000 evaluations where the search took 250):
SPREAD_SHARE = 0.25  # a spread above this share of an output's bound: `fragile` at once
AIM_SHARE = 0.2  # all aimed searches and the validation of every plan written (the first's
AIM_FLOOR = 8  # too): at most this share of the first search's evaluations (at least this many)


def _scores(j: Judgement) -> dict[str, Score]:
    """A judgement's scores with a threshold, by `output:criterion` (`sample:` for a hook's)."""
    out = {}
    for e in j.errors.values():
        for s in e.scores:
            out[f"{s.output}:{s.criterion}"] = s
    for s in j.scores:
        out[f"{s.output or 'sample'}:{s.criterion}"] = s
    return {k: s for k, s in out.items() if math.isfinite(s.bound)}


@dataclass(frozen=True)
class Certificate:
    """Whether a written plan holds under the variations (module docstring)."""

    outputs: dict[str, OutputMargin]  # per output judged by the default criterion
    variant_verdicts: dict[str, bool]  # per variation: the run's criteria pass on it
    decided: str | None = None  # why no (further) aimed search: `fragile` at once
    scores: dict[str, ScoreMargin] = field(default_factory=dict)  # every criterion's score
    # the FP32 noise floor per output: the reference's alone, so one measurement serves every
    # plan of the run (an aimed search's certificate reuses it)
    noise: dict[str, float] = field(default_factory=dict, repr=False)
    # the search's own noise over SPREAD_SHARE (search/noise.py `Rise`): it stopped at once,
    # and its plan, however clear of the tools' spread, is one the criterion cannot tell apart
    search_noise: Noisy | None = None

    @property
    def certified(self) -> bool:
        return (self.search_noise is None and all(self.variant_verdicts.values())
                and all(m.certified for m in self.outputs.values())
                and all(m.certified for m in self.scores.values()))

    @property
    def uncertified(self) -> list[str]:
        """What fails: outputs with too little margin, variations whose verdict fails."""
        return ([o for o, m in self.outputs.items() if not m.certified]
                + ([f"{self.search_noise.output} (the search's own noise)"]
                   if self.search_noise is not None else [])
                + [k for k, m in self.scores.items() if not m.certified]
                + [f"the criteria under {v}" for v, ok in self.variant_verdicts.items() if not ok])

    def stopped_on(self, noise: Noisy) -> Certificate:
        """This certificate of a plan whose search stopped on its own noise (search/noise.py):
        `fragile` at once, and why no aimed round can help."""
        noted = replace(self, search_noise=noise)
        return replace(noted, decided=noted.hopeless())

    def hopeless(self) -> str | None:
        """Why aiming inside the bound cannot help, if it cannot: on an output without the
        margin, what the tools compute spreads by more than SPREAD_SHARE of the bound, so
        the noise is as large as the effect a nearer plan could buy; or the search itself
        found its criterion too noisy near the bound (search/noise.py)."""
        if self.search_noise is not None:
            return (f"{self.search_noise.text()}: over {SPREAD_SHARE:.0%} of the bound, the "
                    "noise is as large as the effect")
        for name, m in self.outputs.items():
            if not m.certified and m.bound > 0 and m.spread > SPREAD_SHARE * m.bound:
                return (f"on {name} what the tools compute spreads by {m.spread:.3g}, over "
                        f"{SPREAD_SHARE:.0%} of the bound {m.bound:.3g}: the noise is as "
                        "large as the effect")
        return None

    def spread_grew(self, nearer: Certificate) -> bool:
        """The nearer plan's spread is larger on an output this one failed: aiming again
        would aim at a moving target."""
        return any(name in nearer.outputs and nearer.outputs[name].spread > m.spread
                   for name, m in self.outputs.items() if not m.certified)

    def aim(self, previous: Tolerance) -> Tolerance | None:
        """The tolerance a search aims at: each output's bound capped AIM_FACTOR spreads
        inside the rendered bound (and inside any earlier aim); None when no output can be
        aimed (only a variation's verdict fails, under a criterion with no bound)."""
        ceiling = dict(previous.ceiling)
        for name, m in self.outputs.items():
            cap = m.bound - AIM_FACTOR * m.spread
            if not m.certified or name in ceiling:
                ceiling[name] = min(cap, ceiling.get(name, math.inf))
        if ceiling == dict(previous.ceiling):
            return None
        return replace(previous, ceiling=ceiling)

    def to_json(self) -> dict:
        return self.record().to_json()

    def record(self) -> CertificateRecord:
        """The frozen record a result keeps (result.CertificateRecord), its margins the very
        records measured here: its `to_json` is this certificate's. The searches aimed inside
        the bound before this plan are the aimed rounds' to count (stages/search.py `aim`
        records them): none here."""
        noise = self.search_noise
        return CertificateRecord(
            self.certified, 0, dict(self.outputs), dict(self.variant_verdicts),
            dict(self.scores), None if noise is None else Rise.from_json(noise.to_json()),
            self.decided)


def certify(ctx: Context, judge: JudgeOptions, emulated: Written, judged: Sequence[Judgement],
            noise: Mapping[str, float] | None = None,
            given: Sequence[Judgement] | None = None) -> Certificate:
    """The certificate of the plan whose written file's judge graph is `emulated` and whose
    judgements (per sample, every sample) under `judge` are `judged`. `noise`: the run's FP32
    noise floor, measured already (an earlier certificate's `noise`). `given`: the file's
    judgements on every sample the user gave, in their order (held-out ones included: the
    renderings check them all): the worst max|d| and the bound are over these, the very
    numbers the tables show (compare.py `worst`); the spread is measured on `judged`'s
    samples."""
    from ..backends.ort import (
        fp32_moves,
        judge_threads,
        nudge_moves,
        nudge_noise,
        variant_runs,
    )

    # the noise floor's optimized half is the optimized variation's own FP32 reference
    # against the judge's (backends/ort.kernel_noise, without two more sessions)
    measured: dict[str, float] | None = None if noise is not None else {}
    default = [o for o in ctx.graph.output_names()
               if judged and o in judged[0].errors and not judged[0].errors[o].scores]
    moved: dict[str, float] = {o: 0.0 for o in default}
    worst_v: dict[str, dict[str, float]] = {o: {} for o in default}
    per_variant: dict[str, list[Judgement]] = {}
    # under --pass-rate a sample may fail: the margin is that of the samples that pass
    keep = {k for k, j in enumerate(judged) if j.passed or judge.criteria.pass_rate >= 1}
    for v, k, ref, got in variant_runs(ctx.graph, (emulated.proto, emulated.arrays),
                                       ctx.every_sample, judge.threads,
                                       getattr(ctx, "variant_references", None)):
        if measured is not None and v.optimized and v.threads == judge_threads(judge.threads):
            fp32_moves(measured, ctx.every_reference[k], ref)
        j = judge.criteria.judge(ref, got, ctx.every_sample[k], judge.tolerance)
        per_variant.setdefault(v.label, []).append(j)
        for o in default:
            if k not in keep:
                continue
            a, b = j.errors[o].max_abs, judged[k].errors[o].max_abs
            d = abs(a - b) if math.isfinite(a) and math.isfinite(b) else (
                0.0 if a == b else math.inf)
            moved[o] = max(moved[o], d)
            worst_v[o][v.label] = max(worst_v[o].get(v.label, 0.0), a)
    if measured is not None:
        early = getattr(ctx, "variant_references", None)
        runs = (early.nudged(ctx.graph, ctx.every_sample, judge.threads)
                if early is not None else None)
        nudged = (nudge_moves(ctx.every_reference, runs) if runs is not None else
                  nudge_noise(ctx.graph, ctx.every_sample, ctx.every_reference, judge.threads))
        noise = {o: max(measured.get(o, 0.0), nudged.get(o, 0.0))
                 for o in measured.keys() | nudged.keys()}
    assert noise is not None
    outputs = {}
    every = list(given) if given else list(judged)
    # a failing sample does not count: under --pass-rate the margin is the passing ones', and
    # a held-out sample that fails is the validation's verdict (judge/validation.py)
    counted = [k for k, j in enumerate(every) if j.passed or (
        judge.criteria.pass_rate >= 1 and not given)]
    shown = worst([every[k].errors for k in counted], counted if len(every) > 1 else None)
    for o in default:
        if o not in shown:
            continue
        s = shown[o]
        floor = noise.get(o, 0.0)
        outputs[o] = OutputMargin(s.bound, s.max_abs, max(moved[o], floor), floor, worst_v[o],
                                  s.sample, s.bound_sample)
    verdicts = {label: judge.criteria.verdict(js).passed for label, js in per_variant.items()}
    return Certificate(outputs, verdicts, noise=dict(noise),
                       scores=_score_margins(judged, per_variant, keep,
                                                     getattr(ctx, "kept", None)))


def _score_margins(judged: Sequence[Judgement], per_variant: Mapping[str, list[Judgement]],
                   keep: set[int], numbers: Sequence[int] | None = None
                   ) -> dict[str, ScoreMargin]:
    """Per criterion with a threshold: the worst severity over the samples that count, against
    the largest move of that severity under a variation (on the same sample)."""
    out: dict[str, ScoreMargin] = {}
    several = len(judged) > 1
    for key in (_scores(judged[0]) if judged else {}):
        own = [(k, _scores(judged[k])[key]) for k in sorted(keep) if key in _scores(judged[k])]
        if not own:
            continue
        k_worst, worst = max(own, key=lambda p: p[1].severity)  # the first of equals
        moved = 0.0
        for js in per_variant.values():
            for k, j in enumerate(js):
                if k not in keep or key not in _scores(j) or key not in _scores(judged[k]):
                    continue
                a, b = _scores(j)[key].severity, _scores(judged[k])[key].severity
                moved = max(moved, abs(a - b) if math.isfinite(a) and math.isfinite(b)
                            else 0.0 if a == b else math.inf)
        out[key] = ScoreMargin(worst.bound, worst.value, worst.higher_is_better,
                               worst.severity, moved, (numbers[k_worst] if numbers else k_worst)
                               if several else None)
    return out


def aimed(judge: JudgeOptions, tolerance: Tolerance) -> JudgeOptions:
    """The run's judge options with the search aimed at `tolerance` (the user's criteria still
    judge the written file); their settings are built again, under the new bound."""
    return replace(judge, tolerance=tolerance)


def certificate_lines(cert: CertificateRecord | None) -> list[str]:
    """Per output, the margin against the spread, as the console and reports say it."""
    if cert is None:
        return []
    lines = []
    for name, m in cert.outputs.items():
        ok = "> spread" if m.certified else "<= spread: FRAGILE"
        lines.append(f"{name}: margin {_fmt(m.margin)} = bound {_fmt(m.bound)}"
                     f"{_of_sample(m.bound_sample)} - max|d| {_fmt(m.worst)}"
                     f"{_of_sample(m.sample)} {ok} {_fmt(m.spread)}")
    for label, passed in cert.variants.items():
        if not passed:
            lines.append(f"fails the criteria under {label}")
    for key, sm in cert.scores.items():
        lines.append(sm.text(key))
    if cert.decided:
        lines.append(f"fragile, decided: {cert.decided}")
    return lines


def _of_sample(k) -> str:
    return f" (sample {k})" if isinstance(k, int) else ""


def _fmt(x) -> str:
    if isinstance(x, str) or x is None:
        return str(x)
    return f"{x:.3g}"
