"""The run's nouns: its options (`Options`), the loaded model with its samples and FP32
reference (`Context`) and `prepare`, which builds one. Below the judge, the searches and
the writers that use them; `pipeline.py` orchestrates."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .base.limits import EVAL_TIMEOUT, Limits, set_eval_timeout
from .data.inputs import Sample
from .data.sources import expand, iter_items, npz_shapes
from .data.store import SampleSet, reference_set, update_hash
from .errors import TrtBisectError
from .graph import Graph, external_data_hash, external_files, model_hash
from .graph.repair import say
from .judge import degenerate, semantics, subset
from .judge.compare import Tolerance, validate_tolerance
from .judge.criteria import Criteria
from .judge.loadable import InputCheck
from .judge.precision import precision as low_precision
from .judge.settings import JudgeSettings
from .judge.validation import HOLD_OUT_SHARE, Holdout
from .search import cost


def _default_trt_version() -> int:
    from .backends.trt import default_trt_version
    return default_trt_version()


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleOptions:
    """Where the run's samples come from and how many the search and validation see."""

    inputs: Sequence[str] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int = 0
    samples: int = 1  # random samples when no --inputs are given
    data_loader: str | None = None  # Polygraphy's --data-loader-script FILE.py[:FUNCTION]
    search_samples: int = subset.SEARCH_SAMPLES  # above this many, search on a subset first
    # the share of two samples or more the search never sees, the written plan is validated on
    # (judge/validation.py; one sample: perturbed copies; 0: no validation)
    validation_share: float = HOLD_OUT_SHARE
    # bounds on samples and spooled bytes (limits.py, docs/limits.md)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class JudgeOptions:
    """Every setting a verdict depends on, with the criteria as given (a --check hook's
    function may not pickle). `settings` is their picklable form, built once (judge/settings.py):
    the journal's fingerprint, the reference cache key and the workers' spec come from it."""

    tolerance: Tolerance = field(default_factory=Tolerance)
    criteria: Criteria = field(default_factory=Criteria)  # default: the tolerance's max error
    strict: bool = False
    threads: int | None = None
    semantics: str = "trt"  # trt: round where TensorRT rounds; strict: every node (docs/semantics.md)
    # the weight-conversion rule and renderings' target: the installed TensorRT's major, else 11
    trt_version: int = field(default_factory=_default_trt_version)
    tf32: bool = False  # FP32 MatMul/Conv/Gemm read TF32-rounded operands (else --noTF32)
    fp16_accumulate: bool = False  # FP16 MatMul/Gemm/Conv accumulate in FP16 (an approximation)
    precision: str = "fp16"  # the low precision plans target: fp16 | bf16 (judge/precision.py)
    eval_timeout: float = EVAL_TIMEOUT  # --eval-timeout: one inference (limits.py)
    settings: JudgeSettings = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", JudgeSettings.of(self))

    @property
    def accumulate(self) -> int:
        """The --fp16-accumulate block size (0: off)."""
        return semantics.FP16_ACCUMULATE_BLOCK if self.fp16_accumulate else 0


@dataclass(frozen=True)
class SearchOptions:
    """How the search runs: its bound, objective and pricing, its workers, its extra passes."""

    max_evaluations: int | None = None
    memory_budget: int = 1 << 30  # bytes of intermediate tensors held at once (layer-wise)
    stability: int = 0  # N >= 2: rerun the plan and all-FP16 on N jittered copies per sample
    rewrite: bool = False  # try verified FP16-safe graph rewrites before any FP32 fallback
    gpu: str = cost.DEFAULT_GPU  # the GPU class plans are priced on (cost.py, docs/cost.md)
    objective: str = "cost"  # cost: the cheapest plan in estimated engine time; count: fewest units
    budget: float | None = None  # --budget PCT: the plan's slowdown against all-FP16 at most this
    # evaluations on N worker processes (parallel/; None: as the cores and memory allow; 1:
    # in this process), or on Ray actors (`ray`: a cluster's address, "" for a local one)
    workers: int | None = 1
    ray: str | None = None


