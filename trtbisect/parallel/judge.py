"""The judge of a plan on samples: one code path for the in-process evaluator and every worker.

A plan is judged sample by sample (the emulator's outputs, or with --strict also its watched
non-finite tensors, under the run's criteria), stopping early once it cannot pass any more.
`take` is that stopping rule; the in-process evaluator feeds it lazily, so it runs no sample
past the stop. Workers judge a chunk of the samples each, stopping on their own chunk by the
same rule, and the parent feeds `take` the chunks in sample order: because a stop depends only
on failures seen so far (`Criteria.hopeless` counts them, a non-finite tensor is one), the
chunks hold every sample up to the sequential stop, and `take` returns exactly the judgements
the sequential loop would have made, with the same count of inferences.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..base.limits import EvalTimeout, set_eval_timeout
from ..errors import TrtBisectError
from ..judge.compare import Tolerance
from ..judge.criteria import Criteria, Judgement, timed_out
from ..judge.settings import JudgeSettings, criteria_digest

Arrays = Mapping[str, np.ndarray]
Result = tuple[Judgement, list[str]]  # one sample: its judgement, its non-finite watched tensors


@dataclass
class Measured:
    """A plan judged on samples: the verdict, per sample judged its judgement (up to the
    stop), the watched tensors that went non-finite."""

    passed: bool
    judged: list[Judgement]
    nonfinite: list[str]
    stopped: bool = False  # stopped early: `judged` holds the samples up to the stop


def judge_one(emulator, plan: frozenset[str], sample: Arrays, reference: Arrays,
              criteria: Criteria, tolerance: Tolerance, strict: bool) -> Result:
    """One sample under the plan: what `Evaluator.measure` has always computed per sample.
    An inference that runs past --eval-timeout fails the sample (limits.py): an engine whose
    Loop never ends is no better than one that overflows."""
    try:
        if strict:
            outs, bad = emulator.nonfinite(plan, sample)
        else:
            outs, bad = emulator.run(plan, sample), []
    except EvalTimeout as exc:
        return timed_out(reference, exc.seconds), []
    return criteria.judge(reference, outs, sample, tolerance), list(bad)


def stops(criteria: Criteria, judged: Sequence[Judgement], nonfinite: Sequence[str],
          total: int) -> bool:
    """The plan cannot pass any more: a watched tensor went non-finite, or too many samples
    failed for `total` samples (monotone in the failures seen: a chunk may apply it alone)."""
    return bool(nonfinite) or criteria.hopeless(judged, total)


def take(results: Iterable[Result], criteria: Criteria, total: int,
         stop_early: bool) -> Measured:
    """The sequential verdict over `results` in sample order (pulled lazily: nothing past a
    stop is computed)."""
    judged: list[Judgement] = []
    nonfinite: list[str] = []
    for judgement, bad in results:
        judged.append(judgement)
        nonfinite += [t for t in bad if t not in nonfinite]
        if stop_early and stops(criteria, judged, nonfinite, total):
            return Measured(False, judged, nonfinite, stopped=True)
    return Measured(criteria.verdict(judged).passed and not nonfinite, judged, nonfinite)


def merge(chunks: Sequence[tuple[list[Result], bool]], criteria: Criteria, total: int,
          stop_early: bool) -> Measured:
    """Chunks of consecutive samples (each: its results, whether it ran to its end) as the
    sequential loop judges them. A chunk cut short stopped by the rule `take` applies, so the
    sequential stop comes at or before its end."""
    def ordered() -> Iterator[Result]:
        for results, complete in chunks:
            yield from results
            if not complete:
                raise _CutShort
    try:
        return take(ordered(), criteria, total, stop_early)
    except _CutShort:
        raise AssertionError("a worker stopped its chunk where the sequential judge goes on "
                             "(please report this)") from None


class _CutShort(Exception):
    pass


# ---------------------------------------------------------------- what a worker builds

@dataclass(frozen=True)
class JudgeSpec:
    """Everything a worker needs to build the run's judge; small and picklable (the model
    and the samples travel as paths or object-store references, never pickled arrays)."""

    model: str  # the ONNX file the run judges (its rewritten model, saved, under --rewrite)
    judge: JudgeSettings  # everything a verdict depends on (judge/settings.py), one object
    watch: tuple[str, ...]  # --strict: the tensors whose non-finite values fail a plan
    groups: tuple[tuple[str, ...], ...]  # nodes plans keep together (the search's units)
    active: tuple[str, ...]  # switchable from the first session on (the prior's prefetch)
    names: str = ""  # digest of the judged graph: the worker must prepare the same graph
    model_sha256: str | None = None  # checked where the file is not the parent's own path
    # --shape: what a graph input declaring no shape is given in the run's copy (graph/repair.py)
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()


def graph_digest(graph) -> str:
    """The judged graph's node names and candidates, as a worker must rebuild them."""
    h = hashlib.sha256()
    for n in graph.names:
        h.update(n.encode() + b"\0")
    h.update(b"\1")
    for n in graph.candidates():
        h.update(n.encode() + b"\0")
    return h.hexdigest()


class SampleJudge:
    """A worker's judge: the run's emulator session and criteria, built from a spec."""

    def __init__(self, spec: JudgeSpec) -> None:
        from ..backends.ort import Emulator
        from ..graph import Graph, model_hash
        from ..judge import semantics

        set_eval_timeout(spec.judge.eval_timeout)
        if spec.model_sha256 is not None and model_hash(spec.model) != spec.model_sha256:
            raise TrtBisectError(f"the model {spec.model} a worker reads differs from the "
                                 "run's (give a path every node reads the same file at)")
        from ..judge.precision import precision
        settings = spec.judge
        graph = Graph.from_path(spec.model, precision(settings.precision).min_opset,
                                dict(spec.shapes))
        judged, prepared = semantics.prepare_graph(graph, settings.semantics,
                                                   settings.trt_version)
        if spec.names and graph_digest(judged) != spec.names:
            raise TrtBisectError("a worker prepared another graph than the run's (a different "
                                 "trtbisect or onnx version on a worker?)")
        self.criteria = settings.criteria()
        if criteria_digest(self.criteria) != settings.criteria_fingerprint:
            raise TrtBisectError("a --check file changed during the run")
        rules = semantics.rules_for(prepared, settings.tf32, settings.accumulate,
                                    precision(settings.precision))
        self.emulator = Emulator(judged, settings.threads, watch=list(spec.watch), rules=rules,
                                 groups=[list(g) for g in spec.groups], active=spec.active)
        self.spec = spec

    def chunk(self, plan: frozenset[str], pairs: Iterable[tuple[Arrays, Arrays]], total: int,
              stop_early: bool) -> tuple[list[Result], bool]:
        """Judge consecutive samples; stop early by the sequential rule on this chunk alone.
        Returns the results and whether the chunk ran to its end."""
        out: list[Result] = []
        judged: list[Judgement] = []
        bad: list[str] = []
        for sample, ref in pairs:
            result = judge_one(self.emulator, plan, sample, ref, self.criteria,
                               self.spec.judge.tolerance, self.spec.judge.strict)
            out.append(result)
            judged.append(result[0])
            bad += result[1]
            if stop_early and stops(self.criteria, judged, bad, total):
                return out, False
        return out, True

    def close(self) -> None:
        self.emulator.close()
