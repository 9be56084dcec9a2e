"""What a tensor-parallel collective costs beyond the cost model, by the size of its message: a diagnostic.

    .venv/bin/python scripts/tp_residuals.py [--model tiny] [--micro-batches 1,4,16,64,256] [--sequence-parallel]
                                             [--hardware data/fresh/cpu/hardware.json] [--reps 15]

Steps the tensor-parallel trainer of a preset on two spawned ranks, pinned as the calibration pins them, at each
micro-batch (:func:`distperf.measure.calibrate.tensor_parallel_step_time`: the slowest rank's median step, and the
communication of profiled steps on the rank that waited least) and prints the measured step, the cost model's step
on the profile with DTensor's per-collective constants at 0
(:func:`distperf.measure.path_fits.step_terms`), the step's collectives, their mean message and the residual per
collective: what the calibration's fit (:func:`distperf.measure.path_fits.tensor_parallel_paths`) takes as DTensor's
cost per collective (a cost per byte beside it was tried and turned down on 5 December 2026), and the part of that
residual a profiler sees inside the collective (the profiled communication less the collectives' α-β time, per
collective: what :func:`distperf.measure.path_fits.tensor_parallel_waits` fits). Run it on the fit's
preset (``tiny``) and on a validation preset (``small``) one after the other to see whether the residual follows the
message's size. Not part of the build: it fits nothing and writes nothing.
"""
from __future__ import annotations

import argparse
import json
import sys

from distperf import presets
from distperf.config import ConfigError
from distperf.hardware import load_profile
from distperf.measure.calibrate import join_spawned, spawned_ranks, tensor_parallel_step_time
from distperf.measure.path_fits import TP_FIT_BATCHES, step_prediction, step_terms

WORLD = 2


def _rank(rank: int, world: int, model: str, micro_batches: tuple, sp: bool, reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    join_spawned(rank, world, out, "gloo")
    steps = {b: tensor_parallel_step_time(world, b, sp, reps, model) for b in micro_batches}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(steps, f)
    dist.destroy_process_group()


def _positive(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _batches(text: str) -> tuple[int, ...]:
    """argparse type: whole numbers of at least 1, separated by commas."""
    try:
        return tuple(_positive(x) for x in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be whole numbers of at least 1 separated by commas, got {text!r}") \
            from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a preset whose heads and positions divide by 2 (default tiny)")
    parser.add_argument("--micro-batches", type=_batches, default=TP_FIT_BATCHES,
                        help="comma-separated (default the calibration's: %(default)s)")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--hardware", default="data/fresh/cpu/hardware.json", help="a calibrated profile")
    parser.add_argument("--reps", type=_positive, default=15, help="timed steps per micro-batch (default 15)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the ranks are stopped")
    args = parser.parse_args(argv)
    try:
        hw = load_profile(args.hardware)
        spec = presets.model(args.model)
    except (ConfigError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if hw.kernels is None or spec.heads % WORLD or spec.seq % WORLD:
        print(f"error: needs a calibrated profile (--hardware) and a preset whose heads and seq divide by {WORLD}",
              file=sys.stderr)
        return 2
    try:
        steps = spawned_ranks(_rank, WORLD, lambda out: (WORLD, args.model, args.micro_batches, args.sequence_parallel,
                                                         args.reps, out), args.timeout, "the tensor-parallel steps")
    except TimeoutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.model}, tensor parallel on {WORLD} ranks{', sequence parallel' if args.sequence_parallel else ''}; "
          f"profile {args.hardware}")
    print(f"{'micro-batch':>11} {'measured ms':>12} {'model ms':>9} {'collectives':>11} {'message KiB':>12} "
          f"{'residual µs/collective':>23} {'inside µs/collective':>21}")
    for b, (measured, waited) in sorted((int(b), s) for b, s in steps.items()):
        bare, calls, nbytes = step_terms(args.model, b, args.sequence_parallel, hw, WORLD)
        alpha_beta = step_prediction(args.model, b, args.sequence_parallel, hw, WORLD, 0.0,
                                     0.0)["communication_exposed"]
        print(f"{b:>11} {measured * 1e3:>12.2f} {bare * 1e3:>9.2f} {calls:>11.0f} {nbytes / calls / 1024:>12.1f} "
              f"{(measured - bare) / calls * 1e6:>23.0f} {(waited - alpha_beta) / calls * 1e6:>21.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
