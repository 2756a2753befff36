"""The run's verdict, decided in one place from what the run found.

A search proposes (`result.search_verdict`: a plan, none, one over the budget, or FP16 as it
is); the written file, its certificate, its validation and the graph's coverage decide what
that plan may be called, in this order:

1. the written file fails its own judge: `no_plan` (one judge: a file that fails is never
   `fixed`); a plan over the `--budget` whose file passes is `fixed` after all;
2. it passes by less than the spread of what the tools compute (stages/spread.py), or the
   certificate decided that no nearer plan can have the margin, or the search found its
   own criterion too noisy near the bound to tell plans apart (search/noise.py): `fragile`;
3. it fails the samples the search never saw (judge/validation.py): `unvalidated`;
4. a passing verdict on a graph the emulator could not wholly round (stages/coverage.py):
   `partial` (the judged part passes; the rest ran in FP32).

What `fixed` (and `fp16_ok`) certifies is therefore all of: the written file passes the
run's criteria on every sample searched, by more than the spread on every output, and on
every validation sample (held out, or perturbed copies of a single one) where the run had
any. A finding left `None` was not judged and decides nothing.

The TensorRT backend's own search (`pipeline.verify_on_tensorrt`) judges engines instead of
the emulator: `on_tensorrt` says what its outcome makes of the verdict, after all the above.

The quantized road's file as given (`quantized_ok`) is held to the same findings as FP16 as
it is (`fp16_ok`): without its margin over the spread it is `fragile`, and so on.

`Findings` holds what a run found so far; `Findings.verdict()` is `decide` over all of them,
always from the search's proposal (never from a verdict an earlier finding already changed).
Every road decides it once, over all its findings, when its result is assembled
(stages/assembly.assemble, quant/run.py `assemble`, torch/driver.py); a result is frozen, and a
finding made after it (TensorRT's own search) makes a new one (result.py `RunResult.settled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

VerdictName = Literal["fp16_ok", "fixed", "no_plan", "over_budget", "fragile", "unvalidated",
                      "partial", "reference_invalid", "reference_unstable", "nothing_to_judge",
                      "not_searched", "quantized_ok"]
PASSING: tuple[VerdictName, ...] = ("fixed", "fp16_ok")


@dataclass(frozen=True)
class TensorRT:
    """`--backend trt`'s own search: whether it found an engine plan, whether that plan is
    another than the emulator's, and whether it keeps anything FP32."""
    found: bool
    changed: bool
    planned: bool


@dataclass(frozen=True)
class Findings:
    """What decides a run's verdict: the search's proposal and each finding judged since
    (None: not judged, so it decides nothing)."""
    proposed: VerdictName
    file_passed: bool | None = None  # the written file, judged as `check` judges it
    certified: bool | None = None  # it passes by more than the tools' spread
    validated: bool | None = None  # it passes the samples the search never saw
    covered: bool | None = None  # the emulator rounded the whole graph
    tensorrt: TensorRT | None = None  # TensorRT's own search (--backend trt)

    def verdict(self) -> VerdictName:
        return decide(self.proposed, file_passed=self.file_passed, certified=self.certified,
                      validated=self.validated, covered=self.covered, tensorrt=self.tensorrt)


def decide(proposed: str, *, file_passed: bool | None = None, certified: bool | None = None,
           validated: bool | None = None, covered: bool | None = None,
           tensorrt: TensorRT | None = None) -> VerdictName:
    """The verdict a proposed one becomes given the findings known so far (module
    docstring: the order; None: not judged, so it decides nothing)."""
    verdict = _emulated(cast(VerdictName, proposed), file_passed, certified, validated,
                        covered)
    if tensorrt is not None:
        return on_tensorrt(verdict, found=tensorrt.found, changed=tensorrt.changed,
                           planned=tensorrt.planned)
    return verdict


def _emulated(proposed: VerdictName, file_passed: bool | None, certified: bool | None,
              validated: bool | None, covered: bool | None) -> VerdictName:
    """The emulator's findings, in the module docstring's order."""
    as_given = proposed == "quantized_ok"  # held to what FP16 as it is is held to
    verdict: VerdictName = "fp16_ok" if as_given else proposed
    if verdict == "over_budget":
        if not file_passed:
            return verdict
        verdict = "fixed"  # the file decides: it fits the budget and passes
    if verdict not in PASSING:
        return verdict
    if file_passed is False:
        return "no_plan"
    if certified is False:
        return "fragile"
    if validated is False:
        return "unvalidated"
    if covered is False:
        return "partial"
    return "quantized_ok" if as_given else verdict


def on_tensorrt(proposed: str, *, found: bool, changed: bool, planned: bool) -> VerdictName:
    """The verdict after TensorRT's own search (`--backend trt`): no engine plan passes:
    `no_plan`; TensorRT needed another plan than the emulator's: that plan, judged on the
    engines themselves, is `fixed` (or `fp16_ok` when empty); the same plan: as decided."""
    if not found:
        return "no_plan"
    if changed:
        return "fixed" if planned else "fp16_ok"
    return cast(VerdictName, proposed)
