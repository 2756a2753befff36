"""One model and every precision plan of a search, on a private copy of the model."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

from ..errors import TrtBisectError
from ..graph.modules import within
from .export import Sample, TorchModel, flatten_outputs, to_numpy
from .precision import Precision, reduced, reduced_args
from .snippet import _fp32_forward


class TorchRunner:
    """One model and every precision plan of a search, on a private copy of the model."""

    def __init__(self, module: torch.nn.Module, precision: Precision) -> None:
        self.p = precision
        self.model = copy.deepcopy(module).float().eval().to(precision.device)
        self.modules = dict(self.model.named_modules())
        self.full: dict[tuple[str, str], torch.Tensor] = {}
        self.low: dict[tuple[str, str], torch.Tensor] = {}
        for path, m in self.modules.items():
            for name, t in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]:
                if t.is_floating_point():
                    self.full[(path, name)] = t.data
                    if precision.mode == "half":
                        self.low[(path, name)] = t.data.to(precision.torch_dtype)
        self.runs = 0

    def args(self, tm: TorchModel, sample: Sample) -> tuple:
        return tm.args(sample, self.p.device)

    def reference(self, args: tuple) -> dict[str, np.ndarray]:
        self._set_tensors(None)
        with torch.no_grad():
            return to_numpy(flatten_outputs(self.model(*args)))

    def run(self, fp32: frozenset[str], args: tuple) -> dict[str, np.ndarray]:
        """Outputs (float32 arrays) with `fp32` kept FP32 and the rest in reduced precision."""
        self.runs += 1
        with self.applied(fp32), self.reduced():
            out = self.model(*self.reduced_args(args))
        return to_numpy(flatten_outputs(out))

    def reduced_args(self, args: tuple) -> tuple:
        return reduced_args(self.p, args)

    def reduced(self, on_overflow: Callable[[str, int], None] | None = None):
        return reduced(self.p, on_overflow)

    @contextmanager
    def applied(self, fp32: frozenset[str]) -> Iterator[None]:
        """The plan, exactly as `apply_plan` makes it, undone afterwards."""
        unknown = [m for m in fp32 if m not in self.modules]
        if unknown:
            raise TrtBisectError(f"no module named {', '.join(sorted(unknown))} in the model")
        self._set_tensors(fp32)
        wrapped = []
        try:
            for name in sorted(fp32):
                m = self.modules[name]
                wrapped.append((m, m.__dict__.get("forward")))
                m.forward = _fp32_forward(m.forward, restore=self.p.mode == "half")
            yield
        finally:
            for m, previous in reversed(wrapped):
                if previous is None:
                    del m.forward
                else:
                    m.forward = previous

    def _set_tensors(self, fp32: frozenset[str] | None) -> None:
        """Half mode: reduced-dtype weights outside the plan (all FP32 when fp32 is None)."""
        if self.p.mode != "half":
            return
        for (path, name), full in self.full.items():
            keep = fp32 is None or within(path, fp32)
            value = full if keep else self.low[(path, name)]
            m = self.modules[path]
            if name in m._parameters:
                m._parameters[name].data = value
            else:
                m._buffers[name] = value
