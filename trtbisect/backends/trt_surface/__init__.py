"""TensorRT's Python API as NVIDIA's bindings wheels define it: one JSON file per release.

`scripts/trt_surface.py` writes the files from the real `tensorrt-cu1x-bindings` wheels (method:
docs/tensorrt.md, "How trtbisect knows TensorRT's API"). The tests check every TensorRT name
trtbisect's code and its rendered snippets use against the release each code path targets,
and the fake TensorRT the tests run on raises AttributeError for whatever that release lacks.
Reading a surface needs no TensorRT.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
# The release each TensorRT major's code path is checked against (a surface file each).
CHECKED = {10: "10.13", 11: "11.4"}


@dataclass(frozen=True)
class Surface:
    """One release: module names, classes (own members and bases) and enum values."""

    release: str  # "11.4"
    version: str  # "11.4.0.106", the wheel's
    module: Mapping[str, str]  # name -> "class", "function", an enum value ("DataType.FLOAT")
    classes: Mapping[str, Mapping[str, list[str]]]  # name -> {"bases": [...], "members": [...]}
    enums: Mapping[str, Mapping[str, int]]  # enum class -> value name -> int

    @property
    def major(self) -> int:
        return int(self.release.split(".")[0])

    def members(self, owner: str) -> frozenset[str]:
        """Public names reachable on class `owner` (inherited ones and enum values too);
        `owner` "" is the module."""
        if not owner:
            return frozenset(self.module)
        out: set[str] = set()
        todo, seen = [owner], set()
        while todo:
            cls = todo.pop()
            if cls in seen or cls not in self.classes:
                continue
            seen.add(cls)
            out.update(self.classes[cls]["members"])
            out.update(self.enums.get(cls, {}))
            todo.extend(self.classes[cls]["bases"])
        return frozenset(out)

    def has(self, owner: str, name: str) -> bool:
        return name in self.members(owner)


def releases() -> list[str]:
    """Releases with a surface file, oldest first."""
    return sorted((p.stem for p in HERE.glob("*.json")),
                  key=lambda r: tuple(int(x) for x in r.split(".")))


@cache
def load(release: str | int) -> Surface:
    """The surface of a release ("11.4"), or of the release a major's path is checked against."""
    name = CHECKED[release] if isinstance(release, int) else release
    data = json.loads((HERE / f"{name}.json").read_text())
    return Surface(name, data["tensorrt"], data["module"], data["classes"], data["enums"])
