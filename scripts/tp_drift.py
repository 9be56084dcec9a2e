"""Do collective probes follow the tensor-parallel step's drift? An experiment on this machine, archived as reference
data (too long for a build of the book).

    python scripts/tp_drift.py                                  # 250 rounds: 8 min 34 s on two cores at 53f7f3a
    python scripts/tp_drift.py --rounds 2 --out /tmp/drift.csv  # to try it

The tensor-parallel runs of the book miss by more than the other strategies, and the per-collective cost each of
them implies moves from one repeat and one build to the next (``distperf.analysis.tp_implied``) while the speed
probe each run takes (``distperf.measure.speed``: a matrix product, an element-wise kernel, module calls) reads the
same speed. A probe that followed that drift could price each run at its own cost per collective, as the speed
probe prices its kernels. This experiment asks whether one would: two ranks (gloo, launched by torchrun, one thread
each) alternate, round after round,

- three collective probes of 32 calls each, the slowest rank's time per call: an all-reduce of 128 KiB
  (``ar_128k_s``, the `small` preset's message at micro-batch 2), one of 8 bytes (``ar_8b_s``), and DTensor's
  redistribution of a 128 KiB ``Partial`` tensor to ``Replicate`` (``dtensor_128k_s``);
- the speed probe (``gemm_s``, ``elementwise_s``, ``python_s``: the slowest rank's);
- 8 steps each of the tensor-parallel trainer of `small` at micro-batch 2 without and with sequence parallelism
  (``tp_step_s``, ``tp_sp_step_s``: the median of the last 6, the slowest rank's).

Writes ``data/reference/<machine>/tp_drift.csv`` (one row per round, with provenance) and its entry in that
directory's manifest; the chapter "Where the time goes" reads it (``distperf.analysis.tp_implied.drift``). An
existing table is kept (``--force`` measures again). Exit status 0 on success, 1 when the run failed or timed out,
2 on bad input.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

NAME = "tp_drift"
CALLS = 32  # per collective probe
STEPS, WARMUP = 8, 2  # per trainer and round
SECONDS_PER_ROUND = 10  # the timeout's allowance per round (a round took about 2 s on two cores)
START_S = 120  # the timeout's allowance for starting the ranks and building the trainers


def worker(rounds: int, rows_path: str) -> None:
    """One rank's part (under torchrun): the rounds of the module's docstring; rank 0 writes a JSON row per round."""
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Partial, Replicate, init_device_mesh

    from distperf import presets
    from distperf.config import Config, Layout, RunOptions, validate
    from distperf.measure.speed import PARTS, probe_alone, slowest
    from distperf.parallel.loop import build_trainer, step_barrier
    from distperf.parallel.mesh import init_distributed
    from distperf.tokens import make_source

    torch.set_num_threads(1)
    device = init_distributed("cpu", timeout_s=START_S)
    opts = RunOptions(steps=STEPS, warmup=WARMUP)
    trainers = {}
    for name, sp in (("tp_step_s", False), ("tp_sp_step_s", True)):
        cfg = validate(Config(model=presets.model("small"), layout=Layout(tp=2, micro_batch=2, sequence_parallel=sp)))
        torch.manual_seed(0)
        trainers[name] = (cfg, build_trainer(cfg, opts, device))
    spec = presets.model("small")
    source = make_source(opts.data, spec.vocab, spec.seq, 0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    message, word = torch.ones(2 * spec.seq * spec.hidden), torch.ones(2)  # 128 KiB and 8 bytes of fp32

    def per_call(fn) -> float:
        step_barrier()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        return slowest((time.perf_counter() - start) / CALLS)

    def redistribute():
        DTensor.from_local(message, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()]).to_local()

    with open(rows_path, "w") if dist.get_rank() == 0 else open(os.devnull, "w") as out:
        for i in range(rounds):
            row = {"round": i, "time_s": time.time(), "ar_128k_s": per_call(lambda: dist.all_reduce(message)),
                   "ar_8b_s": per_call(lambda: dist.all_reduce(word)), "dtensor_128k_s": per_call(redistribute)}
            speed = probe_alone(True)
            row.update({k: speed[k] for k in PARTS})
            for name, (cfg, trainer) in trainers.items():
                times = []
                for step in range(STEPS):
                    x, y = source.batch(step, cfg.layout.global_batch)
                    step_barrier()
                    start = time.perf_counter()
                    trainer.step(x, y)
                    times.append(time.perf_counter() - start)
                row[name] = slowest(statistics.median(times[WARMUP:]))
            out.write(json.dumps(row) + "\n")
            out.flush()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from distperf import reference

    return reference.rounds_main(Path(__file__), NAME, __doc__.splitlines()[0], argv, 250, worker,
                                 (START_S, SECONDS_PER_ROUND))


if __name__ == "__main__":
    sys.exit(main())
