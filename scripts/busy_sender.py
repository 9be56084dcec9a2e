"""Does a receive wait longer when its sender is computing? Two gloo ranks on this machine, pinned one to a core as
the book's runs are: the measurement behind the pipeline timeline's stalls (the chapter "Where the time goes").

    python scripts/busy_sender.py                      # 100 trials of each, 128 KiB, the sender busy for 10 ms
    python scripts/busy_sender.py --trials 5 --no-pin

Each trial starts at a barrier: rank 0 posts an ``isend`` of ``--bytes`` and then either computes (128×128 matrix
products, one thread) or sleeps for ``--hold-ms``, then waits on its send; rank 1 sleeps 2 ms, so that the send is
long posted, then times a blocking ``recv``. The two modes alternate trial by trial. gloo hands a message over only
once the receiver has posted its receive, on the sender's communication thread, which shares the sender's core with
its compute (as in a pipeline, where the previous stage is already computing the next microbatch). Prints, per mode,
the receive's median, 90th percentile and largest time, the share of trials slower than 1 ms (the pipeline
timeline's stall, ``distperf.measure.pipeline_replay.STALL_US``) and the mean time over the idle mode's median:
the expected cost of one such receive. Exit status 0, 1 when a rank failed or timed out, 2 on bad input.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

LEAD_S = 0.002  # the receiver posts this long after the send
STALL_MS = 1.0
MODES = ("busy", "idle")


def _rank(rank: int, port: int, trials: int, nbytes: int, hold_s: float, pin: bool, out) -> None:
    import torch
    import torch.distributed as dist

    from distperf.launch import pin_rank

    if pin:
        pin_rank(rank, 2, 1)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    message = torch.zeros(max(1, nbytes // 4))
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    times = {m: [] for m in MODES}
    for k in range(2 * trials):
        mode = MODES[k % 2]
        dist.barrier()
        if rank == 0:
            work = dist.isend(message, 1)
            if mode == "busy":
                end = time.perf_counter() + hold_s
                while time.perf_counter() < end:
                    torch.mm(a, b)
            else:
                time.sleep(hold_s)
            work.wait()
        else:
            time.sleep(LEAD_S)
            start = time.perf_counter()
            dist.recv(message, 0)
            times[mode].append((time.perf_counter() - start) * 1e3)
    dist.destroy_process_group()
    if rank == 1:
        out.put(times)


def summary(times: dict[str, list[float]]) -> dict[str, dict]:
    """Per mode: ``median_ms``, ``p90_ms``, ``max_ms``, ``stalled`` (the share slower than :data:`STALL_MS`) and
    ``excess_ms`` (the mean less the idle mode's median)."""
    idle = statistics.median(times["idle"])
    out = {}
    for mode, values in times.items():
        v = sorted(values)
        out[mode] = {"trials": len(v), "median_ms": statistics.median(v), "p90_ms": v[int(0.9 * (len(v) - 1))],
                     "max_ms": v[-1], "stalled": sum(x > STALL_MS for x in v) / len(v),
                     "excess_ms": statistics.fmean(v) - idle}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100, help="trials of each mode (default 100)")
    parser.add_argument("--bytes", type=int, default=2 * 128 * 128 * 4,
                        help="the message (default 131072: the `small` model's activation at micro-batch 2)")
    parser.add_argument("--hold-ms", type=float, default=10.0, help="how long the sender computes or sleeps "
                                                                    "(default 10)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="pin each rank to a core of its own, as distperf run does (default on)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are killed")
    args = parser.parse_args(argv)
    for name, value, least in (("trials", args.trials, 1), ("bytes", args.bytes, 4), ("hold-ms", args.hold_ms, 1),
                               ("timeout", args.timeout, 1)):
        if value < least:
            print(f"error: --{name} must be at least {least}, got {value}", file=sys.stderr)
            return 2
    from distperf.rendezvous import listening_socket

    with listening_socket() as sock:  # a free port, released just before the ranks bind it
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, args.trials, args.bytes, args.hold_ms / 1e3, args.pin, out),
                         daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    deadline, times = time.monotonic() + args.timeout, None
    while times is None and time.monotonic() < deadline:
        try:
            times = out.get(timeout=0.5)
        except Exception:  # queue.Empty
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
    if times is None:
        print(f"error: the ranks did not finish within {args.timeout:.0f} s or failed", file=sys.stderr)
        return 1
    print(f"{args.trials} trials of each mode, {args.bytes} bytes, sender held {args.hold_ms:g} ms, "
          f"ranks {'pinned' if args.pin else 'not pinned'}")
    for mode, s in summary(times).items():
        print(f"  sender {mode}: receive median {s['median_ms']:.3f} ms, p90 {s['p90_ms']:.3f}, largest "
              f"{s['max_ms']:.3f}; {s['stalled']:.0%} slower than {STALL_MS:g} ms; mean over the idle median "
              f"{s['excess_ms']:+.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
