"""The timed steps: a barrier before each, on every rank and every trainer (PipeDream-2BW included, whose
activations stay in flight between steps); each rank on cores of its own (distperf.launch.pin_rank)."""
from __future__ import annotations

import os

import pytest
from dist_harness import spawn, tiny_spec

from distperf.config import Config, Layout, RunOptions, validate
from distperf.launch import available_cores, pin_rank


def _events(cfg, opts):
    """What each rank did, in order: 'barrier' (loop.step_barrier) and 'step' (the trainer's step)."""
    from distperf.parallel import loop

    events, barrier, build = [], loop.step_barrier, loop.build_trainer

    def recorded_barrier():
        events.append("barrier")
        barrier()

    def recorded_build(*args, **kwargs):
        trainer = build(*args, **kwargs)
        step = trainer.step

        def recorded_step(x, y):
            events.append("step")
            return step(x, y)

        trainer.step = recorded_step
        return trainer

    loop.step_barrier, loop.build_trainer = recorded_barrier, recorded_build
    result = loop.run_training(cfg, opts)
    return {"events": events, "flag": result["iteration_time_s"]["barrier_before_each_step"]}


@pytest.mark.parametrize("layout, barrier", [(dict(dp=2, micro_batch=2), True),
                                             (dict(pp=2, schedule="1f1b", micro_batch=1, microbatches=2), True),
                                             (dict(pp=2, schedule="2bw", micro_batch=1, microbatches=2), False)])
def test_every_rank_meets_the_others_before_each_step_but_under_2bw(layout, barrier):
    """2BW's steps overlap across ranks (the tied embedding's update of the last stage in step t waits for the
    first stage's step t + 1): a barrier between them deadlocks, so there is none."""
    cfg = validate(Config(model=tiny_spec(), layout=Layout(**layout)))
    ranks = spawn(_events, 2, cfg, RunOptions(steps=3, warmup=1, device="cpu"), timeout=60)
    assert [r["events"] for r in ranks] == [["barrier", "step"] * 3 if barrier else ["step"] * 3] * 2
    assert [r["flag"] for r in ranks] == [barrier] * 2


def test_each_rank_gets_cores_of_its_own_when_there_are_enough():
    before = available_cores()
    try:
        assert pin_rank(1, 2, threads=1, cores=[before[0]]) == {
            "pinned": False, "cores": [before[0]], "reason": "2 ranks on 1 cores: not pinned"}
        if len(before) >= 2:
            mine = pin_rank(1, 2, threads=4, cores=before)
            k = len(before) // 2
            assert mine == {"pinned": True, "cores": before[k:2 * k], "reason": ""}
            assert available_cores() == before[k:2 * k]
            assert pin_rank(0, 1, threads=1, cores=before)["cores"] == before[:1]  # no more cores than threads
            assert available_cores() == before[:1]
    finally:
        os.sched_setaffinity(0, before)
