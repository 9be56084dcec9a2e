"""Pipeline parallelism on 2 gloo ranks: GPipe, 1F1B and interleaved 1F1B equal the single-device run
(all partition kinds, tied and untied heads, recomputation); PipeDream-2BW, run through the same
trainer, follows W(t+1) = W(t) − ν∇f(W(t−1)) of a single-process simulation."""
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
}


@pytest.mark.parametrize("name", CASES)
def test_pipeline_equals_single_device(name):
    check_against_reference(CASES[name])


def test_pipeline_with_untied_head_equals_single_device():
    check_against_reference(CASES["1f1b"], spec=tiny_spec(tied=False))


def test_checks_of_torchs_schedules_come_before_any_process():
    from distperf.parallel.pipeline import check_pipeline

    spec = tiny_spec()
    for layout, field in ((Layout(pp=2, schedule="1f1b", microbatches=1), "microbatches"),
                          (Layout(pp=2, schedule="interleaved", chunks=2, microbatches=5), "microbatches"),
                          (Layout(pp=2, schedule="pipedream", microbatches=2), "schedule"),
                          (Layout(pp=2, schedule="2bw", microbatches=2, zero=1), "zero"),
                          (Layout(pp=2, schedule="2bw", microbatches=2, recompute="full"), "recompute")):
        with pytest.raises(ConfigError) as e:
            check_pipeline(validate(Config(model=spec, layout=layout)))
        assert e.value.field == field


# ---------------------------------------------------------------- PipeDream-2BW through the trainer
def _simulate_2bw(cfg, opts):
    """One process: batch t's gradient at W(max(t−1, 0)), applied to W(t) by the same optimizer."""
    import torch

    from distperf.data import make_source
    from distperf.model import build_model, lm_loss
    from distperf.parallel.common import make_optimizer, split_rows

    model, stale = build_model(cfg.model, opts.seed), build_model(cfg.model, opts.seed)
    optimizer = make_optimizer(model.parameters(), cfg.training, opts.lr)
    source = make_source(opts.data, cfg.model.vocab, cfg.model.seq, opts.seed)
    losses, dp, m = [], cfg.layout.dp, cfg.layout.microbatches
    for t in range(opts.steps):
        x, y = source.batch(t, cfg.layout.global_batch)
        stale.zero_grad()
        total = 0.0
        for r in range(dp):  # each replica's microbatches, gradients averaged over all of them
            for xi, yi in zip(split_rows(x, r, dp).chunk(m), split_rows(y, r, dp).chunk(m)):
                loss = lm_loss(stale(xi), yi) / (m * dp)
                loss.backward()
                total += loss.item()
        losses.append(total)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for p, q in zip(model.parameters(), stale.parameters()):
            p.grad = q.grad.clone()
        optimizer.step()
        with torch.no_grad():  # the next batch's gradient is taken at this update's starting point
            for n, q in stale.named_parameters():
                q.copy_(before[n])
    return {"losses": losses, "parameters": {n: p.detach() for n, p in model.named_parameters()}}


@pytest.mark.parametrize("dp, tp", [(1, 1), (2, 1), (1, 2)])
def test_2bw_trainer_follows_the_2bw_update_rule(dp, tp):
    """Plain, with two replicas per stage (width 2), and with tensor + sequence parallel stages."""
    from dist_harness import train_job

    spec = tiny_spec()
    layout = Layout(dp=dp, tp=tp, pp=2, schedule="2bw", micro_batch=1, microbatches=GLOBAL_BATCH // dp,
                    sequence_parallel=tp > 1)
    cfg = validate(Config(model=spec, layout=layout, training=Training(optimizer="sgd")))
    opts = run_options(steps=4)
    expected = spawn(_simulate_2bw, 1, cfg, opts)[0]
    results = spawn(train_job, cfg.layout.world_size, cfg, opts, timeout=90)
    for result in results:
        for loss, want in zip(result["losses"], expected["losses"]):
            assert relative_error(loss, want) <= TOLERANCE
        for name, value in result["parameters"].items():
            want = expected["parameters"]["tok.weight" if name == "head.weight" else name]
            assert relative_error(value, want) <= TOLERANCE, name
    vanilla = spawn(train_job, 1, validate(Config(model=spec, layout=Layout(micro_batch=GLOBAL_BATCH),
                                                  training=Training(optimizer="sgd"))), opts)[0]
    stale_update = results[0]["parameters"]["layers.0.mlp.fc.weight"]
    assert relative_error(stale_update, vanilla["parameters"]["layers.0.mlp.fc.weight"]) > 100 * TOLERANCE
