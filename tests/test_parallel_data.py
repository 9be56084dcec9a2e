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


def _ddp_buckets(caps, tied):
    """How many buckets torch's DDP all-reduces per step once it has rebuilt them (its third step), at each cap."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from distperf.model import build_model

    dist.init_process_group("gloo")
    spec, counts = tiny_spec(tied=tied), []
    for cap in caps:
        model = DistributedDataParallel(build_model(spec), bucket_cap_mb=cap, gradient_as_bucket_view=True)
        tokens = torch.randint(0, spec.vocab, (1, spec.seq))
        for _ in range(3):
            model(tokens).sum().backward()
        counts.append(model._get_ddp_logging_data()["num_buckets_reduced"])
    return counts


@pytest.mark.parametrize("tied", [True, False])
def test_the_cost_model_counts_the_buckets_ddp_makes(tied):
    from dist_harness import spawn
    from distperf.cost.stage import Span, ddp_buckets

    spec = tiny_spec(tied=tied)
    caps = (0.001, 0.005, 0.01, 0.02, 0.05, 1.0)  # MiB: from one bucket per tensor to one for everything
    measured = spawn(_ddp_buckets, 2, caps, tied)[0]
    counted = [ddp_buckets(spec, 1, 1, Span(spec.layers, True, True), 4, int(cap * 2**20))[0] for cap in caps]
    assert counted == measured
    assert len(set(measured)) > 3  # the caps span the regimes
