"""Pipeline parallelism on 2 gloo ranks: GPipe, 1F1B, interleaved 1F1B and PipeDream-Flush on the 2BW engine
equal the single-device run (all partition kinds, tied and untied heads, recomputation); PipeDream-2BW, run
through the same trainer, follows W(t+1) = W(t) − ν∇f(W(t−1)) of a single-process simulation."""
from __future__ import annotations

import pytest

from dist_harness import (GLOBAL_BATCH, TOLERANCE, check_against_reference, relative_error, run_options, spawn,
                          tiny_spec)
from distperf.config import Config, ConfigError, Layout, Training, validate

CASES = {
    "gpipe": Layout(pp=2, schedule="gpipe", micro_batch=1, microbatches=4),
    "1f1b": Layout(pp=2, schedule="1f1b", micro_batch=2, microbatches=2),
    "1f1b-partition-3-1": Layout(pp=2, schedule="1f1b", micro_batch=1, microbatches=4, partition=(3, 1)),
    "interleaved": Layout(pp=2, schedule="interleaved", chunks=2, micro_batch=1, microbatches=4),
    "1f1b-full-recompute": Layout(pp=2, schedule="1f1b", micro_batch=1, microbatches=4, recompute="full"),
    "interleaved-selective-recompute": Layout(pp=2, schedule="interleaved", chunks=2, micro_batch=1,
                                              microbatches=4, recompute="selective"),
    # PipeDream-Flush on the 2BW engine: a flush every step, so the ordinary update of one device
    "2bw-flush": Layout(pp=2, schedule="2bw-flush", micro_batch=1, microbatches=4),
    "2bw-flush-width-2": Layout(dp=2, pp=2, schedule="2bw-flush", micro_batch=1, microbatches=2),
}


@pytest.mark.parametrize("name", CASES)
def test_pipeline_equals_single_device(name):
    check_against_reference(CASES[name])


@pytest.mark.parametrize("name", ["1f1b", "2bw-flush"])
def test_pipeline_with_untied_head_equals_single_device(name):
    check_against_reference(CASES[name], spec=tiny_spec(tied=False))


def test_checks_of_torchs_schedules_come_before_any_process():
    from distperf.parallel.pipeline import check_pipeline

    spec = tiny_spec()
    for layout, field in ((Layout(pp=2, schedule="1f1b", microbatches=1), "microbatches"),
                          (Layout(pp=2, schedule="interleaved", chunks=2, microbatches=5), "microbatches"),
                          (Layout(pp=2, schedule="pipedream", microbatches=2), "schedule"),
                          (Layout(pp=2, schedule="2bw", microbatches=2, zero=1), "zero"),
                          (Layout(pp=2, schedule="2bw-flush", microbatches=2, zero=1), "zero")):
        with pytest.raises(ConfigError) as e:
            check_pipeline(validate(Config(model=spec, layout=layout)))
        assert e.value.field == field


# ---------------------------------------------------------------- PipeDream-2BW through the trainer
def _simulate_2bw(cfg, opts):
    from distperf.parallel.twobw_reference import simulate_2bw

    return simulate_2bw(cfg, opts)


@pytest.mark.parametrize("dp, tp, recompute", [(1, 1, "none"), (2, 1, "none"), (1, 2, "none"), (1, 1, "full")])
def test_2bw_trainer_follows_the_2bw_update_rule(dp, tp, recompute):
    """Plain, with two replicas per stage (width 2), with tensor + sequence parallel stages, and with
    full activation recomputation (which must rerun each forward with the weight version it used)."""
    from dist_harness import train_job

    spec = tiny_spec()
    layout = Layout(dp=dp, tp=tp, pp=2, schedule="2bw", micro_batch=1, microbatches=GLOBAL_BATCH // dp,
                    sequence_parallel=tp > 1, recompute=recompute)
    cfg = validate(Config(model=spec, layout=layout, training=Training(optimizer="sgd")))
    opts = run_options(steps=4)
    expected = spawn(_simulate_2bw, 1, cfg, opts)[0]
    results = spawn(train_job, cfg.layout.world_size, cfg, opts, timeout=90)
    held = set()
    for result in results:
        assert len(result["losses"]) == len(expected["losses"]) == opts.steps
        for loss, want in zip(result["losses"], expected["losses"]):
            assert relative_error(loss, want) <= TOLERANCE
        for name, value in result["parameters"].items():
            name = "tok.weight" if name == "head.weight" else name
            assert relative_error(value, expected["parameters"][name]) <= TOLERANCE, name
            held.add(name)
    assert held == set(expected["parameters"]), set(expected["parameters"]) ^ held  # every tensor compared
    vanilla = spawn(train_job, 1, validate(Config(model=spec, layout=Layout(micro_batch=GLOBAL_BATCH),
                                                  training=Training(optimizer="sgd"))), opts)[0]
    stale_update = results[0]["parameters"]["layers.0.mlp.fc.weight"]
    assert relative_error(stale_update, vanilla["parameters"]["layers.0.mlp.fc.weight"]) > 100 * TOLERANCE
