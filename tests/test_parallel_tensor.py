"""Megatron tensor parallelism (and sequence parallelism) on 2 gloo ranks equals the single-device run."""
from __future__ import annotations

import pytest

from dist_harness import check_against_reference, spawn, tiny_spec
from distperf.config import Layout

CASES = {
    "tp": Layout(tp=2, micro_batch=2, microbatches=2),
    "tp-sp": Layout(tp=2, micro_batch=4, sequence_parallel=True),
    "tp-sp-selective-recompute": Layout(tp=2, micro_batch=4, sequence_parallel=True, recompute="selective"),
    "tp-full-recompute": Layout(tp=2, micro_batch=4, recompute="full"),
}


@pytest.mark.parametrize("name", CASES)
def test_tensor_parallel_equals_single_device(name):
    check_against_reference(CASES[name])


def _shard_shapes(spec, sequence_parallel):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from distperf.model import build_model
    from distperf.parallel.mesh import init_distributed
    from distperf.parallel.tensor import apply_tensor_parallel

    init_distributed("cpu", 60)
    model = apply_tensor_parallel(build_model(spec), init_device_mesh("cpu", (2,)), sequence_parallel)
    out = {n: tuple((p.to_local() if isinstance(p, DTensor) else p).shape) for n, p in model.named_parameters()}
    x = torch.randint(spec.vocab, (2, spec.seq))
    residual = []
    model.layers["1"].register_forward_pre_hook(lambda m, a: residual.append(tuple(a[0].shape)))
    model(x)
    return out, residual[0]


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_megatron_sharding_of_each_layer(sequence_parallel):
    spec = tiny_spec()
    h, f = spec.hidden, spec.ffn
    shapes, residual = spawn(_shard_shapes, 2, spec, sequence_parallel)[0]
    assert shapes["layers.0.attn.qkv.weight"] == (3 * h // 2, h)  # column-parallel, bias sharded too
    assert shapes["layers.0.attn.qkv.bias"] == (3 * h // 2,)
    assert shapes["layers.0.attn.proj.weight"] == (h, h // 2)  # row-parallel, bias replicated
    assert shapes["layers.0.attn.proj.bias"] == (h,)
    assert shapes["layers.0.mlp.fc.weight"] == (f // 2, h) and shapes["layers.0.mlp.out.weight"] == (h, f // 2)
    assert shapes["tok.weight"] == (spec.vocab, h) and shapes["layers.0.ln1.weight"] == (h,)  # replicated
    assert residual == ((2, spec.seq // 2, h) if sequence_parallel else (2, spec.seq, h))


def test_with_dropout_the_tensor_parallel_replicas_stay_identical():
    """Dropout in the replicated (and sequence-parallel) regions draws the same mask on every tp rank
    (same seed, same order of random calls), so replicated parameters never drift apart."""
    from dist_harness import relative_error, run_options, train_job
    from distperf.config import Config, Training, validate

    cfg = validate(Config(model=tiny_spec(dropout=0.1), layout=Layout(tp=2, micro_batch=4, sequence_parallel=True),
                          training=Training(optimizer="sgd")))
    a, b = spawn(train_job, 2, cfg, run_options())
    assert a["losses"] == b["losses"]
    for name, value in a["parameters"].items():
        assert relative_error(value, b["parameters"][name]) == 0.0, name
