"""Waiting for the slowest rank: what a synchronization costs beyond its collective, by the compute before it.

Ranks that synchronize (DDP's gradient all-reduce, a tensor-parallel layer's all-reduces) leave the collective
together, when the last of them arrives. Two ranks given the same d seconds of work do not finish it together: on a
machine whose cores the ranks share with gloo's threads, the allocator and the rest of the system, each burst takes a
little more or less, so a synchronized step lasts the slowest rank's burst, not the typical one. The profiled mode's
parts are each rank's typical (median) times, the analytical mode's kernels one rank's; neither holds the wait.

The probe (:func:`skew_waits`, run by the calibration): every rank computes bursts of k forwards and backwards of one
layer of :data:`SKEW_PROBE` (a shape no preset has), the ranks aligned by an all-reduce of one number before each
burst and joined by another after it, and times each burst. For each k the wait is the median over the bursts of the
slowest rank's burst, less the mean over the ranks of each one's median burst: what one synchronization after d
seconds of compute adds to the step. (The median, as the runs' iteration is a median over their steps; the mean over
the bursts is kept beside it.) :func:`distperf.cost.kernels.sync_wait` interpolates the table in d.

On the 2-core machine, 5 December 2026, three rounds of this probe (``data/probes/skew-cpu-2c.json``; 3.5 to 224 ms
bursts) read waits of 0.7 to 4.3 % of the burst; an hour before, while the machine ran slower, bursts of the ``small``
preset's layer read 6 to 17 % as the mean over the bursts of the slowest rank's less its median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SKEW_PROBE = dict(name="skew-probe", layers=1, hidden=192, heads=4, vocab=16, seq=64)  # no preset's shape
SKEW_BURSTS = (1, 4, 16, 64)  # layer forwards and backwards per burst
SKEW_BURSTS_QUICK = (1, 8)
SKEW_UNITS = 1200  # layer passes per burst length (at least SKEW_MIN_BURSTS bursts)
SKEW_UNITS_QUICK = 80
SKEW_MIN_BURSTS = 40


def burst_count(units: int, total: int) -> int:
    """How many bursts of ``units`` layer passes the probe times: ``total`` passes' worth, at least
    :data:`SKEW_MIN_BURSTS`."""
    return max(SKEW_MIN_BURSTS, total // units)


def waits(per_rank: list[list[float]]) -> dict:
    """{burst_s, wait_s, mean_wait_s} of one burst length from each rank's burst times (``per_rank[r][i]``: rank r's
    i-th burst, all ranks aligned before it): the ranks' mean median burst, the median over the bursts of the slowest
    rank's one less it (at least 0), and the mean over the bursts of the slowest rank's one less it."""
    typical = statistics.fmean(statistics.median(times) for times in per_rank)
    slowest = [max(burst) for burst in zip(*per_rank)]
    return {"burst_s": typical, "wait_s": max(statistics.median(slowest) - typical, 0.0),
            "mean_wait_s": statistics.fmean(slowest) - typical}


def _rank(rank: int, world: int, bursts: tuple, total: int, out: str) -> None:
    """One rank of :func:`skew_waits` (spawned, gloo, one thread, pinned); rank 0 writes the rows to ``out``."""
    import torch
    import torch.distributed as dist

    from ..config import ModelSpec
    from ..model import Block, layer_input
    from .calibrate import join_spawned

    torch.set_num_threads(1)
    placement = [None] * world
    dist.all_gather_object(placement, join_spawned(rank, world, out, "gloo"))
    torch.manual_seed(0)
    spec = ModelSpec(**SKEW_PROBE)
    block = Block(spec)
    x = layer_input(spec, 1).requires_grad_(True)
    token = torch.zeros(1)
    rows = []
    for units in bursts:
        times = []
        for i in range(burst_count(units, total) + 2):  # the first two warm up
            dist.all_reduce(token)
            start = time.perf_counter()
            for _ in range(units):
                block(x).sum().backward()
            times.append(time.perf_counter() - start)
            dist.all_reduce(token)
        every = [None] * world
        dist.all_gather_object(every, times[2:])
        rows.append({"ranks": world, "units": units, **waits(every)})
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rows": rows, "placement": placement}, f)
    dist.destroy_process_group()


def skew_waits(ranks: int, bursts: tuple = SKEW_BURSTS, total: int = SKEW_UNITS, timeout: float = 300.0) -> dict:
    """{rows, placement}: per burst length in ``bursts`` (layer passes), ``{ranks, units, burst_s, wait_s,
    mean_wait_s}`` (:func:`waits`) on ``ranks`` pinned gloo ranks at once. TimeoutError past ``timeout``."""
    from .calibrate import spawned_ranks

    return spawned_ranks(_rank, ranks, lambda out: (ranks, tuple(bursts), total, out), timeout, "the skew probe")


def skew_table(rows: list[dict]) -> tuple:
    """The hardware profile's ``kernels.skew``: ((ranks, burst_s, wait_s), …) sorted, from :func:`skew_waits`'s
    rows."""
    return tuple(sorted((int(r["ranks"]), float(r["burst_s"]), float(r["wait_s"])) for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the rounds (JSON)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the probe (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are killed")
    args = parser.parse_args(argv)
    from ..atomic import write_text
    from ..results import provenance

    if args.rounds < 1:
        print(f"error: rounds: must be a whole number of at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    found = []
    for _ in range(args.rounds):
        try:
            found.append(skew_waits(2, timeout=args.timeout))
        except TimeoutError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for row in found[-1]["rows"]:
            print(f"round {len(found)}: bursts of {row['units']:3d} layers, {row['burst_s'] * 1e3:7.2f} ms: the "
                  f"slowest rank's {row['wait_s'] * 1e3:6.3f} ms longer ({row['wait_s'] / row['burst_s']:+.1%}; mean "
                  f"{row['mean_wait_s'] * 1e3:.3f} ms)")
    write_text(args.out, json.dumps({"provenance": provenance("cpu"), "ranks": 2, "rounds": found}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
