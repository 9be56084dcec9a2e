"""First probe of analytical time terms on one device: each class of a measured step
(:mod:`distperf.measure.breakdown`) beside an estimate from microbenchmarks alone.

    python scripts/time_terms_probe.py

Constants (microbenchmarks at no preset's shape): the square-GEMM rate by n, priced at n_eff = (m·n·k)^(1/3); fused
attention forward + backward at one shape (b = 1, a = 2, s = 64, d = 16); Adam's step per tensor on 8-element
tensors; copy bandwidth. Validation: the tiny, small and medium presets at micro-batch 1, 2 and 4, wide at 1, one
thread. It prints each class measured and estimated with the signed error. The estimates are first cuts, the
starting point of a time model that prices each class; they are not part of :func:`distperf.cost.predict`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from distperf import presets
from distperf.config import Config, Layout, RunOptions, validate
from distperf.measure.breakdown import StepBreakdown
from distperf.parallel.single import SingleDeviceTrainer

SIZES = (16, 32, 64, 128, 256, 512, 1024)
VALIDATION = {"tiny": (1, 2, 4), "small": (1, 2, 4), "medium": (1, 2, 4), "wide": (1,)}  # preset: micro-batches


def median_time(fn, min_run_time: float = 0.3) -> float:
    return Timer(stmt="f()", globals={"f": fn}).blocked_autorange(min_run_time=min_run_time).median


def square_gemm_rates() -> dict[int, float]:
    rates = {}
    for n in SIZES:
        a, b = torch.randn(n, n), torch.randn(n, n)
        rates[n] = 2 * n**3 / median_time(lambda: torch.mm(a, b))
    return rates


def gemm_rate(rates: dict[int, float], m: int, n: int, k: int) -> float:
    """The square table's rate at n_eff = (m·n·k)^(1/3), interpolated in log-log, clamped at the ends."""
    size, sizes = (m * n * k) ** (1 / 3), sorted(rates)
    if size <= sizes[0] or size >= sizes[-1]:
        return rates[sizes[0] if size <= sizes[0] else sizes[-1]]
    lo, hi = next((lo, hi) for lo, hi in zip(sizes, sizes[1:]) if lo <= size <= hi)
    w = (math.log(size) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return rates[lo] ** (1 - w) * rates[hi] ** w


def attention_rate() -> float:
    """Counted FLOPs (3 × 4·b·s²·h: forward and a backward of twice the forward) per second of fused attention."""
    q, k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(3))

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    return 3 * 4 * 64 * 64 * 32 / median_time(step)


def adam_seconds_per_tensor(tensors: int = 50) -> float:
    params = [torch.nn.Parameter(torch.randn(8)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(8)
    optimizer = torch.optim.Adam(params)
    return median_time(optimizer.step) / tensors


def copy_bandwidth() -> float:
    src = torch.randn(4 << 20)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / median_time(lambda: dst.copy_(src))


def measured_classes(name: str, micro_batch: int) -> tuple[dict, SingleDeviceTrainer]:
    spec = presets.model(name)
    cfg = validate(Config(model=spec, layout=Layout(micro_batch=micro_batch)))
    trainer = SingleDeviceTrainer(cfg, RunOptions(seed=0), torch.device("cpu"))
    tokens = torch.randint(0, spec.vocab, (micro_batch, spec.seq + 1))
    for _ in range(2):
        trainer.step(tokens[:, :-1], tokens[:, 1:])
    with StepBreakdown() as tracked:
        trainer.step(tokens[:, :-1], tokens[:, 1:])
    return tracked.summary(), trainer


def estimates(name: str, b: int, trainer, rates, attention, adam, bandwidth) -> dict:
    spec = presets.model(name)
    s, h, f, layers, vocab = spec.seq, spec.hidden, spec.ffn, spec.layers, spec.vocab
    m = b * s
    shapes = [(m, 3 * h, h), (m, h, h), (m, f, h), (m, h, f)]  # QKV, projection, MLP in, MLP out
    matrix = layers * sum(3 * 2 * x * y * z / gemm_rate(rates, x, y, z) for x, y, z in shapes)
    matrix += 3 * 2 * m * vocab * h / gemm_rate(rates, m, vocab, h)  # the head
    params = list(trainer.model.parameters())
    return {"matrix_products": matrix, "attention": layers * 3 * 4 * b * s * s * h / attention,
            "optimizer": len(params) * adam + sum(p.numel() for p in params) * 4 * 7 / bandwidth}


def main() -> None:
    torch.set_num_threads(1)
    rates, attention, adam, bandwidth = square_gemm_rates(), attention_rate(), adam_seconds_per_tensor(), \
        copy_bandwidth()
    print(f"constants: GEMM {rates[512] / 1e9:.0f} GFLOP/s at n = 512, attention {attention / 1e9:.1f} GFLOP/s, "
          f"Adam {adam * 1e6:.1f} µs per tensor, copy {bandwidth / 1e9:.1f} GB/s")
    for name, batches in VALIDATION.items():
        for b in batches:
            measured, trainer = measured_classes(name, b)
            guess = estimates(name, b, trainer, rates, attention, adam, bandwidth)
            cells = [f"{c} {measured[c] * 1e3:.2f} ms vs {guess[c] * 1e3:.2f} ({guess[c] / measured[c] - 1:+.0%})"
                     for c in guess]
            rest = (f"other operators {measured['other_operators'] * 1e3:.2f} ms, framework "
                    f"{measured['framework'] * 1e3:.2f} ms, step {measured['window'] * 1e3:.2f} ms")
            print(f"{name:6s} b={b}: " + " | ".join(cells) + " | " + rest)


if __name__ == "__main__":
    main()
