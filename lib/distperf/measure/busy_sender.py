"""A receive from a sender that is computing: how much longer it waits than one from an idle sender.

In a pipeline a stage's input is ready when its neighbour's action ends, and the neighbour is by then computing its
next one. gloo hands a message over only once the receiver has posted its receive, on the sender's communication
thread, which shares the sender's core with its compute (each rank is pinned to a core of its own, as the runs' ranks
are: :func:`distperf.measure.calibrate.join_spawned`); when that thread is not woken at once it waits for the
scheduler. The pipeline timeline calls such waits stalls (:mod:`distperf.measure.pipeline_replay`): on the `small`
model's two-stage pipelines at m = 8 they were 1.5 to 7 ms each, up to seven a step (6 December 2026).

The probe (:func:`busy_sender_waits`, run by the calibration): each trial starts at a barrier; rank 0 posts an
``isend`` of :data:`MESSAGE_BYTES` (the `small` model's activation at micro-batch 2) and then either computes (128×128
matrix products) or sleeps for :data:`HOLD_S`, then waits on its send; rank 1 sleeps :data:`LEAD_S`, so that the send
is long posted, and times a blocking ``recv``. A third mode, ``together``, has both ranks sleep :data:`LEAD_S` and
then send and receive at once, neither computing. The modes alternate trial by trial. ``stall_s``, the busy mode's
mean receive less the idle mode's median, is the expected cost of one receive from a computing sender: a what-if of
the cost model (``kernels.p2p_stall_s``, which no profile sets: :mod:`distperf.cost.kernels`), judged by the rule of
the chapter "Where the time goes" (it did not stand on the build that judged it). On 6 December 2026 a pipeline's
stalls came as often when the sender was waiting as when it computed (:func:`distperf.measure.pipeline_replay.
stalls_by_sender`), and a bare send and receive posted together stalled too: the third mode measures that.

    python -m distperf.measure.busy_sender                 # 100 trials of each mode, two pinned ranks
    python -m distperf.measure.busy_sender --trials 5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

MESSAGE_BYTES = 2 * 128 * 128 * 4
HOLD_S = 0.010  # the sender computes or sleeps this long after posting
LEAD_S = 0.002  # the receiver posts this long after the send
STALL_S = 0.001  # a receive slower than this stalled (distperf.measure.pipeline_replay.STALL_US)
TRIALS, TRIALS_QUICK = 100, 12
MODES = ("busy", "idle", "together")


def summary(times: dict[str, list[float]]) -> dict:
    """Per mode of ``times`` (seconds per trial): ``trials``, ``median_s``, ``p90_s``, ``max_s``, ``stalled`` (the
    share slower than :data:`STALL_S`) and ``mean_s``; and ``stall_s``, the busy mode's mean less the idle mode's
    median (at least 0)."""
    out = {}
    for mode, values in times.items():
        v = sorted(values)
        out[mode] = {"trials": len(v), "median_s": statistics.median(v), "p90_s": v[int(0.9 * (len(v) - 1))],
                     "max_s": v[-1], "stalled": sum(x > STALL_S for x in v) / len(v), "mean_s": statistics.fmean(v)}
    out["stall_s"] = max(out["busy"]["mean_s"] - out["idle"]["median_s"], 0.0)
    return out


def _rank(rank: int, world: int, trials: int, nbytes: int, out: str) -> None:
    """One rank of :func:`busy_sender_waits` (spawned, gloo, one thread, pinned); rank 1 times, rank 0 writes."""
    import json

    import torch
    import torch.distributed as dist

    from .calibrate import join_spawned

    torch.set_num_threads(1)
    placement = [None] * world
    dist.all_gather_object(placement, join_spawned(rank, world, out, "gloo"))
    message = torch.zeros(max(1, nbytes // 4))
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    times = {m: [] for m in MODES}
    for k in range(len(MODES) * (trials + 1)):  # the first round warms up
        mode = MODES[k % len(MODES)]
        dist.barrier()
        if mode == "together":  # both ranks sleep, then send and receive at once
            time.sleep(LEAD_S)
            start = time.perf_counter()
            if rank == 0:
                dist.send(message, 1)
            elif rank == 1:
                dist.recv(message, 0)
                if k >= len(MODES):
                    times[mode].append(time.perf_counter() - start)
        elif rank == 0:
            work = dist.isend(message, 1)
            if mode == "busy":
                end = time.perf_counter() + HOLD_S
                while time.perf_counter() < end:
                    torch.mm(a, b)
            else:
                time.sleep(HOLD_S)
            work.wait()
        elif rank == 1:
            time.sleep(LEAD_S)
            start = time.perf_counter()
            dist.recv(message, 0)
            if k >= len(MODES):
                times[mode].append(time.perf_counter() - start)
    every = [None] * world
    dist.all_gather_object(every, times)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"bytes": nbytes, "hold_s": HOLD_S, "lead_s": LEAD_S, **summary(every[1]),
                       "placement": placement}, f)
    dist.destroy_process_group()


def busy_sender_waits(trials: int = TRIALS, nbytes: int = MESSAGE_BYTES, timeout: float = 300.0) -> dict:
    """{bytes, hold_s, lead_s, busy, idle, stall_s, placement}: :func:`summary` of ``trials`` receives of each mode
    on two pinned gloo ranks. TimeoutError past ``timeout``."""
    from .calibrate import spawned_ranks

    return spawned_ranks(_rank, 2, lambda out: (2, trials, nbytes, out), timeout, "the busy-sender probe")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=TRIALS, help=f"trials of each mode (default {TRIALS})")
    parser.add_argument("--bytes", type=int, default=MESSAGE_BYTES,
                        help=f"the message (default {MESSAGE_BYTES}: the `small` model's activation at micro-batch 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are killed")
    args = parser.parse_args(argv)
    for name, value, least in (("trials", args.trials, 1), ("bytes", args.bytes, 4), ("timeout", args.timeout, 1)):
        if value < least:
            print(f"error: --{name} must be at least {least}, got {value}", file=sys.stderr)
            return 2
    try:
        found = busy_sender_waits(args.trials, args.bytes, args.timeout)
    except TimeoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.trials} trials of each mode, {found['bytes']} bytes, the sender held {found['hold_s'] * 1e3:g} ms")
    labels = {"busy": "sender computing", "idle": "sender sleeping", "together": "both posting at once"}
    for mode in MODES:
        s = found[mode]
        print(f"  {labels[mode]}: receive median {s['median_s'] * 1e3:.3f} ms, 90th percentile {s['p90_s'] * 1e3:.3f}, "
              f"largest {s['max_s'] * 1e3:.3f}, mean {s['mean_s'] * 1e3:.3f}; {s['stalled']:.0%} slower than "
              f"{STALL_S * 1e3:g} ms")
    print(f"expected stall of a receive from a computing sender: {found['stall_s'] * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
