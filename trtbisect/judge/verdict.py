"""The run's verdict, decided in one place from what the run found.

A search proposes (`search_verdict`: a plan, none, one over the budget, or FP16 as it is); the
written file, its certificate and its validation decide what that plan may be called:

- the written file fails its own judge: `no_plan` (one judge: a file that fails is never
  `fixed`); a plan over the `--budget` whose file passes is `fixed` after all;
- it passes by less than the spread of what the tools compute (judge/spread.py): `fragile`;
- it fails the samples the search never saw (judge/validation.py): `unvalidated`.

`coverage.apply_partial` (a graph not wholly judged) and the TensorRT backend's own search
(`pipeline.verify_on_tensorrt`) come after, on what this decides.
"""

from __future__ import annotations

from typing import Literal

VerdictName = Literal["fp16_ok", "fixed", "no_plan", "over_budget", "fragile", "unvalidated",
                      "partial", "reference_invalid", "reference_unstable", "nothing_to_judge",
                      "not_searched", "quantized_ok"]
PASSING = ("fixed", "fp16_ok")


def decide(proposed: str, *, file_passed: bool | None = None, certified: bool | None = None,
           validated: bool | None = None) -> str:
    """The verdict a proposed one becomes given the findings known so far (None: not
    judged, so it decides nothing)."""
    verdict = proposed
    if verdict == "over_budget":
        return "fixed" if file_passed else verdict
    if verdict in PASSING and file_passed is False:
        return "no_plan"
    if verdict in PASSING and certified is False:
        return "fragile"
    if verdict in PASSING and validated is False:
        return "unvalidated"
    return verdict