@dataclass(frozen=True)
class OutputOptions:
    """What the output folder holds and reuses."""

    resume: bool = True  # replay the folder's journal and reference cache
    report: bool = False  # also write report.html / report.md (needs matplotlib)


_GROUPS = {"sample": SampleOptions, "judge": JudgeOptions, "search": SearchOptions,
           "output": OutputOptions}
_GROUP_OF = {f.name: group for group, cls in _GROUPS.items() for f in fields(cls) if f.init}


@dataclass(frozen=True)
class Options:
    """A run's options in four groups; a function takes the group it reads."""

    sample: SampleOptions = field(default_factory=SampleOptions)
    judge: JudgeOptions = field(default_factory=JudgeOptions)
    search: SearchOptions = field(default_factory=SearchOptions)
    output: OutputOptions = field(default_factory=OutputOptions)

    @classmethod
    def of(cls, **settings: Any) -> Options:
        """Options from the groups' field names (`Options.of(seed=1, tolerance=t)`)."""
        return cls(**{group: kind(**_pick(settings, group)) for group, kind in _GROUPS.items()})

    def but(self, **changes: Any) -> Options:
        """These options with some fields changed, named as in `of` (a group not named is
        kept as it is: its JudgeSettings are not built again)."""
        groups = {group: replace(getattr(self, group), **_pick(changes, group))
                  for group in _GROUPS if any(_GROUP_OF[k] == group for k in changes)}
        return replace(self, **groups)


def _pick(settings: Mapping[str, Any], group: str) -> dict[str, Any]:
    unknown = sorted(k for k in settings if k not in _GROUP_OF)
    if unknown:
        raise TypeError(f"Options have no field {', '.join(unknown)}")
    return {k: v for k, v in settings.items() if _GROUP_OF[k] == group}


@dataclass
class Context:
    """A loaded model with its samples and FP32 reference outputs."""

    path: Path
    model: onnx.ModelProto
    graph: Graph
    samples: Sequence[Sample]  # what the search judges on: every sample, or a subset of them
    references: Sequence[dict[str, np.ndarray]]
    sha256: str
    # what the search judges: the model after TensorRT's build-time rewrites (trt semantics) or
    # `graph` itself (strict); the FP32 reference is always `graph`, the model as given
    search: Graph | None = None
    prepared: semantics.Prepared | None = None
    rules: semantics.Rules = semantics.STRICT
    sources: list[Path] = field(default_factory=list)  # the run's input files: never moved
    data_sha256: str | None = None  # of the external data files, when the model has some
    # every sample and its reference (streamed, data/store.py): what a written plan is
    # certified on; `samples`/`references` unless the search judges a subset
    every_sample: Sequence[Sample] = ()  # () until __post_init__: `samples`
    every_reference: Sequence[dict[str, np.ndarray]] = ()
    subset: tuple[int, ...] | None = None  # indices into every_sample the search judges on
    # what the run's written copies are held to: the input's own checker verdict (loadable.py)
    input_check: InputCheck = field(default_factory=InputCheck)
    # the samples the written plan is validated on, never searched (judge/validation.py)
    validation: Holdout | None = None
    # every sample the user gave and its reference, held-out ones included, in their order:
    # what the written file is reported on (`check` of it on the user's data says the same)
    given_sample: Sequence[Sample] = ()  # () until __post_init__: `every_sample`
    given_reference: Sequence[dict[str, np.ndarray]] = ()
    kept: list[int] | None = None  # every_sample's indices among the given samples
    # the certificate's FP32 references under each variant (backends/ort.VariantReferences),
    # started once the samples are known (pipeline.run); None: computed when certified
    variant_references: Any = None

    def __post_init__(self) -> None:
        if not self.every_sample:  # no run has no sample: () is the unset default
            self.every_sample, self.every_reference = self.samples, self.references
        if not self.given_sample:
            self.given_sample, self.given_reference = self.every_sample, self.every_reference

    @property
    def judged(self) -> Graph:
        return self.search if self.search is not None else self.graph

    def hold_out(self, share: float, seed: int, threads: int | None = None) -> None:
        """Set the validation samples aside (judge/validation.py): of two samples or more,
        `share` of them leave the search's samples for good; of one, perturbed copies of it
        validate (their references made on first use)."""
        from .backends.ort import Reference
        from .data.store import View
        from .judge import validation
        graph = self.graph

        def reference(samples):
            ref = Reference(graph, threads)
            try:
                return [ref.run(s) for s in samples]
            finally:
                ref.close()
        kept, self.validation = validation.hold_out(
            self.every_sample, self.every_reference, share, seed, reference,
            validation.shape_like_inputs(graph) if len(self.every_sample) == 1 else frozenset())
        self.given_sample, self.given_reference = self.every_sample, self.every_reference
        self.kept = kept
        if len(kept) < len(self.every_sample):
            self.every_sample = View(self.every_sample, kept)
            self.every_reference = View(self.every_reference, kept)
            self.samples, self.references, self.subset = (self.every_sample,
                                                          self.every_reference, None)

    def sample_numbers(self) -> list[int]:
        """The user's number of each sample the search judges (`samples`): held-out ones are
        not among them, and a subset is the subset's."""
        assert self.every_sample is not None
        idx = range(len(self.every_sample)) if self.subset is None else self.subset
        return [self.kept[i] if self.kept else i for i in idx]

    def narrow(self, subset: Sequence[int] | None) -> None:
        """Let the search judge on `subset` of the samples (None: on every sample)."""
        from .data.store import View
        if subset is None or len(subset) == len(self.every_sample):
            self.samples, self.references, self.subset = (self.every_sample,
                                                          self.every_reference, None)
        else:
            self.subset = tuple(subset)
            self.samples = View(self.every_sample, subset)
            self.references = View(self.every_reference, subset)


