"""What a run found (`RunResult`: the verdict, the plan, its errors, its files) and the exit
code of each verdict. Below the writers and the report that read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import __version__, degenerate
from .compare import OutputError, TensorStats, Tolerance
from .diagnose import Culprit
from .errors import (EXIT_FRAGILE, EXIT_NO_PLAN, EXIT_OK, EXIT_OVER_BUDGET, EXIT_PARTIAL,
                     EXIT_REFERENCE_INVALID, EXIT_REFERENCE_UNSTABLE)
from .judge.criteria import Criteria
from .mixed import Written
from .render import RenderContext
from .search import SearchResult

BULKY_EXTRAS = ("layerwise_plan",)  # kept for the report, not written into precision.json
VERDICT_EXIT = {"fp16_ok": EXIT_OK, "fixed": EXIT_OK, "reference_invalid": EXIT_REFERENCE_INVALID,
                "no_plan": EXIT_NO_PLAN, "partial": EXIT_PARTIAL,
                "over_budget": EXIT_OVER_BUDGET, degenerate.NOTHING_TO_JUDGE: EXIT_OK,
                "fragile": EXIT_FRAGILE, "reference_unstable": EXIT_REFERENCE_UNSTABLE}


@dataclass
class RunResult:
    verdict: str
    model_path: str
    model_sha256: str
    fp32_nodes: list[str]
    candidates: int
    nodes: int
    evaluations: int
    inferences: int
    samples: int
    tolerance: Tolerance
    strict: bool
    errors_before: dict[str, OutputError]
    errors_after: dict[str, OutputError]
    culprits: list[Culprit] = field(default_factory=list)
    one_minimal: bool = False
    search: SearchResult | None = None
    reference_problems: list[str] = field(default_factory=list)
    mixed_check: dict[str, OutputError] | None = None
    mixed_model: Written | None = field(default=None, repr=False)  # for fp32_nodes
    rewritten_model: Written | None = field(default=None, repr=False)  # FP32, rewrites applied
    staged: list[str] = field(default_factory=list)  # judged files waiting in --out/.staging
    emulated_mixed: Written | None = field(default=None, repr=False)  # the judge's own graph
    stats: dict[str, TensorStats] = field(default_factory=dict)
    prior_seeds: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)  # filled by diagnosis, torch, trt
    render_context: RenderContext | None = field(default=None, repr=False)  # write_outputs
    model_data_sha256: str | None = None  # the external data files' (model_sha256: the file's)
    criteria: Criteria = field(default_factory=Criteria, repr=False)  # what judged the plan

    @property
    def mixed_model_passed(self) -> bool | None:
        if self.mixed_check is None:
            return None
        return all(e.passed for e in self.mixed_check.values())

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def to_json(self) -> dict:
        return {
            "tool": "trtbisect", "version": __version__, "backend": "ort-emulator",
            "model": {"path": self.model_path, "sha256": self.model_sha256, "nodes": self.nodes,
                      "candidates": self.candidates,
                      **({"external_data_sha256": self.model_data_sha256}
                         if self.model_data_sha256 else {})},
            "verdict": self.verdict,
            "fp32_nodes": self.fp32_nodes,
            "one_minimal": self.one_minimal,
            "evaluations": self.evaluations,
            "inferences": self.inferences,
            "samples": self.samples,
            "tolerance": {**self.tolerance.to_json(), "strict": self.strict},
            "errors_before": {k: v.to_json() for k, v in self.errors_before.items()},
            "errors_after": {k: v.to_json() for k, v in self.errors_after.items()},
            "culprits": [c.to_json() for c in self.culprits],
            "prior_seeds": self.prior_seeds,
            "reference_problems": self.reference_problems,
            "mixed_model_passed": self.mixed_model_passed,
            "mixed_model_check": ({k: v.to_json() for k, v in self.mixed_check.items()}
                                  if self.mixed_check is not None else None),
            "renderings": self.renderings(),
            "files": self.files,
            "seconds": round(self.seconds, 3),
            **{k: v for k, v in self.extra.items() if k not in BULKY_EXTRAS},
        }

    def renderings(self) -> dict[str, object]:
        """Every tool's rendering of the plan (render.py); paths as `render_context` gives them."""
        from .render import RenderContext, renderings_json

        model = self.files.get("rewritten_model") or self.files.get("named_model", self.model_path)
        rc = self.render_context or RenderContext(
            model=model, mixed_model=self.files.get("mixed_model", "<mixed>.onnx"),
            tolerance=self.tolerance, criteria=self.criteria)
        return renderings_json(self.fp32_nodes, rc)
