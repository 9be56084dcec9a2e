"""Memory by category from exact tensor accounting (distperf.measure.memory)."""
from __future__ import annotations

import torch
import torch.nn as nn

from dist_harness import spawn
from distperf import presets
from distperf.measure.memory import measure_step_memory
from distperf.model import build_model, lm_loss


def _adam_step(model, optimizer, vocab, seq, batch=2):
    def step():
        x = torch.randint(0, vocab, (batch, seq))
        lm_loss(model(x), x).backward()
        optimizer.step()
        optimizer.zero_grad()
    return step


def test_model_states_of_fp32_adam_are_4_4_8_bytes_per_parameter():
    spec = presets.model("tiny")
    model = build_model(spec)
    optimizer = torch.optim.Adam(model.parameters())
    psi = sum(p.numel() for p in model.parameters())  # the tied head counts once
    r = measure_step_memory(model, optimizer, _adam_step(model, optimizer, spec.vocab, spec.seq))
    assert (r["parameters"], r["gradients"], r["optimizer_states"]) == (4 * psi, 4 * psi, 8 * psi)
    assert r["other"] == 4 * len(list(model.parameters()))  # Adam's fp32 scalar step counters
    assert r["activations"] > 0 and r["temporaries"] > 0
    assert r["total"] == sum(r["at_peak"].values())
    assert r["total"] <= sum(r[k] for k in r["at_peak"])


def test_activations_are_the_tensors_saved_for_backward():
    """Two bias-free Linears on an (n, a) input: backward keeps x (n·a) and the hidden h (n·b)."""
    n, a, b, c = 8, 16, 32, 4
    model = nn.Sequential(nn.Linear(a, b, bias=False), nn.Linear(b, c, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(torch.randn(n, a)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    r = measure_step_memory(model, optimizer, step)
    assert r["activations"] == 4 * n * (a + b)
    assert r["optimizer_states"] == 0  # plain SGD keeps no state
    stash = [p.detach().clone() for p in model.parameters()]  # a second weight version, as 2BW keeps
    with_stash = measure_step_memory(model, optimizer, step, extra={"parameters": stash})
    assert with_stash["parameters"] == 2 * r["parameters"] == 2 * 4 * (a * b + b * c)


def _ddp_memory():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    spec = presets.model("tiny")
    results = []
    for zero_first in (False, True):  # the step clears gradients at its end, or at its start (as our trainers)
        model = build_model(spec)
        ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True, bucket_cap_mb=0.05)
        optimizer = torch.optim.Adam(ddp.parameters())
        step = _adam_step(ddp, optimizer, spec.vocab, spec.seq)
        if zero_first:
            step = (lambda inner: lambda: (optimizer.zero_grad(), inner()))(step)
        results.append(measure_step_memory(ddp, optimizer, step, warmup=2))
    return sum(p.numel() for p in model.parameters()), results


def test_model_states_under_ddp_with_two_gloo_ranks():
    for psi, results in spawn(_ddp_memory, 2, timeout=60):
        for r in results:
            # gradients are views of DDP's buckets: one storage per bucket, together exactly 4Ψ; what
            # autograd accumulates before DDP copies it into the bucket is a temporary
            assert (r["parameters"], r["gradients"], r["optimizer_states"]) == (4 * psi, 4 * psi, 8 * psi)
            assert r["at_peak"]["gradients"] == 4 * psi


def test_where_the_step_clears_gradients_does_not_change_the_categories():
    n, a, b = 8, 16, 32

    def measure(zero_first: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(a, b), nn.Linear(b, b))
        optimizer = torch.optim.Adam(model.parameters())

        def step():
            if zero_first:
                optimizer.zero_grad()
            model(torch.randn(n, a)).sum().backward()
            optimizer.step()
            if not zero_first:
                optimizer.zero_grad()

        return measure_step_memory(model, optimizer, step, warmup=2)

    first, last = measure(True), measure(False)
    for key in ("parameters", "gradients", "optimizer_states", "activations", "temporaries"):
        assert first[key] == last[key], key