def prepare(model_path: str | Path, opts: Options, search: bool = True,
            cache: Path | None = None, spool: Path | None = None) -> Context:
    """Load, reference outputs, and (`search`) the graph the emulator judges under
    `opts.judge.semantics`. `cache`: a folder where a resumed run finds the reference outputs;
    `spool`: where samples and references that do not fit in memory go (default: a
    temporary folder)."""
    path, given, judge = Path(model_path), opts.sample, opts.judge
    # the emulator rounds with Casts to the low type: an older opset is judged as converted
    graph = Graph.from_path(path, low_precision(judge.precision).min_opset if search else 1,
                            {**npz_shapes(list(given.inputs)), **given.shapes})
    if graph.repairs:
        log.warning("%s", say(path, graph.repairs))
    if search:  # float64 compute: refused or named, as TensorRT's parser would cast it
        degenerate.check_judgeable(graph, path)
    validate_tolerance(judge.tolerance, graph.output_names())  # typos are usage errors (#14)
    judge.criteria.validate(graph.output_names())
    set_eval_timeout(judge.eval_timeout)  # every inference of this run (limits.py)
    samples = SampleSet(iter_items(graph, list(given.inputs), given.data_loader, given.shapes,
                                   given.seed, given.samples, given.limits),
                        spool=spool or cache, limits=given.limits)
    sha, data_sha = model_hash(path), external_data_hash(path)
    references = reference_set(graph, samples, judge.threads, f"{sha}:{data_sha}", cache,
                               spool or cache, samples.spooled)
    judge.criteria.check_fit(references[0])
    _declare_computed_shapes(graph, references[0], path)
    ctx = Context(path, graph.source, graph, samples, references, sha,
                  sources=[path, *external_files(path), *input_files(given)],
                  data_sha256=data_sha, input_check=InputCheck(path))
    semantics.weight_rule_for(judge.semantics, judge.trt_version)  # fail early on bad values
    if judge.fp16_accumulate and not low_precision(judge.precision).narrow_range:
        raise TrtBisectError("--fp16-accumulate models FP16-accumulating kernels; BF16 GEMMs "
                             "and convolutions accumulate in FP32 (cuBLAS has no BF16 compute "
                             "type): drop it with --precision bf16")
    if search:
        ctx.search, ctx.prepared = semantics.prepare_graph(graph, judge.semantics,
                                                           judge.trt_version)
        ctx.rules = semantics.rules_for(ctx.prepared, judge.tf32, judge.accumulate,
                                        low_precision(judge.precision))
    return ctx


