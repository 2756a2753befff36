"""The FP16-safe graph rewrites, in the order the driver tries them (most exact first)."""

from __future__ import annotations

from .core import Match, Refusal, Rewrite, RewriteRefused
from .mask import REWRITE as CLAMP_MASK_CONSTANT
from .norm import LAYERNORM as FUSE_LAYERNORM
from .norm import RMSNORM as FUSE_RMSNORM
from .scale import PRESCALE_ATTENTION, RAISE_EPSILON, REDUCESUM_TO_MEAN, SCALE_BEFORE_SQUARE

REWRITES: tuple[Rewrite, ...] = (
    CLAMP_MASK_CONSTANT, FUSE_LAYERNORM, PRESCALE_ATTENTION, REDUCESUM_TO_MEAN,
    SCALE_BEFORE_SQUARE, FUSE_RMSNORM, RAISE_EPSILON,
)

# rewrites whose only effect is to keep values inside FP16's range (a mask fill, logits, a sum,
# a square, an eps above FP16's subnormals): BF16 has FP32's range, so they are not offered there
RANGE_ONLY = frozenset({CLAMP_MASK_CONSTANT.name, PRESCALE_ATTENTION.name, REDUCESUM_TO_MEAN.name,
                        SCALE_BEFORE_SQUARE.name, RAISE_EPSILON.name})


def rewrites_for(narrow_range: bool) -> tuple[Rewrite, ...]:
    """The rewrites worth trying for a low precision: all of them for FP16 (`narrow_range`),
    only those that change how values are computed (fused norms) for BF16."""
    return REWRITES if narrow_range else tuple(r for r in REWRITES if r.name not in RANGE_ONLY)


__all__ = ["RANGE_ONLY", "REWRITES", "Match", "Refusal", "Rewrite", "RewriteRefused",
           "rewrites_for"]
