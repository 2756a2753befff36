"""Find a 1-minimal set of nodes to keep in FP32, given a check function.

Pure: no runtime, no files. The caller hands in `check(fp32_nodes) -> bool` (True when the
plan "these nodes FP32, every other candidate FP16" meets the tolerance). Checks are memoized
and counted; the count is what a user pays for (one inference, or one engine build, each).

Two searches live here:

* `find_minimal_fp32`: the product. A prior from the layer-wise comparison (nodes whose
  FP16 values leave the FP16 range, ranked suspects) gives a first plan; it is grown along the
  ranking if it fails (the last node it takes, pinned, is tried alone) and then minimised. The
  result is certified 1-minimal: for every node x in the final set S, `check(S - {x})` was run
  and failed.
* `ddmin`: plain delta debugging over all candidates with no prior, the reference we measure
  against (Zeller and Hildebrandt, 2002).

Given a `price` (plan -> estimated engine seconds, cost.py), `find_minimal_fp32` minimizes
that instead of the count (`--objective cost`, the default): the prior and the grow phase are
the same, but the plan is shrunk and certified most expensive unit first, a failed run of
removals is bisected instead of retried piece by piece, and the 1-minimal plan is then
certified a local optimum: no single swap of one of its units for a cheaper unit adjacent to
it in the data flow (`adjacent`; at most `swap_k` per unit, the most suspicious first)
passes. Without a price the search is the count-minimal one, evaluation for evaluation.

Batches (#23): a check may be a `Batch` (parallel/: worker processes, Ray actors) that runs
several evaluations at once. The searches then propose what they will need next (the single
removals of a certification pass, ddmin's subsets and complements, the swaps, and along the
grow, bisect and shrink steps the plans each outcome leads to) and consume the results one at a
time in the sequential order, so the plan, the trace and `evaluations` are those of the
sequential search bit for bit. A plan evaluated ahead that the sequential search never asks for
is speculative: counted apart (`Oracle.speculative`), never a trial, never a decision.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)

Check = Callable[[frozenset[str]], bool]
Price = Callable[[frozenset[str]], float]
Score = Callable[[frozenset[str]], "float | None"]  # an evaluated plan's error (lower is better)
# after each evaluation: (its number, its plan) -> why the search cannot tell plans apart, if
# it cannot (search/noise.py: keeping more in FP32 made an output worse by too much)
Watch = Callable[[int, frozenset[str]], "Noisy | None"]
# a step after the cost certificate (cheaper.py): (oracle, plan) -> (plan, the step, stopped
# by the budget)
After = Callable[["Oracle", frozenset[str]], "tuple[frozenset[str], CheaperStep, bool]"]
SWAP_K = 2  # cheaper neighbours tried per unit of the plan in the swap certificate
SWAP_SHARE = 0.5  # the swap certificate evaluates at most this share of what came before it


# ------------------------------------------------ how a cost-aware search certified its plan
# (frozen records: written whole to trace.json, counted by the quantized road's precision.json,
# quant/cost.py `CostCertificate.of_search`)

@dataclass(frozen=True)
class CheaperStep:
    """The step from the 1-minimal plan to cheaper passing plans one unit away
    (cheaper.py `descend`): its moves in order, the cheaper neighbours of the final plan it
    judged (all failed) and left unjudged, its new evaluations and allowance."""
    moves: tuple[Mapping[str, list[str]], ...]  # in order: {"added": [...], "removed": [...]}
    cheaper_neighbours_failed: int
    cheaper_neighbours_unjudged: int
    evaluations: int
    allowance: int
    stopped_early: bool

    def to_json(self) -> dict:
        return {"moves": [dict(m) for m in self.moves],
                "cheaper_neighbours_failed": self.cheaper_neighbours_failed,
                "cheaper_neighbours_unjudged": self.cheaper_neighbours_unjudged,
                "evaluations": self.evaluations, "allowance": self.allowance,
                "stopped_early": self.stopped_early}

    @classmethod
    def from_json(cls, d: Mapping) -> CheaperStep:
        return cls(tuple(dict(m) for m in d["moves"]), d["cheaper_neighbours_failed"],
                   d["cheaper_neighbours_unjudged"], d["evaluations"], d["allowance"],
                   d["stopped_early"])


@dataclass(frozen=True)
class SearchCertificate:
    """`--objective cost`'s certificate of a plan: its price, every removal of one unit and
    every cheaper swap evaluated (each a whole plan; all failed), their neighbourhood; a plan
    searched within a limit (`--budget`) has `limit_s`; where a step after the certificate
    moved the 1-minimal plan, that plan, its price and the step."""
    objective: str
    price_s: float
    removals: tuple[tuple[str, ...], ...]
    swaps: tuple[tuple[str, ...], ...]
    neighbourhood: str
    limit_s: float | None = None
    minimal_plan: tuple[str, ...] | None = None
    minimal_price_s: float | None = None
    cheaper: CheaperStep | None = None

    def to_json(self) -> dict:
        return {"objective": self.objective, "price_s": self.price_s,
                **({"limit_s": self.limit_s} if self.limit_s is not None else {}),
                "removals": [list(r) for r in self.removals],
                "swaps": [list(s) for s in self.swaps], "neighbourhood": self.neighbourhood,
                **({"minimal_plan": list(self.minimal_plan),
                    "minimal_price_s": self.minimal_price_s}
                   if self.minimal_plan is not None else {}),
                **({"cheaper": self.cheaper.to_json()} if self.cheaper is not None else {})}


class Noisy(Protocol):
    """What a watch names when the search cannot tell plans apart (search/noise.py `Rise`):
    the output it was seen on, said in words and written into the trace."""

    @property
    def output(self) -> str: ...

    def text(self) -> str: ...

    def to_json(self) -> dict: ...


@dataclass(frozen=True)
class Trial:
    """One evaluated plan."""

    index: int
    fp32: tuple[str, ...]
    passed: bool
    phase: str
    price: float | None = None  # estimated engine seconds (cost-aware searches)
    score: float | None = None  # the plan's worst relative error, when the caller knows it
    why: str | None = None  # a failing plan: why, when the caller knows (stages/evaluator.py)

    def to_json(self) -> dict:
        out = {"index": self.index, "size": len(self.fp32), "passed": self.passed,
               "phase": self.phase, "fp32": list(self.fp32)}
        if self.price is not None:
            out["price_s"] = self.price
        if self.score is not None:
            out["score"] = self.score
        if self.why is not None:
            out["why"] = self.why
        return out


@dataclass
class SearchResult:
    fp32: list[str]  # the plan, in candidate order; empty when FP16 already passes
    found: bool  # a passing plan exists (False: even the fallback plan failed)
    one_minimal: bool  # certified: every single removal was evaluated and failed
    evaluations: int
    trials: list[Trial] = field(default_factory=list)
    stopped_early: bool = False  # the evaluation budget ran out
    # cost-aware searches: how the plan was certified (removals and swaps evaluated, all failed)
    certificate: SearchCertificate | None = None
    over_budget: bool = False  # --budget: no plan within it passed; this is the best failing one
    noisy: Noisy | None = None  # the watch stopped the search (search/noise.py): its best pass
    # with a batch check: rounds of parallel evaluation (the critical path, in evaluation
    # times) and plans evaluated ahead that the search never took. Not in the trace: the
    # trace is the same whatever the number of workers
    rounds: int = 0
    speculative: int = 0

    def to_json(self) -> dict:
        out = {"fp32": self.fp32, "found": self.found, "one_minimal": self.one_minimal,
               "evaluations": self.evaluations, "stopped_early": self.stopped_early,
               "over_budget": self.over_budget, "trials": [t.to_json() for t in self.trials]}
        if self.certificate is not None:
            out["certificate"] = self.certificate.to_json()
        if self.noisy is not None:
            out["noisy"] = self.noisy.to_json()
        return out


class BudgetExhausted(Exception):
    pass


class Undecidable(BudgetExhausted):
    """The watch found the search's own noise over its share: the search stops at once, as
    when its budget runs out (a nested search that swallows the one stops on the next
    evaluation its caller asks for)."""


Progress = Callable[[Trial, int], None]


@runtime_checkable
class Batch(Protocol):
    """A check that runs up to `width` evaluations at once (parallel/judge.py).

    `evaluate` runs plans concurrently and returns their outcomes, opaque to the search;
    `consume` is called once per plan the search takes, in the search's order, and returns its
    verdict (the judge journals it then). `known`: a verdict available without evaluating (a
    resumed run's journal); `passed`: an outcome's verdict before it is taken (None: cannot
    say, e.g. an error that `consume` will raise). Neither has side effects."""

    width: int

    def known(self, plan: frozenset[str]) -> bool | None: ...

    def evaluate(self, plans: Sequence[frozenset[str]]) -> list[Any]: ...

    def passed(self, outcome: Any) -> bool | None: ...

    def consume(self, plan: frozenset[str], outcome: Any) -> bool: ...


class _Serial:
    """A plain check as a batch of one: evaluated when the search asks for it, never ahead."""

    width = 1

    def __init__(self, check: Check) -> None:
        self._check = check

    def known(self, plan: frozenset[str]) -> bool | None:
        return None

    def evaluate(self, plans: Sequence[frozenset[str]]) -> list[Any]:
        return [bool(self._check(p)) for p in plans]

    def passed(self, outcome: Any) -> bool | None:
        return outcome

    def consume(self, plan: frozenset[str], outcome: Any) -> bool:
        return outcome


@dataclass(frozen=True)
class Ask:
    """A step of a sequential search (`Oracle.walk`): evaluate `plan`, then go on from `yes`
    if it passes or from `no` if it fails. States are plain values, so the steps after either
    outcome can be looked at before the outcome is known."""

    plan: frozenset[str]
    yes: Any
    no: Any
    phase: str | None = None
    remaining: int | None = None


@dataclass(frozen=True)
class Done:
    value: Any


Step = Callable[[Any], "Ask | Done"]
LOOKAHEAD = 64  # states a speculation looks at per evaluation slot, at most


class Oracle:
    """The one check wrapper every search strategy drives (prior-guided, ddmin, the TensorRT
    verify-then-refine, the PyTorch module search): memoizes and counts checks, enforces the
    budget, and records the trace. `label` and `level` name a check in the log ("TensorRT
    check" at INFO, where each one is an engine build).

    With a `Batch` check of width > 1, `first` and `walk` evaluate ahead what the search will
    likely ask next, in rounds of up to `width` plans; trials are still recorded one by one in
    the order the search takes them. An Oracle is itself a `Batch`, so a nested search (the
    TensorRT certificate) batches through its caller's oracle."""

    def __init__(self, check: Check | Batch, order: Sequence[str],
                 max_evaluations: int | None = None, progress: Progress | None = None, *,
                 label: str = "evaluation", level: int = logging.DEBUG,
                 price: Price | None = None, watch: Watch | None = None) -> None:
        self._batch: Batch = check if isinstance(check, Batch) else _Serial(check)
        self.width = max(1, int(self._batch.width))
        self.price = price
        self._position = {name: i for i, name in enumerate(order)}
        self._memo: dict[frozenset[str], bool] = {}
        self._ahead: dict[frozenset[str], Any] = {}  # evaluated, not (yet) taken by the search
        self.trials: list[Trial] = []
        self.max_evaluations = max_evaluations
        self.progress = progress
        self.phase = ""
        self.remaining = 0
        self.exhausted = False  # the budget stopped a check (a nested search may swallow it)
        self.label, self.level = label, level
        self.rounds = 0  # batches evaluated: the critical path, in evaluation times
        self.watch = watch
        self.noisy: Noisy | None = None  # what the watch found: no plan is evaluated after it
        self._passes = 0

    @property
    def speculative(self) -> int:
        """Plans evaluated ahead that the search never took (so far)."""
        return len(self._ahead)

    def __call__(self, fp32: Iterable[str]) -> bool:
        key = frozenset(fp32)
        if key in self._memo:
            return self._memo[key]
        if self.noisy is not None:
            raise Undecidable
        if self.max_evaluations is not None and len(self.trials) >= self.max_evaluations:
            self.exhausted = True
            raise BudgetExhausted
        if key not in self._ahead and self._batch.known(key) is None:
            self._run([key])
        passed = bool(self._batch.consume(key, self._ahead.pop(key, None)))
        self._memo[key] = passed
        trial = Trial(len(self.trials) + 1, self.sorted(key), passed, self.phase,
                      self.price(key) if self.price is not None else None)
        self.trials.append(trial)
        log.log(self.level, "%s %d (%s): %d nodes FP32 -> %s", self.label, trial.index,
                self.phase, len(key), "pass" if passed else "fail")
        if self.progress is not None:
            self.progress(trial, self.remaining)
        self._passes += passed
        if self.watch is not None:
            noisy = self.watch(trial.index, key)
            if noisy is not None and self._passes:  # stop once there is a plan to write
                self.noisy = noisy
                raise Undecidable
        return passed

    def known(self, fp32: Iterable[str]) -> bool | None:
        return self._memo.get(frozenset(fp32))

    def smallest_pass(self) -> frozenset[str] | None:
        passing = [k for k, ok in self._memo.items() if ok]
        return min(passing, key=len) if passing else None

    def sorted(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(names, key=lambda n: self._position.get(n, len(self._position))))

    # ------------------------------------------------------------ evaluating ahead

    def _run(self, plans: list[frozenset[str]]) -> None:
        self.rounds += 1
        self._ahead.update(zip(plans, self._batch.evaluate(plans)))

    def _answer(self, key: frozenset[str]) -> bool | None:
        """The verdict of `key` if it is known without evaluating it now."""
        if key in self._memo:
            return self._memo[key]
        if key in self._ahead:
            return self._batch.passed(self._ahead[key])
        return self._batch.known(key)

    def _open(self, key: frozenset[str]) -> bool:
        return key not in self._memo and key not in self._ahead and self._batch.known(key) is None

    def _room(self) -> int:
        """Plans one round may evaluate: the width, and no more than the budget leaves."""
        if self.max_evaluations is None:
            return self.width
        return max(1, min(self.width, self.max_evaluations - len(self.trials)))

    def first(self, plans: Iterable[Iterable[str]]) -> int | None:
        """Index of the first plan that passes, asking them in order (every one before it
        failed); None when none passes. With a batch, the next `width` open plans are
        evaluated together; those after the first pass are speculative."""
        it = (frozenset(p) for p in plans)
        buf: deque[frozenset[str]] = deque()
        for i in itertools.count():
            if not buf:
                buf.extend(itertools.islice(it, 1))
                if not buf:
                    return None
            if self.width > 1 and self._open(buf[0]):
                self._prefetch(buf, it)
            if self(buf.popleft()):
                return i
        return None  # unreachable

    def _prefetch(self, buf: deque[frozenset[str]], it: Iterator[frozenset[str]]) -> None:
        room, looked = self._room(), 0
        picked: list[frozenset[str]] = []
        for k in itertools.count():
            if k >= len(buf):
                buf.extend(itertools.islice(it, 1))
                if k >= len(buf):
                    break
            key = buf[k]
            looked += 1
            if self._open(key) and key not in picked:
                picked.append(key)
            if len(picked) >= room or looked >= LOOKAHEAD * room:
                break
        self._run(picked)

    def walk(self, state: Any, step: Step) -> Any:
        """Run a sequential search given as `step(state) -> Ask | Done` from `state` and
        return its `Done` value. With a batch, each round evaluates the open plans the search
        most likely asks next (a pass or fail weighted by the phase's record so far)."""
        while True:
            s = step(state)
            if isinstance(s, Done):
                return s.value
            if s.phase is not None:
                self.phase = s.phase
            if s.remaining is not None:
                self.remaining = s.remaining
            if self.width > 1 and self._open(s.plan):
                self._run(self._likely(state, step))
            state = s.yes if self(s.plan) else s.no

    def _likely(self, state: Any, step: Step) -> list[frozenset[str]]:
        """The open plans of the states ahead of `state`, most probable first (best-first
        over the tree of outcomes), up to one round's room."""
        room, tie = self._room(), itertools.count()
        picked: list[frozenset[str]] = []
        heap: list[tuple[float, int, Any]] = [(-1.0, next(tie), state)]
        looked = 0
        while heap and len(picked) < room and looked < LOOKAHEAD * room:
            neg, _, st = heapq.heappop(heap)
            looked += 1
            s = step(st)
            if isinstance(s, Done):
                continue
            answer = self._answer(s.plan)
            if answer is not None:  # known: only one way on
                heapq.heappush(heap, (neg, next(tie), s.yes if answer else s.no))
                continue
            if s.plan not in picked:
                picked.append(s.plan)
            p = self._pass_rate(s.phase or self.phase)
            heapq.heappush(heap, (neg * p, next(tie), s.yes))
            heapq.heappush(heap, (neg * (1 - p), next(tie), s.no))
        return picked

    def _pass_rate(self, phase: str) -> float:
        """How often plans of `phase` passed so far (Laplace's rule: 1/2 with no record)."""
        done = [t.passed for t in self.trials if t.phase == phase]
        return (sum(done) + 1) / (len(done) + 2)

    # ------------------------------------------------------------ an Oracle is a Batch

    def evaluate(self, plans: Sequence[frozenset[str]]) -> list[Any]:
        """Evaluate ahead for a nested search: the outcome is the plan itself, looked up
        here when it is taken."""
        open_ = [p for p in dict.fromkeys(plans) if self._open(p)]
        if open_:
            self._run(open_)
        return list(plans)

    def passed(self, outcome: Any) -> bool | None:
        return self._answer(outcome)

    def consume(self, plan: frozenset[str], outcome: Any) -> bool:
        return self(plan)


def find_minimal_fp32(
    candidates: Sequence[str],
    check: Check | Batch,
    seeds: Iterable[str] = (),
    ranking: Sequence[str] = (),
    max_evaluations: int | None = None,
    progress: Progress | None = None,
    *,
    price: Price | None = None,
    adjacent: Mapping[str, Sequence[str]] | None = None,
    swap_k: int = SWAP_K,
    swap_share: float | None = SWAP_SHARE,
    limit: float | None = None,
    score: Score | None = None,
    after: After | None = None,
    watch: Watch | None = None,
) -> SearchResult:
    """Prior-guided search for a certified 1-minimal FP32 set.

    `seeds` are the nodes the layer-wise comparison says must stay FP32 (they read or write
    values outside the FP16 range); `ranking` orders every candidate from most to least
    suspicious. Neither needs to be right: a wrong prior costs evaluations, not correctness.
    `price` (and `adjacent`): minimize the plan's estimated cost instead of its count, and
    certify that no cheaper swap passes (`_find_cheapest`).
    `limit` (with `price`): --budget, the most a plan may cost; only plans within it are
    evaluated (`_find_within`), and `score(plan)` (its error once evaluated) picks the best
    failing one when none passes.
    `after` (with `price`, no `limit`), for a price that is not monotone (the quantized
    road's): a step after the certificate, through the same oracle (cheaper.py `Cheaper`:
    to cheaper passing plans one unit away).
    `watch`: told of every evaluation; when it names the search's own noise (search/noise.py)
    the search stops at once with its smallest passing plan (`SearchResult.noisy`).
    """
    if limit is not None and price is not None:
        return _find_within(candidates, check, seeds, ranking, max_evaluations, progress,
                            price, adjacent or {}, swap_k, swap_share, limit, score)
    if price is not None:
        return _find_cheapest(candidates, check, seeds, ranking, max_evaluations, progress,
                              price, adjacent or {}, swap_k, swap_share, after, watch)
    cand, seed_list, rank = _ordered(candidates, seeds, ranking)
    oracle = Oracle(check, cand, max_evaluations, progress, watch=watch)
    try:
        first = _first_pass(oracle, cand, seed_list, rank)
        if first is None:
            return _result(oracle, frozenset(cand), found=False, minimal=False)
        current, how = first
        if how == "all-fp16":
            return _result(oracle, current, found=True, minimal=True)
        if how == "grown":
            current = _shrink(oracle, current, rank)
        return _result(oracle, _certify(oracle, current, rank), found=True, minimal=True)
    except BudgetExhausted:
        return _stopped(oracle, cand)


def _ordered(candidates: Sequence[str], seeds: Iterable[str],
             ranking: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """The candidates once each, the seeds among them, and the ranking: seeds first, then the
    prior's order, then every other candidate."""
    cand = list(dict.fromkeys(candidates))
    cand_set = set(cand)
    seed_list = [n for n in dict.fromkeys(seeds) if n in cand_set]
    rank = [n for n in dict.fromkeys([*seed_list, *ranking, *cand]) if n in cand_set]
    return cand, seed_list, rank


def _first_pass(oracle: Oracle, cand: list[str], seed_list: list[str],
                rank: list[str]) -> tuple[frozenset[str], str] | None:
    """The first passing plan both objectives start from, and how it was found: "all-fp16"
    (the empty plan), "prior" (the seeds), "pinned" or "ddmin" (both already small), or
    "grown" (a prefix of the ranking, still to shrink). None: nothing passes."""
    oracle.phase, oracle.remaining = "all-fp16", 1 + len(seed_list)
    if oracle(()):
        return frozenset(), "all-fp16"
    oracle.phase = "prior"
    if seed_list and oracle(frozenset(seed_list)):
        return frozenset(seed_list), "prior"
    current = _grow(oracle, rank, len(seed_list))
    if current is None:
        return None
    # The last node the grow phase took is pinned: without it the prefix failed. One
    # culprit is the common case, so ask first whether it suffices alone.
    pinned = frozenset(_removal_order(current, rank)[:1])
    oracle.phase = "pinned"
    rest = [n for n in cand if n not in current]  # what the ranking left out
    if len(current) > 1 and oracle(pinned):
        return pinned, "pinned"
    if 2 * len(current) > len(cand) and rest and oracle(rest):
        # a prefix of most of the ranking passes, and so does what it left out: the
        # prefix may pass only as a wide combination. ddmin over the rest (PP-OCRv4
        # rec under strict semantics: a 295-node prefix, one node outside it suffices)
        oracle.phase = "ddmin"
        return _ddmin(oracle, rest), "ddmin"
    return current, "grown"


def _stopped(oracle: Oracle, cand: list[str]) -> SearchResult:
    best = oracle.smallest_pass()
    if oracle.noisy is not None:
        log.warning("the search stops: %s; the best passing plan so far is not certified "
                    "minimal", oracle.noisy.text())
    else:
        log.warning("evaluation budget of %s reached; the plan is not certified minimal",
                    oracle.max_evaluations)
    if best is None:
        return _result(oracle, frozenset(cand), found=False, minimal=False, stopped=True)
    return _result(oracle, best, found=True, minimal=False, stopped=True)


def _grow(oracle: Oracle, rank: list[str], start: int) -> frozenset[str] | None:
    """Take ever longer prefixes of the ranking until one passes, then bisect the length."""
    n = len(rank)

    def step(state: tuple) -> Ask | Done:
        mode, lo, size = state  # prefix lengths <= lo are known (or assumed) to fail
        if mode == "grow":
            size = min(size, n)
            return Ask(frozenset(rank[:size]), ("bisect", lo, size),
                       ("stop", lo, size) if size == n else ("grow", size, size * 2), "grow",
                       max(1, math.ceil(math.log2(max(2, n / max(size, 1))))) + 1)
        if mode == "stop":
            return Done(None)
        hi = size
        if hi - lo <= 1:
            return Done(frozenset(rank[:hi]))
        mid = (lo + hi) // 2
        return Ask(frozenset(rank[:mid]), ("bisect", lo, mid), ("bisect", mid, hi), "bisect",
                   math.ceil(math.log2(hi - lo)))

    return oracle.walk(("grow", start, max(2 * start, 4)), step)


def _removal_order(plan: Iterable[str], rank: list[str]) -> list[str]:
    """Least suspicious first: those are the likeliest to be removable."""
    pos = {name: i for i, name in enumerate(rank)}
    return sorted(plan, key=lambda x: -pos.get(x, len(pos)))


def _shrink(oracle: Oracle, plan: frozenset[str], rank: list[str]) -> frozenset[str]:
    """Drop runs of the least suspicious nodes: the run doubles after a removal that passes and
    halves after one that fails, and a node that cannot go alone stays. A plan of k that keeps
    m costs about m * log2(k / m) evaluations, and about k + m when nearly every node is needed,
    where complement-removal ddmin degrades to a quadratic number (PP-OCRv4 det: 85)."""
    oracle.phase = "shrink"
    order = _removal_order(plan, rank)

    def step(state: tuple) -> Ask | Done:
        plan, i, size = state
        while i < len(order):
            run = order[i:i + size]
            trial = plan - set(run)
            failed = (plan, i, size // 2) if size > 1 else (plan, i + 1, 1)
            if trial:
                return Ask(trial, (trial, i + len(run), 2 * size), failed, "shrink",
                           len(order) - i)
            plan, i, size = failed  # nothing left: all-FP16, known to fail
        return Done(plan)

    return oracle.walk((plan, 0, 1), step)


def _certify(oracle: Oracle, plan: frozenset[str], rank: list[str]) -> frozenset[str]:
    """Try removing each node until a full pass removes none: the result is 1-minimal."""
    oracle.phase = "minimize"
    changed = True
    while changed:
        changed = False
        order = _removal_order(plan, rank)
        while order:  # the pass's removals, one batch until one of them passes
            oracle.remaining = sum(1 for y in plan if oracle.known(plan - {y}) is None)
            k = oracle.first(plan - {x} for x in order)
            if k is None:
                break
            plan, changed, order = plan - {order[k]}, True, order[k + 1:]
    return plan


# ---------------------------------------------------------------- cost-aware search

def _find_cheapest(candidates: Sequence[str], check: Check | Batch, seeds: Iterable[str],
                   ranking: Sequence[str], max_evaluations: int | None,
                   progress: Progress | None, price: Price,
                   adjacent: Mapping[str, Sequence[str]], swap_k: int,
                   swap_share: float | None, after: After | None = None,
                   watch: Watch | None = None) -> SearchResult:
    """`find_minimal_fp32` minimizing `price`: the same prior, grow and handover to ddmin;
    then shrink (bisecting failed runs), certify 1-minimal and certify that no single swap
    for a cheaper neighbour passes, the most expensive units tried first throughout."""
    cand, seed_list, rank = _ordered(candidates, seeds, ranking)
    pos = {n: i for i, n in enumerate(rank)}
    oracle = Oracle(check, cand, max_evaluations, progress, price=price, watch=watch)
    try:
        first = _first_pass(oracle, cand, seed_list, rank)
        if first is None:
            return _result(oracle, frozenset(cand), found=False, minimal=False)
        current, how = first
        if how == "all-fp16":
            return _result(oracle, current, found=True, minimal=True)
        current = _bisecting_shrink(oracle, current, _costliest_first(current, price, pos))
        current = _certify_cost(oracle, current, price, pos)
        allowance = (max(1, int(swap_share * len(oracle.trials))) if swap_share is not None
                     else len(cand) ** 2)  # what the certificate may cost, at most
        current, swaps = _swap(oracle, current, price, pos, adjacent, swap_k, allowance)
        minimal_plan, stepped = current, None
        if after is not None:
            current, stepped, stopped = after(oracle, current)
        result = _result(oracle, current, found=True, minimal=current == minimal_plan)
        result.stopped_early = bool(stepped is not None and stopped)
        result.certificate = SearchCertificate(
            "cost", price(current),
            tuple(tuple(oracle.sorted(minimal_plan - {x})) for x in oracle.sorted(minimal_plan)),
            tuple(tuple(oracle.sorted(s)) for s in swaps),
            f"units adjacent in the data flow and cheaper in the plan's place, at most {swap_k} "
            f"per unit (the most suspicious), the cheapest swaps first, at most {allowance} "
            f"evaluated in all ({swap_share} of the evaluations before the certificate)",
            minimal_plan=None if stepped is None else tuple(oracle.sorted(minimal_plan)),
            minimal_price_s=None if stepped is None else price(minimal_plan), cheaper=stepped)
        return result
    except BudgetExhausted:
        return _stopped(oracle, cand)


def _find_within(candidates: Sequence[str], check: Check | Batch, seeds: Iterable[str],
                 ranking: Sequence[str], max_evaluations: int | None,
                 progress: Progress | None, price: Price,
                 adjacent: Mapping[str, Sequence[str]], swap_k: int,
                 swap_share: float | None, limit: float, score: Score | None) -> SearchResult:
    """`_find_cheapest` inside a budget: every plan evaluated costs at most `limit`.

    The prior and the grow phase run along the ranking restricted to what fits (each unit, most
    suspicious first, taken when the plan with it stays within the limit; the engine's price
    grows with every unit kept FP32, so every prefix fits too). A passing plan is then shrunk,
    certified and swapped as `_find_cheapest` does (removals and cheaper swaps stay within the
    limit). When nothing along the ranking passes, the cheapest-first fill (as many units as
    fit) is tried; when that fails too, the evaluated plan with the smallest `score` is
    returned, `over_budget`."""
    cand, seed_list, rank = _ordered(candidates, seeds, ranking)
    pos = {n: i for i, n in enumerate(rank)}
    oracle = Oracle(check, cand, max_evaluations, progress, price=price)

    def fill(order: Sequence[str]) -> list[str]:
        taken: list[str] = []
        for u in order:
            if price(frozenset([*taken, u])) <= limit:
                taken.append(u)
        return taken

    try:
        oracle.phase, oracle.remaining = "all-fp16", 1 + len(seed_list)
        if oracle(()):
            return _result(oracle, frozenset(), found=True, minimal=True)
        fitting = fill(rank)
        seeds_in = [u for u in fitting if u in set(seed_list)]
        current: frozenset[str] | None = None
        oracle.phase = "prior"
        if seeds_in and oracle(frozenset(seeds_in)):
            current = frozenset(seeds_in)
        elif fitting:
            current = _grow(oracle, fitting, len(seeds_in))
        if current is None:
            cheap = fill(sorted(cand, key=lambda u: (price(frozenset((u,))), pos.get(u, 0))))
            oracle.phase = "fill"
            if cheap and oracle.known(cheap) is None and oracle(cheap):
                current = frozenset(cheap)
        if current is None:
            return _best_within(oracle, price, limit, score)
        current = _bisecting_shrink(oracle, current, _costliest_first(current, price, pos))
        current = _certify_cost(oracle, current, price, pos)
        allowance = (max(1, int(swap_share * len(oracle.trials))) if swap_share is not None
                     else len(cand) ** 2)
        current, swaps = _swap(oracle, current, price, pos, adjacent, swap_k, allowance)
        result = _result(oracle, current, found=True, minimal=True)
        result.certificate = SearchCertificate(
            "cost", price(current),
            tuple(tuple(oracle.sorted(current - {x})) for x in oracle.sorted(current)),
            tuple(tuple(oracle.sorted(s)) for s in swaps),
            f"units adjacent in the data flow and cheaper in the plan's place, at most {swap_k} "
            f"per unit, at most {allowance} evaluated", limit_s=limit)
        return result
    except BudgetExhausted:
        passing = [t for t in oracle.trials if t.passed and price(frozenset(t.fp32)) <= limit]
        if passing:
            best = min(passing, key=lambda t: (price(frozenset(t.fp32)), t.index))
            return _result(oracle, frozenset(best.fp32), found=True, minimal=False, stopped=True)
        result = _best_within(oracle, price, limit, score)
        result.stopped_early = True
        return result


def _best_within(oracle: Oracle, price: Price, limit: float,
                 score: Score | None) -> SearchResult:
    """No plan within the limit passed: the evaluated one with the smallest error (then the
    cheapest), `over_budget`."""
    def err(plan: frozenset[str]) -> float:
        e = score(plan) if score is not None else None
        return float(e) if e is not None and e == e else math.inf

    inside = [t for t in oracle.trials if price(frozenset(t.fp32)) <= limit] or oracle.trials[:1]
    best = min(inside, key=lambda t: (err(frozenset(t.fp32)), price(frozenset(t.fp32)),
                                      t.index))
    result = _result(oracle, frozenset(best.fp32), found=True, minimal=False)
    result.over_budget = True
    return result


def _costliest_first(plan: Iterable[str], price: Price, pos: Mapping[str, int]) -> list[str]:
    """Removal order: the largest saving first (what leaving the unit out of the plan saves,
    boundary Casts included); equal savings, the least suspicious first."""
    plan = frozenset(plan)
    whole = price(plan)
    return sorted(plan, key=lambda x: (-(whole - price(plan - {x})), -pos.get(x, len(pos))))


def _bisecting_shrink(oracle: Oracle, plan: frozenset[str], order: list[str]) -> frozenset[str]:
    """Drop runs along `order`, doubling after a removal that passes; a run that fails holds
    a needed unit, and bisection finds the longest removable prefix of it (the unit after that
    prefix is needed). One needed unit among k costs about 2 log2(k) evaluations; every unit
    needed, one each."""
    oracle.phase = "shrink"

    def settle(plan: frozenset[str], i: int, lo: int) -> tuple:
        # removing run[:lo] passes and run[lo] is needed while the rest of the plan stays
        return ("run", plan - set(order[i:i + lo]), i + lo + 1, 1)

    def step(state: tuple) -> Ask | Done:
        while True:
            if state[0] == "run":
                _, plan, i, size = state
                if i >= len(order):
                    return Done(plan)
                run = order[i:i + size]
                trial = plan - set(run)
                # an empty trial is all-FP16: known to fail, not evaluated again
                return Ask(trial, ("run", trial, i + len(run), 2 * size),
                           ("bisect", plan, i, 0, len(run)), "shrink", len(order) - i)
            _, plan, i, lo, hi = state  # removing order[i:i+lo] passes, [i:i+hi] fails
            if hi - lo <= 1:
                state = settle(plan, i, lo)
                continue
            mid = (lo + hi) // 2
            return Ask(plan - set(order[i:i + mid]), ("bisect", plan, i, mid, hi),
                       ("bisect", plan, i, lo, mid), "shrink", len(order) - i)

    return oracle.walk(("run", plan, 0, 1), step)


def _certify_cost(oracle: Oracle, plan: frozenset[str], price: Price,
                  pos: Mapping[str, int]) -> frozenset[str]:
    """`_certify` with the largest saving tried first: a pass tries each unit's removal in
    that order (a removal that passes is kept and the pass goes on), until a pass removes
    none: the result is 1-minimal."""
    oracle.phase = "minimize"
    changed = True
    while changed:
        changed = False
        order = _costliest_first(plan, price, pos)
        while order:  # one batch while nothing passes
            oracle.remaining = sum(1 for y in plan if oracle.known(plan - {y}) is None)
            k = oracle.first(plan - {x} for x in order)
            if k is None:
                break
            plan, changed, order = plan - {order[k]}, True, order[k + 1:]
    return plan


def swap_neighbourhood(plan: frozenset[str], price: Price, pos: Mapping[str, int],
                       adjacent: Mapping[str, Sequence[str]], k: int = SWAP_K
                       ) -> list[frozenset[str]]:
    """The swaps the certificate tries: for each unit x of the plan, up to `k` units y
    adjacent to x (the most suspicious first) with `plan - x + y` cheaper than the plan; all
    of them, cheapest plan first."""
    whole = price(plan)
    out: dict[frozenset[str], float] = {}
    for x in sorted(plan, key=lambda u: pos.get(u, len(pos))):
        near = sorted((y for y in adjacent.get(x, ()) if y not in plan),
                      key=lambda y: pos.get(y, len(pos)))
        taken = 0
        for y in near:
            if taken >= k:
                break
            swapped = (plan - {x}) | {y}
            cost = price(swapped)
            if cost < whole:
                out.setdefault(swapped, cost)
                taken += 1
    return sorted(out, key=lambda s: (out[s], sorted(pos.get(u, len(pos)) for u in s)))


def _swap(oracle: Oracle, plan: frozenset[str], price: Price, pos: Mapping[str, int],
          adjacent: Mapping[str, Sequence[str]], k: int, allowance: int
          ) -> tuple[frozenset[str], list[frozenset[str]]]:
    """Try the cheaper swaps, cheapest first, up to `allowance` new evaluations in all; take
    the first that passes, make it 1-minimal again, repeat. Returns the plan and its
    certificate: the swaps tried on it, all failed."""
    while True:
        oracle.phase = "swap"
        trials, new = [], 0
        for t in swap_neighbourhood(plan, price, pos, adjacent, k):
            if oracle.known(t) is None:
                if new >= allowance:
                    break
                new += 1
            trials.append(t)  # one batch
        oracle.remaining = new
        before = len(oracle.trials)
        taken = oracle.first(trials)  # one batch
        allowance -= len(oracle.trials) - before
        if taken is None:
            return plan, trials
        plan = _certify_cost(oracle, trials[taken], price, pos)


def _split(items: list[str], n: int) -> list[list[str]]:
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def _result(oracle: Oracle, plan: frozenset[str], *, found: bool, minimal: bool,
            stopped: bool = False) -> SearchResult:
    return SearchResult(list(oracle.sorted(plan)), found, minimal and oracle.noisy is None,
                        len(oracle.trials), list(oracle.trials), stopped, rounds=oracle.rounds,
                        speculative=oracle.speculative, noisy=oracle.noisy)


def ddmin(
    candidates: Sequence[str],
    check: Check,
    max_evaluations: int | None = None,
    progress: Progress | None = None,
) -> SearchResult:
    """Plain ddmin over all candidates (subsets and complements), no prior.

    Starts from "everything FP32" and keeps the passing property while shrinking; the result
    is 1-minimal by construction (at full granularity every complement failed).
    """
    cand = list(dict.fromkeys(candidates))
    oracle = Oracle(check, cand, max_evaluations, progress)
    try:
        oracle.phase = "all-fp16"
        if oracle(()):
            return _result(oracle, frozenset(), found=True, minimal=True)
        oracle.phase = "all-fp32"
        if not oracle(cand):
            return _result(oracle, frozenset(cand), found=False, minimal=False)
        oracle.phase = "ddmin"
        return _result(oracle, _ddmin(oracle, cand), found=True, minimal=True)
    except BudgetExhausted:
        return _stopped(oracle, cand)


def _ddmin(oracle: Oracle, plan: Sequence[str]) -> frozenset[str]:
    """ddmin from a passing plan: subsets, then complements, at ever finer granularity; the
    result is 1-minimal (at full granularity every complement failed)."""
    current, n = list(plan), 2
    while len(current) >= 2:
        chunks = _split(current, n)
        oracle.remaining = 2 * len(chunks)
        reduced = False
        # the subsets, then the complements: one batch, the first that passes is taken
        rests = [[x for x in current if x not in set(chunk)] for chunk in chunks]
        tries = [*chunks, *(r for r in rests if r)]
        k = oracle.first(tries)
        if k is not None:
            current, n, reduced = tries[k], (2 if k < len(chunks) else max(n - 1, 2)), True
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return frozenset(current)
