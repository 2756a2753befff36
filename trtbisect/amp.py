"""The old home of `trtbisect torch`'s module-level AMP search, kept so that
`from trtbisect.amp import ...` (docs/pytorch.md's library example) still works. The code lives
in `trtbisect/torch/`, one concern a module; import from there."""

from __future__ import annotations

from .torch.driver import diagnose
from .torch.emulation import ReducedStorage
from .torch.explain import explain
from .torch.layerwise import ModuleStats, layerwise, summarize
from .torch.outputs import render_snippet, write_outputs
from .torch.precision import DTYPES, MODES, Precision, pick_precision, reduced, reduced_args
from .torch.prior import EXACT_MODULES, candidates, prior
from .result import VERDICT_EXIT
from .torch.result import TorchCulprit, TorchOptions, TorchResult
from .torch.runner import TorchRunner
from .torch.snippet import SNIPPET_FUNCTIONS, apply_plan

__all__ = [
    "DTYPES", "EXACT_MODULES", "MODES", "SNIPPET_FUNCTIONS", "VERDICT_EXIT", "ModuleStats",
    "Precision", "ReducedStorage", "TorchCulprit", "TorchOptions", "TorchResult", "TorchRunner",
    "apply_plan", "candidates", "diagnose", "explain", "layerwise", "pick_precision", "prior",
    "reduced", "reduced_args", "render_snippet", "summarize", "write_outputs",
]
