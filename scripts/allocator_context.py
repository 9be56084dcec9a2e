"""Does a one-device step take longer than its parts because of glibc's allocator? An experiment on this machine,
archived as reference data.

    python scripts/allocator_context.py                                  # 16 rounds: about 4 min on two cores
    python scripts/allocator_context.py --rounds 1 --out /tmp/alloc.csv  # to try it

On the book's build at ac5aefb the one-device runs took 4 % to 20 % longer than the parts the profiled mode composes
for them, timed in the same processes. Each round of this experiment starts two fresh processes in turn (which goes
first alternates), one with glibc's default allocator and one with glibc told by its environment to keep the memory a
step frees (``distperf.analysis.allocator_context.HELD``); each, on one thread, pinned, trains the single-device
trainer of the `small` preset at micro-batch 2 with 2 and with 8 microbatches as ``distperf run`` trains it
(``distperf.parallel.loop.run_training``), two steps to warm up and then :data:`STEPS` timed, counting the minor page
faults of each step; the run then times its parts as the book's runs do (``distperf.measure.parts``), composed here as
the profiled mode composes a one-device step: L layers' forward and backward, the embeddings and the head per
microbatch, and the optimizer's step.

Writes ``data/reference/<machine>/allocator_context.csv`` (one row per round, variant and configuration: the median
step, the steps' relative standard deviation, the median page faults per step, the composed parts, with provenance)
and its entry in that directory's manifest; the chapter "Where the time goes" reads it
(``distperf.analysis.allocator_context``). An existing table is kept (``--force`` measures again). Exit status 0 on
success, 1 when a run failed or timed out, 2 on bad input.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from distperf.analysis.allocator_context import (HELD, MICRO_BATCH, MICROBATCHES, NAME, PRESET,  # noqa: E402
                                                 VARIANTS)

STEPS = 10
WARMUP = 2
VARIANT, ROUND = "DISTPERF_ALLOCATOR_VARIANT", "DISTPERF_ALLOCATOR_ROUND"  # the worker's variant and round
SECONDS_PER_ROUND = 90  # the timeout's allowance per round (a round took about 15 s on two cores)
START_S = 60


def composed(parts: dict, layers: int, microbatches: int) -> float:
    """The parts as the profiled mode composes a one-device step: per microbatch L layers' forward and backward, the
    embeddings' and the head's; then the optimizer's step over the layers' tensors and the ends'."""
    def both(part: str) -> float:
        return parts[part]["forward_s"] + parts[part]["backward_s"]

    optimizer = parts["optimizer"]
    return (microbatches * (layers * both("layer") + both("embedding") + both("head"))
            + layers * optimizer["layer_s"] + optimizer["first_s"] + optimizer["last_s"])


def worker(rounds: int, rows_path: str) -> None:
    """One process's part: each configuration of the module's docstring, run as ``distperf run`` runs it on one
    device (:func:`distperf.parallel.loop.run_training`: the speed probes, the timed steps, the parts), each step's
    minor page faults counted around the trainer's step."""
    import resource
    import statistics

    from distperf import presets
    from distperf.config import Config, Layout, RunOptions, validate
    from distperf.launch import pin_this_rank
    from distperf.parallel import loop

    pin_this_rank(1)
    faulted: list[int] = []
    built = loop.build_trainer

    def counting(cfg, opts, device):  # the run's own trainer, its step counted
        trainer = built(cfg, opts, device)
        step = trainer.step

        def counted(x, y):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            out = step(x, y)
            faulted.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            return out

        trainer.step = counted
        return trainer

    loop.build_trainer = counting
    with open(rows_path, "w") as out:
        for m in MICROBATCHES:
            cfg = validate(Config(model=presets.model(PRESET), layout=Layout(micro_batch=MICRO_BATCH,
                                                                            microbatches=m)))
            faulted.clear()
            result = loop.run_training(cfg, RunOptions(steps=WARMUP + STEPS, warmup=WARMUP))
            times = result["iteration_time_s"]["steps"][WARMUP:]
            row = {"round": int(os.environ.get(ROUND, 0)), "variant": os.environ.get(VARIANT, "default"),
                   "time_s": time.time(), "preset": PRESET, "micro_batch": MICRO_BATCH, "microbatches": m,
                   "steps": STEPS, "step_s": result["iteration_time_s"]["median"],
                   "steps_rsd": statistics.pstdev(times) / statistics.fmean(times),
                   "faults_per_step": statistics.median(faulted[WARMUP:WARMUP + STEPS]),
                   "composed_s": composed(result["part_times"], cfg.model.layers, m)}
            out.write(json.dumps({k: round(v, 7) if isinstance(v, float) else v for k, v in row.items()}) + "\n")


def alternating_rows(script: Path, rounds: int, timeout: float) -> list[dict]:
    """Every round, one fresh process per variant of :data:`VARIANTS` (the first one alternating), all within
    ``timeout`` seconds; RuntimeError when one fails or time runs out."""
    from distperf.reference import worker_rows

    deadline, rows = time.monotonic() + timeout, []
    for i in range(rounds):
        order = list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1]
        for variant in order:
            env = {VARIANT: variant, ROUND: str(i), **(HELD if variant == "held" else {})}
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the rounds did not finish within {timeout:.0f} s")
            rows += worker_rows(script, 1, left, ranks=1, env=env, unset=tuple(HELD))
    return rows


def main(argv: list[str] | None = None) -> int:
    from distperf import reference
    from distperf.analysis.allocator_context import sentence

    return reference.rounds_main(Path(__file__), NAME, __doc__.splitlines()[0], argv, 16, worker,
                                 (START_S, SECONDS_PER_ROUND), sentence, launch=alternating_rows)


if __name__ == "__main__":
    sys.exit(main())
