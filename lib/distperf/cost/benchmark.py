"""How fast the cost model is: ``python -m distperf.cost.benchmark [--count N]``, and how fast the
planner is: ``python -m distperf.cost.benchmark --planner`` (2240-layer GPT on 1024 V100s, cold caches).

Builds a grid of valid configurations (models from the presets × dp × tp × pp × schedule × microbatches
× ZeRO stage × recomputation × precision), then times :func:`distperf.cost.predict` over the first N of
them in grid order (as a sweep visits them) or shuffled, validation included, each pass from cold caches, and prints
configurations per second of CPU time (what the code costs; the grid, built first, is frozen out of the garbage
collector's scans): the median of ``--repeats`` passes (5) and their range,
since one pass on a shared machine is an anecdote; ``--hardware FILE`` times it on a calibrated profile, whose
measured kernels switch on the kernel time model. A benchmark, not a test: nothing asserts on the number.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import time

from ..config import Config, ConfigError, Layout, Training, validate
from ..hardware import PRESETS, Hardware
from ..presets import MODELS
from .predict import clear_caches, predict

GRID_MODELS = ("bert-large", "gpt2-xl", "megatron-7.5b", "megatron-145.6b", "gpt3-175b", "2bw-gpt-2.2b", "small")


def grid(count: int) -> list[Config]:
    """The first ``count`` valid configurations of a fixed grid (in a fixed order, so runs compare)."""
    configs = []
    axes = itertools.product(GRID_MODELS, (1, 2, 8, 64), (1, 2, 8), (1, 2, 4, 8, 16),
                             ("1f1b", "gpipe", "interleaved", "2bw", "pipedream"), (1, 8, 32, 128), (0, 1, 2, 3),
                             ("none", "selective", "full"), ("mixed", "fp32"), (1, 4))
    for name, dp, tp, pp, schedule, m, zero, recompute, precision, b in axes:
        if pp == 1 and schedule not in ("1f1b", "gpipe"):
            continue
        layout = Layout(dp=dp, tp=tp, pp=pp, sequence_parallel=tp > 1 and recompute == "selective",
                        schedule=schedule if pp > 1 else "none", chunks=2 if schedule == "interleaved" else 1,
                        micro_batch=b, microbatches=m, zero=zero, recompute=recompute)
        cfg = Config(model=MODELS[name], layout=layout, training=Training(precision=precision))
        try:
            validate(cfg)
        except ConfigError:
            continue
        configs.append(cfg)
        if len(configs) == count:
            break
    return configs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=_positive, default=100_000, help="configurations to evaluate (default 10^5)")
    parser.add_argument("--shuffle", action="store_true",
                        help="evaluate in a random order (seeded), so that consecutive configurations share less "
                             "of what the cost model caches")
    parser.add_argument("--hardware", default="A100-80GB",
                        help="a preset or a profile file (one with measured kernels times the kernel time model)")
    parser.add_argument("--planner", action="store_true",
                        help="time the planner instead: 2bw-gpt-28.3b (2240 layers) on 1024 V100-16GB, 8 per node, "
                             "25 Gbit/s per node, global batch 2048, from cold caches (best and median of 5)")
    parser.add_argument("--repeats", type=_positive, default=5, help="passes over the grid, each from cold caches "
                                                                     "(default 5): the median and range are printed")
    args = parser.parse_args(argv)
    if args.planner:
        return planner_benchmark()
    configs = grid(args.count)
    if args.shuffle:
        random.Random(0).shuffle(configs)
    # the grid is the benchmark's input, 10^5 configurations of four objects each held at once: out of the garbage
    # collector's full scans, which would otherwise walk them while predict runs (a sweep that builds each
    # configuration as it goes holds no such heap)
    gc.collect()
    gc.freeze()
    from ..hardware import hardware

    rates = rates_per_cpu_second(configs, hardware(args.hardware), args.repeats)
    print(f"{len(configs):,} configurations: {statistics.median(rates):,.0f} per CPU second, the median of "
          f"{len(rates)} passes from cold caches ({min(rates):,.0f} to {max(rates):,.0f})")
    return 0


def rates_per_cpu_second(configs: list[Config], hw: Hardware | None = None, repeats: int = 1,
                         cold: bool = True) -> list[float]:
    """Configurations predicted per CPU-second in each of ``repeats`` passes over ``configs`` in their order, each
    from cold caches (``cold``), or with whatever the caches hold."""
    rates = []
    for _ in range(repeats):
        if cold:
            clear_caches()
        start = time.process_time()
        for cfg in configs:
            predict(cfg, hw)
        rates.append(len(configs) / (time.process_time() - start))
    return rates


def _positive(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def planner_benchmark(repeats: int = 5) -> int:
    from ..planner import candidates, plan

    model = MODELS["2bw-gpt-28.3b"]
    times = []
    for _ in range(repeats):
        clear_caches()
        start = time.perf_counter()
        result = plan(model, 1024, PRESETS["V100-16GB"], 2048, gpus_per_node=8, node_bandwidth=25e9 / 8)
        times.append(time.perf_counter() - start)
    times.sort()
    print(f"planner: {model.name} ({model.layers} layers) on 1024 devices, {len(candidates(model, 1024))} candidates "
          f"({len(result['plans'])} fit): best {times[0]:.3f} s, median {times[len(times) // 2]:.3f} s wall-clock")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
