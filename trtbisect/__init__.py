"""trtbisect: find the minimal FP32 fallback that makes an FP16 model match FP32.

The library's public face: the names in `__all__` are the supported API, e.g.

    from pathlib import Path
    import trtbisect

    opts = trtbisect.Options.of(inputs=["val.npz"], tolerance=trtbisect.Tolerance(rtol=1e-2))
    result = trtbisect.run("model.onnx", opts, out_dir=Path("runs/model"))
    print(result.verdict, result.fp32_nodes)

Each name is imported from its module the first time it is asked for, so `import trtbisect`
loads neither ONNX Runtime nor PyTorch (the torch names need torch, the quantized ones ModelOpt
only to quantize). Everything else is reachable by its module path and may change between
releases.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> (module, attribute): the library API, one line each, grouped by room
_API: dict[str, tuple[str, str]] = {
    # the FP16 run: `trtbisect run`, `check`
    "run": ("trtbisect.pipeline", "run"),
    "check_mixed": ("trtbisect.pipeline", "check_mixed"),
    "judge_all_fp16": ("trtbisect.pipeline", "judge_all_fp16"),
    "Options": ("trtbisect.context", "Options"),
    "RunResult": ("trtbisect.result", "RunResult"),
    "TrtBisectError": ("trtbisect.errors", "TrtBisectError"),
    # the judge's vocabulary
    "Tolerance": ("trtbisect.judge.compare", "Tolerance"),
    "Criteria": ("trtbisect.judge.criteria", "Criteria"),
    "JudgeSettings": ("trtbisect.judge.settings", "JudgeSettings"),
    "Graph": ("trtbisect.graph.core", "Graph"),
    # the search alone: a minimal FP32 set for any check function
    "find_minimal_fp32": ("trtbisect.search.minimal", "find_minimal_fp32"),
    "SearchResult": ("trtbisect.search.minimal", "SearchResult"),
    # quantized (INT8/FP8 Q/DQ) models
    "run_quantized": ("trtbisect.quant.run", "run"),
    "check_quantized": ("trtbisect.quant.run", "check_file"),
    # PyTorch models (need torch)
    "export": ("trtbisect.torch.export", "export"),
    "load_torch_model": ("trtbisect.torch.export", "load_torch_model"),
    "resolve_model_arg": ("trtbisect.torch.export", "resolve_model_arg"),
    "diagnose_torch": ("trtbisect.torch.driver", "diagnose"),
    "TorchOptions": ("trtbisect.torch.result", "TorchOptions"),
    "pick_precision": ("trtbisect.torch.precision", "pick_precision"),
    "apply_plan": ("trtbisect.torch.snippet", "apply_plan"),
    "module_of": ("trtbisect.graph.modules", "module_of"),
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _API[name]
    except KeyError:
        raise AttributeError(f"module 'trtbisect' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
