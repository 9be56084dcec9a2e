"""The wait clock (distperf.measure.wait_clock) on real gloo ranks, and its summary."""
import threading
import time

import pytest
from dist_harness import spawn

from distperf.measure import wait_clock
from distperf.measure.wait_clock import WaitClock

LATE = 0.3  # seconds rank 1 sleeps before it sends


def _late_sender():
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    PG, Work = dist.distributed_c10d.ProcessGroup, dist.distributed_c10d.Work
    before = (PG.__dict__["send"], PG.__dict__["recv"], Work.__dict__["wait"])
    x = torch.zeros(1000)
    other = {}
    with WaitClock() as clock:
        dist.barrier()
        start = clock.seconds
        if dist.get_rank() == 0:
            work = dist.irecv(x, src=1)
            other["w"] = dist.barrier(async_op=True)
            work.wait()
        else:
            time.sleep(LATE)
            dist.isend(torch.ones(1000), dst=0).wait()
            other["w"] = dist.barrier(async_op=True)
        waited = clock.seconds - start
    other["w"].wait()
    restored = (PG.__dict__["send"], PG.__dict__["recv"], Work.__dict__["wait"]) == before
    after = clock.seconds
    dist.barrier()  # outside the clock: the wrappers are gone
    return {"waited": waited, "restored": restored, "unchanged": clock.seconds == after, "got": float(x.sum()),
            "by_call": dict(clock.by_call), "seconds": clock.seconds}


def test_the_wait_clock_counts_this_threads_sends_receives_and_waits():
    late_waiter, sender = spawn(_late_sender, 2, timeout=60)
    assert late_waiter["got"] == 1000  # the transfer went through the wrapped calls
    assert late_waiter["waited"] >= LATE / 2  # rank 0 waited for the late sender, on its own thread
    assert sender["waited"] < late_waiter["waited"]  # the sender slept outside the clock's calls
    assert all(r["restored"] and r["unchanged"] for r in (late_waiter, sender))
    assert late_waiter["by_call"]["wait"] >= LATE / 2 and late_waiter["by_call"]["recv"] < late_waiter["waited"]
    assert all(sum(r["by_call"].values()) == pytest.approx(r["seconds"]) for r in (late_waiter, sender))


class _Calls:
    """Stands for the wrapped methods: each call takes at least ``PAUSE``; ``outer`` calls ``inner``."""
    PAUSE = 0.02

    def inner(self):
        time.sleep(self.PAUSE)

    def outer(self):
        self.inner()
        time.sleep(self.PAUSE)


class _Clock(WaitClock):
    METHODS = ((_Calls, "inner"), (_Calls, "outer"))


def test_the_clock_counts_its_own_thread_once_per_outermost_call():
    calls = _Calls()
    with _Clock() as clock:
        side = threading.Thread(target=calls.outer)  # another thread's calls are not this thread's waiting
        side.start()
        side.join()
        assert clock.seconds == 0.0
        calls.outer()  # inner inside outer counts once, with outer
        once = clock.seconds
        assert clock.by_call == {"inner": 0.0, "outer": once}
        calls.inner()
    assert once >= 2 * _Calls.PAUSE and clock.seconds - once >= _Calls.PAUSE
    assert clock.by_call["inner"] == clock.seconds - once and sum(clock.by_call.values()) == clock.seconds
    assert (_Calls.inner.__qualname__, _Calls.outer.__qualname__) == ("_Calls.inner", "_Calls.outer")  # restored
    seconds = clock.seconds
    calls.outer()
    assert clock.seconds == seconds


def test_the_clock_summary_is_the_median_of_the_timed_steps():
    assert wait_clock.summary([9.0, 5.0, 1.0, 3.0, 2.0], warmup=2) == {"median": 2.0,
                                                                      "steps": [9.0, 5.0, 1.0, 3.0, 2.0]}
    assert wait_clock.summary([4.0, 6.0], warmup=2)["median"] == 5.0  # no step left after warm-up: all of them
    assert wait_clock.summary([], warmup=0)["median"] is None
    calls = [{"send": 1.0, "wait": 8.0}, {"send": 2.0, "wait": 4.0}, {"send": 3.0, "wait": 6.0}]
    assert wait_clock.summary([9.0, 6.0, 9.0], warmup=1, by_call=calls)["by_call"] == {"send": 2.5, "wait": 5.0}


@pytest.mark.parametrize("distributed, backend, pp, kept", [
    (True, "gloo", 2, True), (True, "gloo", 1, False), (True, "nccl", 2, False), (False, None, 2, False)])
def test_only_a_pipeline_over_gloo_keeps_the_clock(distributed, backend, pp, kept):
    assert wait_clock.clocked(distributed, backend, pp) is kept
