"""Calibrate this machine: the rates the cost model needs, measured, and a hardware profile from them.

What is measured (all timings are medians of ``torch.utils.benchmark.Timer.blocked_autorange``, or of
repeated calls for the collectives; ``min_run_time`` per point):

- **matrix products** ``torch.mm`` of n×n by n×n, for several n and dtypes (fp32; bf16 where the device
  runs it), at the given thread count: rate = 2n³ / time;
- **memory bandwidth**: ``dst.copy_(src)`` of a large buffer: 2 · bytes / time (a read and a write);
- **per-layer times** of the model presets in use, at each micro-batch size: one Transformer layer
  (:class:`distperf.model.Block`), the embeddings and the head with its loss; forward time, and
  backward time = (forward + backward) − forward, each on a fresh graph;
- **collectives** over gloo (NCCL on CUDA) for 2…N ranks started with ``torch.multiprocessing``
  (spawn, one thread each, each pinned to a core of its own as a run's ranks are, with a timeout):
  all-reduce, all-gather and reduce-scatter of a buffer of M bytes (M from 4 B to 4 MiB), and send/recv
  between two ranks (half a round trip). A point's time is the slowest rank's median.

The α-β fit (chapter "The analytical framework", section on communication; :mod:`distperf.cost.collectives`): time = steps(n)·α +
volume(n, M)/β with steps and volume of the ring algorithms (all-reduce 2(n − 1) steps and
2(n − 1)/n·M bytes; all-gather and reduce-scatter n − 1 and (n − 1)/n·M; send 1 and M). The fit is
linear in (α, 1/β); it is weighted least squares with weights 1/time, i.e. it minimises relative
residuals, so that 4-byte and 4-MiB messages count alike. One fit per collective and rank count, and
one over all rank counts together.

The profile (:class:`distperf.hardware.Hardware`) takes:

- ``flops_fp32``: the best fp32 matrix-product rate measured (so ``flops_efficiency`` = 1: the rate is
  already an achieved one); ``flops_16bit``: the best bf16 rate, or the fp32 one where bf16 was not
  measured;
- ``memory_bandwidth``: the copy bandwidth; ``memory_capacity``: physical memory (CPU) or the GPU's;
- ``intra_latency``, ``intra_bandwidth``: α and β of the all-reduce fit over all rank counts; ``collectives`` (CPU):
  each kind's own fit (α, β) to its times as a training step issues it (:func:`training_conditions`: after a burst
  of compute, no barrier), with which the cost model times that kind inside a node;
  ``inter_*``: the same (one machine has no link between nodes); ``devices_per_node``: CPU cores (a CPU
  rank is a "device") or GPUs.

- ``kernels`` (CPU): the kernel microbenchmarks of :mod:`distperf.measure.kernels` (the time of a linear layer,
  fused attention, each memory-bound operator by size, a view, a module call, a backward's start, Adam per
  tensor), its ``contention`` (memory-bound and compute-bound kernels and a layer with every rank running at once,
  over one alone: :func:`training_conditions`), and ``step_s``, the trainer's fixed Python per step, fitted on the
  ``tiny`` preset (:func:`distperf.measure.kernels.fit_step_overhead`; the residuals are in the sidecar's
  ``step_fit``), and ``probe``: the machine's speed while they were measured (:mod:`distperf.measure.speed`: per part
  the median of a probe before each kernel table and one after the last, all in the sidecar's
  ``speed_probe.probes``), against which each run's own probe scales them. The sidecar's ``conditions.skew``
  records how much longer the slowest of the ranks takes than the typical one over bursts of compute started
  together (:mod:`distperf.measure.skew`); the model does not price it (the book prices it as a what-if), so the
  path constants are taken without it. Its
  ``conditions.fsdp_units`` records FSDP2's unit probe (:func:`distperf.measure.fsdp_overhead.fsdp_unit_times`),
  which the model does not price either (the book's what-if: :func:`distperf.measure.path_fits.with_fsdp_units`), and
  its ``conditions.busy_sender`` how much longer a receive waits when its sender is computing
  (:mod:`distperf.measure.busy_sender`; the book's what-if: ``kernels.p2p_stall_s``).

Everything measured goes into a sidecar JSON next to the profile (``<profile>.calibration.json``).
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..config import DDP_BUCKET_MB
from .alpha_beta import fit_collectives, fit_issued
from .path_fits import (FSDP_UNIT_HIDDENS, FSDP_UNIT_HIDDENS_QUICK, PATH_PROBE, PATH_UNITS, PIPE_MICROBATCHES,
                        PIPE_PROBES, STEP_FIT_MODEL, TP_FIT_BATCHES, tensor_parallel_fits, with_path_constants)
from .profiles import sidecar_path
from .rounds import (ISSUED_LARGEST, ROUNDS_BUDGET_S, ROUNDS_MAX, ROUNDS_MIN, SETTLED, another_round, fitted_rows,
                     least_contention, median_rows, moves, settled)
from .speed import slowest

SIZES_FULL = (64, 128, 256, 512, 1024, 2048)
SIZES_QUICK = (128, 256, 512)
MESSAGE_BYTES_FULL = tuple(4 * 4**k for k in range(11))  # 4 B … 4 MiB in ×4 steps
MESSAGE_BYTES_QUICK = (4, 1024, 65536, 1048576)
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "send")


def _timer_median(stmt, min_run_time: float) -> float:
    from torch.utils.benchmark import Timer

    return Timer(stmt="f()", globals={"f": stmt}).blocked_autorange(min_run_time=min_run_time).median


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_rates(sizes, dtypes, device="cpu", min_run_time: float = 0.2) -> list[dict]:
    """[{n, dtype, seconds, flops_per_s}] for torch.mm of n×n by n×n; a dtype the device cannot
    multiply is left out, and so are the sizes after one whose next would take longer than
    :data:`distperf.measure.kernels.CALL_BUDGET_S` per call (bf16 on a CPU without bf16 units)."""
    from .kernels import affordable

    device = torch.device(device)
    rows = []
    for dtype in dtypes:
        for n in sizes:
            last = rows[-1] if rows and rows[-1]["dtype"] == str(dtype).replace("torch.", "") else None
            if last and not affordable(last["seconds"], last["n"], n):
                break
            try:
                a = torch.randn(n, n, device=device).to(dtype)
                b = torch.randn(n, n, device=device).to(dtype)
                torch.mm(a, b)
            except (RuntimeError, TypeError):
                break

            def mm():
                torch.mm(a, b)
                _sync(device)

            t = _timer_median(mm, min_run_time)
            rows.append({"n": n, "dtype": str(dtype).replace("torch.", ""), "seconds": t, "flops_per_s": 2 * n**3 / t})
    return rows


def copy_bandwidth(nbytes: int, device="cpu", min_run_time: float = 0.2) -> dict:
    """{bytes, seconds, bytes_per_s}: dst.copy_(src) moves 2·nbytes (read + write)."""
    device = torch.device(device)
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)
        _sync(device)

    t = _timer_median(copy, min_run_time)
    return {"bytes": nbytes, "seconds": t, "bytes_per_s": 2 * nbytes / t}


def layer_times(model, micro_batches, device="cpu", min_run_time: float = 0.2) -> list[dict]:
    """Forward and backward seconds of one layer, the embeddings and the head (with the loss) of a
    preset (by name) or of a :class:`~distperf.config.ModelSpec`, at this process's thread count."""
    import torch.nn as nn

    from .. import presets
    from ..cost.flops import head_forward_flops, layer_forward_flops
    from ..model import Block, init_weights, layer_input, lm_loss

    spec = presets.model(model) if isinstance(model, str) else model
    model_name = spec.name
    device = torch.device(device)
    torch.manual_seed(0)
    block = Block(spec).to(device)
    init_weights(block)
    embed_tok, embed_pos = nn.Embedding(spec.vocab, spec.hidden).to(device), nn.Embedding(spec.seq, spec.hidden).to(device)
    ln_f, head = nn.LayerNorm(spec.hidden).to(device), nn.Linear(spec.hidden, spec.vocab, bias=False).to(device)
    rows = []
    for b in micro_batches:
        x = layer_input(spec, b, device=device).requires_grad_(True)
        tokens = torch.randint(0, spec.vocab, (b, spec.seq), device=device)
        positions = torch.arange(spec.seq, device=device)
        parts = {
            "layer": (lambda: block(x), layer_forward_flops(b, spec.seq, spec.hidden, spec.ffn)),
            "embedding": (lambda: embed_tok(tokens) + embed_pos(positions), 0),
            "head": (lambda: lm_loss(head(ln_f(x)), tokens), head_forward_flops(b, spec.seq, spec.hidden, spec.vocab)),
        }
        for part, (forward, flops) in parts.items():
            def fwd():
                forward()
                _sync(device)

            def fwd_bwd():
                forward().float().sum().backward()
                _sync(device)

            t_f = _timer_median(fwd, min_run_time)
            t_fb = _timer_median(fwd_bwd, min_run_time)
            rows.append({"model": model_name, "part": part, "micro_batch": b, "seq": spec.seq, "hidden": spec.hidden,
                         "forward_s": t_f, "backward_s": max(t_fb - t_f, 0.0), "forward_flops": flops,
                         "arch": spec.arch, "heads": spec.heads, "ffn": spec.ffn, "vocab": spec.vocab,
                         "dropout": spec.dropout, "threads": torch.get_num_threads()})
    return rows


