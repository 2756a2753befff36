"""A corpus of bad and odd inputs for the command line, as a new user (or a broken disk) would
hand them over: damaged and strange models, npz files, option values and --out folders.

Every case builds its files in a fresh folder and returns the command line to run. The contract
(tests/test_fuzz.py): it ends with a documented exit code, never a traceback or a hang; an error
is one line on stderr; the input files are byte-identical afterwards.

    python -m tests.fuzz.make_cases        # list the corpus
"""

from __future__ import annotations

import io
import json
import os
import random
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from tests.models import input_models

# 7: fragile (a plan without the margin, written); 8: reference_unstable (random numbers)
DOCUMENTED = frozenset({0, 2, 3, 4, 7, 8})
ANY = DOCUMENTED
ACCEPTED = frozenset({0, 3, 4, 7})  # the model was taken and judged


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], list[str]]  # writes its files into the folder, returns CLI args
    codes: frozenset[int] = ANY  # the exit codes this case may end with
    patch: str | None = None  # a fault injected in-process (see test_fuzz.PATCHES)
    xfail: str | None = None


# ---------------------------------------------------------------- models

def tiny_model(elem: int = TP.FLOAT, dims: Sequence[int | str] = (2, 4), name: str = "relu",
               inp: str = "x", out: str = "y") -> onnx.ModelProto:
    """y = Relu(x @ W): a model that runs in milliseconds."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4), "W")
    nodes = [h.make_node("MatMul", [inp, "W"], ["h"], name="mm"),
             h.make_node("Relu", ["h"], [out], name=name)]
    g = h.make_graph(nodes, "tiny", [h.make_tensor_value_info(inp, elem, list(dims))],
                     [h.make_tensor_value_info(out, TP.FLOAT, ["rows", "cols"])], [w])
    return _model(g)


def overflow_model(names: Sequence[str] = ("up1", "up2", "down")) -> onnx.ModelProto:
    """y = (x * 1000) * 1000 / 1e6: FP16 overflows in the middle, so a plan is needed (all
    three nodes, whatever they are named)."""
    k = [numpy_helper.from_array(np.array(v, np.float32), n)
         for n, v in (("k1", 1000.0), ("k2", 1000.0), ("k3", 1e-6))]
    nodes = [h.make_node("Mul", ["x", "k1"], ["a"], name=names[0]),
             h.make_node("Mul", ["a", "k2"], ["b"], name=names[1]),
             h.make_node("Mul", ["b", "k3"], ["y"], name=names[2])]
    g = h.make_graph(nodes, "ovf", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])], k)
    return _model(g)


# Node names a hostile model might carry: terminal escapes (clear screen, OSC 52 clipboard), a
# bidi override, HTML, Markdown that would start a heading or break a table, shell syntax, and
# every line break str.splitlines() knows.
HOSTILE = ("\x1b[2J\x1b[Hverdict: fp16_ok\x1b]52;c;cHduZWQ=\x07 <script>alert(1)</script>",
           "a\nb\r\n# Fake heading\x1c\x1d\x1e\x85\u2028\u2029|c|`d`",
           "\u202eevil\u202c $(touch pwned) `touch pwned`; <img src=x onerror=alert(1)> [l](j:x)")


def typed_model(elem: int, op: str) -> onnx.ModelProto:
    """y = op(x, x) in one element type (an int64 Add, a bool And, a float64 Mul)."""
    g = h.make_graph([h.make_node(op, ["x", "x"], ["y"], name="only")], "typed",
                     [h.make_tensor_value_info("x", elem, [2, 4])],
                     [h.make_tensor_value_info("y", elem, [2, 4])])
    return _model(g)


def scalar_model() -> onnx.ModelProto:
    """y = x * s with a scalar input s (stacked scalars must work)."""
    nodes = [h.make_node("Mul", ["x", "s"], ["y"], name="scale")]
    g = h.make_graph(nodes, "scal", [h.make_tensor_value_info("x", TP.FLOAT, [4]),
                                     h.make_tensor_value_info("s", TP.FLOAT, [])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4])])
    return _model(g)


def _model(g: onnx.GraphProto, opset: int = 13) -> onnx.ModelProto:
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="fuzz")
    m.ir_version = 10
    return m


def _save(folder: Path, m: onnx.ModelProto | bytes, name: str = "m.onnx") -> Path:
    p = folder / name
    p.write_bytes(m if isinstance(m, bytes) else m.SerializeToString())
    return p


def _npz(folder: Path, name: str = "in.npz", **arrays: np.ndarray) -> Path:
    p = folder / name
    np.savez(p, **arrays)
    return p


X = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)


def _mutated(mutate: Callable[[onnx.ModelProto], object], base=tiny_model):
    def build(folder: Path) -> onnx.ModelProto:
        m = base()
        mutate(m)
        return m
    return build


def _dims(m: onnx.ModelProto, *dims: int | str) -> None:
    t = m.graph.input[0].type.tensor_type
    t.shape.Clear()
    for d in dims:
        t.shape.dim.add().dim_param = d if isinstance(d, str) else ""
        if isinstance(d, int):
            t.shape.dim[-1].dim_value = d


def _raw_replace(old: bytes, new: bytes, base=tiny_model) -> Callable[[Path], bytes]:
    return lambda folder: base().SerializeToString().replace(old, new)


MODEL_MUTATIONS: dict[str, tuple[Callable[[Path], onnx.ModelProto | bytes], str | None]] = {
    "elem_type_0": (_mutated(lambda m: setattr(m.graph.input[0].type.tensor_type,
                                               "elem_type", 0)), None),
    "elem_type_999": (_mutated(lambda m: setattr(m.graph.input[0].type.tensor_type,
                                                 "elem_type", 999)), None),
    "elem_type_string": (lambda f: tiny_model(TP.STRING), None),
    "elem_type_int64": (lambda f: tiny_model(TP.INT64), None),
    "elem_type_double": (lambda f: tiny_model(TP.DOUBLE), None),
    "elem_type_bool": (lambda f: tiny_model(TP.BOOL), None),
    # float16/bfloat16 models are accepted: judged against their FP32 upcast
    "elem_type_float16": (lambda f: tiny_model(TP.FLOAT16), None),
    "elem_type_bfloat16": (lambda f: tiny_model(TP.BFLOAT16), None),
    "dim_2_40": (_mutated(lambda m: _dims(m, 2**40, 4)), None),
    "dims_1e12_elements": (_mutated(lambda m: _dims(m, 10**6, 10**6, 4)), None),
    "dim_zero": (_mutated(lambda m: _dims(m, 0, 4)), None),
    "dim_param": (_mutated(lambda m: _dims(m, "batch", 4)), None),
    "no_shape": (_mutated(lambda m: m.graph.input[0].type.tensor_type.ClearField("shape")), None),
    "scalar_declared": (_mutated(lambda m: _dims(m)), None),
    "rank_3": (_mutated(lambda m: _dims(m, 1, 2, 4)), None),
    "utf8_bad_node_name": (_raw_replace(b"relu", b"r\xffl\xfe"), None),
    "utf8_bad_input_name": (lambda f: tiny_model(inp="xq").SerializeToString().replace(
        b"xq", b"\xc3("), None),
    "utf8_bad_output_name": (lambda f: tiny_model(out="yq").SerializeToString().replace(
        b"yq", b"\xe2\x28"), None),
    "unicode_names": (lambda f: tiny_model(name="réLU→1", inp="输入", out="y ö"), None),
    "spaces_commas_in_names": (lambda f: tiny_model(name="a,b:c d", inp="x y", out="o,1"), None),
    "empty_node_name": (lambda f: tiny_model(name=""), None),
    # names like trtbisect's own internal ones: the separator makes them collide with nothing
    "reserved_name": (lambda f: tiny_model(name="trtbisect_fp16_0", out="trtbisect_fp16_0"),
                      None),
    "ir_version_99": (_mutated(lambda m: setattr(m, "ir_version", 99)), None),
    "ir_version_1": (_mutated(lambda m: setattr(m, "ir_version", 1)), None),
    "opset_99": (_mutated(lambda m: setattr(m.opset_import[0], "version", 99)), None),
    "opset_1": (_mutated(lambda m: setattr(m.opset_import[0], "version", 1)), None),
    "no_outputs": (_mutated(lambda m: m.graph.ClearField("output")), None),
    "no_nodes": (_mutated(lambda m: m.graph.ClearField("node")), None),
    "unknown_op": (_mutated(lambda m: setattr(m.graph.node[1], "op_type", "Frobnicate")), None),
    "custom_domain": (_mutated(lambda m: setattr(m.graph.node[1], "domain", "com.x")), None),
    "dangling_input": (_mutated(lambda m: m.graph.node[1].input.append("nowhere")), None),
    "duplicate_node_names": (_mutated(lambda m: setattr(m.graph.node[1], "name", "mm")), None),
    "input_twice": (_mutated(lambda m: m.graph.input.append(m.graph.input[0])), None),
    "output_is_input": (_mutated(lambda m: m.graph.output.append(m.graph.input[0])), None),
    "overflow": (lambda f: overflow_model(), None),
    # nothing FP16 can change: a verdict of its own (exit 0); float64 compute: refused (exit 2)
    "int64_compute": (lambda f: typed_model(TP.INT64, "Add"), None),
    "bool_compute": (lambda f: typed_model(TP.BOOL, "And"), None),
    "double_compute": (lambda f: typed_model(TP.DOUBLE, "Mul"), None),
    "hostile_names": (lambda f: overflow_model(HOSTILE), None),
    "empty_file": (lambda f: b"", None),
    "text_file": (lambda f: b"not a model at all\n", None),
    "zeros": (lambda f: bytes(4096), None),
    "random_bytes": (lambda f: random.Random(7).randbytes(2048), None),
}
# #34: what exporters of every year write and ONNX Runtime runs (old IR versions and opsets,
# defaulted and sparse initializers, shapeless I/O, unsorted nodes, random ops ...)
INPUT_CLASSES = {**input_models.JUDGED, **input_models.UNSTABLE}
MODEL_MUTATIONS.update({f"class_{name}": ((lambda f, b=build: b()), None)
                        for name, build in INPUT_CLASSES.items()})


def _truncated(fraction: float) -> Callable[[Path], bytes]:
    def build(folder: Path) -> bytes:
        data = overflow_model().SerializeToString()
        return data[: int(len(data) * fraction)]
    return build


def _flipped(seed: int) -> Callable[[Path], bytes]:
    def build(folder: Path) -> bytes:
        data = bytearray(overflow_model().SerializeToString())
        rng = random.Random(seed)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    return build


# ---------------------------------------------------------------- npz files

def _zip(folder: Path, members: dict[str, bytes], name: str = "in.npz") -> Path:
    p = folder / name
    with zipfile.ZipFile(p, "w") as zf:
        for k, v in members.items():
            zf.writestr(k, v)
    return p


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _lying_header(shape: tuple[int, ...]) -> bytes:
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return head.getvalue() + bytes(64)  # the magic and a header, then 64 bytes of "data"


NPZ: dict[str, Callable[[Path], Path]] = {
    "ok": lambda f: _npz(f, x=X),
    "npy_not_npz": lambda f: (np.save(f / "in.npy", X), f / "in.npy")[1],
    "empty_npz": lambda f: _npz(f),
    "zero_length_file": lambda f: _raw(f, b""),
    "text_member": lambda f: _zip(f, {"x.txt": b"hello"}),
    "text_member_npy_suffix": lambda f: _zip(f, {"x.npy": b"hello, not an array"}),
    "object_member": lambda f: _zip(f, {"x.npy": _pickled()}),
    "header_1e12": lambda f: _zip(f, {"x.npy": _lying_header((10**6, 10**6))}),
    "header_2_40": lambda f: _zip(f, {"x.npy": _lying_header((2**40, 4))}),
    "truncated_member": lambda f: _zip(f, {"x.npy": _npy_bytes(X)[:-8]}),
    "wrong_dtype": lambda f: _npz(f, x=X.astype(np.float64)),
    "int_dtype": lambda f: _npz(f, x=X.astype(np.int32)),
    "wrong_shape": lambda f: _npz(f, x=X[:, :2]),
    "wrong_rank": lambda f: _npz(f, x=X[None, None]),
    "stacked_3": lambda f: _npz(f, x=np.stack([X, X * 2, -X])),
    "stacked_0": lambda f: _npz(f, x=np.zeros((0, 2, 4), np.float32)),
    "missing_input": lambda f: _npz(f, z=X),
    "extra_member": lambda f: _npz(f, x=X, extra=X),
    "nan_values": lambda f: _npz(f, x=np.full((2, 4), np.nan, np.float32)),
    "inf_values": lambda f: _npz(f, x=np.full((2, 4), np.inf, np.float32)),
    "huge_values": lambda f: _npz(f, x=np.full((2, 4), 3e38, np.float32)),
    "tiny_values": lambda f: _npz(f, x=np.full((2, 4), 1e-30, np.float32)),
    "fortran_order": lambda f: _npz(f, x=np.asfortranarray(X)),
    "big_endian": lambda f: _npz(f, x=X.astype(">f4")),
    "truncated_zip": lambda f: _raw(f, _npz(f, x=X).read_bytes()[:50]),
    "random_bytes": lambda f: _raw(f, random.Random(3).randbytes(300)),
    "directory": lambda f: (f / "in.npz").mkdir() or f / "in.npz",
    "missing_file": lambda f: f / "absent.npz",
    "compressed": lambda f: (np.savez_compressed(f / "in.npz", x=X), f / "in.npz")[1],
    "utf8_member_name": lambda f: _zip(f, {"x\u00e9.npy": _npy_bytes(X)}),
    # #35: a negative dimension in a header, one name twice (numpy reads the last)
    "header_negative_dim": lambda f: _zip(f, {"x.npy": _lying_header((-3, 4))}),
    "duplicate_member": lambda f: _zip_twice(f, "x.npy", _npy_bytes(X), _npy_bytes(-X)),
}


def _zip_twice(folder: Path, member: str, first: bytes, second: bytes) -> Path:
    import warnings
    p = folder / "in.npz"
    with warnings.catch_warnings(), zipfile.ZipFile(p, "w") as zf:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate: that is the point
        zf.writestr(member, first)
        zf.writestr(member, second)
    return p


def _raw(folder: Path, data: bytes, name: str = "in.npz") -> Path:
    (folder / name).write_bytes(data)
    return folder / name


def _pickled() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    return buf.getvalue()


# ---------------------------------------------------------------- options and --out

OPTIONS: dict[str, list[str]] = {
    "rtol_negative": ["--rtol", "-1"], "rtol_nan": ["--rtol", "nan"], "rtol_inf": ["--rtol", "inf"],
    "rtol_text": ["--rtol", "abc"], "rtol_zero": ["--rtol", "0"], "rtol_huge": ["--rtol", "1e308"],
    "atol_negative": ["--atol", "-0.5"], "atol_nan": ["--atol", "NaN"], "atol_big": ["--atol", "10"],
    "samples_0": ["--samples", "0"], "samples_negative": ["--samples", "-3"],
    "samples_3": ["--samples", "3"], "seed_negative": ["--seed", "-1"],
    "samples_1e9": ["--samples", "1000000000"],
    "seed_huge": ["--seed", str(2**70)], "seed_text": ["--seed", "x"],
    "threads_0": ["--threads", "0"], "threads_100000": ["--threads", "100000"],
    "threads_1": ["--threads", "1"], "threads_negative": ["--threads", "-2"],
    "shape_negative": ["--shape", "x:-1x4"], "shape_empty_dims": ["--shape", "x:"],
    "shape_no_name": ["--shape", ":2x4"], "shape_letters": ["--shape", "x:2xax4"],
    "shape_no_colon": ["--shape", "x"], "shape_names_output": ["--shape", "y:2x4"],
    "shape_unknown_name": ["--shape", "nosuch:2x4"], "shape_wrong": ["--shape", "x:3x4"],
    "shape_ok": ["--shape", "x:2x4"], "shape_huge": ["--shape", "x:99999999999x4"],
    "output_tol_typo": ["--output-tol", "typo:0.5"], "output_tol_nan": ["--output-tol", "y:nan"],
    "output_tol_negative": ["--output-tol", "y:-1"], "output_tol_text": ["--output-tol", "y:a:b"],
    "output_tol_bare": ["--output-tol", "y"], "output_tol_ok": ["--output-tol", "y:0.05:0.001"],
    "output_tol_input": ["--output-tol", "x:0.1"],
}
RUN_OPTIONS: dict[str, list[str]] = {
    "max_evals_0": ["--max-evals", "0"], "max_evals_negative": ["--max-evals", "-5"],
    "max_evals_1": ["--max-evals", "1"], "stability_1": ["--stability", "1"],
    "stability_negative": ["--stability", "-2"], "stability_2": ["--stability", "2"],
    "stability_1000": ["--stability", "1000"],
    "strict": ["--strict"], "no_resume": ["--no-resume"], "backend_bogus": ["--backend", "tpu"],
    "json": ["--json"], "unknown_option": ["--frobnicate"],
    "max_samples_0": ["--max-samples", "0"], "max_input_bytes_text": ["--max-input-bytes", "x"],
    "max_spool_bytes_negative": ["--max-spool-bytes", "-1"],
    "eval_timeout_0": ["--eval-timeout", "0"], "eval_timeout_nan": ["--eval-timeout", "nan"],
    "eval_timeout_inf": ["--eval-timeout", "inf"],
    "max_input_bytes_tiny": ["--max-input-bytes", "8"],
}
USAGE_ONLY = {"rtol_negative", "rtol_nan", "rtol_inf", "rtol_text", "atol_negative", "atol_nan",
              "samples_0", "samples_negative", "seed_negative", "seed_text", "threads_0",
              "threads_100000", "threads_negative", "shape_negative", "shape_no_name",
              "shape_letters", "shape_no_colon", "shape_names_output", "shape_unknown_name",
              "shape_wrong", "shape_huge", "output_tol_typo", "output_tol_nan",
              "output_tol_negative", "output_tol_text", "output_tol_bare", "output_tol_input",
              "max_evals_0", "max_evals_negative", "stability_1", "stability_negative",
              "backend_bogus", "unknown_option", "samples_1e9", "stability_1000",
              "max_samples_0", "max_input_bytes_text", "max_spool_bytes_negative",
              "eval_timeout_0", "eval_timeout_nan", "eval_timeout_inf", "max_input_bytes_tiny"}


def _out_setup(kind: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        out = folder / "out"
        out.mkdir()
        if kind == "plan_folder":
            (out / "precision.json").mkdir()
        elif kind == "layer_precisions_folder":
            (out / "layer_precisions.txt").mkdir()
        elif kind == "journal_garbage":
            (out / "journal.jsonl").write_bytes(b"\xff\x00garbage\n{not json\n")
        elif kind == "journal_foreign":
            (out / "journal.jsonl").write_text(json.dumps({"fingerprint": {"model": "other"}})
                                               + "\n" + json.dumps({"done": "[]", "passed": True})
                                               + "\n")
        elif kind == "journal_folder":
            (out / "journal.jsonl").mkdir()
        elif kind == "journal_cut":
            (out / "journal.jsonl").write_bytes(b'{"fingerprint": {"mo')
        elif kind == "previous_is_file":
            (out / ".previous").write_text("x")
        elif kind == "manifest_garbage":
            (out / ".trtbisect-manifest.json").write_text('{"files": ["../../etc/passwd", 3]}')
        elif kind == "manifest_folder":
            (out / ".trtbisect-manifest.json").mkdir()
        elif kind == "lock_folder":
            (out / ".trtbisect.lock").mkdir()
        elif kind == "out_is_file":
            out.rmdir()
            out.write_text("I am a file")
        elif kind == "stale_generation":
            for name in ("precision.json", "layer_precisions.txt", "commands.sh", "m.mixed.onnx"):
                (out / name).write_text("from an earlier run")
        elif kind in PLANTED:  # a link where trtbisect writes: the victim must keep its bytes
            victim = folder / "victim"
            victim.write_text("precious\n")
            target = folder / "victim_dir" if kind in ("cache_symlink", "inputs_symlink",
                                                       "staging_symlink") else victim
            target.mkdir(exist_ok=True) if target.name == "victim_dir" else None
            (out / PLANTED[kind]).symlink_to(target)
        elif kind == "lock_hardlink":
            (folder / "victim").write_text("precious\n")
            (out / ".trtbisect.lock").hardlink_to(folder / "victim")
        elif kind == "lock_fifo":
            os.mkfifo(out / ".trtbisect.lock")
        elif kind == "journal_fifo":
            os.mkfifo(out / "journal.jsonl")
        elif kind == "cache_fifo":
            (out / ".cache").mkdir()
            (out / ".cache" / ".trtbisect-cache").write_text("x")
            for key in ("reference-0000000000000000.npz", "layerwise-0000000000000000.json"):
                os.mkfifo(out / ".cache" / key)
        elif kind == "user_files":  # the user's own files in --out stay untouched
            (out / "notes.md").write_text("mine")
            (out / "inputs").mkdir()
            (out / "inputs" / "data.txt").write_text("mine")
        elif kind == "user_report":
            (out / "data_loader.py").write_text("mine")
        elif kind == "user_previous":
            (out / ".previous").mkdir()
            (out / ".previous" / "notes.txt").write_text("mine")
            (out / ".trtbisect-manifest.json").write_text(json.dumps(
                {"tool": "trtbisect", "format": 2, "complete": True, "files": ["precision.json"],
                 "folders": []}))
            (out / "precision.json").write_text(json.dumps({"tool": "trtbisect"}))
        elif kind == "manifest_lists_outside":
            (out / ".trtbisect-manifest.json").write_text(json.dumps(
                {"tool": "trtbisect", "format": 2, "complete": False,
                 "files": ["../victim", "/etc/passwd", "inputs/../../victim", ".", ""]}))
            (folder / "victim").write_text("precious\n")
        return out
    return build


# a symbolic link planted where trtbisect writes, -> the file or folder it must not touch
PLANTED = {"lock_symlink": ".trtbisect.lock", "manifest_symlink": ".trtbisect-manifest.json",
           "journal_symlink": "journal.jsonl", "cache_symlink": ".cache",
           "inputs_symlink": "inputs", "staging_symlink": ".staging",
           "plan_symlink": "precision.json", "commands_symlink": "commands.sh",
           "previous_symlink": ".previous"}


OUT_KINDS = ["plan_folder", "layer_precisions_folder", "journal_garbage", "journal_foreign",
             "journal_folder", "journal_cut", "previous_is_file", "manifest_garbage",
             "manifest_folder", "lock_folder", "out_is_file", "stale_generation", *PLANTED,
             "lock_hardlink", "lock_fifo", "journal_fifo", "cache_fifo", "user_files",
             "user_report", "user_previous", "manifest_lists_outside"]
OUT_CODES = {"lock_folder": frozenset({2}), "out_is_file": frozenset({2}),
             "manifest_folder": frozenset({0, 2}), "lock_symlink": frozenset({2}),
             "lock_hardlink": frozenset({2}), "lock_fifo": frozenset({2}),
             "inputs_symlink": frozenset({2}), "manifest_symlink": frozenset({2}),
             "plan_symlink": frozenset({2}), "commands_symlink": frozenset({2}),
             "user_report": frozenset({2}), "user_previous": frozenset({2}),
             # a link where a scratch folder goes only turns the scratch off; the run goes on
             "cache_symlink": frozenset({0}), "staging_symlink": frozenset({0}),
             "journal_symlink": frozenset({0}), "journal_fifo": frozenset({0}),
             "cache_fifo": frozenset({0}), "previous_symlink": frozenset({0}),
             "user_files": frozenset({0}), "manifest_lists_outside": frozenset({0})}


# ---------------------------------------------------------------- hostile hooks, loaders, files (#35)

def loop_model(stop: float | None) -> onnx.ModelProto:
    """y = x + 1, repeated up to 10^12 times while the sum stays below `stop` (None: forever).
    From x = 2040 with stop 2100, FP32 ends after 60 trips (far from any timeout); in FP16
    2048 + 1 rounds back to 2048, so the Loop never ends unless its Add (`count[body]/step`)
    is kept in FP32."""
    cond = (h.make_node("Less", ["v_out", "stop"], ["cond_out"], name="more") if stop
            else h.make_node("Identity", ["cond_in"], ["cond_out"], name="more"))
    body = h.make_graph(
        [h.make_node("Add", ["v_in", "one"], ["v_out"], name="step"), cond], "body",
        [h.make_tensor_value_info("i", TP.INT64, []),
         h.make_tensor_value_info("cond_in", TP.BOOL, []),
         h.make_tensor_value_info("v_in", TP.FLOAT, [1])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []),
         h.make_tensor_value_info("v_out", TP.FLOAT, [1])],
        [h.make_tensor("one", TP.FLOAT, [1], [1.0]),
         h.make_tensor("stop", TP.FLOAT, [1], [stop or 0.0])])
    g = h.make_graph([h.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body, name="count")],
                     "g", [h.make_tensor_value_info("x", TP.FLOAT, [1])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1])],
                     [h.make_tensor("trip", TP.INT64, [], [10**12]),
                      h.make_tensor("cond", TP.BOOL, [], [True])])
    return _model(g, opset=17)


LOOP_START = np.array([2040.0], np.float32)  # loop_model's x: 60 trips below 2100 in FP32


def raw_longer_model() -> onnx.ModelProto:
    """A 64x64 weight (held outside the proto) whose raw data is 16 bytes longer than its
    shape needs."""
    w = numpy_helper.from_array(np.full((64, 64), 0.01, np.float32), "W")
    w.raw_data += bytes(16)
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "long",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, 64])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 64])], [w])
    return _model(g)


HOOKS = {  # --check FILE.py:check bodies
    "score_1e400": "def check(fp32, fp16, sample):\n    return True, 10**400\n",
    "prints": "print('imported')\ndef check(fp32, fp16, sample):\n    print('called')\n"
              "    return True\n",
    "vandal": "import numpy as np\ndef check(fp32, fp16, sample):\n"
              "    for d in (fp32, fp16, sample):\n        for a in d.values():\n"
              "            while isinstance(a, np.ndarray):\n"
              "                try:\n                    a.flags.writeable = True\n"
              "                    a[...] = 0\n                except ValueError:\n"
              "                    pass\n                a = a.base\n    return True\n",
}
LOADERS = {  # --data-loader-script FILE.py bodies (x: a [2, 4] float32 input)
    "reused_buffer": "import numpy as np\ndef load_data():\n    buf = np.zeros((2, 4), np.float32)\n"
                     "    for k in range(3):\n        buf[...] = k\n        yield {'x': buf}\n",
    "never_ends": "import numpy as np\ndef load_data():\n    while True:\n"
                  "        yield {'x': np.ones((2, 4), np.float32)}\n",
    "prints": "import numpy as np\nprint('imported')\ndef load_data():\n    print('loading')\n"
              "    yield {'x': np.ones((2, 4), np.float32)}\n",
}


def _with_hook(body: str, extra: Sequence[str] = ()):
    def build(folder: Path) -> list[str]:
        (folder / "hook.py").write_text(body)
        return ["run", str(_save(folder, overflow_model())), "--inputs", str(_npz(folder, x=X)),
                "--check", f"{folder / 'hook.py'}:check", "--out", str(folder / "out"),
                *extra]
    return build


def _with_loader(body: str, extra: Sequence[str] = ()):
    def build(folder: Path) -> list[str]:
        (folder / "loader.py").write_text(body)
        return ["run", str(_save(folder, overflow_model())), "--data-loader-script",
                str(folder / "loader.py"), "--out", str(folder / "out"), *extra]
    return build


def _billion_empty_samples(folder: Path) -> list[str]:
    """A ~200-byte .npz whose header declares 10^9 samples of shape (0, 4)."""
    path = _zip(folder, {"x.npy": _lying_header((10**9, 0, 4))})
    return ["run", str(_save(folder, tiny_model(dims=("n", 4)))), "--inputs", str(path),
            "--out", str(folder / "out")]


def hostile_cases() -> list[Case]:
    # 7 (fragile): a sample of zeros has a bound of 0, which no plan passes with a margin
    out = [Case(f"hook-{name}-run", _with_hook(body, ["--json"]), frozenset({0, 4, 7}))
           for name, body in HOOKS.items()]
    out += [Case(f"loader-{name}-run", _with_loader(body, ["--max-samples", "20"]),
                 frozenset({2}) if name == "never_ends" else frozenset({0, 4, 7}))
            for name, body in LOADERS.items()]
    out += [Case("npz-billion_empty_samples-run", _billion_empty_samples, frozenset({2})),
            Case("model-loop_forever-run", _with_model(lambda f: loop_model(None), "run",
                                                       lambda f: _npz(f, x=np.zeros(1, np.float32)),
                                                       ["--eval-timeout", "0.2"]), frozenset({2})),
            Case("model-loop_stuck_in_fp16-run", _with_model(
                lambda f: loop_model(2100.0), "run", lambda f: _npz(f, x=LOOP_START),
                ["--eval-timeout", "0.25"]), frozenset({0})),
            Case("model-initializer_raw_longer-run", _with_model(
                lambda f: raw_longer_model(), "run",
                lambda f: _npz(f, x=np.ones((2, 64), np.float32))), frozenset({2})),
            Case("model-node_name_100k-run", _with_model(
                lambda f: overflow_model(("u" * 100_000, "up2", "d" * 100_000)), "run",
                NPZ["ok"]), frozenset({0}))]
    return out


# ---------------------------------------------------------------- the corpus

def _with_model(model: Callable[[Path], onnx.ModelProto | bytes], command: str,
                inputs: Callable[[Path], Path] | None = None, extra: Sequence[str] = ()):
    def build(folder: Path) -> list[str]:
        path = _save(folder, model(folder))
        args = [command, str(path)]
        if command == "check":
            args += ["--reference", str(_save(folder, tiny_model(), "ref.onnx"))]
        if inputs is not None:
            args += ["--inputs", str(inputs(folder))]
        if command == "run":
            args += ["--out", str(folder / "out")]
        return args + list(extra)
    return build


def _check_with(mixed: Callable[[Path], onnx.ModelProto | bytes], ref=tiny_model):
    def build(folder: Path) -> list[str]:
        return ["check", str(_save(folder, mixed(folder))), "--reference",
                str(_save(folder, ref(), "ref.onnx")), "--inputs", str(_npz(folder, x=X))]
    return build


def _with_out(kind: str):
    def build(folder: Path) -> list[str]:
        out = _out_setup(kind)(folder)
        return ["run", str(_save(folder, overflow_model())), "--inputs",
                str(_npz(folder, x=X)), "--out", str(out)]
    return build


def _scalar_stacked(folder: Path) -> list[str]:
    inputs = _npz(folder, x=np.ones((3, 4), np.float32), s=np.array([1.0, 2.0, 3.0], np.float32))
    return ["run", str(_save(folder, scalar_model())), "--inputs", str(inputs),
            "--out", str(folder / "out")]


def cases() -> list[Case]:
    """The whole corpus, in a fixed order."""
    out: list[Case] = []
    commands = ("run", "compare", "check")
    for name, (model, xfail) in MODEL_MUTATIONS.items():
        for cmd in commands:
            codes = ACCEPTED if xfail else ANY
            out.append(Case(f"model-{name}-{cmd}", _with_model(model, cmd), codes, xfail=xfail))
            if cmd != "check":
                out.append(Case(f"model-{name}-{cmd}-inputs",
                                _with_model(model, cmd, NPZ["ok"]), codes, xfail=xfail))
    for k in range(1, 10):
        out.append(Case(f"model-truncated-{k}0pct", _with_model(_truncated(k / 10), "run")))
    for seed in range(60):
        out.append(Case(f"model-flipped-{seed}", _with_model(_flipped(seed), "run",
                                                              NPZ["ok"], ["--max-evals", "20"])))
    for name, npz in NPZ.items():
        for cmd in commands:
            out.append(Case(f"npz-{name}-{cmd}", _with_model(
                _overflow, cmd, npz) if cmd != "check" else _npz_check(npz)))
    for name, opt in {**OPTIONS, **RUN_OPTIONS}.items():
        codes = frozenset({2}) if name in USAGE_ONLY else ANY
        for cmd in commands if name in OPTIONS else ("run",):
            out.append(Case(f"option-{name}-{cmd}",
                            _with_model(_overflow, cmd, None if "shape" in name else NPZ["ok"],
                                        opt), codes))
    for kind in OUT_KINDS:
        out.append(Case(f"out-{kind}", _with_out(kind), OUT_CODES.get(kind, ANY)))
    out.append(Case("out-read-only", lambda f: ["run", str(_save(f, tiny_model())),
                                                 "--out", "/proc/trtbisect-fuzz/out"],
                    frozenset({2})))
    for target in ("write", "replace", "journal"):
        out.append(Case(f"out-disk-full-{target}", _with_out("none"), frozenset({2}),
                        patch=f"enospc-{target}"))
    out.append(Case("out-locked-by-another-run", _with_out("none"), frozenset({2}),
                    patch="locked"))
    out.append(Case("stacked-scalar-inputs", _scalar_stacked, frozenset({0})))
    out += hostile_cases()
    # 500 random samples of 400 MB: refused before one is made (their total against memory)
    out.append(Case("option-samples_total_bytes-run", _with_model(
        lambda f: tiny_model(dims=("n", 4)), "run", None,
        ["--shape", "x:100000000x4", "--samples", "500"]), frozenset({2})))
    for name, mixed in {"fp16_model": lambda f: _fp16(tiny_model()),
                        "garbage": lambda f: b"garbage", "other_outputs": lambda f: tiny_model(
                            out="z"), "utf8_bad": MODEL_MUTATIONS["utf8_bad_node_name"][0],
                        "same_as_ref": lambda f: tiny_model()}.items():
        codes = ACCEPTED if name == "fp16_model" else ANY  # a float16 model is a mixed model
        out.append(Case(f"check-mixed-{name}", _check_with(mixed), codes))
    return out


def _overflow(folder: Path) -> onnx.ModelProto:
    return overflow_model()


def _npz_check(npz: Callable[[Path], Path]):
    def build(folder: Path) -> list[str]:
        return ["check", str(_save(folder, tiny_model())), "--reference",
                str(_save(folder, tiny_model(), "ref.onnx")), "--inputs", str(npz(folder))]
    return build


def _fp16(m: onnx.ModelProto) -> onnx.ModelProto:
    """The whole model in float16, inputs and outputs included."""
    for v in [*m.graph.input, *m.graph.output]:
        v.type.tensor_type.elem_type = TP.FLOAT16
    for t in m.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    return m


if __name__ == "__main__":  # pragma: no cover
    all_cases = cases()
    for c in all_cases:
        print(c.name)
    print(f"{len(all_cases)} cases")
