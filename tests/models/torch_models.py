"""Small PyTorch models with planted reduced-precision faults and the answers trtbisect should
find for them (`trtbisect torch` module sets on CPU with emulated kernels).

This file is also a valid `FILE.py:FACTORY` for the CLI: every factory returns
`(model, example_inputs)` with fixed seeds, e.g. `trtbisect torch tests/models/torch_models.py:overflow`.
Each expected set is derived in the model's docstring from what the plan means (docs/pytorch.md):
in half mode a module kept FP32 casts its outputs back to FP16, in autocast mode it returns FP32.
"""

from __future__ import annotations

import torch
from torch import nn

# {factory: {mode: expected fp32_modules (empty: FP16 already meets the tolerance)}}
EXPECTED: dict[str, dict[str, frozenset[str]]] = {
    "healthy": {"half": frozenset(), "autocast": frozenset()},
    "overflow": {"half": frozenset({"norm"}), "autocast": frozenset({"norm"})},
    "bn_tiny_var": {"half": frozenset({"features.1"}), "autocast": frozenset()},
    "amp_conv_overflow": {"half": frozenset({"stem"}), "autocast": frozenset({"stem.0"})},
}


class RMSNorm(nn.Module):
    """The pre-fix LLaMA-style RMSNorm: squares its input in the input's own dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Mlp(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 32)
        self.norm = RMSNorm(32)
        self.head = nn.Linear(32, 8)
        with torch.no_grad():
            self.embed.weight.mul_(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(x)))


def healthy():
    """Nothing out of range: both modes meet rtol 1e-2 with no module kept FP32."""
    torch.manual_seed(0)
    convs = ConvNet(var_floor=None)
    return convs.eval(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def overflow():
    """`embed` outputs reach ~600, so `norm`'s x.pow(2) (~4e5) overflows FP16 to inf and
    rsqrt(inf) zeroes the output. Half: `norm` in FP32 reads the FP16-exact input, squares in
    FP32 and casts its unit-scale output back: {norm}. CPU autocast runs pow and mean in FP16
    too (CUDA autocast would run pow in FP32): {norm}."""
    torch.manual_seed(0)
    model = Mlp(scale=400.0)
    return model.eval(), torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


class ConvNet(nn.Module):
    def __init__(self, var_floor: float | None) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, eps=1e-9), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flat = nn.Flatten()
        self.head = nn.Linear(8, 4)
        calibrate(self.features[0], self.features[1], var_floor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.flat(self.pool(self.features(x))))


def calibrate(conv: nn.Conv2d, bn: nn.BatchNorm2d, tiny: float | None) -> None:
    """BatchNorm statistics from data; with `tiny`, channels 0 and 1 get a running_var of `tiny`
    and a weight that keeps their FP32 output at unit scale."""
    with torch.no_grad():
        y = conv(torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(2)))
        bn.running_mean.copy_(y.mean((0, 2, 3)))
        bn.running_var.copy_(y.var((0, 2, 3)))
        if tiny is not None:
            bn.running_var[:2] = tiny
            bn.weight[:2] = (tiny + bn.eps) ** 0.5 / y.std((0, 2, 3))[:2]


def bn_tiny_var():
    """Two channels have running_var 1e-9 with eps 1e-9 (a dead channel's statistics). In
    FP16 storage 1e-9 flushes to zero, so 1/sqrt(var + eps) grows by sqrt(2) and those channels
    are 41% off: half needs {features.1} (the BatchNorm, with FP32 buffers). Autocast keeps
    BatchNorm's buffers FP32: no plan needed."""
    torch.manual_seed(0)
    return ConvNet(var_floor=1e-9).eval(), torch.randn(
        2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


class AmpNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 4)
        with torch.no_grad():
            self.stem[0].weight.mul_(1e5)
        calibrate(self.stem[0], self.stem[1], None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.act(self.stem(x))).flatten(1))


def amp_conv_overflow():
    """The AMP "NaN in BatchNorm" story: the stem conv's outputs reach ~1e5, inf in FP16, and
    BatchNorm turns them into inf/NaN. Autocast: the conv in FP32 hands BatchNorm FP32 values
    it normalises: {stem.0}. Half: a lone FP32 conv casts its output back to FP16 (inf again)
    and the BatchNorm's running_var (~1e10) overflows FP16, so the FP32 region must hold both:
    {stem}."""
    torch.manual_seed(0)
    return AmpNet().eval(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.ln2(x))


class Tiny(nn.Module):
    """Nested blocks for export and module-mapping tests: scopes like /blocks/blocks.1/ln2/..."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def tiny():
    """A healthy transformer-ish stack; no example inputs (give --input x:2x5x8)."""
    torch.manual_seed(0)
    return Tiny()
