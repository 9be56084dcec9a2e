"""The command-line flags that describe a configuration, shared by ``predict``, ``run`` and ``sweep``.

``add_config_arguments`` declares them; ``config_from_args`` turns parsed flags into a validated
:class:`~distperf.config.Config` (raising ConfigError with the flag's name on a bad value).
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from . import presets
from .config import (ARCHS, OPTIMIZERS, PRECISIONS, RECOMPUTE, SCHEDULES, Config, ConfigError, Layout,
                     Training, global_batch_to_microbatches, validate)

MODEL_OVERRIDES = ("layers", "hidden", "heads", "ffn", "vocab", "seq")


def add_config_arguments(p: argparse.ArgumentParser, default_model: str = "small") -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=default_model, help=f"preset name (default {default_model}); see distperf.presets")
    g.add_argument("--arch", choices=ARCHS, help="gpt (causal decoder) or bert (encoder); overrides the preset")
    for name in MODEL_OVERRIDES:
        g.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")
    g.add_argument("--dropout", dest="dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="dropout on (p=0.1) or off; default: the preset's")
    g.add_argument("--untied", action="store_true", help="untie the output projection from the token embedding")

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
                        "uniform, params (balanced parameters) or time (balanced measured time)")

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


def config_from_args(a: argparse.Namespace) -> Config:
    spec = presets.model(a.model)
    over = {n: getattr(a, n) for n in MODEL_OVERRIDES if getattr(a, n) is not None}
    if a.arch:
        over["arch"] = a.arch
    if a.dropout is not None:
        over["dropout"] = 0.1 if a.dropout else 0.0
    if a.untied:
        over["tied"] = False
    if "hidden" in over and "ffn" not in over:
        over["ffn"] = 4 * over["hidden"]
    spec = replace(spec, **over)

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
