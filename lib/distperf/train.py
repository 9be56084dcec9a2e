"""Per-rank training entry point: every process of a run executes ``python -m distperf.train``.

``python -m distperf run`` starts it through torch's launcher (``torch.distributed.run``). On several
nodes, or with another launcher, start it yourself; it reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT from the environment as every torch launcher sets them::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m distperf.train --model gpt2 --dp 4 --tp 4 --micro-batch 4 --steps 50 --out result.json
    accelerate launch --multi_gpu --num_processes 16 --num_machines 2 --machine_rank R \\
        --main_process_ip HOST -m distperf.train --model gpt2 --dp 4 --tp 4 --micro-batch 4 --steps 50 \\
        --out result.json

(``accelerate launch --multi_gpu`` goes through torchrun and also works on CPU-only hosts with
``--device cpu``; its ``--cpu`` flag instead starts one process, or MPI ranks, without RANK.)

It takes the layout flags of ``predict``/``run`` (or ``--spec FILE``, the JSON that ``run`` writes) and
the run options; rank 0 writes the result JSON to ``--out`` (or stdout). A rank that fails writes its
error next to ``--out`` (``<out>.rank<R>.error``) before exiting with status 1.

Each rank first pins itself to cores of its own (:func:`distperf.launch.pin_this_rank`); the result's
``placement`` says where every rank ran (``cores``, one list per rank), with how many threads, or why the
ranks were not pinned.

``--batch FILE --out-dir DIR`` (the sweep's, :mod:`distperf.runner.batch`) runs several configurations one
after another in the same process group: FILE holds ``{"runs": [{"config", "options", "policy",
"hardware"}, …]}``, all of one world size. For each, every rank builds a fresh mesh and trainer and trains
(:func:`distperf.parallel.loop.run_training`); rank 0 adds the prediction beside it (``hardware``, as
``run --hardware`` does: :func:`distperf.measure.compare.attach`) while the other ranks wait, and writes
``DIR/<i>.json`` as soon as configuration ``i`` is done; with ``"handshake": true`` in FILE it then waits for
``DIR/<i>.next`` (the sweep has written its row); then all meet before the next one starts. A rank that fails
writes ``DIR/<i>.rank<R>.error`` and exits, which ends the launch.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from dataclasses import replace

from . import atomic
from .config import Config, ConfigError, RunOptions, needs_distributed
from .flags import add_config_arguments, add_run_arguments, config_and_policy, options_from_args


def _resolve_time_partition(cfg: Config, device: str) -> Config:
    """``--partition time`` under a foreign launcher: rank 0 measures, every rank uses its answer."""
    import torch.distributed as dist

    from .parallel.partition import resolve

    if not dist.is_initialized():
        return resolve(cfg, "time", device)
    box = [resolve(cfg, "time", device).layout.partition if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return replace(cfg, layout=replace(cfg.layout, partition=tuple(box[0])))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m distperf.train", description=__doc__.splitlines()[0])
    add_config_arguments(p)
    add_run_arguments(p)
    p.add_argument("--spec", help="JSON file with 'config' and 'options' (written by distperf run); "
                                  "replaces the layout and run flags")
    p.add_argument("--out", help="write the result JSON here (rank 0) instead of stdout")
    p.add_argument("--parameters-out", help="write the trained parameters of every rank, whole and by name, to this "
                                            "file (rank 0, torch.save)")
    p.add_argument("--batch", help="JSON file with the configurations to run one after another (the sweep's); "
                                   "results go to --out-dir")
    p.add_argument("--out-dir", help="with --batch: write configuration i's result to OUT_DIR/<i>.json")
    a = p.parse_args(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank of torchrun's: it dies with its launcher
        from .launch import die_with_parent

        die_with_parent()
    rank = int(os.environ.get("RANK", 0))
    if a.batch:
        return run_batch(a.batch, a.out_dir or ".")
    try:
        from .parallel.loop import run_training
        from .parallel.mesh import init_distributed
        from .parallel.rules import check_run

        if a.spec:
            with open(a.spec) as f:
                spec = json.load(f)
            cfg, policy, opts = Config.from_dict(spec["config"]), None, RunOptions(**spec["options"])
        else:
            cfg, policy = config_and_policy(a)
            opts = options_from_args(a)
        check_run(cfg, opts)
        distributed = needs_distributed(cfg)
        if distributed:
            init_distributed(opts.device, opts.timeout_s)
        placement = place_ranks(distributed)
        if policy == "time":
            cfg = _resolve_time_partition(cfg, opts.device if opts.device != "auto" else "cpu")
        result = {**run_training(cfg, opts, parameters=bool(a.parameters_out)), "placement": placement}
        if a.parameters_out:
            from .parallel.loop import save_parameters

            save_parameters(result.pop("parameters"), a.parameters_out)
    except ConfigError as e:
        print(f"distperf.train: error: {e}", file=sys.stderr)
        _write_error(a.out, rank, f"{e}")
        _exit_now(2)
    except BaseException as e:
        traceback.print_exc()
        _write_error(a.out, rank, f"{type(e).__name__}: {e}")
        _exit_now(1)
    if rank == 0:
        text = json.dumps(result, indent=1)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)
        else:
            print(text)
    _shutdown()
    return 0


def place_ranks(distributed: bool) -> dict:
    """Pin this rank (:func:`distperf.launch.pin_this_rank`, at its thread count) and return the placement of
    every rank (collective when distributed): ``pinned`` (all ranks), ``cores`` (one list per rank),
    ``threads`` and ``threads_from`` (the user's OMP_NUM_THREADS, or cores // ranks), ``reason`` (why not)."""
    import torch
    import torch.distributed as dist

    from .launch import pin_this_rank

    mine = pin_this_rank(torch.get_num_threads())
    ranks = [mine]
    if distributed:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    return {"pinned": all(r["pinned"] for r in ranks), "cores": [r["cores"] for r in ranks],
            "threads": mine["threads"], "threads_from": mine["threads_from"],
            "reason": next((r["reason"] for r in ranks if r["reason"]), "")}


def run_batch(spec_path: str, out_dir: str) -> int:
    """Run the configurations of a batch file one after another in this process group (see the module
    docstring); rank 0 writes each result as it is done. A failure ends the process at once."""
    from .launch import available_cores
    from .parallel.loop import run_training
    from .parallel.mesh import init_distributed
    from .parallel.rules import check_run

    rank = int(os.environ.get("RANK", 0))
    allowed = available_cores()
    with open(spec_path) as f:
        batch = json.load(f)
    runs, handshake = batch["runs"], batch.get("handshake", False)
    where = os.path.join(out_dir, "0")
    try:
        first = [(Config.from_dict(r["config"]), RunOptions(**r["options"])) for r in runs[:1]][0]
        distributed = "RANK" in os.environ or needs_distributed(first[0])
        if distributed:
            init_distributed(first[1].device, max(r["options"]["timeout_s"] for r in runs))
        placement = place_ranks(distributed)
        for i, run in enumerate(runs):
            where = os.path.join(out_dir, str(i))
            cfg, opts = Config.from_dict(run["config"]), RunOptions(**run["options"])
            check_run(cfg, opts)
            if run.get("policy") == "time":
                cfg = _resolve_time_partition(cfg, opts.device if opts.device != "auto" else "cpu")
            result = {**run_training(cfg, opts), "placement": placement}
            if rank == 0:
                _predict_beside(cfg, result, run.get("hardware", "auto"), allowed)
                atomic.write_text(f"{where}.json", json.dumps(result, indent=1))
                if handshake and i + 1 < len(runs):
                    _wait_for(f"{where}.next", opts.timeout_s)
            del result
            gc.collect()
            if distributed:  # the next configuration starts when rank 0 has written this one's result
                import torch.distributed as dist

                dist.barrier()
    except ConfigError as e:
        print(f"distperf.train: error: {e}", file=sys.stderr)
        _write_error(where, rank, f"{e}")
        _exit_now(2)
    except BaseException as e:
        traceback.print_exc()
        _write_error(where, rank, f"{type(e).__name__}: {e}")
        _exit_now(1)
    _shutdown()
    return 0


def _predict_beside(cfg: Config, result: dict, hardware: str, allowed: list[int]) -> None:
    """``run``'s prediction and errors (:func:`distperf.measure.compare.attach`), with this rank back on the cores
    it was ``allowed`` before pinning: a quick calibration may start processes of its own, which would inherit
    the pinning."""
    from .launch import available_cores, set_affinity
    from .measure.compare import attach

    pinned = available_cores()
    try:
        set_affinity(allowed)
        attach(cfg, result, hardware)
    finally:
        set_affinity(pinned)


def _wait_for(path: str, timeout_s: float) -> None:
    """Until ``path`` exists (the sweep has written the row of a result); RuntimeError after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sweep did not take the result within {timeout_s:g} s ({path} is missing)")
        time.sleep(0.005)


def _write_error(out: str | None, rank: int, message: str) -> None:
    if out:
        with open(f"{out}.rank{rank}.error", "w") as f:
            f.write(message)


def _exit_now(status: int) -> None:
    """Leave at once: a failed rank must not linger in the process group's teardown while its peers
    wait for it; its exit closes their connections, so they fail fast too."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
