"""The wait clock: the seconds a pipeline rank's own thread spends posting its sends and receives and waiting on
them, read on the timed steps themselves, without a profiler.

A pipeline engine (torch's ``torch.distributed.pipelining`` schedules, PipeDream-2BW's hand-written one) posts every
transfer from Python (``ProcessGroup.send`` and ``.recv``, which ``dist.isend`` and ``dist.irecv`` call) and waits on
it from Python (``Work.wait``); a synchronous collective inside the step (``dist.all_reduce``) also waits through
``Work.wait``. On gloo, whose transfers run on its own threads, the time inside these calls on the rank's main thread
is the step's communication: the sends and receives that the work in between does not hide, and the waits for the
neighbouring stage, the bubble among them. The clock wraps the three methods for as long as it runs and adds up, on
the thread that started it, the time spent inside them (perf_counter; some 40 calls per step of a two-stage pipeline
at m = 8, a few microseconds each); calls made inside another one of them count once.

Why a clock beside the profiler's breakdown (:mod:`distperf.measure.breakdown`): the profiler lengthens a pipeline's
waits unevenly. On 6 December 2026, `small` on two stages, micro-batch 2, m = 8, rank 0 spent 40 ms of a profiled GPipe
step inside communication against 29 ms under 1F1B (a median of ten steps each, two runs), while the same rank's
unprofiled steps, read by wrapping torch's ``_batch_p2p`` and ``_wait_batch_p2p``, spent 19-23 ms per step under
GPipe and 18-20 ms under 1F1B (the mean over each run's nine steps): the profiled GPipe step posted receives that
blocked for about 5-7 ms each (``c10d::recv_``) while its neighbour's eight sends were pending. Whether the book's
goal reads a pipeline's exposed communication on this clock was a rule declared before the build that judged it
(:func:`distperf.analysis.time_model.wait_clock_rule`): on afd1f12 it did not stand (the clock's repeats spread more),
so the goal stays on the breakdown steps and the clock is reported beside them; over six runs each of GPipe and 1F1B
(``scripts/pipeline_instruments.py``) the breakdown steps read more than the clock on most runs of both schedules.

Only on gloo: under NCCL ``Work.wait`` returns once the GPU stream waits, not when the transfer is done.
"""
from __future__ import annotations

import threading
import time

import torch.distributed as dist


class WaitClock:
    """``with WaitClock() as clock:`` then ``clock.seconds`` (a running total; read it around each step) and
    ``clock.by_call`` (the same by method: ``send`` and ``recv``, posting a transfer, and ``wait``). Wraps
    ``ProcessGroup.send``, ``ProcessGroup.recv`` and ``Work.wait`` while inside; counts the calls made on the thread
    that entered it."""

    METHODS = ((dist.distributed_c10d.ProcessGroup, "send"), (dist.distributed_c10d.ProcessGroup, "recv"),
               (dist.distributed_c10d.Work, "wait"))

    def __init__(self):
        self.seconds = 0.0
        self.by_call = {name: 0.0 for _, name in self.METHODS}
        self._thread = None  # the thread that enters it
        self._depth = 0
        self._originals: list = []

    def _timed(self, original, name: str):
        def call(obj, *args, **kwargs):
            if threading.get_ident() != self._thread or self._depth:
                return original(obj, *args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return original(obj, *args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.seconds += spent
                self.by_call[name] += spent
                self._depth -= 1

        return call

    def __enter__(self):
        self._thread = threading.get_ident()
        for cls, name in self.METHODS:
            # restored from the class's own dict: getattr unwraps pybind's method into a function that binds no self
            self._originals.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, self._timed(getattr(cls, name), name))
        return self

    def __exit__(self, *exc):
        for cls, name, original in reversed(self._originals):
            setattr(cls, name, original)
        self._originals.clear()
        return False


def clocked(distributed: bool, backend: str | None, pp: int) -> bool:
    """Whether a run keeps the wait clock: a pipeline (pp > 1) over gloo."""
    return distributed and pp > 1 and backend == "gloo"


def summary(per_step: list[float], warmup: int, by_call: list[dict] | None = None) -> dict:
    """A rank's clock: ``median`` over its timed steps after ``warmup`` (all when none is left, as the iteration's
    median), ``steps``, every step's seconds, and with ``by_call`` (a dict per step: seconds per method,
    :attr:`WaitClock.by_call`) ``by_call``, each method's median over the same steps (the medians need not add up to
    the whole's)."""
    import statistics

    def median(values: list) -> float | None:
        timed = values[warmup:] or values
        return statistics.median(timed) if timed else None

    out = {"median": median(per_step), "steps": list(per_step)}
    if by_call:
        out["by_call"] = {name: median([step[name] for step in by_call]) for name in by_call[0]}
    return out
