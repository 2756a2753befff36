"""The options of a `trtbisect torch` run and its result: the run's result (`result.Found`:
verdict, plan, counts, errors, search, files, exit code) with a plan of module paths and the
torch run's own fields (the source, the precision, the module count, the layer-wise summary, the
pasted snippet's check)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

import torch

from ..judge.compare import OutputError, Tolerance
from ..judge.criteria import Criteria
from ..result import Found, errors_json
from .layerwise import ModuleStats
from .precision import Precision


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


@dataclass(frozen=True)
class TorchResult(Found[TorchCulprit, ModuleStats]):
    """The plan, `fp32_nodes` (the name RunResult gives it), holds module paths, as
    `named_modules()` names them (torch_plan.json's `fp32_modules`). Verdicts: fp16_ok, fixed,
    no_plan, reference_invalid, not_searched (--no-search)."""
    _: KW_ONLY
    source: str
    precision: Precision
    modules: int
    summary: dict[str, object] = field(default_factory=dict)  # layerwise.summarize
    snippet_check: dict[str, OutputError] | None = None  # the plan as apply_plan applies it

    @property
    def fp32_modules(self) -> list[str]:
        return self.fp32_nodes

    def to_json(self) -> dict:
        from .. import __version__
        return {
            "tool": "trtbisect", "version": __version__, "backend": "torch",
            "source": self.source, "torch": torch.__version__,
            "precision": self.precision.to_json(),
            "verdict": self.verdict,
            "fp32_modules": self.fp32_nodes,
            **self.counts_json(),
            "modules": self.modules,
            "candidates": self.candidates,
            "tolerance": self.tolerance.to_json(),
            **self.judged_json(),
            "layerwise": self.summary,
            "prior_seeds": self.prior_seeds,
            "snippet_check": (errors_json(self.snippet_check)
                              if self.snippet_check is not None else None),
            "reference_problems": self.reference_problems,
            "files": self.files,
            "seconds": round(self.seconds, 3),
        }