def model_time(model, micro_batch: int, device="cpu", min_run_time: float = 0.2) -> dict:
    """Seconds of one forward and backward of a whole preset (by name) or :class:`~distperf.config.ModelSpec` —
    embeddings, every layer, final LayerNorm, head and loss — on a fresh graph each call, at this process's thread
    count; with the model's shape."""
    from .. import presets
    from ..model import Transformer, init_parameters, lm_loss

    spec = presets.model(model) if isinstance(model, str) else model
    device = torch.device(device)
    whole = Transformer(spec).to(device)
    init_parameters(whole, 0)
    tokens = torch.randint(0, spec.vocab, (micro_batch, spec.seq), device=device)

    def step():
        lm_loss(whole(tokens), tokens).backward()
        _sync(device)

    return {"layers": spec.layers, "seq": spec.seq, "hidden": spec.hidden, "vocab": spec.vocab,
            "time_s": _timer_median(step, min_run_time)}


# --- collectives -------------------------------------------------------------------------------

def time_collective(collective: str, group, peers: tuple[int, int], nbytes: int, reps: int,
                    device: torch.device) -> tuple[int, float | None]:
    """(bytes, this rank's median seconds) of one collective on ``group`` (every member calls it; a
    non-member gets None). ``send`` is a ping-pong between ``peers`` (global ranks; half a round trip,
    the other members idle). Each repetition starts after a barrier; the first two are warm-up."""
    import statistics

    import torch.distributed as dist

    n, rank = dist.get_world_size(group), dist.get_rank()
    numel = max(n, (nbytes // 4) // n * n)  # divisible among the ranks
    buf = torch.ones(numel, device=device)
    part = torch.ones(numel // n, device=device)
    times = []
    for i in range(reps + 2):
        dist.barrier(group=group)
        _sync(device)
        t0 = time.perf_counter()
        if collective == "all-reduce":
            dist.all_reduce(buf, group=group)
        elif collective == "all-gather":
            dist.all_gather_single(buf, part, group=group)
        elif collective == "reduce-scatter":
            dist.reduce_scatter_single(part, buf, group=group)
        elif rank == peers[0]:
            dist.send(buf, peers[1])
            dist.recv(buf, peers[1])
        elif rank == peers[1]:
            dist.recv(buf, peers[0])
            dist.send(buf, peers[0])
        _sync(device)
        dt = time.perf_counter() - t0
        if i >= 2:
            times.append(dt / 2 if collective == "send" else dt)
    return numel * 4, statistics.median(times)


def join_spawned(rank: int, world: int, out: str, backend: str) -> dict:
    """Join the spawned ranks' process group through a file beside ``out`` (no store listening on the network)
    and, on Linux, keep gloo's connections on loopback; on CPU, pin the rank to a core of its own as a run's ranks
    are (:func:`distperf.launch.pin_rank`). Returns the rank's placement (``pinned``, ``cores``, ``reason``).

    Why pin: until 3 December 2026 the calibration's ranks were not pinned, the runs' ranks were, and the probes
    measured another machine. In a two-rank ``torchrun`` of the ``small`` preset's pipeline (pp 2, micro-batch 2, steps
    of 2 and 8 microbatches, two rounds each), the engine added to each microbatch, beyond the same stage's plain
    passes with both ranks at once, 6.1 and 7.0 ms (2BW) and 5.9 and 8.4 ms (1F1B) unpinned, and 2.8 and −1.0 ms,
    −0.1 and 3.8 ms pinned; on the eighteenth build of the book, whose unpinned probe gave 3.9 ms per 2BW action, the
    profiled mode over-predicted PipeDream-2BW by a median 30 %."""
    import torch.distributed as dist

    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"file://{out}.store", rank=rank, world_size=world)
    if backend == "nccl":
        return {"pinned": False, "cores": [], "reason": "GPU ranks are not pinned"}
    from ..launch import pin_rank

    return pin_rank(rank, world, torch.get_num_threads())


def _bench_rank(rank: int, world: int, sizes, reps: int, backend: str, out: str) -> None:
    """One rank of the collective benchmark (spawned); rank 0 writes the rows to ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    join_spawned(rank, world, out, backend)
    rows = []
    for n in range(2, world + 1):
        group = dist.new_group(list(range(n)))
        for collective in COLLECTIVES:
            if collective == "send" and n != 2:
                continue
            for nbytes in sizes:
                size, median = time_collective(collective, group, (0, 1), nbytes, reps, device) \
                    if rank < n else (nbytes, None)
                seconds = slowest(median, device)
                if rank == 0:
                    rows.append({"collective": collective, "ranks": n, "bytes": size, "seconds": seconds})
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def collective_times(ranks: int, sizes, reps: int = 10, device="cpu", timeout: float = 120.0) -> list[dict]:
    """[{collective, ranks, bytes, seconds}] for 2…``ranks`` ranks; raises TimeoutError past ``timeout``."""
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    return spawned_ranks(_bench_rank, ranks, lambda out: (ranks, tuple(sizes), reps, backend, out), timeout,
                         "the collective benchmark")


def spawned_ranks(target, ranks: int, args, timeout: float, what: str):
    """Run ``target(rank, *args(out))`` on ``ranks`` spawned processes with one thread each (``out``: a temporary
    output file, beside which the ranks meet, :func:`join_spawned`); return the JSON rank 0 wrote there. Raises
    TimeoutError past ``timeout``, and kills what is left."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="distperf-calibrate-") as tmp:
        out = os.path.join(tmp, "out.json")
        env_threads = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            ctx = mp.start_processes(target, args=args(out), nprocs=ranks, join=False,
                                     start_method="spawn")
        finally:
            if env_threads is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = env_threads
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} on {ranks} ranks did not finish within {timeout:g} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        with open(out) as f:
            return json.load(f)


def _conditions_rank(rank: int, world: int, sizes, reps: int, contention_rounds: int, out: str) -> None:
    """One rank of one round of :func:`training_conditions` (spawned, gloo, one thread): ``contention_rounds`` rounds of
    the contention probe, back to back, then the issued collectives, the overlap probes and the path probes once; rank
    0 writes them to ``out`` with the process's threads when the path probes began and ended."""
    import statistics

    import torch.distributed as dist

    from .speed import contention_round

    torch.set_num_threads(1)
    placement = [None] * world
    dist.all_gather_object(placement, join_spawned(rank, world, out, "gloo"))
    device = torch.device("cpu")
    a = torch.randn(192, 192)

    def compute():
        for _ in range(4):
            torch.mm(a, a)

    def timed(op) -> float:
        """The median time of ``op`` over ``reps`` calls after two of warm-up, from a barrier."""
        times = []
        dist.barrier()
        for _ in range(reps + 2):
            start = time.perf_counter()
            op()
            times.append(time.perf_counter() - start)
        return statistics.median(times[2:])

    def per_iteration(op) -> float:
        return timed(lambda: (compute(), op()))

    def issued() -> list[dict]:  # rank 0's rows; the burst's own time measured again, just before
        base = per_iteration(lambda: None)
        rows = []
        for collective in COLLECTIVES:
            for nbytes in sizes + ((ISSUED_LARGEST[collective],) if collective in ISSUED_LARGEST else ()):
                numel = max(world, (nbytes // 4) // world * world)
                buf, part = torch.ones(numel), torch.ones(numel // world)
                if collective == "all-reduce":
                    op = (lambda: dist.all_reduce(buf))
                elif collective == "all-gather":
                    op = (lambda: dist.all_gather_into_tensor(buf, part))
                elif collective == "reduce-scatter":
                    op = (lambda: dist.reduce_scatter_tensor(part, buf))
                elif rank == 0:
                    op = (lambda: (dist.send(buf, 1), dist.recv(buf, 1)))
                elif rank == 1:
                    op = (lambda: (dist.recv(buf, 0), dist.send(buf, 0)))
                else:
                    op = (lambda: None)
                seconds = max(per_iteration(op) - base, 0.0) / (2 if collective == "send" else 1)
                seconds = slowest(seconds, device)
                if rank == 0:
                    rows.append({"collective": collective, "ranks": world, "bytes": numel * 4, "seconds": seconds})
        return rows

    # overlap, the rule until 4 December 2026, kept for comparison (the sidecar's overlap_rounds): an asynchronous
    # all-reduce of 1 MiB issued before the 4 matrix products of compute(), waited after
    base = per_iteration(lambda: None)
    small = torch.ones(1 << 18)
    alone = max(per_iteration(lambda: dist.all_reduce(small)) - base, 1e-9)

    def overlapped():
        work = dist.all_reduce(small, async_op=True)
        compute()
        work.wait()

    def hidden_share(both, burst: float, collective: float) -> float:
        """(burst + collective − both) / min(burst, collective), in [0, 1], the least of any rank."""
        together = timed(both)
        return 0.0 - slowest(-min(max((burst + collective - together) / min(burst, collective), 0.0), 1.0), device)

    bucket = torch.ones(DDP_BUCKET_MB * 2**20 // 4)
    product = max(base / 4, 1e-9)  # one of compute()'s matrix products

    def overlap_round() -> dict:
        """The share hidden of DDP's default bucket, all-reduced asynchronously before a burst of matrix products
        about as long as that all-reduce alone (so that either could hide the other whole); and the 1 MiB rule's."""
        collective = max(timed(lambda: dist.all_reduce(bucket)), 1e-9)
        count = max(1, round(collective / product))

        def products():
            for _ in range(count):
                torch.mm(a, a)

        def both():
            work = dist.all_reduce(bucket, async_op=True)
            products()
            work.wait()

        burst = timed(products)

        return {"bucket_bytes": bucket.numel() * 4, "collective_s": collective, "burst_s": burst,
                "overlap": hidden_share(both, burst, collective),
                "overlap_1mib": hidden_share(overlapped, base, alone)}

    ratios = [contention_round(0.2, device, layer=True) for _ in range(contention_rounds)]  # rank 0's, else None
    issued_rows, overlap = issued(), overlap_round()
    threads = [process_threads()]
    paths = {name: slowest(seconds, device) for name, seconds in parallel_paths(world, reps).items()}
    threads.append(process_threads())
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"issued": issued_rows, "overlap": overlap, "paths": paths, "contention_rounds": ratios,
                       "compute_between_s": base, "placement": placement, "threads": threads}, f)
    dist.destroy_process_group()


# The issued collectives, the contention and the path probes are the noisiest measurements of a calibration (a busy
# two-core machine moves a path probe by ±20 %, the copy's contention between 1.1 and 2.3): a full calibration repeats
# the contention probe three times and the others in rounds until the constants taken from their medians settle
# (distperf.measure.rounds), with every round in the sidecar (conditions.issued_rounds, contention_rounds, path_rounds,
# and conditions.rounds: how many, whether they settled), and keeps each issued point's and each path's median and
# each contention ratio's least. The least: a contention round reads either the ranks' steady sharing of the cores
# (≈ 1.0-1.1× here) or that plus a burst of the virtual machine's host (1.5-1.9×), which a run's median step rides out. On four builds
# of the book on this machine, the held-out runs priced with the least round's ratios missed by a median of about
# 6 %, 9 %, 30 % and 12 %, with the median's 47 %, 8 %, 36 % and 13 % (the rule was chosen on the first three; the
# chapter "Where the time goes" prices each round of its build); on the seventh, 10.3 % against 6.5-7.9 % for each of
# its other rounds (with the path constants at their least-cost rounds, below). The path constants (residuals of a
# probe's time after every other term) take the rounds' median times. Their least-cost round (the least time; for
# FSDP2 the most overlap) was tried after the sixth build, whose tensor-parallel collective read 1.4-3.7 ms over its
# rounds and over-predicted tensor-parallel runs by up to 47 % (priced with the least rounds: 6.5 % / 24 % median and
# largest |error| of the analytical mode, against the median's 8.5 % / 47 %); on the seventh build, the first it had
# not seen, it did worse: 10.3 % / 26 % against 8.9 % / 24 % (profiled mode 7.2 % / 26 % against 6.0 % / 19 %), and
# was dropped.
PATH_ROUNDS_FROM_REPS = 10  # fewer repetitions (a quick calibration): one round
# Each round runs in fresh processes, as each run does (from 6 December 2026; until then every round ran in the same
# two ranks). Each probe's trainer builds gloo groups whose threads outlive it (a tcp loop and two run loops each, still
# running after torch's destroy_process_group of those groups in development), 96 threads per round, and a rank slows
# as they pile up: on four ten-repeat builds (d91ccc8 to 177e3f8) the plain stack of the path probes took
# 25 to 43 % longer in the last of 6-7 rounds than in the first, every build rising nearly monotonically, and the
# tensor + sequence-parallel step of the tiny preset at micro-batch 1 up to 88 % longer, while every run is a fresh
# process. In development, two ranks timing that plain stack while creating 50 idle gloo groups per round rose from
# 18.2 to 25.8 ms over 8 rounds (1054 threads); without the groups, 17.2 to 19.9 ms (18.4-20.8 in between).
# The contention probe keeps its three rounds, back to back: measured inside the rounds of the others (9th and 10th
# builds), its first round read exactly 1.0 for both ratios in both builds, and the least of seven rounds, 1.0,
# priced every run as though its ranks did not share the machine (the 10th build's analytical mode: 14.7 % median
# |error|, every strategy too fast; with each later round's ratios 6.7 to 8.8 %)
CONTENTION_ROUNDS = 3


def parallel_paths(world: int, reps: int = 10) -> dict:
    """Seconds, on this rank while every rank runs the same: the training step of the tensor-parallel trainer on the
    :data:`~distperf.cost.kernels.STEP_FIT_MODEL` preset over the ``world`` ranks, without and with sequence
    parallelism, at each micro-batch of :data:`TP_FIT_BATCHES` (``tp_b<b>_step_s``, ``tp_sp_b<b>_step_s``, and the
    communication of profiled steps, ``tp_b<b>_wait_s``, ``tp_sp_b<b>_wait_s``; when the preset's heads and positions
    divide among the ranks), and the forward + backward of :data:`PATH_UNITS`
    :class:`distperf.model.Block` of :data:`PATH_PROBE`'s shape plain (``plain_stack_s``) and under FSDP2, one unit
    each and a root (``fsdp_stack_s``): the collectives as those paths issue them, with what they hide.
    Each is the median of ``reps`` calls after two, the same number on every rank (their collectives must pair up).
    With no more ranks than the probe has layers, also a microbatch's time with the probe pipelined one stage per rank
    under torch's 1F1B (``pp_microbatch_s``) and under the 2BW engine (``twobw_microbatch_s``), with the
    communication a microbatch adds to a profiled step (``pp_microbatch_wait_s``, ``twobw_microbatch_wait_s``):
    :func:`pipeline_microbatch_time`."""
    import statistics

    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ..config import ModelSpec
    from ..model import Block, layer_input

    spec = ModelSpec(**PATH_PROBE)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    x = layer_input(spec, 1).requires_grad_(True)

    def timed(module) -> float:
        dist.barrier()
        times = []
        for _ in range(reps + 2):
            start = time.perf_counter()
            module(x).sum().backward()
            times.append(time.perf_counter() - start)
        return statistics.median(times[2:])

    stack = nn.Sequential(*[Block(spec) for _ in range(PATH_UNITS)])
    sharded = nn.Sequential(*[Block(spec) for _ in range(PATH_UNITS)])
    for block in sharded:
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    out = {"plain_stack_s": timed(stack), "fsdp_stack_s": timed(sharded)}
    if tensor_parallel_fits(world):
        for sp, prefix in ((False, "tp"), (True, "tp_sp")):
            for b in TP_FIT_BATCHES:
                out[f"{prefix}_b{b}_step_s"], out[f"{prefix}_b{b}_wait_s"] = tensor_parallel_step_time(world, b, sp,
                                                                                                     reps)
    if world <= PATH_PROBE["layers"]:  # a stage per rank
        for schedule, key, _, wait, _ in PIPE_PROBES:
            out[key], out[wait] = pipeline_microbatch_time(schedule, world, reps)
    return out


def tensor_parallel_step_time(world: int, micro_batch: int, sequence_parallel: bool, reps: int,
                              model: str = STEP_FIT_MODEL) -> tuple[float, float]:
    """The median seconds of ``reps`` training steps (after two) of the tensor-parallel trainer on the preset
    ``model`` (the :data:`~distperf.cost.kernels.STEP_FIT_MODEL` preset unless a diagnostic asks for another) over the
    ``world`` ranks (one microbatch of ``micro_batch``), the slowest rank's, and then the communication class of
    :data:`PROFILED_STEPS` more steps under :class:`~distperf.measure.breakdown.StepBreakdown` (seconds per step), the
    least of any rank's: what :func:`distperf.measure.path_fits.tensor_parallel_paths` fits DTensor's cost per
    collective on, and :func:`~distperf.measure.path_fits.tensor_parallel_waits` the part of it inside the
    collective."""
    import statistics

    import torch.distributed as dist

    from .. import presets
    from ..config import Config, Layout, RunOptions, validate
    from ..parallel.loop import build_trainer
    from ..tokens import make_source
    from .breakdown import StepBreakdown

    spec = presets.model(model)
    cfg = validate(Config(model=spec, layout=Layout(tp=world, micro_batch=micro_batch,
                                                    sequence_parallel=sequence_parallel)))
    trainer = build_trainer(cfg, RunOptions(device="cpu"), torch.device("cpu"))
    x, y = make_source("synthetic", spec.vocab, spec.seq, 0).batch(0, micro_batch)
    dist.barrier()
    times = []
    for _ in range(reps + 2):
        start = time.perf_counter()
        trainer.step(x, y)
        times.append(time.perf_counter() - start)
    with StepBreakdown() as profiled:
        for _ in range(PROFILED_STEPS):
            trainer.step(x, y)
    trainer.finish()
    waited = profiled.summary(PROFILED_STEPS)["communication"]
    return slowest(statistics.median(times[2:]), torch.device("cpu")), -slowest(-waited, torch.device("cpu"))


PROFILED_STEPS = 2  # the profiled steps after a tensor-parallel probe's timed ones
PIPE_PROFILED_STEPS = 3  # the profiled drained steps of each length after a pipeline probe's timed ones (their median)


def pipeline_microbatch_time(schedule: str, world: int, reps: int) -> tuple[float, float]:
    """Seconds the trainer's engine for ``schedule`` (torch's pipelining runtime, or the 2BW engine) adds to one more
    microbatch of :data:`PATH_PROBE` pipelined over the ``world`` ranks (one stage each, microbatch 1), beyond the
    stage's own forward and backward: per rank, steps of the two lengths of :data:`PIPE_MICROBATCHES` alternate with the
    same microbatches through a plain copy of the rank's stage (every rank at once, no communication; under 2BW, whose
    steps leave microbatches in flight, the plain passes follow the steps); (pipelined
    difference − plain difference) / difference in microbatches, medians, the mean over the ranks
    (:func:`mean_over_ranks`). The step's fixed costs, the pipeline's fill and the compute cancel; the engine's work,
    its sends and its waits on the neighbours stay. Second, the same difference of the communication class of
    :data:`PIPE_PROFILED_STEPS` more steps of each length (their median), drained (2BW's fill and drain cancel in the
    difference), under :class:`~distperf.measure.breakdown.StepBreakdown` (its sends, receives and waits), per
    microbatch, the least of any rank's: what :func:`distperf.measure.path_fits.pipeline_waits` fits the part of an
    action inside communication on.

    Why the least, and three steps (from 6 December 2026; until then one step of each length and the mean over the
    ranks): the rank a run's exposed communication is read on is the one that ends the iteration, whose own work took
    longest and which therefore waited least (:func:`distperf.analysis.time_model.exposed_errors`), as the
    tensor-parallel probe's least rank is (:func:`tensor_parallel_step_time`); the mean also counts what the other
    rank waits for it. On the build at 696dc47 the mean read 1277 µs per 1F1B action, more than the action's 919 µs,
    while that build's 1F1B runs of `small` measured about 2.0 ms of exposed communication per microbatch more against
    the model's 0.8 ms; rerun three times on the development machine the next hour, one profiled step per length, the
    two ranks read 4.7 and 5.7, 5.0 and 1.0, 2.1 and 0.4 ms per 1F1B microbatch (2BW: 5.0 and 2.0, −0.4 and 1.7, 0.8
    and 1.1 ms): a single step per length is noise. Declared before the build that judged it
    (:func:`distperf.analysis.time_model.wait_rule`), at de85c17, where the split it measures did not stand; from
    6 December 2026 the calibration fits each schedule's part on the tiny preset's runs instead
    (:mod:`distperf.analysis.pipeline_waits`), which the cost model takes in place of this probe's where present.

    Why the mean: until 3 December 2026 the probe took the largest of the ranks' values, and the largest of noisy
    values reads high. The probe's stages are alike (its vocabulary of 16 makes the embedding and the head negligible),
    so what tells them apart is noise: in two pinned runs of the probe on the development machine the first stage's
    plain passes of the ten-microbatch step took 151.5 and 141.9 ms, the last stage's 142.0 and 149.3 ms, the heavier
    stage changing from one run to the next; and in five pinned rounds the first stage read 3.8, 4.5, 4.9, 3.6 and
    2.3 ms per 1F1B microbatch and the last 3.1, 3.9, 2.6, 2.3 and 2.8 ms (2BW: 3.0, 5.1, 4.2, 6.5 and 7.7 ms against
    3.3, 4.0, 3.9, 5.0 and 3.9 ms), so the largest read a median 0.35 ms (1F1B) and 0.6 ms (2BW) per microbatch above
    the mean. On the twenty-third build of the book the 2BW action read 1.83 ms and the 1F1B one 1.25 ms, while the
    profiled mode's median signed error over each schedule's runs would have been zero at about 0.25 and 0.75 ms: the
    mean removes a quarter of a millisecond of that, not the rest. Declared before the build that validates it."""
    import statistics

    import torch.distributed as dist

    from ..config import Config, Layout, ModelSpec, RunOptions, stage_layers, validate
    from ..model import build_stage, layer_input, lm_loss
    from ..parallel.loop import build_trainer
    from ..tokens import make_source
    from .breakdown import StepBreakdown

    spec = ModelSpec(**PATH_PROBE)
    source = make_source("synthetic", spec.vocab, spec.seq, 0)
    rank = dist.get_rank()
    first, last = rank == 0, rank == world - 1
    act = layer_input(spec, 1).requires_grad_(True)
    medians, waited = [], []
    for m in PIPE_MICROBATCHES:
        cfg = validate(Config(model=spec, layout=Layout(pp=world, micro_batch=1, microbatches=m, schedule=schedule)))
        trainer = build_trainer(cfg, RunOptions(device="cpu"), torch.device("cpu"))
        plain = build_stage(spec, stage_layers(spec, cfg.layout), rank)
        x, y = source.batch(0, m)

        def alone():
            for i in range(m):
                out = plain(x[i:i + 1] if first else act)
                (lm_loss(out, y[i:i + 1]) if last else out.sum()).backward()

        def timed(fn) -> float:
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start

        pipelined, together = [], []
        dist.barrier()
        for _ in range(reps + 2):
            if trainer.flushes:  # a plain pass after each step, every rank at once: drift cancels
                dist.barrier()
                pipelined.append(timed(lambda: trainer.step(x, y)))
                dist.barrier()
                together.append(timed(alone))
            else:  # 2BW's sends of one step are received in the next: its steps run back to back
                pipelined.append(timed(lambda: trainer.step(x, y)))
        trainer.finish()
        profiled_steps = []
        for _ in range(PIPE_PROFILED_STEPS):
            with StepBreakdown() as profiled:  # a drained step, as a run breaks 2BW's down (distperf.measure.steps)
                trainer.step(x, y)
                trainer.finish()
            profiled_steps.append(profiled.summary()["communication"])
        waited.append(statistics.median(profiled_steps))
        dist.barrier()
        if not together:
            together = [timed(alone) for _ in range(reps + 2)]
        medians.append(statistics.median(pipelined[2:]) - statistics.median(together[2:]))
    more = PIPE_MICROBATCHES[1] - PIPE_MICROBATCHES[0]
    return mean_over_ranks((medians[1] - medians[0]) / more), -slowest(-(waited[1] - waited[0]) / more,
                                                                        torch.device("cpu"))


def mean_over_ranks(seconds: float) -> float:
    """The mean of every rank's ``seconds`` (a collective over the world)."""
    import torch.distributed as dist

    value = torch.tensor([float(seconds)], dtype=torch.float64)
    dist.all_reduce(value)
    return float(value.item()) / dist.get_world_size()


def training_conditions(ranks: int, sizes, reps: int = 10, timeout: float = 120.0) -> dict:
    """Collectives and kernels as a training step meets them, on ``ranks`` CPU ranks over gloo (spawned, one thread
    each, pinned as a run's ranks are: ``placement``, one record per rank, :func:`join_spawned`): ``issued``, each
    collective issued after a burst of matrix products (about a millisecond), as a step issues it between its
    operators — the time it adds to the burst, no barrier before it, the slowest rank's
    median ([{collective, ranks, bytes, seconds}], as :func:`collective_times`); ``contention``, the time of a
    memory-bound copy (32 MiB) and of a 192×192 matrix product with every rank running it at once over the time on
    one rank alone ({memory, compute}, ≥ 1), and ``overlap``: the share of the shorter of an asynchronous all-reduce
    of DDP's default bucket (25 MiB) and the burst of matrix products it was issued before, about as long as it, that
    ran at once, (burst + all-reduce − both) / min(burst, all-reduce), in [0, 1], the least of any rank, the median
    of the rounds (``overlap_rounds``: each round's, with ``overlap_1mib``, the same of a 1 MiB all-reduce before
    four products, the rule until 4 December 2026); ``paths``, the parallel paths' times
    (:func:`parallel_paths`). With ``reps`` ≥ 10 the contention is measured :data:`CONTENTION_ROUNDS` times
    (``contention_rounds``; the profile takes the least: the comment at :data:`PATH_ROUNDS_FROM_REPS` says why), and
    the issued collectives and the paths in rounds until the constants taken from them settle
    (:mod:`distperf.measure.rounds`; ``issued_rounds``, ``path_rounds``: each round; ``rounds``: how many, whether they
    settled, the last round's moves, and ``threads``: each round's threads on rank 0 when its path probes began and
    ended), the issued times and the paths the rounds' medians. Each round runs in fresh processes (the comment at
    :data:`PATH_ROUNDS_FROM_REPS` says why). Raises TimeoutError when a round takes longer than ``timeout``."""
    import statistics

    least, most = (ROUNDS_MIN, ROUNDS_MAX) if reps >= PATH_ROUNDS_FROM_REPS else (1, 1)
    rounds, moved, began = [], {}, time.monotonic()
    while True:  # each round in fresh processes, until the constants settle (distperf.measure.rounds)
        contention = (CONTENTION_ROUNDS if least > 1 else 1) if not rounds else 0
        rounds.append(spawned_ranks(_conditions_rank, ranks, lambda out: (ranks, tuple(sizes), reps, contention, out),
                                    timeout, "the training-conditions benchmark"))
        moved = moves([r["issued"] for r in rounds], [r["paths"] for r in rounds])
        if not another_round(len(rounds), time.monotonic() - began, moved, least, most):
            break
    issued_rounds, path_rounds = [r["issued"] for r in rounds], [r["paths"] for r in rounds]
    overlap_rounds, ratios = [r["overlap"] for r in rounds], rounds[0]["contention_rounds"]
    contention = {"overlap": statistics.median(r["overlap"] for r in overlap_rounds), **least_contention(ratios)}
    record = {"rounds": len(rounds), "settled": settled(moved), "last_moves": moved, "rule": {
        "least": least, "most": most, "settled": SETTLED, "budget_s": ROUNDS_BUDGET_S},
        "seconds": round(time.monotonic() - began, 2), "threads": [r["threads"] for r in rounds]}
    return {"issued": median_rows(issued_rounds), "issued_rounds": issued_rounds, "contention": contention,
            "compute_between_s": rounds[0]["compute_between_s"],
            "paths": {name: statistics.median(r[name] for r in path_rounds) for name in path_rounds[0]},
            "path_rounds": path_rounds, "contention_rounds": ratios, "overlap_rounds": overlap_rounds,
            "rounds": record, "placement": rounds[0]["placement"]}


def process_threads() -> int:
    """How many threads this process runs (Linux; 0 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


# --- the whole calibration ---------------------------------------------------------------------

def physical_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def calibrate(quick: bool = False, models=("small",), micro_batches=(1, 2, 4), ranks: int | None = None,
              threads: int | None = None, device: str = "cpu", timeout: float = 300.0, log=print):
    """Measure; return (Hardware, sidecar dict)."""
    from ..hardware import Hardware
    from ..results import machine_slug, provenance

    dev = torch.device(device)
    if threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    min_run = 0.05 if quick else 0.3
    ranks = ranks or (torch.cuda.device_count() if dev.type == "cuda" else max(2, min(os.cpu_count() or 2, 8)))
    start = time.monotonic()
    phases = []  # (what, seconds from the start) of every step the log names: where a calibration's time goes
    say = log

    def log(message):
        phases.append([str(message), round(time.monotonic() - start, 2)])
        say(message)

    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if dev.type == "cuda" else [])
    log(f"matrix products ({threads} thread(s))")
    gemm = gemm_rates(SIZES_QUICK if quick else SIZES_FULL, dtypes, dev, min_run)
    log("memory bandwidth")
    copy = copy_bandwidth((32 if quick else 256) * 2**20, dev, min_run)
    log("layer times")
    layers = [row for m in models for row in layer_times(m, micro_batches, dev, min_run)]
    kernels, step_fit, speed = None, None, None
    if dev.type == "cpu":
        from .kernels import fit_step_overhead, kernel_costs
        from .speed import median, probe

        probes = []  # the machine's speed before each kernel table and after the last
        kernels = kernel_costs(quick, log, between=lambda: probes.append(probe()))
        log("kernels: the step's fixed Python, fitted on the tiny preset")
        step_fit = fit_step_overhead(kernels, steps=4 if quick else 12)
        kernels["step_s"] = step_fit["step_s"]
        probes.append(probe())
        kernels["probe"] = median(probes)
        speed = {"probes": probes}
    log(f"collectives on 2..{ranks} ranks")
    if ranks < 2:
        from ..config import ConfigError

        raise ConfigError("ranks", f"the collectives need at least 2 ranks (devices), got {ranks}")
    comm = collective_times(ranks, MESSAGE_BYTES_QUICK if quick else MESSAGE_BYTES_FULL, reps=5 if quick else 15,
                            device=device, timeout=timeout)
    fits = fit_collectives(comm)
    conditions, issued_fits = None, {}
    if dev.type == "cpu":
        log(f"collectives as a step issues them, and contention, on {ranks} ranks")
        conditions = training_conditions(ranks, MESSAGE_BYTES_QUICK if quick else MESSAGE_BYTES_FULL[::2],
                                          reps=5 if quick else 15, timeout=timeout)
        issued_fits = fit_issued(fitted_rows(conditions["issued"]), fits)
        kernels["contention"] = conditions["contention"]
        log(f"waiting for the slowest rank, on {ranks} ranks")
        from .skew import SKEW_BURSTS, SKEW_BURSTS_QUICK, SKEW_UNITS, SKEW_UNITS_QUICK, skew_waits

        skew = skew_waits(ranks, SKEW_BURSTS_QUICK if quick else SKEW_BURSTS,
                          SKEW_UNITS_QUICK if quick else SKEW_UNITS, timeout=timeout)
        log("a receive from a computing sender, on 2 ranks")
        from .busy_sender import TRIALS, TRIALS_QUICK, busy_sender_waits

        busy_sender = busy_sender_waits(TRIALS_QUICK if quick else TRIALS, timeout=timeout)
        log(f"FSDP2 units by size, on {ranks} ranks")
        from .fsdp_overhead import fsdp_unit_times

        fsdp_units = fsdp_unit_times(ranks, FSDP_UNIT_HIDDENS_QUICK if quick else FSDP_UNIT_HIDDENS,
                                     reps=3 if quick else 9, timeout=timeout)

    best = {d: max((r["flops_per_s"] for r in gemm if r["dtype"] == d), default=None) for d in ("float32", "bfloat16")}
    ar = fits["all-reduce"]["all"]
    from ..cost.kernels import KernelCosts

    hw = Hardware(name=f"calibrated-{machine_slug(device)}", flops_fp32=best["float32"],
                  flops_16bit=best["bfloat16"] or best["float32"], memory_bandwidth=copy["bytes_per_s"],
                  memory_capacity=float(physical_memory(dev)), intra_bandwidth=ar["beta"], intra_latency=ar["alpha"],
                  inter_bandwidth=ar["beta"], inter_latency=ar["alpha"],
                  devices_per_node=torch.cuda.device_count() if dev.type == "cuda" else (os.cpu_count() or 1),
                  kernels=KernelCosts.from_dict(kernels) if kernels else None,
                  collectives=tuple((c, f["all"]["alpha"], f["all"]["beta"]) for c, f in sorted(issued_fits.items())),
                  collectives_on=(ar["alpha"], ar["beta"]) if issued_fits else ())
    if conditions is not None:
        hw = with_path_constants(hw, conditions["paths"], ranks)
        conditions["fsdp_units"] = fsdp_units
        conditions["skew"] = skew
        conditions["busy_sender"] = busy_sender
    sidecar = {"provenance": provenance(device), "quick": quick, "threads": threads, "ranks": ranks,
               "seconds": round(time.monotonic() - start, 2), "phases_s": phases, "gemm": gemm, "copy": copy, "layers": layers,
               "collectives": comm, "fits": fits, "step_fit": step_fit, "conditions": conditions,
               "issued_fits": issued_fits,
               "speed_probe": speed,
               "profile_from": {"flops_fp32": "max gemm float32", "flops_16bit": "max gemm bfloat16 (else float32)",
                                "memory_bandwidth": "copy", "memory_capacity": "physical memory",
                                "intra_latency": "fits.all-reduce.all.alpha", "intra_bandwidth": "fits.all-reduce.all.beta",
                                "inter_*": "the same as intra_*",
                                "collectives": "issued_fits.<kind>.all: alpha and beta of each kind as a step "
                                               "issues it (conditions.issued)",
                                "kernels.contention": "conditions.contention",
                                "conditions.fsdp_units": "measured, not priced: the book's what-if "
                                                         "(distperf.measure.path_fits.fsdp_unit_table)",
                                "conditions.skew": "measured, not priced: the book's what-if "
                                                   "(distperf.measure.skew.skew_table)",
                                "conditions.busy_sender": "measured, not priced: the book's what-if "
                                                          "(kernels.p2p_stall_s = its stall_s)",
                                "kernels": "distperf.measure.kernels microbenchmarks (CPU); kernels.step_s: "
                                           "step_fit, on the tiny preset; kernels.probe: per part the median "
                                           "of speed_probe.probes (distperf.measure.speed)"}}
    return hw, sidecar


def write(hw, sidecar: dict, profile: Path) -> Path:
    """Write the profile (read by hardware.load_profile) and its sidecar; return the sidecar's path."""
    from ..hardware import save_profile

    profile = Path(profile)
    profile.parent.mkdir(parents=True, exist_ok=True)
    save_profile(hw, profile)
    side = sidecar_path(profile)
    side.write_text(json.dumps(sidecar, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o)
                               else str(o)) + "\n")
    return side
