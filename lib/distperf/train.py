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

from .cli_args import add_config_arguments, config_from_args
from .config import Config, ConfigError, Layout, ModelSpec, Training, validate
from .data import SOURCES

DEVICES = ("auto", "cpu", "cuda")
PARTITION_POLICIES = ("uniform", "params", "time")
MESH_ORDERS = ("pp,dp,tp", "dp,pp,tp")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    g.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the data (default 0)")
    g.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    g.add_argument("--device", choices=DEVICES, default="auto", help="auto: CUDA if present (NCCL), else CPU (gloo)")
    g.add_argument("--bucket-mb", type=float, default=25.0,
                   help="DDP gradient bucket in MiB, the communication block size (default 25, torch's)")
    g.add_argument("--data", choices=SOURCES, default="synthetic",
                   help="synthetic Markov-chain tokens or English text (pydoc_data, bytes) (default synthetic)")
    g.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing statistics (default 1)")
    g.add_argument("--timeout", type=float, default=900.0,
                   help="seconds: a collective that waits longer fails, and run stops the whole launch (default 900)")
    g.add_argument("--mesh-order", default="pp,dp,tp", choices=MESH_ORDERS,
                   help="how consecutive ranks (one node's) fill the mesh, slowest-varying dimension first: "
                        "pp,dp,tp keeps a stage's replicas together, dp,pp,tp a replica's pipeline "
                        "(default pp,dp,tp; distperf.parallel.mesh)")
    g.add_argument("--measure", action=argparse.BooleanOptionalAction, default=True,
                   help="after the timed steps, measure memory by category and communication by kind on 3 more "
                        "optimizer steps (distperf.measure.steps) (default on)")


def options_from_args(a: argparse.Namespace):
    from .parallel.common import RunOptions

    if a.steps < 1:
        raise ConfigError("steps", f"must be a positive integer, got {a.steps}")
    if not a.lr > 0:
        raise ConfigError("lr", f"must be positive, got {a.lr}")
    if not a.bucket_mb > 0:
        raise ConfigError("bucket_mb", f"must be positive, got {a.bucket_mb}")
    if a.warmup < 0:
        raise ConfigError("warmup", f"must be 0 or more, got {a.warmup}")
    if not a.timeout > 0:
        raise ConfigError("timeout", f"must be positive, got {a.timeout}")
    return RunOptions(steps=a.steps, seed=a.seed, lr=a.lr, bucket_mb=a.bucket_mb, data=a.data, device=a.device,
                      warmup=min(a.warmup, a.steps - 1), timeout_s=a.timeout, measure=a.measure,
                      mesh_order=a.mesh_order)


def config_and_policy(a: argparse.Namespace) -> tuple[Config, str | None]:
    """The validated configuration, and the partition policy if ``--partition`` names one."""
    policy = a.partition if a.partition in PARTITION_POLICIES else None
    if policy:
        a = argparse.Namespace(**{**vars(a), "partition": ""})
    cfg = config_from_args(a)
    if policy == "params":
        from .parallel.partition import resolve
        cfg, policy = resolve(cfg, "params"), None
    return cfg, policy if policy != "uniform" else None


def check_run(cfg: Config, opts) -> None:
    """Rules of the trainers beyond :func:`distperf.config.validate`; raise ConfigError before any
    process starts."""
    from .parallel.pipeline import check_pipeline

    check_pipeline(cfg)
    if opts.data == "text" and cfg.model.vocab < 256:
        raise ConfigError("data", f"the byte-level text needs vocab >= 256, the model has {cfg.model.vocab}")
    if opts.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda was asked for but torch sees no CUDA device")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.layout.world_size))
        if torch.cuda.device_count() < local:
            raise ConfigError("device", f"{local} ranks on this node need as many GPUs, "
                                        f"torch sees {torch.cuda.device_count()}")


def config_to_json(cfg: Config) -> dict:
    return cfg.to_dict()


def config_from_json(d: dict) -> Config:
    layout = {**d["layout"], "partition": tuple(d["layout"]["partition"])}
    return validate(Config(model=ModelSpec(**d["model"]), layout=Layout(**layout), training=Training(**d["training"])))


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
        from .parallel.common import RunOptions
        from .parallel.loop import needs_distributed, run_training
        from .parallel.mesh import init_distributed

        if a.spec:
            with open(a.spec) as f:
                spec = json.load(f)
            cfg, policy, opts = config_from_json(spec["config"]), None, RunOptions(**spec["options"])
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
