"""What a run found (`RunResult`: the verdict, the plan, its errors, its files) and the exit
code of each verdict. Below the writers and the report that read it. `Found` is what every
search run finds, whatever its plan names (ONNX nodes here, PyTorch modules in torch/result.py):
the fields both results share, defined once."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Generic, Protocol, TypedDict, TypeVar

from . import __version__
from .diagnosis.diagnose import Culprit, CulpritGroup
from .errors import (
    EXIT_FRAGILE,
    EXIT_NO_PLAN,
    EXIT_OK,
    EXIT_OVER_BUDGET,
    EXIT_PARTIAL,
    EXIT_REFERENCE_INVALID,
    EXIT_REFERENCE_UNSTABLE,
    EXIT_UNVALIDATED,
)
from .judge import metrics
from .judge.compare import OutputError, TensorStats, Tolerance, from_json_float
from .judge.criteria import Criteria, Entry, Verdict, error_from_json
from .judge.hints import Hint
from .judge.mixed import Written
from .judge.precision import Precision
from .judge.semantics import Record as SemanticsRecord
from .judge.trt_layers import TrtSearchReport
from .judge.validation import Validation
from .judge.verdict import Findings, TensorRT, VerdictName
from .outputs.render import RenderContext
from .rewrites.driver import RewritesRecord
from .search.cost import CostRecord
from .search.minimal import SearchResult
from .search.noise import Rise

# What a verdict records beside the plan, as precision.json writes it. Each is JSON as its
# module's `to_json()` makes it; the key names are precision.json's.
JSON = dict[str, Any]
# as judge/criteria.json_number writes one: a non-finite one as a string
Number = float | str | None


@dataclass(frozen=True)
class Margin:
    """One output's certificate: how far inside the bound, against the tools' spread
    (numbers as judge/criteria.json_number writes them: a non-finite one as a string)."""
    margin: float | str | None
    spread: float | str | None
    noise_floor: float | str | None
    fragile: bool

    def to_json(self) -> JSON:
        return {"margin": self.margin, "spread": self.spread, "noise_floor": self.noise_floor,
                "fragile": self.fragile}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Margin:
        return cls(d["margin"], d["spread"], d["noise_floor"], d["fragile"])


def _num(x: float) -> float | str:
    """A number as precision.json writes a margin's: inf and NaN as text."""
    return x if math.isfinite(x) else str(x)


def _float(x: float | str) -> float:
    return from_json_float(x)


