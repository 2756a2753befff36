"""The old home of the ONNX node -> PyTorch module mapping, kept so that
`from trtbisect.modules import ...` still works. The code lives in `trtbisect/torch/modules.py`;
import from there."""

from __future__ import annotations

from .torch.modules import (CLASS_HIERARCHY, MODULES_KEY, NAME_SCOPES, ancestors, module_label,
    module_of, module_table, modules_metadata, rebuild_path, scope_components, short_class,
    unqualified, within)

__all__ = [
    "CLASS_HIERARCHY", "MODULES_KEY", "NAME_SCOPES", "ancestors", "module_label", "module_of",
    "module_table", "modules_metadata", "rebuild_path", "scope_components", "short_class",
    "unqualified", "within",
]
