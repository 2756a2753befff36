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

__all__ = ["REWRITES", "Match", "Refusal", "Rewrite", "RewriteRefused"]