@dataclass(frozen=True)
class OutputMargin:
    """One output's margin in the certificate (stages/spread.py measures it): the rendered
    bound less the judge's worst max|d|, against the spread of what the tools compute."""
    bound: float  # the smallest bound over the samples: what the renderings write
    worst: float  # the judge's largest max|d| over the samples
    spread: float  # max over variations and samples of |max|d| moved|, or the noise floor
    noise_floor: float
    variants: dict[str, float] = field(default_factory=dict)  # each variation's worst max|d|
    sample: int | None = None  # the user's number of the sample whose max|d| is `worst`
    bound_sample: int | None = None  # ... and of the sample whose bound is `bound`

    @property
    def margin(self) -> float:
        return self.bound - self.worst

    @property
    def certified(self) -> bool:
        return self.margin > self.spread

    def to_json(self) -> JSON:
        return {"bound": _num(self.bound), "worst": _num(self.worst), "margin": _num(self.margin),
                "spread": _num(self.spread), "noise_floor": _num(self.noise_floor),
                "certified": self.certified,
                "variants": {k: _num(v) for k, v in self.variants.items()},
                **({"sample": self.sample, "bound_sample": self.bound_sample}
                   if self.sample is not None else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OutputMargin:
        """Back from its `to_json` ("margin" and "certified" follow from the rest)."""
        return cls(_float(d["bound"]), _float(d["worst"]), _float(d["spread"]),
                   _float(d["noise_floor"]), {k: _float(v) for k, v in d["variants"].items()},
                   d.get("sample"), d.get("bound_sample"))


@dataclass(frozen=True)
class ScoreMargin:
    """One criterion's score (a `--metric`, a `--check-error-stat` statistic, a hook's score)
    clear of its threshold against how far the tools' variations move it (stages/spread.py).

    Measured in the score's severity (criteria.Score.severity: 1 at the threshold, below 1
    passing), the one number that follows each pass rule exactly: a metric's (1 - score) /
    (1 - threshold), Polygraphy's statistic passing when |d| <= atol OR rel <= rtol (the
    smaller of the two ratios), SNR's ratio of noise powers. The margin is 1 - the worst
    severity over the samples, the spread the largest move of the severity under a variation
    on the same sample; certified when the margin exceeds the spread."""
    bound: float  # the threshold the score is held to (its own units)
    worst: float  # the worst sample's score (its own units)
    higher_is_better: bool
    severity: float  # the worst severity over the samples
    spread: float  # max over variations and samples of |severity moved|
    sample: int | None = None  # the user's number of the worst sample (several samples)

    @property
    def margin(self) -> float:
        return 1.0 - self.severity

    @property
    def certified(self) -> bool:
        return self.margin > self.spread

    def to_json(self) -> JSON:
        return {"bound": _num(self.bound), "worst": _num(self.worst),
                "severity": _num(self.severity), "margin": _num(self.margin),
                "spread": _num(self.spread), "higher_is_better": self.higher_is_better,
                "certified": self.certified,
                **({"sample": self.sample} if self.sample is not None else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ScoreMargin:
        """Back from its `to_json` ("margin" and "certified" follow from the rest)."""
        return cls(_float(d["bound"]), _float(d["worst"]), d["higher_is_better"],
                   _float(d["severity"]), _float(d["spread"]), d.get("sample"))

    def text(self, key: str) -> str:
        """The margin in words: its score and threshold in their own units, the margin and
        the spread in severity (1 at the threshold), as the console and the reports say it."""
        def g(x: object) -> str:
            return f"{x:.3g}" if isinstance(x, (int, float)) else str(x)

        def score(x: object) -> str:  # as Score.text says it (a cosine of 0.99999 is not 1)
            return f"{x:.6g}" if isinstance(x, (int, float)) else str(x)
        on = f" on sample {self.sample}" if isinstance(self.sample, int) else ""
        ok = "> spread" if self.certified else "<= spread: FRAGILE"
        return (f"{key}: score {score(self.worst)}{on} against threshold "
                f"{score(self.bound)}: "
                f"severity {g(self.severity)} (1 at the threshold), margin "
                f"{g(self.margin)} {ok} {g(self.spread)}")


@dataclass(frozen=True)
class CertificateRecord:
    """The written plan's certificate (stages/spread.Certificate, as precision.json's
    "certificate" writes it): per output and per criterion the margin against the spread,
    each variation's verdict, the search's own noise when it stopped on it, and why no
    (further) aimed search ran (`decided`)."""
    certified: bool
    aim_rounds: int
    outputs: dict[str, OutputMargin]
    variants: dict[str, bool]  # per variation: the run's criteria pass on it
    scores: dict[str, ScoreMargin] = field(default_factory=dict)
    search_noise: Rise | None = None
    decided: str | None = None

    def to_json(self) -> JSON:
        d: JSON = {"certified": self.certified, "aim_rounds": self.aim_rounds,
                   "outputs": {k: m.to_json() for k, m in self.outputs.items()},
                   "variants": dict(self.variants)}
        if self.scores:
            d["scores"] = {k: m.to_json() for k, m in self.scores.items()}
        if self.search_noise is not None:
            d["search_noise"] = self.search_noise.to_json()
        if self.decided:
            d["decided"] = self.decided
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CertificateRecord:
        noise = d.get("search_noise")
        return cls(d["certified"], d["aim_rounds"],
                   {k: OutputMargin.from_json(m) for k, m in d["outputs"].items()},
                   dict(d["variants"]),
                   {k: ScoreMargin.from_json(m) for k, m in (d.get("scores") or {}).items()},
                   Rise.from_json(noise) if noise is not None else None, d.get("decided"))


@dataclass(frozen=True)
class OneJudge:
    """Whether the search measured the numbers `check` of the written file measures."""
    search_equals_check: bool
    search_errors: dict[str, JSON]  # output -> OutputError.to_json

    def to_json(self) -> JSON:
        return {"search_equals_check": self.search_equals_check,
                "search_errors": self.search_errors}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OneJudge:
        return cls(d["search_equals_check"], dict(d["search_errors"]))


@dataclass(frozen=True)
class StrictError:
    """One output's all-low-precision error under per-node rounding (stages/strict.py), and
    the run's criteria's words for it where a criterion scored it."""
    error: OutputError

    @property
    def text(self) -> str | None:
        return self.error.scores_text if self.error.scores else None

    def to_json(self) -> JSON:
        return {**self.error.to_json(), **({"text": self.text} if self.error.scores else {})}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], entries: Mapping[str, Entry]) -> StrictError:
        """Back from its `to_json` ("text" is said again from the scores); `entries`:
        metrics.entries(), for the scores."""
        return cls(error_from_json({k: v for k, v in d.items() if k != "text"}, entries))


@dataclass(frozen=True)
class JudgedRecord:
    """The criterion's verdicts over the samples (judge/criteria.Verdict): all-FP16
    ("before"), the written plan ("after"), and the samples the search judged when it judged
    a subset. Each verdict is kept without its per-output errors, which precision.json
    writes beside it (errors_before, errors_after): `of` and `with_after` take them out."""
    before: Verdict | None = None
    search_samples: list[int] | None = None
    after: Verdict | None = None

    @classmethod
    def of(cls, before: Verdict | None, search_samples: list[int] | None = None,
           after: Verdict | None = None) -> JudgedRecord:
        return cls(_samples_only(before), search_samples, _samples_only(after))

    def with_after(self, after: Verdict) -> JudgedRecord:
        """This record with the written plan's verdict."""
        return replace(self, after=_samples_only(after))

    @property
    def shown(self) -> Verdict | None:
        """The verdict the console and the report tell: the plan's, else all-FP16's."""
        return self.after if self.after is not None else self.before

    def to_json(self) -> JSON:
        return {k: v for k, v in (("before", self.before and self.before.to_json()),
                                  ("search_samples", self.search_samples),
                                  ("after", self.after and self.after.to_json()))
                if v is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> JudgedRecord:
        def verdict(v: Mapping[str, Any] | None) -> Verdict | None:
            return Verdict.from_json(v, {}, metrics.entries()) if v is not None else None
        return cls(verdict(d.get("before")), d.get("search_samples"), verdict(d.get("after")))


def _samples_only(v: Verdict | None) -> Verdict | None:
    """A verdict without its per-output errors (written beside it in precision.json)."""
    return replace(v, errors={}) if v is not None and v.errors else v


@dataclass(frozen=True)
class CriteriaRecord:
    """The criteria that judged the run (precision.json's "criteria"): Criteria.to_json()
    and their description in words."""
    criteria: JSON
    description: str

    def to_json(self) -> JSON:
        return {**self.criteria, "description": self.description}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CriteriaRecord:
        return cls({k: v for k, v in d.items() if k != "description"}, d["description"])


@dataclass(frozen=True)
class WorkersRecord:
    """Where the search judged (stages/batch.summary; precision.json's "workers"): in this
    process and why (`backend` None: only `workers` and `chosen`), or on a pool of worker
    processes (parallel/pool.Stats) with the search's rounds against its evaluations."""
    workers: int
    chosen: str  # why this many
    backend: str | None = None  # "local", "ray"; None: judged in this process
    threads: int | None = None
    inferences_run: int = 0
    tasks: int = 0
    seconds_waiting: float = 0.0
    replaced: int = 0  # workers that died and were started again
    peak_rss_mib: list[float] = field(default_factory=list)
    rounds: int = 0
    evaluations: int = 0
    speculative: int = 0

    def to_json(self) -> JSON:
        if self.backend is None:
            return {"workers": self.workers, "chosen": self.chosen}
        return {"workers": self.workers, "backend": self.backend, "threads": self.threads,
                "chosen": self.chosen, "inferences_run": self.inferences_run,
                "tasks": self.tasks, "seconds_waiting": self.seconds_waiting,
                "replaced": self.replaced, "peak_rss_mib": list(self.peak_rss_mib),
                "rounds": self.rounds, "evaluations": self.evaluations,
                "speculative": self.speculative}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WorkersRecord:
        if "backend" not in d:
            return cls(d["workers"], d["chosen"])
        return cls(d["workers"], d["chosen"], d["backend"], d["threads"], d["inferences_run"],
                   d["tasks"], d["seconds_waiting"], d["replaced"], list(d["peak_rss_mib"]),
                   d["rounds"], d["evaluations"], d["speculative"])


@dataclass(frozen=True)
class OutputStability:
    """One output of one plan under --stability (stages/stability.OutputSpread as precision.json
    writes it): error ratios (max|d| / bound) over the samples and their jittered copies."""
    judged_ratio: Number  # the worst over the unjittered samples: what the search saw
    min_ratio: Number
    max_ratio: Number
    noise: Number
    sample_spread: Number
    margin: Number
    flips: bool  # passes on some runs and fails on others
    fragile: bool

    def to_json(self) -> JSON:
        return {"judged_ratio": self.judged_ratio, "min_ratio": self.min_ratio,
                "max_ratio": self.max_ratio, "noise": self.noise,
                "sample_spread": self.sample_spread, "margin": self.margin,
                "flips": self.flips, "fragile": self.fragile}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OutputStability:
        return cls(d["judged_ratio"], d["min_ratio"], d["max_ratio"], d["noise"],
                   d["sample_spread"], d["margin"], d["flips"], d["fragile"])


@dataclass(frozen=True)
class PlanStability:
    """One plan under --stability (the written plan, all-low-precision)."""
    plan: str
    fp32_nodes: int
    flips: bool
    fragile: bool
    outputs: dict[str, OutputStability]

    def to_json(self) -> JSON:
        return {"plan": self.plan, "fp32_nodes": self.fp32_nodes, "flips": self.flips,
                "fragile": self.fragile,
                "outputs": {k: v.to_json() for k, v in self.outputs.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PlanStability:
        return cls(d["plan"], d["fp32_nodes"], d["flips"], d["fragile"],
                   {k: OutputStability.from_json(v) for k, v in d["outputs"].items()})


@dataclass(frozen=True)
class StabilityRecord:
    """What --stability measured (stages/stability.Stability.record; precision.json's
    "stability"): each plan's outputs over jittered copies, whether reruns are
    bit-identical, and what it flags, in words."""
    runs: int  # jittered copies per sample, the sample itself included
    samples: int
    jitter: float
    deterministic: bool
    flags: list[str]
    plans: list[PlanStability]
    method: str

    def to_json(self) -> JSON:
        return {"runs": self.runs, "samples": self.samples, "jitter": self.jitter,
                "deterministic": self.deterministic, "flags": list(self.flags),
                "plans": [p.to_json() for p in self.plans], "method": self.method}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StabilityRecord:
        return cls(d["runs"], d["samples"], d["jitter"], d["deterministic"], list(d["flags"]),
                   [PlanStability.from_json(p) for p in d["plans"]], d["method"])


@dataclass(frozen=True)
class AimedSearch:
    """One search again inside the certificate's bound (stages/spread.py; precision.json's
    "aimed_searches"): the ceiling it aimed at per output (compare.Tolerance's JSON), whether
    it found a plan, how many units that keeps FP32, and its evaluations."""
    round: int
    ceiling: dict[str, Number]
    found: bool
    fp32_units: int
    evaluations: int
    known_failing: int  # evaluations a looser bound's failure answered (nothing judged)

    def to_json(self) -> JSON:
        return {"round": self.round, "ceiling": dict(self.ceiling), "found": self.found,
                "fp32_units": self.fp32_units, "evaluations": self.evaluations,
                "known_failing": self.known_failing}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AimedSearch:
        return cls(d["round"], dict(d["ceiling"]), d["found"], d["fp32_units"],
                   d["evaluations"], d["known_failing"])


@dataclass(frozen=True)
class OpCount:
    """An op kind and the nodes of the model that use it (trtbisect's names, graph order),
    with why it is listed (stages/coverage.py: what the judge cannot round, what TensorRT's
    parser would refuse) and what to do, where there is something to do. `domain`: as
    precision.json writes it ("ai.onnx" for ONNX's default domain)."""

    op: str
    domain: str
    nodes: tuple[str, ...]
    why: str  # why it is listed, in a few words
    fix: str = ""

    @property
    def label(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain not in ("", "ai.onnx") else self.op

    def to_json(self) -> JSON:
        d = {"op": self.op, "domain": self.domain or "ai.onnx", "count": len(self.nodes),
             "nodes": list(self.nodes), "why": self.why}
        if self.fix:
            d["fix"] = self.fix
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OpCount:
        return cls(d["op"], d["domain"], tuple(d["nodes"]), d["why"], d.get("fix", ""))


@dataclass(frozen=True)
class Coverage:
    """How much of the graph the judge rounds, what it cannot, and what TensorRT's parser
    would refuse (stages/coverage.record; precision.json's "coverage")."""
    nodes: int
    judged: int
    judged_in_subgraphs: int
    functions_inlined: bool
    unjudged: tuple[OpCount, ...]
    tensorrt_unsupported: tuple[OpCount, ...]
    tensorrt_operator_list: str
    # ops whose schema takes no float16 (Range): FP32 in every FP16 file and in the judge
    # (coverage.kept_fp32); judged, and pinned to FP32 under weak typing
    fp32_by_schema: tuple[OpCount, ...] = ()

    def to_json(self) -> JSON:
        return {"nodes": self.nodes, "judged": self.judged,
                "judged_in_subgraphs": self.judged_in_subgraphs,
                "functions_inlined": self.functions_inlined,
                "unjudged": [c.to_json() for c in self.unjudged],
                "fp32_by_schema": [c.to_json() for c in self.fp32_by_schema],
                "tensorrt_unsupported": [c.to_json() for c in self.tensorrt_unsupported],
                "tensorrt_operator_list": self.tensorrt_operator_list}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Coverage:
        return cls(d["nodes"], d["judged"], d["judged_in_subgraphs"], d["functions_inlined"],
                   tuple(OpCount.from_json(c) for c in d["unjudged"]),
                   tuple(OpCount.from_json(c) for c in d["tensorrt_unsupported"]),
                   d["tensorrt_operator_list"],
                   tuple(OpCount.from_json(c) for c in d.get("fp32_by_schema", ())))


@dataclass(frozen=True)
class Partial:
    """A verdict over a graph not wholly judged (coverage.partial_of): the judged part's
    verdict, and the ops not judged (coverage.record's "unjudged")."""
    judged_verdict: VerdictName
    unjudged: tuple[OpCount, ...]

    def to_json(self) -> JSON:
        return {"judged_verdict": self.judged_verdict,
                "unjudged": [c.to_json() for c in self.unjudged]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Partial:
        return cls(d["judged_verdict"], tuple(OpCount.from_json(c) for c in d["unjudged"]))


class Stage(TypedDict):
    stage: str
    seconds: float


# precision.json's records after the plan, in its order (the order a run sets them in); not
# written: RunResult.layerwise_plan (bulky, the report's only). "tensorrt" (the TensorRT
# backend's report, verify_on_tensorrt) is read back as JSON: nothing of trtbisect's reads it.
TYPED = ("semantics", "precision", "coverage", "model_copy", "nothing_to_judge", "fp32_layers",
         "workers", "cost", "criteria_record", "judged", "rewrites", "one_judge",
         "certificate", "margins", "fragile", "aimed_searches", "validation", "criterion_hints",
         "culprit_groups", "errors_before_strict", "strict_only_culprits", "stability",
         "partial", "stages", "tensorrt")
JSON_KEY = {"criteria_record": "criteria"}  # attribute -> precision.json key, where they differ
# how precision.json's JSON of a frozen record becomes the record again (typed_from_json)
FROM_JSON: dict[str, Callable[[Any], object]] = {"semantics": SemanticsRecord.from_json,
                                                 "precision": Precision.from_json,
                                                 "coverage": Coverage.from_json,
                                                 "criteria_record": CriteriaRecord.from_json,
                                                 "judged": JudgedRecord.from_json,
                                                 "one_judge": OneJudge.from_json,
                                                 "margins": lambda v: {
                                                     k: Margin.from_json(m) for k, m in v.items()},
                                                 "partial": Partial.from_json,
                                                 "certificate": CertificateRecord.from_json,
                                                 "cost": CostRecord.from_json,
                                                 "workers": WorkersRecord.from_json,
                                                 "stability": StabilityRecord.from_json,
                                                 "rewrites": RewritesRecord.from_json,
                                                 "criterion_hints": lambda v: [
                                                     Hint.from_json(h) for h in v],
                                                 "aimed_searches": lambda v: [
                                                     AimedSearch.from_json(a) for a in v],
                                                 "culprit_groups": lambda v: [
                                                     CulpritGroup.from_json(g) for g in v],
                                                 "validation": lambda v: Validation.from_json(
                                                     v, metrics.entries()),
                                                 "errors_before_strict": lambda v: {
                                                     k: StrictError.from_json(
                                                         e, metrics.entries())
                                                     for k, e in v.items()}}
VERDICT_EXIT: dict[VerdictName, int] = {"fp16_ok": EXIT_OK, "fixed": EXIT_OK, "reference_invalid": EXIT_REFERENCE_INVALID,
                "no_plan": EXIT_NO_PLAN, "partial": EXIT_PARTIAL,
                "over_budget": EXIT_OVER_BUDGET, "nothing_to_judge": EXIT_OK,
                "fragile": EXIT_FRAGILE, "reference_unstable": EXIT_REFERENCE_UNSTABLE,
                "not_searched": EXIT_OK, "unvalidated": EXIT_UNVALIDATED,
                "quantized_ok": EXIT_OK}  # the quantized road's file as given passes  # not_searched: `torch --no-search`, layer-wise only


def search_verdict(search: SearchResult, planned: bool) -> VerdictName:
    """A search's verdict before its plan is judged again: no plan found, one over the
    budget, a plan to apply (`planned`: it keeps something FP32, or a rewrite changed the
    model), or the reduced precision as it is."""
    if not search.found:
        return "no_plan"
    if search.over_budget:
        return "over_budget"
    return "fixed" if planned else "fp16_ok"


class ToJson(Protocol):
    def to_json(self) -> dict: ...


C = TypeVar("C", bound=ToJson)  # a culprit: diagnose.Culprit, torch/result.TorchCulprit
S = TypeVar("S")  # a unit's layer-wise statistics: compare.TensorStats, torch's ModuleStats
V = TypeVar("V")


def known(new: V | None, old: V | None) -> V | None:
    """A finding just judged, else the one known before (None: still not judged)."""
    return old if new is None else new


def as_json(value: object) -> object:
    """A typed record as precision.json writes it: a record by its `to_json`, the values of
    a dict or a list each so; anything else as it is."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


def errors_json(errors: Mapping[str, OutputError]) -> dict[str, dict]:
    return {k: v.to_json() for k, v in errors.items()}


@dataclass(frozen=True)
class Found(Generic[C, S]):
    """What a search run finds, whatever it plans: the verdict, the plan (`fp32_nodes`: the
    units kept FP32, ONNX nodes or PyTorch module paths), the search and its prior, the
    errors before and after, the culprits, the files. A run's own fields follow in its
    subclass, keyword-only."""
    verdict: VerdictName
    fp32_nodes: list[str]
    candidates: int
    evaluations: int
    inferences: int
    samples: int
    tolerance: Tolerance
    errors_before: dict[str, OutputError]
    errors_after: dict[str, OutputError]
    culprits: list[C] = field(default_factory=list)
    one_minimal: bool = False
    search: SearchResult | None = None
    reference_problems: list[str] = field(default_factory=list)
    stats: dict[str, S] = field(default_factory=dict)
    prior_seeds: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)
    criteria: Criteria = field(default_factory=Criteria, repr=False)  # what judged the plan
    # what decided the verdict (judge/verdict.Findings); None: nothing judged since the proposal
    verdict_findings: Findings | None = field(default=None, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def findings_with(self, *, file_passed: bool | None = None, certified: bool | None = None,
                      validated: bool | None = None, covered: bool | None = None,
                      tensorrt: TensorRT | None = None) -> Findings:
        """The findings so far and those given (None: not judged), from the search's
        proposal."""
        was = self.verdict_findings or Findings(self.verdict)
        return Findings(
            was.proposed, file_passed=known(file_passed, was.file_passed),
            certified=known(certified, was.certified), validated=known(validated, was.validated),
            covered=known(covered, was.covered), tensorrt=known(tensorrt, was.tensorrt))

    def counts_json(self) -> dict[str, object]:
        """The search's counts, as both plan files write them after the plan."""
        return {"one_minimal": self.one_minimal, "evaluations": self.evaluations,
                "inferences": self.inferences, "samples": self.samples}

    def judged_json(self) -> dict[str, object]:
        """The errors before and after the plan and why each unit of it is kept FP32."""
        return {"errors_before": errors_json(self.errors_before),
                "errors_after": errors_json(self.errors_after),
                "culprits": [c.to_json() for c in self.culprits]}


@dataclass(frozen=True)
class RunResult(Found[Culprit, TensorStats]):
    """What `trtbisect run` found, assembled once (stages/assembly.assemble, or a verdict given
    before any judgement: pipeline._unjudgeable) and never changed after (frozen, as every
    road's result). What comes later is a new result (`dataclasses.replace`): the timings
    (pipeline._finish), the files the writers wrote (reports/write.write_outputs) and
    TensorRT's own search (`settled`, pipeline.verify_on_tensorrt)."""
    _: KW_ONLY
    model_path: str
    model_sha256: str
    nodes: int
    strict: bool
    mixed_check: dict[str, OutputError] | None = None
    mixed_model: Written | None = field(default=None, repr=False)  # for fp32_nodes
    rewritten_model: Written | None = field(default=None, repr=False)  # FP32, rewrites applied
    staged: list[str] = field(default_factory=list)  # judged files waiting in --out/.staging
    emulated_mixed: Written | None = field(default=None, repr=False)  # the judge's own graph
    # the plan's layer-wise pass, for --report's curve (never written into precision.json)
    layerwise_plan: dict[str, TensorStats] | None = field(default=None, repr=False)
    render_context: RenderContext | None = field(default=None, repr=False)  # write_outputs
    model_data_sha256: str | None = None  # the external data files' (model_sha256: the file's)
    # the typed records (TYPED); None: not recorded by this run, not written
    semantics: SemanticsRecord | None = None
    precision: Precision | None = None
    coverage: Coverage | None = None
    model_copy: list[str] | None = None  # what trtbisect's copy repaired (graph/repair.py)
    nothing_to_judge: str | None = None  # degenerate.nothing_to_judge's reason
    fp32_layers: list[str] | None = None  # the search's units
    workers: WorkersRecord | None = None  # stages/batch.summary
    cost: CostRecord | None = None  # search/cost.PlanPricing.record
    criteria_record: CriteriaRecord | None = None  # precision.json's "criteria"
    judged: JudgedRecord | None = None
    rewrites: RewritesRecord | None = None  # rewrites/driver.RewriteOutcome.record
    one_judge: OneJudge | None = None
    certificate: CertificateRecord | None = None
    margins: dict[str, Margin] | None = None
    fragile: bool | None = None
    aimed_searches: list[AimedSearch] | None = None
    validation: Validation | None = None  # the written plan on unseen samples
    criterion_hints: list[Hint] | None = None
    culprit_groups: list[CulpritGroup] | None = None
    errors_before_strict: dict[str, StrictError] | None = None  # all-FP16 per node (strict.py)
    strict_only_culprits: list[str] | None = None  # failing only under per-node rounding
    stability: StabilityRecord | None = None  # stages/stability.Stability.record
    partial: Partial | None = None
    stages: list[Stage] | None = None  # pipeline._finish
    tensorrt: TrtSearchReport | None = None  # --backend trt's own search (verify_on_tensorrt)

    def settled(self, *, tensorrt: TensorRT | None = None) -> RunResult:
        """This result with a finding made after it was assembled (TensorRT's own search,
        pipeline.verify_on_tensorrt) recorded, and the verdict all the findings decide
        (judge/verdict.decide over `Found.findings_with`): a new result."""
        findings = self.findings_with(tensorrt=tensorrt)
        return replace(self, verdict=findings.verdict(), verdict_findings=findings)

    @property
    def mixed_model_passed(self) -> bool | None:
        if self.mixed_check is None:
            return None
        return all(e.passed for e in self.mixed_check.values())

    def to_json(self) -> dict:
        return {
            "tool": "trtbisect", "version": __version__, "backend": "ort-emulator",
            "model": {"path": self.model_path, "sha256": self.model_sha256, "nodes": self.nodes,
                      "candidates": self.candidates,
                      **({"external_data_sha256": self.model_data_sha256}
                         if self.model_data_sha256 else {})},
            "verdict": self.verdict,
            "fp32_nodes": self.fp32_nodes,
            **self.counts_json(),
            "tolerance": {**self.tolerance.to_json(), "strict": self.strict},
            **self.judged_json(),
            "prior_seeds": self.prior_seeds,
            "reference_problems": self.reference_problems,
            "mixed_model_passed": self.mixed_model_passed,
            "mixed_model_check": (errors_json(self.mixed_check)
                                  if self.mixed_check is not None else None),
            "renderings": self.renderings(),
            "files": self.files,
            "seconds": round(self.seconds, 3),
            **self.records(),
        }

    def typed_json(self) -> dict[str, object]:
        """The typed records set by this run, under precision.json's keys, as JSON (a frozen
        record is written by its `to_json`)."""
        return {JSON_KEY.get(a, a): as_json(getattr(self, a)) for a in TYPED
                if getattr(self, a) is not None}

    def records(self) -> dict[str, object]:
        """The typed records, in precision.json's order (TYPED's)."""
        return self.typed_json()

    @staticmethod
    def typed_from_json(data: dict) -> dict[str, object]:
        """The typed records of a precision.json, by attribute (RunResult's keyword arguments):
        a frozen record built again by its `from_json` (FROM_JSON), the rest as JSON holds it."""
        keys = {JSON_KEY.get(a, a): a for a in TYPED}
        return {keys[k]: (FROM_JSON[keys[k]](v) if keys[k] in FROM_JSON and v is not None
                          else v)
                for k, v in data.items() if k in keys}

    def renderings(self) -> dict[str, object]:
        """Every tool's rendering of the plan (render.py); paths as `render_context` gives them."""
        from .outputs.render import RenderContext, renderings_json

        model = self.files.get("rewritten_model") or self.files.get("named_model", self.model_path)
        rc = self.render_context or RenderContext(
            model=model, mixed_model=self.files.get("mixed_model", "<mixed>.onnx"),
            tolerance=self.tolerance, criteria=self.criteria)
        return renderings_json(self.fp32_nodes, rc)
