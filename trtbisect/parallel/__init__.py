"""Evaluations in parallel (#23): worker processes on this machine, or Ray actors on a cluster.

The search (search.py) proposes batches of plans and takes their results in its sequential
order; this package runs them. Each worker builds the run's own judge (the emulator session
of `judge.SampleJudge`, the run's criteria, the same intra-op thread count) from a small
`JudgeSpec` and reads the run's samples and FP32 references from files (local workers) or
Ray's object store, so its numbers are the in-process judge's, bit for bit.

* `judge.py`: the judge of a plan on samples, shared by the in-process evaluator and every
  worker, and the rule that merges sample chunks into the sequential verdict.
* `pool.py`: local worker processes (spawned), a dead worker replaced and its task retried.
* `ray_pool.py`: the same workers as Ray actors (`pip install trtbisect[ray]`).
* `sizing.py`: how many workers fit the machine's cores and memory.
* `trt_pool.py`: `--backend trt --workers N`: the TensorRT search's plans built on up to N
  visible GPUs, one worker process per GPU (tested on the fake TensorRT only).
* `batch.py`: the search's `Batch` over the run's evaluator and a pool: journal and scores in
  the order the search takes results. It drives the evaluator (stages/evaluator.py), which
  judges with `judge.py`: import it as `parallel.batch`, never from this package's face, or
  the evaluator would import itself through it.
"""

from .judge import JudgeSpec, Measured, SampleJudge, judge_one, take
from .sizing import WorkerPlan, plan_workers

__all__ = ["JudgeSpec", "Measured", "SampleJudge", "WorkerPlan", "judge_one", "plan_workers",
           "take"]
