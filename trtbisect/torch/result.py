"""The options of a `trtbisect torch` run and its result."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..judge.compare import OutputError, Tolerance
from ..errors import EXIT_NO_PLAN, EXIT_OK, EXIT_REFERENCE_INVALID
from ..judge.criteria import Criteria
from ..search.minimal import SearchResult
from .layerwise import ModuleStats
from .precision import Precision

VERDICT_EXIT = {"fp16_ok": EXIT_OK, "fixed": EXIT_OK, "reference_invalid": EXIT_REFERENCE_INVALID,
                "no_plan": EXIT_NO_PLAN}


@dataclass
class TorchOptions:
    precision: Precision = field(default_factory=Precision)
    tolerance: Tolerance = field(default_factory=Tolerance)
    max_evaluations: int | None = None
    search: bool = True
    criteria: Criteria = field(default_factory=Criteria)  # judge/criteria.py


@dataclass
class TorchCulprit:
    module: str
    cls: str
    why: str

    def to_json(self) -> dict:
        return {"module": self.module, "class": self.cls, "why": self.why}


@dataclass
class TorchResult:
    verdict: str  # fp16_ok | fixed | no_plan | reference_invalid | (not_searched)
    source: str
    precision: Precision
    fp32_modules: list[str]
    candidates: int
    modules: int
    evaluations: int
    inferences: int
    samples: int
    tolerance: Tolerance
    errors_before: dict[str, OutputError]
    errors_after: dict[str, OutputError]
    culprits: list[TorchCulprit] = field(default_factory=list)
    one_minimal: bool = False
    search: SearchResult | None = None
    stats: dict[str, ModuleStats] = field(default_factory=dict)
    summary: dict[str, object] = field(default_factory=dict)
    seeds: list[str] = field(default_factory=list)
    snippet_check: dict[str, OutputError] | None = None
    reference_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT.get(self.verdict, EXIT_OK)

    def to_json(self) -> dict:
        from .. import __version__
        return {
            "tool": "trtbisect", "version": __version__, "backend": "torch",
            "source": self.source, "torch": torch.__version__,
            "precision": self.precision.to_json(),
            "verdict": self.verdict,
            "fp32_modules": self.fp32_modules,
            "one_minimal": self.one_minimal,
            "evaluations": self.evaluations,
            "inferences": self.inferences,
            "samples": self.samples,
            "modules": self.modules,
            "candidates": self.candidates,
            "tolerance": self.tolerance.to_json(),
            "errors_before": {k: v.to_json() for k, v in self.errors_before.items()},
            "errors_after": {k: v.to_json() for k, v in self.errors_after.items()},
            "culprits": [c.to_json() for c in self.culprits],
            "layerwise": self.summary,
            "prior_seeds": self.seeds,
            "snippet_check": ({k: v.to_json() for k, v in self.snippet_check.items()}
                              if self.snippet_check is not None else None),
            "reference_problems": self.reference_problems,
            "files": self.files,
            "seconds": round(self.seconds, 3),
        }
