"""The contract every runtime backend meets (the ORT CPU emulator, TensorRT, ...).

A backend is built once per model and then serves every precision plan of a search. A plan is
the set of ONNX node names (as `graph.node_names` gives them) that must run in FP32; every other
candidate node runs in FP16. Backends see only name -> array maps; comparison is not theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

Feeds = Mapping[str, np.ndarray]


@runtime_checkable
class Backend(Protocol):
    name: str

    def candidates(self) -> list[str]:
        """Node names whose precision this backend can switch, in topological order."""
        ...

    def run(self, fp32_nodes: frozenset[str], feeds: Feeds) -> dict[str, np.ndarray]:
        """Graph outputs (as float32 arrays) under the plan: `fp32_nodes` FP32, the rest FP16."""
        ...

    def run_tensors(self, fp16: bool, feeds: Feeds, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Intermediate float tensors of an all-FP32 (fp16=False) or all-FP16 run."""
        ...

    def close(self) -> None:
        ...
