"""Does an all-reduce's time depend on what runs before it? An experiment on this machine, archived as reference data.

    python scripts/allreduce_context.py                                  # 400 rounds: about 5 min on two cores
    python scripts/allreduce_context.py --rounds 2 --out /tmp/ctx.csv    # to try it

The cost model times DDP's gradient all-reduce by its size alone: the α-β fit of the all-reduce as the calibration
issues it, after a burst of matrix products. On the book's builds at d91ccc8 and 7ee0426 the data-parallel runs'
exposed communication missed that by −37 % to −50 %. This experiment times one message four ways, in the same two processes, round after
round (after two rounds not recorded): two ranks (gloo, launched by torchrun, one thread each, pinned), and for each
of the `small` and `medium` presets (their whole gradient is one DDP bucket of 3.2 and 24.6 MiB):

- ``step``: the data-parallel trainer's step (micro-batch 2), broken down as the book's runs are
  (``distperf.measure.breakdown``): its ``communication`` class, each rank's;
- ``bare``: DDP on a module of one parameter of the same size, its forward and backward broken down the same way;
- ``issued``: the all-reduce of the same bytes after a burst of four 192×192 matrix products, less the burst alone,
  without a barrier (the calibration's ``training_conditions``);
- ``after_copy``: the all-reduce timed alone after a barrier that follows a 64 MiB copy.

Writes ``data/reference/<machine>/allreduce_context.csv.gz`` (one row per round, preset and rank: ``seconds`` of each
way and the step's ``window``, with provenance) and its entry in that directory's manifest; the chapter "Where the
time goes" reads it (``distperf.analysis.allreduce_context``). An existing table is kept (``--force`` measures again).
Exit status 0 on success, 1 when the run failed or timed out, 2 on bad input.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from distperf.analysis.allreduce_context import NAME, PRESETS  # noqa: E402

MICRO_BATCH = 2
WARMUP_ROUNDS = 2  # not recorded: DDP builds its buckets, and the allocator its pools, in the first steps
SECONDS_PER_ROUND = 5  # the timeout's allowance per round (a round took about 0.6 s on two cores)
START_S = 120  # the timeout's allowance for starting the ranks and building the trainers


def worker(rounds: int, rows_path: str) -> None:
    """One rank's part (under torchrun): the rounds of the module's docstring; rank 0 writes the JSON rows."""
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from distperf import presets
    from distperf.config import Config, Layout, RunOptions, validate
    from distperf.launch import pin_this_rank
    from distperf.measure.breakdown import StepBreakdown
    from distperf.measure.kernels import ParametersOnly
    from distperf.parallel.loop import build_trainer, step_barrier
    from distperf.parallel.mesh import init_distributed
    from distperf.tokens import make_source

    torch.set_num_threads(1)
    pin_this_rank(1)
    device = init_distributed("cpu", timeout_s=START_S)
    opts = RunOptions(steps=1, warmup=0)
    burst, source_copy, target_copy = torch.randn(192, 192), torch.ones(16 << 20), torch.empty(16 << 20)
    parts = {}
    for name in PRESETS:
        cfg = validate(Config(model=presets.model(name), layout=Layout(dp=2, micro_batch=MICRO_BATCH)))
        torch.manual_seed(0)
        trainer = build_trainer(cfg, opts, device)
        elements = sum(p.numel() for p in trainer.model.parameters())
        bare = DistributedDataParallel(ParametersOnly(1, elements))
        parts[name] = (cfg, trainer, bare, torch.ones(elements), make_source(opts.data, cfg.model.vocab,
                                                                              cfg.model.seq, 0))

    def compute():
        for _ in range(4):
            torch.mm(burst, burst)

    one = torch.ones(())
    rank = dist.get_rank()
    with open(rows_path, "w") if rank == 0 else open(os.devnull, "w") as out:
        for i in range(-WARMUP_ROUNDS, rounds):
            for name, (cfg, trainer, bare, message, source) in parts.items():
                x, y = source.batch(i + WARMUP_ROUNDS, cfg.layout.global_batch)
                step_barrier()
                with StepBreakdown() as b:
                    trainer.step(x, y)
                stepped = b.summary()
                step_barrier()
                with StepBreakdown() as b:
                    bare(one).backward()
                row = {"round": i, "time_s": time.time(), "preset": name, "bytes": message.numel() * 4, "rank": rank,
                       "step": stepped["communication"], "window": stepped["window"],
                       "bare": b.summary()["communication"]}
                step_barrier()
                start = time.perf_counter()
                compute()
                dist.all_reduce(message)
                both = time.perf_counter() - start
                start = time.perf_counter()
                compute()
                row["issued"] = max(both - (time.perf_counter() - start), 0.0)
                target_copy.copy_(source_copy)
                step_barrier()
                start = time.perf_counter()
                dist.all_reduce(message)
                row["after_copy"] = time.perf_counter() - start
                row = {k: round(v, 7) if isinstance(v, float) else v for k, v in row.items()}  # 0.1 µs
                rows = [None] * dist.get_world_size()
                dist.all_gather_object(rows, row)
                if i >= 0:
                    out.write("".join(json.dumps(r) + "\n" for r in rows))
                    out.flush()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from distperf import reference
    from distperf.analysis.allreduce_context import sentence

    return reference.rounds_main(Path(__file__), NAME, __doc__.splitlines()[0], argv, 400, worker,
                                 (START_S, SECONDS_PER_ROUND), sentence, ".csv.gz")


if __name__ == "__main__":
    sys.exit(main())
