"""The held-out loss of a trained run (``run --eval-batches``, distperf.parallel.held_out): the same for every layout
that trains the same weights, different when the weights differ, and on data training never sees.

Real gloo ranks of the tiny model; a few seconds each.
"""
from __future__ import annotations

import torch
from dist_harness import GLOBAL_BATCH, relative_error, run_options, spawn, tiny_spec

from distperf.config import Config, Layout, Training, validate
from distperf.tokens import SyntheticTokens, TextCorpus


def held_out_job(cfg, opts):
    from distperf.parallel.loop import run_training

    return run_training(cfg, opts)["held_out_loss"]


def held_out(layout, untied=False, data="synthetic", **opts):
    cfg = validate(Config(model=tiny_spec(tied=not untied), layout=layout, training=Training(optimizer="sgd")))
    options = run_options(eval_batches=3, data=data, **opts)
    return spawn(held_out_job, cfg.layout.world_size, cfg, options, timeout=90)


PIPELINE = Layout(pp=2, schedule="1f1b", micro_batch=1, microbatches=GLOBAL_BATCH)


def test_every_layout_that_trains_the_same_weights_has_the_same_held_out_loss():
    """The tied head is the hard case: the last stage holds a copy of the token embedding under the head's name."""
    single = held_out(Layout(micro_batch=GLOBAL_BATCH))[0]
    untrained = held_out(Layout(micro_batch=GLOBAL_BATCH), steps=1, lr=1e-9)[0]
    assert single > 0 and relative_error(single, untrained) > 1e-3  # training moved it
    for layout in (PIPELINE, Layout(tp=2, micro_batch=GLOBAL_BATCH)):
        ranks = held_out(layout)
        assert len(ranks) == layout.world_size
        for loss in ranks:
            assert relative_error(loss, single) <= 1e-5, (layout, loss, single)
    stale = held_out(Layout(pp=2, schedule="2bw", micro_batch=1, microbatches=GLOBAL_BATCH))
    assert relative_error(stale[0], single) > 1e-5 and stale[0] == stale[1]  # 2BW's delayed update: other weights


def test_an_untied_head_and_text_data():
    single = held_out(Layout(micro_batch=GLOBAL_BATCH), untied=True, data="text")[0]
    assert all(relative_error(loss, single) <= 1e-5 for loss in held_out(PIPELINE, untied=True, data="text"))


def test_held_out_batches_are_never_training_batches():
    synthetic = SyntheticTokens(256, 16, seed=3)
    train = {tuple(synthetic.batch(step, 2)[0][0].tolist()) for step in range(50)}
    assert not train & {tuple(synthetic.held_out(i, 2)[0][0].tolist()) for i in range(50)}
    assert torch.equal(synthetic.held_out(4, 2)[0], synthetic.held_out(4, 2)[0])
    text = TextCorpus(32, seed=0)
    x, y = text.held_out(0, 4)
    validation = TextCorpus(32, seed=0, part="validation")
    assert torch.equal(x, validation.batch(0, 4)[0]) and torch.equal(y[:, :-1], x[:, 1:])
    assert len(validation.tokens) < len(text.tokens) / 5  # the last 10 % of the corpus


def test_eval_batches_is_checked(capsys):
    from distperf.cli import main

    assert main(["run", "--model", "tiny", "--eval-batches", "-1"]) == 2
    assert "eval_batches" in capsys.readouterr().err
