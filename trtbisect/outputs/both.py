"""`trtbisect run --precision both`: FP16 and BF16 judged in one command, side by side.

The simplest honest design: two complete, independent runs of the same model, samples and
criterion, one per precision, each in its own folder (`<out>/fp16/`, `<out>/bf16/`) with
everything a single run writes (precision.json, the mixed ONNX, renderings, journal: each
resumes on its own). Each is its own one judge; nothing is shared between them but the inputs.
`<out>/precisions.json` and `<out>/precisions.md` hold the side-by-side table: per precision
its verdict, the plan's size, its estimated engine time against all-low-precision and all-FP32
(cost.py; FP16 and BF16 run at the same tensor-core rate on the GPUs priced, so the two columns
are comparable), and the worst output error with the plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from ..base.files import atomic_write_text
from ..judge.precision import BF16, FP16

PRECISIONS = (FP16, BF16)
VERDICT_WORDS = {"fp16_ok": "passes as is", "fixed": "fixed", "no_plan": "no plan",
                 "over_budget": "over budget", "reference_invalid": "reference invalid",
                 "reference_unstable": "reference unstable",
                 "nothing_to_judge": "nothing to judge", "partial": "partial",
                 "fragile": "fragile", "unvalidated": "unvalidated"}


@dataclass(frozen=True)
class Row:
    """One precision's line of the side-by-side table (precisions.json's "precisions"): its
    verdict, the plan's size, its estimated engine time (None: not priced), whether the plan
    passes (None: no output judged with it), its worst error per output, where it is."""

    precision: str
    verdict: str
    fp32_nodes: int
    candidates: int
    all_low_s: float | None
    plan_s: float | None
    all_fp32_s: float | None
    slowdown: float | None
    passed_after: bool | None
    max_abs_after: dict[str, float]
    evaluations: int
    seconds: float
    plan: str  # its precision.json

    def to_json(self) -> dict[str, Any]:
        return {"precision": self.precision, "verdict": self.verdict,
                "fp32_nodes": self.fp32_nodes, "candidates": self.candidates,
                "all_low_s": self.all_low_s, "plan_s": self.plan_s,
                "all_fp32_s": self.all_fp32_s, "slowdown": self.slowdown,
                "passed_after": self.passed_after, "max_abs_after": dict(self.max_abs_after),
                "evaluations": self.evaluations, "seconds": self.seconds, "plan": self.plan}


@dataclass(frozen=True)
class Both:
    """The two runs, FP16's first."""

    results: dict  # precision name -> result.RunResult
    folders: dict  # precision name -> its --out folder

    @property
    def exit_code(self) -> int:
        """0 when either precision has a passing plan (the user can pick it), else FP16's."""
        codes = [r.exit_code for r in self.results.values()]
        return 0 if 0 in codes else codes[0]

    def rows(self) -> list[Row]:
        out = []
        for name, r in self.results.items():
            c = r.cost
            out.append(Row(
                name, r.verdict, len(r.fp32_nodes), r.candidates,
                c.all_low_s if c is not None else None, c.plan_s if c is not None else None,
                c.all_fp32_s if c is not None else None, c.slowdown if c is not None else None,
                all(e.passed for e in r.errors_after.values()) if r.errors_after else None,
                {k: e.max_abs for k, e in r.errors_after.items()}, r.evaluations,
                round(r.seconds, 3), str(Path(self.folders[name]) / "precision.json")))
        return out

    def to_json(self) -> dict:
        return {"precisions": [row.to_json() for row in self.rows()],
                "runs": {name: r.to_json() for name, r in self.results.items()}}


class PerPrecision(Protocol):
    """A run's options as `run_both` needs them: context.Options (a layer above outputs/, so
    named here by the one thing used), whose `but(precision=...)` gives one run's."""

    def but(self, **changes: Any) -> Self: ...


Opts = TypeVar("Opts", bound=PerPrecision)


def run_both(model: str, opts: Opts, out: Path,
             run: Callable[[str, Opts, Path, str], object]) -> Both:
    """Both runs, one after the other; `run(model, opts, folder, name)` is one single run
    (the CLI's, with its progress; the whole options, as each run's are them but for the
    precision). A model one of them cannot judge (BF16 needs opset 13: an older model is
    converted, and refused only where the conversion fails) is refused before either runs,
    not after the FP16 half."""
    from ..graph import load_model

    for p in PRECISIONS:
        if p.min_opset > 1:
            load_model(model, min_opset=p.min_opset)  # raises the one-line refusal
    results, folders = {}, {}
    for p in PRECISIONS:
        one = opts.but(precision=p.name)  # context.Options: its judge group changes
        folders[p.name] = out / p.name
        results[p.name] = run(model, one, folders[p.name], p.name)
    both = Both(results, folders)
    atomic_write_text(out / "precisions.json", json.dumps(
        {"precisions": [row.to_json() for row in both.rows()]}, indent=2) + "\n")
    atomic_write_text(out / "precisions.md", markdown(both))
    return both


def _us(x: float | None) -> str:
    return "-" if x is None else f"{1e6 * x:.4g} us"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def table(both: Both) -> list[list[str]]:
    """Header and one row per precision, as people read them (stdout and precisions.md)."""
    rows = [["precision", "verdict", "FP32 nodes", "est. time", "vs all-low", "all FP32",
             "with the plan"]]
    for r in both.rows():
        ok = r.passed_after
        rows.append([r.precision.upper(), VERDICT_WORDS.get(r.verdict, r.verdict),
                     f"{r.fp32_nodes} of {r.candidates}", _us(r.plan_s), _pct(r.slowdown),
                     _us(r.all_fp32_s), "-" if ok is None else ("pass" if ok else "FAIL")])
    return rows


def markdown(both: Both) -> str:
    rows = table(both)
    lines = ["# FP16 and BF16, side by side", "",
             "Two independent runs (`trtbisect run --precision both`), one folder each; engine "
             "times are cost.py's roofline estimates.", "",
             "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    lines += ["", *(f"- {r.precision.upper()}: `{r.plan}`" for r in both.rows())]
    return "\n".join(lines) + "\n"
