"""Why `trtbisect torch` and `trtbisect run` can disagree on one factory: modules the ONNX
export (and TensorRT) fold away (issue #37).

In eval mode the TorchScript exporter folds a BatchNorm that follows a Conv into the Conv's
weights (in FP32), and TensorRT folds one the exporter left (docs/semantics.md). `run` judges
that one Conv; `torch --mode half` runs PyTorch's own Conv and BatchNorm apart, each storing
its output in FP16, and may need the pair (or its Conv) in FP32 where `run` needs nothing. Both
commands name the folded pair instead of leaving two different plans unexplained.

torch is imported by the callers; this module only reads module trees and ONNX node names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

CONVS = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")
NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")


@dataclass(frozen=True)
class Pair:
    """A Conv and the BatchNorm registered right after it (a Sequential, or conv1/bn1)."""

    conv: str
    conv_class: str
    norm: str
    norm_class: str

    def words(self) -> str:
        return f"{self.norm} ({self.norm_class}) into {self.conv} ({self.conv_class})"

    def holds(self, module: str) -> bool:
        """The module is the Conv, the BatchNorm, or a container of both."""
        inside = self.conv.startswith(module + ".") and self.norm.startswith(module + ".")
        return module in (self.conv, self.norm, "") or inside


def conv_norm_pairs(module: Any) -> list[Pair]:
    """Every Conv directly followed by a BatchNorm among its parent's children."""
    out = []
    for name, parent in module.named_modules():
        children = list(parent.named_children())
        for (a, ma), (b, mb) in zip(children, children[1:]):
            if type(ma).__name__ in CONVS and type(mb).__name__ in NORMS:
                at = f"{name}." if name else ""  # the children's qualified names
                out.append(Pair(at + a, type(ma).__name__, at + b, type(mb).__name__))
    return out


def folded_at_export(pairs: Sequence[Pair], nodes: Iterable[Any]) -> list[Pair]:
    """The pairs whose BatchNorm left no node of its own in the exported ONNX: no node names
    its scope (TorchScript: `/stem/stem.1/BatchNormalization`) or its path (dynamo's node
    metadata). A scope name shared with another module counts as present (no note)."""
    from ..graph.modules import _from_node_metadata, scope_components, unqualified

    scopes: set[str] = set()
    paths: set[str] = set()
    for node in nodes:
        found = _from_node_metadata(node)
        if found is not None:
            paths.add(found[0])
        scopes.update(scope_components(node.name))
    return [p for p in pairs if unqualified(p.norm) not in scopes
            and not any(m == p.norm or m.startswith(p.norm + ".") for m in paths)]


def export_note(folded: Sequence[Pair]) -> list[str]:
    """The export's note (`run FILE.py:FACTORY` and `export` show it)."""
    if not folded:
        return []
    shown = ", ".join(p.words() for p in folded[:3]) + (
        f" and {len(folded) - 3} more" if len(folded) > 3 else "")
    return [f"the export folded {len(folded)} BatchNorm(s) into the Conv before them ({shown}), "
            "as TensorRT does: the ONNX model computes each pair as one Conv with FP32-folded "
            "weights, so `trtbisect run` never rounds between them, while `trtbisect torch` "
            "runs PyTorch's Conv and BatchNorm apart and may keep the Conv (or both) in FP32 "
            "where `run` needs nothing"]


def torch_notes(pairs: Sequence[Pair], fp32_modules: Sequence[str]) -> list[str]:
    """For `torch`: each plan module that holds a folded pair, and why `run` may differ."""
    out = []
    for module in fp32_modules:
        hit = [p for p in pairs if p.holds(module)]
        if hit:
            out.append(f"{module or '(the model)'} holds {hit[0].conv} ({hit[0].conv_class}) "
                       f"and {hit[0].norm} ({hit[0].norm_class}){' and more' if len(hit) > 1 else ''}"
                       ": the ONNX export and TensorRT fold the BatchNorm into the Conv (FP32 "
                       "weights, one FP16 output), so `trtbisect run` on this factory judges "
                       "one Conv and may not keep it in FP32")
    return out
