"""The old home of the PyTorch export (`trtbisect export`, `trtbisect run FILE.py:FACTORY`),
kept so that `from trtbisect.export import ...` still works. The code lives in
`trtbisect/torch/export.py`; import from there."""

from __future__ import annotations

from .torch.export import (DEFAULT_OPSET, DTYPES, EXPORTERS, ExportOptions, ExportResult,
    InputSpec, MAX_IR_VERSION, Sample, TORCH_HINT, TorchModel, export, export_failure,
    export_model, finish_model, flatten_outputs, import_torch, is_factory_arg, layernorm_warnings,
    load_factory, load_torch_model, parse_input_specs, random_samples, resolve_model_arg, to_numpy)

__all__ = [
    "DEFAULT_OPSET", "DTYPES", "EXPORTERS", "ExportOptions", "ExportResult", "InputSpec",
    "MAX_IR_VERSION", "Sample", "TORCH_HINT", "TorchModel", "export", "export_failure",
    "export_model", "finish_model", "flatten_outputs", "import_torch", "is_factory_arg",
    "layernorm_warnings", "load_factory", "load_torch_model", "parse_input_specs",
    "random_samples", "resolve_model_arg", "to_numpy",
]