def _declare_computed_shapes(graph: Graph, reference: Mapping[str, np.ndarray],
                             path: Path) -> None:
    """An output whose declared shape contradicts what the model computes (an exporter's
    rank-0 `[]` on a [1, 40, 18385] tensor; a static batch of 1 under `--shape x:2x...`): the
    run's copy declares each contradicted dimension symbolic (of the computed rank), so every
    file written from the copy declares nothing false (ONNX Runtime warns on each run of it,
    and `check` would refuse it). Said in one line, as every repair of the copy is."""
    from .data.inputs import declared_shape
    notes = []
    for v in graph.source.graph.output:
        if v.name not in reference or not v.type.tensor_type.HasField("shape"):
            continue
        dims, got = declared_shape(v), np.shape(reference[v.name])
        wrong = len(dims) != len(got)
        keep = [not wrong and not (isinstance(d, int) and d > 0 and d != n)
                for d, n in zip(dims if not wrong else got, got)]
        if all(keep):
            continue
        old = list(v.type.tensor_type.shape.dim)
        v.type.tensor_type.ClearField("shape")
        shape = v.type.tensor_type.shape
        for i, ok in enumerate(keep):
            d = shape.dim.add()
            if ok:
                d.CopyFrom(old[i])
            else:
                d.dim_param = f"{v.name}_d{i}"
        notes.append(f"declare output {v.name!r} as {declared_shape(v)} (the file declares "
                     f"{list(dims)}, the model computes {list(got)})")
    if notes:
        graph.repairs = (*graph.repairs, *notes)
        log.warning("%s", say(path, tuple(notes)))


def input_files(given: SampleOptions) -> list[Path]:
    """The files the run's samples come from (folders and globs expanded): never moved."""
    found = [Path(p) for spec in given.inputs for p, _ in expand(spec)]
    loader = given.data_loader
    if loader:
        found.append(Path(loader.rsplit(":", 1)[0] if not loader.endswith(".py") else loader))
    return found


def samples_hash(samples: Sequence[Sample]) -> str:
    sha = getattr(samples, "sha256", None)  # a SampleSet hashed itself while reading
    if sha is not None:
        return sha
    h = hashlib.sha256()
    for s in samples:
        update_hash(h, s)
    return h.hexdigest()


def run_fingerprint(settings: dict, model: str, samples: Sequence[Sample], version: str,
                    **road: object) -> dict:
    """What a journaled verdict depends on, on every road: the model, the samples, the
    version, every setting of the judge (`JudgeSettings.fingerprint()`: one object, so none
    can be left out), and the road's own keys (`road`: the FP16 road's rewrites, the quantized
    road's reference and objective)."""
    return {"model": model, "samples": samples_hash(samples), "version": version,
            "settings": settings, **road}


def reference_problems(ctx: Context) -> list[str]:
    return nonfinite_references(ctx.every_reference)


def nonfinite_references(references: Sequence[Mapping[str, np.ndarray]]) -> list[str]:
    """What makes an FP32 reference unusable (the verdict reference_invalid), one line per
    output of a sample with inf or NaN in it: the ONNX run's and the torch run's."""
    problems = []
    for k, outs in enumerate(references):
        for name, value in outs.items():
            if np.issubdtype(value.dtype, np.floating):
                bad = int(value.size - np.count_nonzero(np.isfinite(value)))
                if bad:
                    problems.append(f"output {name!r} of sample {k} has {bad} non-finite value(s)")
    return problems
