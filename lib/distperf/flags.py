"""The command-line flags of a configuration and a run, defined once for every command that takes them.

- :func:`add_config_arguments` / :func:`config_from_args`: the model, the parallel layout and the training
  settings (``predict``, ``run``, the per-rank entry point :mod:`distperf.train`); a bad value raises
  :class:`~distperf.config.ConfigError` naming the flag and the rule;
- :func:`add_run_arguments` / :func:`options_from_args`: what a run needs besides the configuration
  (:class:`~distperf.config.RunOptions`);
- :data:`COMMAND_ARGUMENTS`: all the flags of ``run`` and ``predict``; the commands declare theirs with it,
  and an experiment file (:mod:`distperf.runner.grid`) is checked against the same parser.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from . import presets
from .config import (ARCHS, ATTENTIONS, DATA_SOURCES, DDP_BUCKET_MB, DEVICES, MAX_EVAL_BATCHES, MESH_ORDERS,
                     OPTIMIZERS, PRECISIONS, RECOMPUTE, SCHEDULES, Config, ConfigError, Layout, ModelSpec, RunOptions,
                     Training, global_batch_to_microbatches, validate, validate_model)
from .emulation.options import add_network_arguments

MODEL_OVERRIDES = ("layers", "hidden", "heads", "ffn", "vocab", "seq")
PARTITION_POLICIES = ("uniform", "params", "time", "flops")  # distperf.parallel.partition


def add_model_arguments(p: argparse.ArgumentParser, default_model: str | None = "small") -> None:
    """The model: a preset (``--model``, any case; required when ``default_model`` is None) and the flags that
    override its dimensions and options."""
    g = p.add_argument_group("model")
    if default_model is None:
        g.add_argument("--model", required=True, help="preset name (any case); see distperf.presets")
    else:
        g.add_argument("--model", default=default_model,
                       help=f"preset name, any case (default {default_model}); see distperf.presets")
    g.add_argument("--arch", choices=ARCHS, help="gpt (causal decoder) or bert (encoder); overrides the preset")
    for name in MODEL_OVERRIDES:
        g.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")
    g.add_argument("--dropout", dest="dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="dropout on (p=0.1) or off; default: the preset's")
    g.add_argument("--untied", action="store_true", help="untie the output projection from the token embedding")
    g.add_argument("--attention", choices=ATTENTIONS, default=None,
                   help="attention core: sdpa (torch's fused scaled_dot_product_attention, no s×s scores kept) or "
                        "math (explicit softmax(QKᵀ/√d)·V, the form Korthikanti et al. count); default: the preset's")


def add_config_arguments(p: argparse.ArgumentParser, default_model: str = "small") -> None:
    add_model_arguments(p, default_model)
    g = p.add_argument_group("parallel layout")
    for name in ("dp", "tp", "pp"):
        g.add_argument(f"--{name}", type=int, default=1, help=f"{name} degree (default 1)")
    g.add_argument("--sequence-parallel", action="store_true", help="sequence parallelism with tensor parallelism")
    g.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="pipeline schedule; default none for pp=1 and 1f1b otherwise")
    g.add_argument("--chunks", type=int, default=None, help="model chunks per rank (interleaved; default 2 there, else 1)")
    g.add_argument("--micro-batch", type=int, default=1, help="microbatch size b (default 1)")
    batch = g.add_mutually_exclusive_group()
    batch.add_argument("--microbatches", type=int, default=None, help="microbatches per step m (default pp)")
    batch.add_argument("--global-batch", type=int, default=None, help="global batch B = b·m·dp")
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 (default 0)")
    g.add_argument("--recompute", choices=RECOMPUTE, default="none", help="activation recomputation (default none)")
    g.add_argument("--partition", default="",
                   help="layers per stage, comma-separated, e.g. 3,1 (default uniform); run also takes a policy: "
                        "uniform, params (balanced parameters), time (balanced measured time) or flops (balanced "
                        "FLOPs, the head's included)")

    g = p.add_argument_group("training")
    g.add_argument("--precision", choices=PRECISIONS, default="fp32", help="fp32 or mixed (default fp32)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="adam or sgd (default adam)")


def _partition(text: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError("partition", f"must be comma-separated integers, got {text!r}") from None


def model_from_args(a: argparse.Namespace) -> ModelSpec:
    """The preset of ``--model`` with the overrides of :func:`add_model_arguments`, its own rules checked."""
    spec = presets.model(a.model)
    over = {n: getattr(a, n) for n in MODEL_OVERRIDES if getattr(a, n) is not None}
    if a.arch:
        over["arch"] = a.arch
    if a.dropout is not None:
        over["dropout"] = 0.1 if a.dropout else 0.0
    if a.untied:
        over["tied"] = False
    if getattr(a, "attention", None) is not None:
        over["attention"] = a.attention
    if "hidden" in over and "ffn" not in over:
        over["ffn"] = 4 * over["hidden"]
    return validate_model(replace(spec, **over))


def config_from_args(a: argparse.Namespace) -> Config:
    spec = model_from_args(a)
    schedule = a.schedule or ("1f1b" if a.pp > 1 else "none")
    chunks = a.chunks if a.chunks is not None else (2 if schedule == "interleaved" else 1)
    if a.global_batch is not None:
        if a.micro_batch < 1 or a.dp < 1:
            raise ConfigError("micro_batch" if a.micro_batch < 1 else "dp", "must be a positive integer")
        microbatches = global_batch_to_microbatches(a.global_batch, a.micro_batch, a.dp)
    else:
        microbatches = a.microbatches if a.microbatches is not None else a.pp
    layout = Layout(dp=a.dp, tp=a.tp, pp=a.pp, sequence_parallel=a.sequence_parallel, schedule=schedule,
                    chunks=chunks, micro_batch=a.micro_batch, microbatches=microbatches, zero=a.zero,
                    recompute=a.recompute, partition=_partition(a.partition))
    return validate(Config(model=spec, layout=layout, training=Training(a.precision, a.optimizer)))


def config_and_policy(a: argparse.Namespace) -> tuple[Config, str | None]:
    """The validated configuration, and ``time`` if ``--partition time`` asks for a partition measured at
    start-up (``params`` and ``flops`` are resolved here, from counts; ``uniform`` is the default)."""
    policy = a.partition if a.partition in PARTITION_POLICIES else None
    if policy:
        a = argparse.Namespace(**{**vars(a), "partition": ""})
    cfg = config_from_args(a)
    if policy in ("params", "flops"):  # from counts: resolved here, no measurement
        from .parallel.partition import resolve

        cfg, policy = resolve(cfg, policy), None
    return cfg, policy if policy != "uniform" else None


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=int, default=10, help="optimizer steps (default 10)")
    g.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the data (default 0)")
    g.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    g.add_argument("--device", choices=DEVICES, default="auto", help="auto: CUDA if present (NCCL), else CPU (gloo)")
    g.add_argument("--bucket-mb", type=float, default=float(DDP_BUCKET_MB),
                   help="DDP gradient bucket in MiB, the communication block size (default 25, torch's)")
    g.add_argument("--data", choices=DATA_SOURCES, default="synthetic",
                   help="synthetic Markov-chain tokens or English text (pydoc_data, bytes) (default synthetic)")
    g.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing statistics (default 1)")
    g.add_argument("--timeout", type=float, default=900.0,
                   help="seconds: a collective that waits longer fails, and run stops the whole launch (default 900)")
    g.add_argument("--mesh-order", default="pp,dp,tp", choices=MESH_ORDERS,
                   help="how consecutive ranks (one node's) fill the mesh, slowest-varying dimension first: "
                        "pp,dp,tp keeps a stage's replicas together, dp,pp,tp a replica's pipeline "
                        "(default pp,dp,tp; distperf.parallel.mesh)")
    g.add_argument("--eval-batches", type=int, default=0,
                   help="after training, the loss on this many held-out batches of the global batch size, with the "
                        "trained weights gathered into one model (text: the corpus's last 10 %%; synthetic: batches "
                        "training never draws) (default 0: none)")
    g.add_argument("--measure", action=argparse.BooleanOptionalAction, default=True,
                   help="after the timed steps, measure memory by category and communication by kind on 3 more "
                        "optimizer steps (distperf.measure.steps) (default on)")
    g.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=True,
                   help="with --no-measure, still break one more optimizer step's time down by class on CPU (the "
                        "time-breakdown step of distperf.measure.steps, which --measure takes too): a time, which "
                        "varies from run to run, unlike memory and bytes (default on)")
    g.add_argument("--trace", metavar="FILE", default=None,
                   help="write the first time-breakdown step of every rank, action by action (each pipeline stage's "
                        "forwards and backwards, its optimizer step, its waits), to FILE as one Chrome trace: open it "
                        "in Perfetto (ui.perfetto.dev); python -m distperf.measure.pipeline_replay FILE says what each wait "
                        "waited for "
                        "(CPU; needs the breakdown step)")


def options_from_args(a: argparse.Namespace) -> RunOptions:
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
    if not 0 <= a.eval_batches <= MAX_EVAL_BATCHES:
        raise ConfigError("eval_batches", f"must be 0 to {MAX_EVAL_BATCHES}, got {a.eval_batches}")
    if a.trace is not None and not (a.measure or a.breakdown):
        raise ConfigError("trace", "needs the time-breakdown step: drop --no-breakdown or --no-measure")
    if a.trace is not None and Path(a.trace).is_dir():
        raise ConfigError("trace", f"must be a file to write, got the directory {a.trace}")
    return RunOptions(steps=a.steps, seed=a.seed, lr=a.lr, bucket_mb=a.bucket_mb, data=a.data, device=a.device,
                      warmup=min(a.warmup, a.steps - 1), timeout_s=a.timeout, measure=a.measure,
                      breakdown=a.breakdown,
                      mesh_order=a.mesh_order, eval_batches=a.eval_batches,
                      trace=str(Path(a.trace).resolve()) if a.trace is not None else None)


def add_hardware_argument(p: argparse.ArgumentParser, default: str, help_text: str) -> None:
    p.add_argument("--hardware", default=default, help=help_text)


def add_run_command_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``python -m distperf run``."""
    add_config_arguments(p)
    add_run_arguments(p)
    add_hardware_argument(p, "auto", "the hardware of the prediction beside the run: auto (this machine's profile "
                                     "from python -m distperf calibrate at the ranks' thread count, else a quick "
                                     "calibration now), a preset, a profile file, or none (default auto)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--parameters-out", metavar="FILE", help="also write the trained parameters, whole and by name, "
                                                            "to FILE (torch.save): to compare layouts tensor by tensor")
    add_network_arguments(p)


