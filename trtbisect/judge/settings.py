"""The judge's settings, in one frozen object with one fingerprint.

Everything that can change a verdict on a plan (where TensorRT rounds and how, the ORT threads
whose split a Conv's sum depends on, the tolerance and the criteria, the precision) lives here
once. The journal's fingerprint, the FP32 reference cache key and the workers' spec are all
built from it, so a setting added here reaches every one of them; a setting kept outside
cannot be forgotten by one (before, `--threads` was part of the judge but not of the journal's
fingerprint: a resumed run with other threads replayed verdicts it never judged).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..base.limits import EVAL_TIMEOUT
from .compare import Tolerance

if TYPE_CHECKING:
    from .criteria import Criteria


class JudgeFields(Protocol):
    """What `JudgeSettings.of` reads: context.JudgeOptions (a layer above the judge, so named
    here by what it holds)."""

    @property
    def semantics(self) -> str: ...
    @property
    def trt_version(self) -> int: ...
    @property
    def tf32(self) -> bool: ...
    @property
    def accumulate(self) -> int: ...
    @property
    def threads(self) -> int | None: ...
    @property
    def strict(self) -> bool: ...
    @property
    def precision(self) -> str: ...
    @property
    def tolerance(self) -> Tolerance: ...
    @property
    def criteria(self) -> Criteria: ...
    @property
    def eval_timeout(self) -> float: ...


@dataclass(frozen=True)
class JudgeSettings:
    """Picklable (workers receive it): the criteria travel as their flags and fingerprint."""

    semantics: str = "trt"
    trt_version: int = 11
    tf32: bool = False
    accumulate: int = 0  # the --fp16-accumulate block size (0: off)
    threads: int | None = None  # ORT intra-op threads of every judging session
    strict: bool = False
    precision: str = "fp16"
    tolerance: Tolerance = field(default_factory=Tolerance)
    criteria_flags: tuple[str, ...] = ()  # judge/flags.criteria_flags: () is the default
    criteria_fingerprint: str = ""  # of the criteria as written, hook code included
    eval_timeout: float = EVAL_TIMEOUT  # --eval-timeout: a plan past it fails (limits.py)

    @classmethod
    def of(cls, opts: JudgeFields, criteria: Criteria | None = None) -> JudgeSettings:
        """The settings of a run's judge options (context.JudgeOptions, which holds them as
        `settings`; `criteria`: instead of the options' own)."""
        from .flags import criteria_flags

        crit = criteria if criteria is not None else opts.criteria
        return cls(semantics=opts.semantics, trt_version=opts.trt_version, tf32=opts.tf32,
                   accumulate=opts.accumulate, threads=opts.threads, strict=opts.strict,
                   precision=opts.precision, tolerance=opts.tolerance,
                   criteria_flags=tuple(criteria_flags(crit)),
                   criteria_fingerprint=criteria_digest(crit),
                   eval_timeout=opts.eval_timeout)

    def criteria(self) -> Criteria:
        """The criteria again, from their flags (a hook file is imported again)."""
        return criteria_from_flags(self.criteria_flags)

    def fingerprint(self) -> dict:
        """What a verdict depends on. A default setting that earlier versions did not record
        is left out, so their journals stay valid where nothing changed."""
        fp: dict = {"tolerance": self.tolerance.to_json(), "strict": self.strict,
                    "semantics": [self.semantics, self.trt_version, self.tf32, self.accumulate],
                    "threads": self.threads}
        if self.eval_timeout != EVAL_TIMEOUT:  # a plan timed out under another limit
            fp["eval_timeout"] = self.eval_timeout
        if self.precision != "fp16":
            fp["precision"] = self.precision
        if self.criteria_flags:
            fp["criteria"] = self.criteria_fingerprint
        return fp

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True)
                              .encode()).hexdigest()


def criteria_digest(criteria: Criteria) -> str:
    """The criteria's fingerprint as one hash (hook code included)."""
    return hashlib.sha256(json.dumps(criteria.fingerprint(), sort_keys=True)
                          .encode()).hexdigest()


def criteria_from_flags(flags: Sequence[str]) -> Criteria:
    """`flags.criteria_flags` read back (judge/flags.py promises the round trip)."""
    from .flags import parse_criteria

    kinds: dict[str, list[str]] = {"--check-error-stat": [], "--error-quantile": [],
                                   "--metric": [], "--check": []}
    rate = 1.0
    for flag, value in zip(flags[::2], flags[1::2]):
        if flag == "--pass-rate":
            rate = float(value)
        else:
            kinds[flag].append(value)
    return parse_criteria(kinds["--check-error-stat"], kinds["--error-quantile"],
                          kinds["--metric"], kinds["--check"], rate)
