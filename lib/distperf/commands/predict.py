"""``python -m distperf predict``: the cost model's prediction for one configuration.

Prints a table with units, or with ``--json`` the dictionary of :func:`distperf.cost.predict`.
"""
from __future__ import annotations

import argparse
import json

from ..cli_args import add_config_arguments, config_from_args
from ..config import ConfigError
from ..cost import DDP_BUCKET_BYTES, predict
from ..hardware import DEFAULT, PRESETS, hardware


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    g = p.add_argument_group("hardware and output")
    g.add_argument("--hardware", default=DEFAULT,
                   help=f"preset ({', '.join(PRESETS)}) or a profile file (JSON); default {DEFAULT}")
    g.add_argument("--bucket-mb", type=float, default=DDP_BUCKET_BYTES / 2**20,
                   help="data-parallel gradient bucket in MiB (default 25, as torch DDP)")
    g.add_argument("--json", action="store_true", help="print the prediction as JSON")


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if not args.bucket_mb > 0:
        raise ConfigError("bucket_mb", f"must be positive, got {args.bucket_mb!r}")
    result = predict(cfg, hardware(args.hardware), bucket_bytes=args.bucket_mb * 2**20, check=False)
    print(json.dumps(result, indent=2) if args.json else table(result, cfg))
    return 0


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def _seconds(x: float) -> str:
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(x) >= size:
            return f"{x / size:,.3f} {unit}"
    return f"{x * 1e9:,.1f} ns" if x else "0 s"


def table(r: dict, cfg) -> str:
    lay = cfg.layout
    layout = (f"dp={lay.dp} tp={lay.tp}{' (sp)' if lay.sequence_parallel else ''} pp={lay.pp} "
              f"schedule={lay.schedule}{f' chunks={lay.chunks}' if lay.chunks > 1 else ''} b={lay.micro_batch} "
              f"m={lay.microbatches} zero={lay.zero} recompute={lay.recompute} {cfg.training.precision}/"
              f"{cfg.training.optimizer}")
    mem, comm, time = r["memory_bytes"], r["communication_bytes"], r["time_s"]
    rows = [
        ("model", f"{cfg.model.name} ({cfg.model.arch}, L={cfg.model.layers} h={cfg.model.hidden} "
                  f"a={cfg.model.heads} V={cfg.model.vocab} s={cfg.model.seq})"),
        ("layout", layout),
        ("hardware", r["hardware"]),
        ("parameters", f"{r['parameters']:,} ({r['parameters'] / 1e9:.3f} B)"),
        ("FLOPs per iteration", f"model {r['flops']['model']:.4g}, hardware {r['flops']['hardware']:.4g}"),
        (f"memory, stage {r['peak_stage']} (most loaded)", ""),
        ("  parameters", _bytes(mem["parameters"])),
        ("  gradients", _bytes(mem["gradients"])),
        ("  optimizer states", _bytes(mem["optimizer_states"])),
        ("  activations", _bytes(mem["activations"])),
        ("  total", _bytes(mem["total"]) + ("" if r["fits"] else "  (exceeds the device's memory)")),
        ("memory per stage", ", ".join(_bytes(x) for x in r["memory_bytes_per_stage"])),
        ("communication per rank and iteration", ""),
    ]
    rows += [(f"  {kind.replace('_', ' ')}", f"{_bytes(comm[kind])} ({r['collectives'][kind]})") for kind in comm]
    rows += [
        ("time per iteration", ""),
        ("  compute", _seconds(time["compute"])),
        ("  exposed communication", _seconds(time["communication_exposed"])),
        ("  bubble", _seconds(time["bubble"])),
        ("  iteration", _seconds(time["iteration"])),
        ("bubble fraction", f"{r['bubble_fraction']:.4f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}".rstrip() for name, value in rows)