def add_convention_arguments(g) -> None:
    """``--convention`` and ``--backend`` of the cost model (:func:`distperf.cost.predict`)."""
    from .cost.activations import CONVENTIONS
    from .cost.collectives import BACKENDS

    g.add_argument("--convention", choices=CONVENTIONS, default="trainer",
                   help="count what the trainers run (trainer, default) or what the papers count (paper: ZeRO's "
                        "mixed-precision bytes, unfused attention, ZeRO-1 as reduce-scatter + all-gather)")
    g.add_argument("--backend", choices=BACKENDS, default="nccl",
                   help="whose collective algorithms are timed: nccl (default) or gloo")


def add_predict_command_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``python -m distperf predict``."""
    from .hardware import DEFAULT, PRESETS

    add_config_arguments(p)
    g = p.add_argument_group("hardware and output")
    add_hardware_argument(g, DEFAULT, f"preset ({', '.join(PRESETS)}) or a profile file (JSON); default {DEFAULT}")
    g.add_argument("--bucket-mb", type=float, default=float(DDP_BUCKET_MB),
                   help="data-parallel gradient bucket in MiB (default 25, as torch DDP)")
    add_convention_arguments(g)
    g.add_argument("--json", action="store_true", help="print the prediction as JSON")


COMMAND_ARGUMENTS = {"run": add_run_command_arguments, "predict": add_predict_command_arguments}
