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
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import replace

from .config import Config, ConfigError, RunOptions
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
    a = p.parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    try:
        from .parallel.loop import needs_distributed, run_training
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
        if needs_distributed(cfg):
            init_distributed(opts.device, opts.timeout_s)
        if policy == "time":
            cfg = _resolve_time_partition(cfg, opts.device if opts.device != "auto" else "cpu")
        result = run_training(cfg, opts)
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
