"""Does a pipeline stage compute faster when its forwards run back to back (GPipe) than interleaved with its
backwards (1F1B)? One process, one thread, no communication: the chapter "Where the time goes" cites it beside the
pipeline-instruments experiment.

    python scripts/stage_order.py                  # small, first of two stages, micro-batch 2, m = 8, 12 passes
    python scripts/stage_order.py --model tiny --passes 2

Builds the first stage of the preset split in two (its embedding and first half of the layers), then times, pass by
pass in alternating order, its m forwards and m backwards (the backward of a constant output gradient) in GPipe's
order (every forward, then every backward) and in the order torch's ``Schedule1F1B`` gives the first of two ranks
(two forwards, then a backward and a forward in turn, then the last two backwards). Prints each order's median, least
and largest seconds of work over the passes after two of warm-up. Exit status 0, or 2 on bad input.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

WARMUP = 2


def orders(m: int) -> dict[str, list[tuple[str, int]]]:
    """The first of two stages' work, (``F`` or ``B``, microbatch) in turn, under GPipe and under 1F1B."""
    one_f_one_b = [("F", 0), ("F", 1)]
    for i in range(m - 2):
        one_f_one_b += [("B", i), ("F", i + 2)]
    return {"gpipe": [("F", i) for i in range(m)] + [("B", i) for i in range(m)],
            "1f1b": one_f_one_b + [("B", m - 2), ("B", m - 1)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="a preset (default small)")
    parser.add_argument("--micro-batch", type=int, default=2, help="sequences per microbatch (default 2)")
    parser.add_argument("--microbatches", type=int, default=8, help="m, at least 2 (default 8)")
    parser.add_argument("--passes", type=int, default=12, help="timed passes of each order (default 12)")
    args = parser.parse_args(argv)
    from distperf import presets
    from distperf.config import ConfigError

    try:
        spec = presets.model(args.model)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, value, least in (("micro-batch", args.micro_batch, 1), ("microbatches", args.microbatches, 2),
                               ("passes", args.passes, 1)):
        if value < least:
            print(f"error: --{name} must be at least {least}, got {value}", file=sys.stderr)
            return 2
    if spec.layers < 2:
        print(f"error: --model {args.model} has {spec.layers} layer; two stages need at least 2", file=sys.stderr)
        return 2
    import torch

    from distperf.model import build_stage

    torch.set_num_threads(1)
    torch.manual_seed(0)
    stage = build_stage(spec, (spec.layers // 2, spec.layers - spec.layers // 2), 0)
    inputs = [torch.randint(0, spec.vocab, (args.micro_batch, spec.seq)) for _ in range(args.microbatches)]

    def work(order) -> float:
        outputs, busy = {}, 0.0
        for kind, i in order:
            start = time.perf_counter()
            if kind == "F":
                outputs[i] = stage(inputs[i])
            else:
                out = outputs.pop(i)
                out.backward(torch.full_like(out, 1e-3))
            busy += time.perf_counter() - start
        stage.zero_grad(set_to_none=True)
        return busy

    times = {name: [] for name in orders(args.microbatches)}
    for k in range(WARMUP + args.passes):
        for name, order in sorted(orders(args.microbatches).items(), reverse=k % 2 == 1):
            seconds = work(order)
            if k >= WARMUP:
                times[name].append(seconds)
    for name, seen in times.items():
        print(f"{spec.name}, first of two stages, micro-batch {args.micro_batch}, m = {args.microbatches}, {name} "
              f"order: median {statistics.median(seen) * 1e3:.1f} ms ({min(seen) * 1e3:.1f} to "
              f"{max(seen) * 1e3:.1f} ms, {len(seen)} pass{'es' if len(seen) > 1 else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
