"""Data as users have it (data/): folders, globs, Polygraphy's --data-loader-script and
--save-inputs JSON give the same samples as the .npz files they hold; samples are streamed;
bad data is one line and exit 2."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from tests.test_cli import invoke
from trtbisect.data.sources import _decode_ndarray, iter_items
from trtbisect.data.store import SampleSet, reference_set
from trtbisect.errors import TrtBisectError
from trtbisect.graph import Graph


def _model(tmp_path):
    nodes = [h.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
             h.make_node("ReduceMean", ["sq"], ["y"], axes=[1], keepdims=0, name="mean")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["n", 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["n"])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.save(m, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


def _samples(n=5, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((2, 16)) * (30 if k == 3 else 1)).astype(np.float32)}
            for k in range(n)]


def _folder(tmp_path, samples):
    d = tmp_path / "data"
    d.mkdir()
    for k, s in enumerate(samples):
        np.savez(d / f"s{k:02d}.npz", **s)
    return d


def _loader(tmp_path, body: str, name="loader.py"):
    path = tmp_path / name
    path.write_text("import numpy as np\n" + body)
    return path


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k])


def _read(g, inputs=(), loader=None):
    return [i.sample for i in iter_items(g, list(inputs), loader, {}, 0)]


def test_every_source_gives_the_same_samples(tmp_path):
    """A folder, a glob, one stacked .npz, a data-loader script, Polygraphy's JSON (through
    Polygraphy and through the reader used without it): the same samples, in order."""
    g = Graph.from_path(_model(tmp_path))
    samples = _samples()
    folder = _folder(tmp_path, samples)
    np.savez(tmp_path / "stack.npz", x=np.stack([s["x"] for s in samples]))
    np.save(tmp_path / "all.npy", np.stack([s["x"] for s in samples]))
    loader = _loader(tmp_path, f"def load_data():\n"
                               f"    for x in np.load({str(tmp_path / 'all.npy')!r}):\n"
                               "        yield {'x': x}\n"
                               "def other():\n    return [{'x': np.zeros((2, 16), np.float32)}]\n")
    _same(_read(g, [str(folder)]), samples)
    _same(_read(g, [str(folder / "s*.npz")]), samples)
    _same(_read(g, [str(tmp_path / "stack.npz")]), samples)
    _same(_read(g, loader=str(loader)), samples)
    _same(_read(g, loader=f"{loader}:other"), [{"x": np.zeros((2, 16), np.float32)}])
    _same(_read(g, [str(folder / "s00.npz")], loader=str(loader)), samples[:1] + samples)
    polygraphy = pytest.importorskip("polygraphy")
    from polygraphy.json import save_json
    save_json(samples, str(tmp_path / "inputs.json"))
    _same(_read(g, [str(tmp_path / "inputs.json")]), samples)
    text = (tmp_path / "inputs.json").read_text()
    decoded = json.loads(text, object_hook=_decode_ndarray)  # the reader without polygraphy
    _same(decoded, samples)
    assert polygraphy.__version__


def test_json_without_polygraphy(tmp_path, monkeypatch):
    import builtins
    pytest.importorskip("polygraphy")
    from polygraphy.json import save_json
    g = Graph.from_path(_model(tmp_path))
    samples = _samples(3)
    save_json(samples, str(tmp_path / "in.json"))
    real = builtins.__import__

    def no_polygraphy(name, *a, **k):
        if name.startswith("polygraphy"):
            raise ImportError("no polygraphy here")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_polygraphy)
    _same(_read(g, [str(tmp_path / "in.json")]), samples)


def test_a_large_set_streams(tmp_path):
    """Past the memory budget samples are read again (from their file, or a spooled copy for a
    data loader) when needed, never all held; the hash is the one of the whole set."""
    g = Graph.from_path(_model(tmp_path))
    samples = _samples(40)
    folder = _folder(tmp_path, samples)
    loader = _loader(tmp_path, f"def load_data():\n"
                               f"    for k in range(40):\n"
                               f"        yield dict(np.load({str(folder)!r} + f'/s{{k:02d}}.npz'))\n")
    one = sum(a.nbytes for a in samples[0].values())
    full = SampleSet(iter_items(g, [str(folder)], None, {}, 0))
    for source in ([str(folder)], None):
        s = SampleSet(iter_items(g, source or [], None if source else str(loader), {}, 0),
                      budget=3 * one, spool=tmp_path / "spool")
        assert len(s) == 40 and s.in_memory == 3
        _same(list(s), samples)
        _same([s[7], s[-1]], [samples[7], samples[-1]])
        assert s.sha256 == full.sha256
    spooled = list((tmp_path / "spool").glob("samples-*/*.npz"))
    assert len(spooled) == 37  # the loader's samples past the budget, one file each
    refs = reference_set(g, s, None, "m", tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "references").glob("*.npz"))) == 40
    again = reference_set(g, s, None, "m", tmp_path / "cache")  # resumed: read, not recomputed
    for a, b in zip(refs, again):
        assert np.array_equal(a["y"], b["y"])


def _stack_writers(tmp_path, x):
    """The three ways an .npz holds a stack: stored (np.savez), deflated
    (np.savez_compressed), and stored in Fortran order."""
    np.savez(tmp_path / "stored.npz", x=x)
    np.savez_compressed(tmp_path / "deflated.npz", x=x)
    np.savez(tmp_path / "fortran.npz", x=np.asfortranarray(x))
    return {k: tmp_path / f"{k}.npz" for k in ("stored", "deflated", "fortran")}


def test_a_stacked_npz_streams(tmp_path):
    """One .npz of 40 stacked samples (how `np.savez(f, x=batch)` and `trtbisect export
    --samples` hand a set over) is read one sample at a time: stored plainly, a sample is read
    again by its offset; deflated, it is decompressed as a stream and what the budget cannot
    hold is spooled. The whole stack is never in memory (before, it was read whole, and a
    sample past the budget was read back by reading the whole file again)."""
    import tracemalloc

    g = Graph.from_path(_model(tmp_path))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 4096, 16)).astype(np.float32)  # 256 KiB a sample
    samples = [{"x": row} for row in x]
    one = x[0].nbytes
    full = SampleSet(iter_items(g, [str(_folder(tmp_path, samples))], None, {}, 0))
    for kind, path in _stack_writers(tmp_path, x).items():
        spool = tmp_path / f"spool-{kind}"
        tracemalloc.start()
        s = SampleSet(iter_items(g, [str(path)], None, {}, 0), budget=3 * one, spool=spool)
        for k, got in enumerate(s):
            assert np.array_equal(got["x"], x[k])
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(s) == 40 and s.in_memory == 3 and s.sha256 == full.sha256
        _same([s[7], s[-1], s[0]], [samples[7], samples[-1], samples[0]])
        assert s.where[:2] == [f"{path}[0]", f"{path}[1]"]
        spooled = list(spool.glob("samples-*/*.npz"))
        if kind == "fortran":  # a sample is not contiguous: the member is read whole once
            assert len(spooled) == 37
            continue
        assert peak < 12 * one, (kind, peak / one)
        assert len(spooled) == (0 if kind == "stored" else 37)


def test_a_stacked_npz_that_changes_or_breaks_is_one_line(tmp_path):
    g = Graph.from_path(_model(tmp_path))
    x = np.random.default_rng(4).standard_normal((6, 64, 16)).astype(np.float32)
    paths = _stack_writers(tmp_path, x)
    s = SampleSet(iter_items(g, [str(paths["stored"])], None, {}, 0), budget=x[0].nbytes)
    assert np.array_equal(s[4]["x"], x[4])
    np.savez(paths["stored"], x=x + 1)  # rewritten during the run
    with pytest.raises(TrtBisectError, match="changed during the run"):
        s[4]
    raw = bytearray(paths["deflated"].read_bytes())
    for i in range(len(raw) // 3, len(raw) // 2):  # the deflated data, not the directory
        raw[i] ^= 0x5A
    paths["deflated"].write_bytes(bytes(raw))
    with pytest.raises(TrtBisectError, match="cannot read"):
        SampleSet(iter_items(g, [str(paths["deflated"])], None, {}, 0))


def test_a_run_on_a_folder_reports_each_sample(tmp_path):
    model = _model(tmp_path)
    folder = _folder(tmp_path, _samples())
    r = invoke("-q", "run", model, "--inputs", folder, "--out", tmp_path / "o", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["samples"] == 5
    after = plan["judged"]["after"]
    assert after["samples"] == 5 and len(after["per_sample"]) == 5 and after["passed"]
    r = invoke("-q", "run", model, "--inputs", folder, "--out", tmp_path / "o")
    assert "judged on 5 sample(s) by max|d| <= rtol*max|ref| + atol" in r.output
    pytest.importorskip("matplotlib")
    r = invoke("-q", "run", model, "--inputs", folder, "--out", tmp_path / "r", "--report")
    assert "- judged on 5 sample(s): " in (tmp_path / "r" / "report.md").read_text()


BAD_LOADERS = {
    "wrong name": ("def load_data():\n    yield {'z': np.zeros((2, 16), np.float32)}\n",
                   "lacks input(s) x"),
    "wrong dtype": ("def load_data():\n    yield {'x': np.zeros((2, 16), np.float64)}\n",
                    "is float64, the model expects float32"),
    "wrong shape": ("def load_data():\n    yield {'x': np.zeros((2, 15), np.float32)}\n",
                    "has shape 2x15, the model expects ?x16"),
    "nothing": ("def load_data():\n    return iter(())\n", "yielded no samples"),
    "not a dict": ("def load_data():\n    yield [1, 2]\n", "not a feed dict"),
    "not an array": ("def load_data():\n    yield {'x': [1.0] * 16}\n", "not a numpy array"),
    "raises": ("def load_data():\n    yield {'x': np.zeros((2, 16), np.float32)}\n"
               "    raise OSError('disk\\ngone')\n", "raised OSError after 1 sample(s): disk gone"),
    "no function": ("def other():\n    pass\n", "defines no 'load_data'"),
    "syntax": ("def load_data(:\n", "importing"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOADERS))
def test_a_bad_data_loader_is_one_line(tmp_path, case):
    body, words = BAD_LOADERS[case]
    r = invoke("-q", "run", _model(tmp_path), "--data-loader-script", _loader(tmp_path, body),
               "--out", tmp_path / "o")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.output


@pytest.mark.parametrize("what, words", [
    ("empty folder", "holds no .npz files"), ("glob", "matches no file"),
    ("missing json", "inputs file not found"), ("bad json", "Polygraphy --save-inputs JSON"),
    ("missing loader", "no such file"),
])
def test_bad_data_sources_are_one_line(tmp_path, what, words):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    args = {"empty folder": ["--inputs", tmp_path / "empty"],
            "glob": ["--inputs", str(tmp_path / "nope*.npz")],
            "missing json": ["--inputs", tmp_path / "none.json"],
            "bad json": ["--inputs", tmp_path / "bad.json"],
            "missing loader": ["--data-loader-script", tmp_path / "none.py"]}[what]
    r = invoke("-q", "run", _model(tmp_path), *args, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.output


def test_no_samples_at_all_is_refused():
    with pytest.raises(TrtBisectError, match="no samples"):
        SampleSet(iter(()))


def _two_faults(tmp_path):
    """|a| and |b| computed as sqrt(x*x): x*x overflows FP16 for |x| > 255 where it is
    stored (per-node rounding: TensorRT would fuse the pair and never store it)."""
    nodes = [h.make_node("Mul", ["a", "a"], ["a2"], name="sq_a"),
             h.make_node("Sqrt", ["a2"], ["ya"], name="sqrt_a"),
             h.make_node("Mul", ["b", "b"], ["b2"], name="sq_b"),
             h.make_node("Sqrt", ["b2"], ["yb"], name="sqrt_b")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("a", TP.FLOAT, [4]),
                                  h.make_tensor_value_info("b", TP.FLOAT, [4])],
                     [h.make_tensor_value_info("ya", TP.FLOAT, [4]),
                      h.make_tensor_value_info("yb", TP.FLOAT, [4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.save(m, tmp_path / "two.onnx")
    d = tmp_path / "two"
    d.mkdir()
    rng = np.random.default_rng(1)
    for k in range(20):
        a, b = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        if k in (0, 1, 2):
            a[1] = 1000
        if k == 15:
            b[2] = 400
        np.savez(d / f"s{k:02d}.npz", a=a, b=b)
    return tmp_path / "two.onnx", d


def test_search_on_a_subset_then_certify_on_every_sample(tmp_path):
    """The search judges on the 2 samples where all-FP16 fails worst (both break branch a);
    the plan it finds fails sample 15 (branch b), which joins the subset for a second search.
    The result is the plan judged on every sample throughout, certified by the written file."""
    from trtbisect.context import Options
    from trtbisect.pipeline import run
    model, data = _two_faults(tmp_path)
    opts = dict(inputs=[str(data)], semantics="strict", validation_share=0)  # none held out
    sub = run(model, Options.of(search_samples=2, **opts), tmp_path / "sub")
    full = run(model, Options.of(search_samples=0, **opts), tmp_path / "full")
    assert set(sub.fp32_nodes) == set(full.fp32_nodes) == {"sq_a", "sqrt_a", "sq_b", "sqrt_b"}
    assert sub.verdict == "fixed" and sub.one_minimal
    assert sub.judged.search_samples == [0, 1, 15]
    assert sum(sub.judged.after.samples) == 20
    assert sub.one_judge.search_equals_check
    assert full.judged.search_samples is None
    journal = [json.loads(ln) for ln in (tmp_path / "sub" / "journal.jsonl").read_text()
               .splitlines()[1:]]
    assert all("@" in (ln.get("done") or ln.get("start")) for ln in journal)  # subset verdicts
    again = run(model, Options.of(search_samples=2, **opts), tmp_path / "sub")
    assert again.fp32_nodes == sub.fp32_nodes  # resumed from the journal: the same plan


def test_under_a_pass_rate_the_search_judges_every_sample(tmp_path):
    from trtbisect.context import Options
    from trtbisect.judge.flags import parse_criteria
    from trtbisect.pipeline import run
    model, data = _two_faults(tmp_path)
    r = run(model, Options.of(inputs=[str(data)], semantics="strict", search_samples=2,
                           criteria=parse_criteria(pass_rate=0.9)), tmp_path / "o")
    assert r.judged.search_samples is None
    assert set(r.fp32_nodes) == {"sq_a", "sqrt_a"}  # sample 15 may fail: 19 of 20 pass
    assert sum(r.judged.after.samples) == 19
