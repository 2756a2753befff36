"""Build the shipped demo model: a tiny CNN + Transformer with one planted FP16 overflow.

The model is a conv stem that turns a 32x32 image into 64 tokens, two pre-norm transformer
blocks with a hand-written LayerNorm (so the export is decomposed into ReduceMean/Sub/Pow/...,
the pattern that overflows in real FP16 engines), mean pooling and a linear head.

The fault: block 1 carries LayerScales of 3e3 on both residual branches (think of a badly
trained or mis-converted checkpoint). After its attention branch the residual stream is ~1e3,
so in `blocks.1/ln2` the square (x - mean)^2 ~ 1e6 exceeds FP16's 65504; its MLP branch is
scaled too, so losing that LayerNorm visibly changes the logits. FP32 is unaffected: LayerNorm
is scale invariant and there is no final norm to overflow again.

Run from the repository root:  python scripts/make_demo.py
Writes models/demo.onnx and models/demo_inputs.npz (deterministic: torch.manual_seed(0)).
Needs torch==2.13.0 (`pip install -e .[torch]`).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

DIM, HEADS, TOKENS, CLASSES = 32, 2, 64, 10
INPUT_NAME, OUTPUT_NAME = "image", "logits"
OVERFLOW_SCALE = 3e3  # LayerScale planted in block 1 (stream std ~1e3); 1.0 in block 0


class LayerNorm(nn.Module):
    """LayerNorm written out by hand so the exporter keeps it decomposed at any opset."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        # "trained-looking" affine parameters; exact ones/zeros would be deduplicated by the
        # exporter into anonymous Identity nodes
        self.weight = nn.Parameter(1.0 + 0.05 * torch.randn(dim))
        self.bias = nn.Parameter(0.05 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xc = x - x.mean(-1, keepdim=True)
        var = xc.pow(2).mean(-1, keepdim=True)
        return xc / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (as in CaiT/DeiT-III); here the fault's carrier."""

    def __init__(self, dim: int, value: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(value * (1.0 + 0.05 * torch.randn(dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Attention(nn.Module):
    """Multi-head self-attention with static shapes (no Shape/Gather clutter in the export)."""

    def __init__(self, dim: int, heads: int, tokens: int) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.heads, self.tokens, self.head_dim = heads, tokens, dim // heads
        self.scale = self.head_dim ** -0.5

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(1, self.tokens, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        attn = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(1, self.tokens, self.heads * self.head_dim)
        return self.proj(out)


class Block(nn.Module):
    """Pre-norm transformer block: x + ls1(attn(ln1(x))), then x + ls2(mlp(ln2(x)))."""

    def __init__(self, dim: int, heads: int, tokens: int, layer_scale: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = LayerNorm(dim), LayerNorm(dim)
        self.attn = Attention(dim, heads, tokens)
        self.ls1, self.ls2 = LayerScale(dim, layer_scale), LayerScale(dim, layer_scale)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.ln1(x)))
        return x + self.ls2(self.mlp(self.ln2(x)))


class DemoNet(nn.Module):
    """Conv stem (32x32 -> 8x8 tokens) -> 2 blocks -> mean pool -> linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, DIM, 3, stride=2, padding=1),
        )
        self.pos = nn.Parameter(0.02 * torch.randn(1, TOKENS, DIM))
        self.blocks = nn.ModuleList(
            [Block(DIM, HEADS, TOKENS, 1.0), Block(DIM, HEADS, TOKENS, OVERFLOW_SCALE)])
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image).reshape(1, DIM, TOKENS).transpose(1, 2) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=1))


def export(model: nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    """TorchScript export at opset 14: node names keep module scopes (/blocks.1/ln2/Pow)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "demo.onnx")
        torch.onnx.export(model, (example,), path, dynamo=False, opset_version=14,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME])
        proto = onnx.load(path)
    proto.ir_version = 10  # onnxruntime 1.18+ and TensorRT 10 parsers read IR 10
    onnx.checker.check_model(proto, full_check=True)
    return proto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path,
                        default=Path(__file__).resolve().parents[1] / "models")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = DemoNet().eval()
    image = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        proto = export(model, torch.from_numpy(image))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(args.out_dir / "demo.onnx"))
    sample: dict[str, Any] = {INPUT_NAME: image}
    np.savez(args.out_dir / "demo_inputs.npz", **sample)
    print(f"wrote {args.out_dir / 'demo.onnx'} ({len(proto.graph.node)} nodes) "
          f"and {args.out_dir / 'demo_inputs.npz'}")


if __name__ == "__main__":
    main()
