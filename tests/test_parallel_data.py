"""Data parallelism on 2 gloo ranks equals the single-device run: DDP (with small buckets and with
gradient accumulation), ZeRO-1, ZeRO-2, ZeRO-3, and recomputation under them."""
from __future__ import annotations

import pytest

from dist_harness import check_against_reference, run_options, tiny_spec
from distperf.config import Layout

CASES = {
    "ddp": Layout(dp=2, micro_batch=2),
    "ddp-accumulate-small-buckets": Layout(dp=2, micro_batch=1, microbatches=2),
    "zero1": Layout(dp=2, micro_batch=2, zero=1),
    "zero2": Layout(dp=2, micro_batch=1, microbatches=2, zero=2),
    "zero3": Layout(dp=2, micro_batch=2, zero=3),
    "ddp-full-recompute": Layout(dp=2, micro_batch=1, microbatches=2, recompute="full"),
    "zero3-selective-recompute": Layout(dp=2, micro_batch=2, zero=3, recompute="selective"),
}


@pytest.mark.parametrize("name", CASES)
def test_data_parallel_equals_single_device(name):
    opts = run_options(bucket_mb=0.01) if "small-buckets" in name else None
    check_against_reference(CASES[name], opts=opts)


def test_ddp_untied_bert_equals_single_device():
    check_against_reference(Layout(dp=2, micro_batch=2), spec=tiny_spec(arch="bert", tied=False))


def test_ddp_with_adam_has_the_reference_losses():
    check_against_reference(Layout(dp=2, micro_batch=2), optimizer="adam", opts=run_options(lr=1e-2),
                            parameters=False)
