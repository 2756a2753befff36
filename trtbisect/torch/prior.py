"""The search's candidates and its prior (search.prior.Prior, the run's shape: seeds, ranking and
scores), from the layer-wise view of modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..graph.modules import ancestors
from ..search.prior import Prior
from .layerwise import ModuleStats

# Modules that compute nothing a reduced dtype could change (moves, max, exact clamps):
# keeping one FP32 never fixes anything, so they are not search candidates.
EXACT_MODULES = frozenset({
    "Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Flatten",
    "Unflatten", "ReLU", "ReLU6", "Hardtanh", "MaxPool1d", "MaxPool2d", "MaxPool3d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "ZeroPad1d", "ZeroPad2d",
    "ZeroPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d",
    "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "PixelShuffle", "PixelUnshuffle",
    "ChannelShuffle"})


def candidates(stats: Mapping[str, ModuleStats]) -> list[str]:
    """Modules that ran, minus the root and modules that compute nothing inexact; in the
    order their first call began (parents before children)."""
    return [m for m in _start_order(stats) if m and stats[m].cls not in EXACT_MODULES]


def _start_order(stats: Mapping[str, ModuleStats]) -> list[str]:
    """Pre-order from post-order: a module begins when the first module inside it finishes."""
    begins = {p: s.order for p, s in stats.items()}
    for p, s in stats.items():
        for a in ancestors(p):
            if a in begins:
                begins[a] = min(begins[a], s.order)
    if "" in begins:
        begins[""] = -1
    return sorted(stats, key=lambda p: (begins[p], p.count(".") if p else -1))


def prior(stats: Mapping[str, ModuleStats], cands: Sequence[str], mode: str) -> Prior:
    """Seeds and ranking from the layer-wise view; the scores are the modules' error growth.

    Seeds: modules whose own code overflowed the reduced dtype, the first module to turn
    non-finite, and modules whose FP32 output is beyond the reduced range. In half mode such an
    output is cast back on leaving an FP32 module, so the seed is the nearest enclosing module
    whose output fits. Ranking: seeds, leaves by error growth, then parents.
    """
    cand = set(cands)
    seeds: list[str] = []

    def enclosing(path: str) -> str | None:
        for a in ancestors(path):
            s = stats.get(a)
            if a in cand and s is not None and s.out_of_range == 0:
                return a
        return None

    for s in stats.values():
        if s.out_of_range and mode == "half":
            target = enclosing(s.module)
        elif s.overflow_ops or s.out_of_range or s.nonfinite_origin:
            target = s.module if s.module in cand else enclosing(s.module)
        else:
            continue
        if target is not None and target not in seeds:
            seeds.append(target)
    leaves = sorted((m for m in cands if stats[m].leaf), key=lambda m: -stats[m].growth)
    parents = [m for m in cands if not stats[m].leaf]
    ranking = list(dict.fromkeys([*seeds, *leaves, *parents]))
    return Prior(seeds, ranking, {m: stats[m].growth for m in cands})
