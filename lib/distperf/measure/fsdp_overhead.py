"""What FSDP2 computes around a layer beyond the layer itself: ``python -m distperf.measure.fsdp_overhead``.

The profiled mode times each rank's part as a plain layer at the shard's shapes (:mod:`distperf.measure.parts`), so
nothing FSDP2 does per unit enters either mode but its collectives and a per-unit Python cost. This probe runs one
Transformer layer (:class:`distperf.model.Block`) forward and backward on two gloo ranks at once, pinned to a core
each as a run's ranks are, first plain and then under ``fully_shard`` (ZeRO-3: ``reshard_after_forward=True``; or
ZeRO-2), and prints each one's median step and, from torch's profiler, the operators that took most of rank 0's
step by self time (communication included: FSDP2's collectives are in the sharded step). A probe, not part of the
model: the chapter "Where the time goes" quotes what it measured.

What the calibration keeps of the same measurement is :func:`fsdp_unit_times`: one layer of widths no preset has, plain
and under ``fully_shard`` with and without gradient synchronization, from which
:func:`distperf.measure.path_fits.fsdp_unit_table` prices a unit by its size: a what-if of the book since that table
left the model (its rule failed on two of the three archives that measured it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from ..config import ConfigError
from ..presets import MODELS
from .calibrate import join_spawned, spawned_ranks

MAX_LAYER_ELEMENTS = 2**28


def _rank(rank: int, model: str, zero: int, steps: int, top: int, out: str) -> None:
    """One of the two ranks (spawned): times the plain layer, then the sharded one; rank 0 writes the results."""
    import json

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    from ..model import Block

    torch.set_num_threads(1)
    placement = join_spawned(rank, 2, out, "gloo")
    spec = MODELS[model]
    x = torch.randn(1, spec.seq, spec.hidden)
    results = {"placement": placement}
    for name in ("plain", "sharded"):
        torch.manual_seed(0)
        block = Block(spec)
        if name == "sharded":
            fully_shard(block, mesh=init_device_mesh("cpu", (2,)), reshard_after_forward=zero == 3)

        def step():
            block(x).sum().backward()

        for _ in range(2):
            step()
        times = []
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
        ops = sorted(((e.key, e.self_cpu_time_total / 1e6 / steps, e.count / steps) for e in prof.key_averages()),
                     key=lambda op: -op[1])
        results[name] = {"median_s": statistics.median(times), "steps_s": times, "ops": ops[:top]}
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def _units_rank(rank: int, world: int, hiddens: tuple, reps: int, out: str) -> None:
    """One rank of :func:`fsdp_unit_times` (spawned); rank 0 writes the rows."""
    import json

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ..model import Block, layer_input
    from .path_fits import fsdp_unit_probe_spec
    from .speed import slowest

    torch.set_num_threads(1)
    placement = join_spawned(rank, world, out, "gloo")
    mesh = init_device_mesh("cpu", (world,))
    rows = []
    for zero in (2, 3):
        for hidden in hiddens:
            spec = fsdp_unit_probe_spec(hidden)
            x = layer_input(spec, 1)
            torch.manual_seed(0)
            plain = Block(spec)
            torch.manual_seed(0)
            sharded = fully_shard(Block(spec), mesh=mesh, reshard_after_forward=zero == 3)

            def timed(block) -> float:
                dist.barrier()
                start = time.perf_counter()
                block(x).sum().backward()
                return time.perf_counter() - start

            times = {"plain_s": [], "nosync_s": [], "sync_s": []}
            for _ in range(reps + 2):  # the three in turn, so that the machine's drift touches each alike
                times["plain_s"].append(timed(plain))
                for sync in (False, True):
                    sharded.set_requires_gradient_sync(sync)
                    times["sync_s" if sync else "nosync_s"].append(timed(sharded))
            rows.append({"hidden": hidden, "zero": zero,
                         **{name: slowest(statistics.median(seconds[2:])) for name, seconds in times.items()}})
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rows": rows, "placement": placement, "reps": reps}, f)
    dist.destroy_process_group()


def fsdp_unit_times(ranks: int, hiddens: tuple, reps: int = 9, timeout: float = 600.0) -> dict:
    """{rows, placement, reps}: per ZeRO stage (2, 3) and width in ``hiddens``, the slowest rank's median seconds of
    ``reps`` forwards and backwards (after two, each behind a barrier) of one layer of
    :func:`distperf.measure.path_fits.fsdp_unit_probe_spec` at micro-batch 1 on ``ranks`` pinned gloo ranks at once:
    plain (``plain_s``), and the same layer under ``fully_shard`` without gradient synchronization (``nosync_s``: its
    gathers, as every microbatch but the last runs them) and with it (``sync_s``: the reduce-scatter too), the three
    in turn at every repetition. TimeoutError past ``timeout``.

    Why in turn: until 5 December 2026 each ran its repetitions in a block of its own, and a slow spell of the machine
    could fall on one of them: on the first build with the probe the widest layer's ZeRO-3 no-sync step took 479 ms,
    longer than its synchronized step (396 ms), and the table read 269 ms per microbatch for that unit where the three
    rounds run alone the same day, priced on the same profile, read 48 to 92 ms."""
    return spawned_ranks(_units_rank, ranks, lambda out: (ranks, tuple(hiddens), reps, out), timeout,
                         "the FSDP2 unit probe")


def fsdp_overhead(model: str = "wide", zero: int = 3, steps: int = 10, top: int = 12, timeout: float = 300.0) -> dict:
    """{placement, plain, sharded}: each with ``median_s`` (a forward and backward of one layer at micro-batch 1),
    ``steps_s`` and ``ops`` ([name, self seconds per step, calls per step] of rank 0, the ``top`` largest); raises
    ConfigError for a model or ZeRO stage it cannot run and TimeoutError past ``timeout``."""
    if model not in MODELS:
        raise ConfigError("model", f"must be one of {', '.join(sorted(MODELS))}, got {model!r}")
    elements = 12 * MODELS[model].hidden ** 2
    if elements > MAX_LAYER_ELEMENTS:
        raise ConfigError("model", f"a layer of {model} has about 12·hidden² = {elements:,} parameters; this probe "
                                   f"runs layers of at most {MAX_LAYER_ELEMENTS:,} (1 GiB in fp32)")
    if zero not in (2, 3):
        raise ConfigError("zero", f"FSDP2 runs ZeRO-2 or ZeRO-3, got {zero!r}")
    for field, value in (("steps", steps), ("top", top)):
        if type(value) is not int or value < 1:
            raise ConfigError(field, f"must be a whole number of at least 1, got {value!r}")
    return spawned_ranks(_rank, 2, lambda out: (model, zero, steps, top, out), timeout, "the FSDP2 probe")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wide", help="a preset (default wide: hidden 1024, sequence 256)")
    parser.add_argument("--zero", type=int, default=3, help="2 or 3 (default 3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps, and profiled steps (default 10)")
    parser.add_argument("--top", type=int, default=12, help="operators listed (default 12)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are killed")
    parser.add_argument("--units", metavar="OUT", help="instead: the calibration's FSDP2 unit probe "
                                                       "(fsdp_unit_times), --rounds times, written to OUT (JSON)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the unit probe (default 3)")
    args = parser.parse_args(argv)
    if args.units:
        return _units_main(args.units, args.rounds, args.timeout)
    try:
        found = fsdp_overhead(args.model, args.zero, args.steps, args.top, args.timeout)
    except (ConfigError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pinned = "pinned" if found["placement"]["pinned"] else "not pinned"
    print(f"{args.model}, ZeRO-{args.zero}, two gloo ranks ({pinned})")
    for name in ("plain", "sharded"):
        run = found[name]
        print(f"{name}: median step {run['median_s'] * 1e3:.1f} ms (of {len(run['steps_s'])}: "
              f"{min(run['steps_s']) * 1e3:.1f} to {max(run['steps_s']) * 1e3:.1f} ms); "
              "rank 0's operators by self time:")
        for op, seconds, calls in run["ops"]:
            print(f"  {op:48s} {seconds * 1e3:8.2f} ms  ×{calls:g}")
    return 0


def _units_main(out: str, rounds: int, timeout: float) -> int:
    """``--units OUT``: the unit probe's rounds, with the machine's provenance, written atomically to ``out``."""
    import json

    from ..atomic import write_text
    from ..results import provenance
    from .path_fits import FSDP_UNIT_HIDDENS

    if rounds < 1:
        print(f"error: rounds: must be a whole number of at least 1, got {rounds}", file=sys.stderr)
        return 2
    found = []
    for _ in range(rounds):
        try:
            found.append(fsdp_unit_times(2, FSDP_UNIT_HIDDENS, timeout=timeout))
        except TimeoutError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for row in found[-1]["rows"]:
            print(f"round {len(found)}: ZeRO-{row['zero']} h {row['hidden']}: plain {row['plain_s'] * 1e3:.1f} ms, "
                  f"no sync {row['nosync_s'] * 1e3:.1f} ms, sync {row['sync_s'] * 1e3:.1f} ms")
    write_text(out, json.dumps({"provenance": provenance("cpu"), "ranks": 2, "rounds": found}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
