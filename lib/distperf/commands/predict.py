"""``python -m distperf predict``: the cost model's prediction for one configuration.

Prints a table with units, or with ``--json`` the dictionary of :func:`distperf.cost.predict`.
"""
from __future__ import annotations

import argparse

from .. import jsonout
from ..config import BUCKET_MB_RANGE, check_finite
from ..cost import predict
from ..flags import add_predict_command_arguments as add_arguments  # noqa: F401 (the dispatcher's interface)
from ..flags import config_from_args
from ..hardware import hardware
from ..parallel.rules import check_pipeline
from ..units import format_bytes, format_seconds


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    check_pipeline(cfg, trainer=False)  # the rules run and plan apply; pipedream, which has no trainer, too
    bucket_mb = check_finite("bucket_mb", args.bucket_mb, *BUCKET_MB_RANGE)
    result = predict(cfg, hardware(args.hardware), bucket_bytes=bucket_mb * 2**20, check=False,
                     convention=args.convention, backend=args.backend)
    print(jsonout.dumps(result, indent=2) if args.json else table(result, cfg))
    return 0


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
        ("convention", f"{r['convention']} (collectives timed as {r['backend']})"),
        ("parameters", f"{r['parameters']:,} ({r['parameters'] / 1e9:.3f} B)"),
        ("FLOPs per iteration", f"model {r['flops']['model']:.4g}, hardware {r['flops']['hardware']:.4g}"),
        (f"memory, stage {r['peak_stage']} (most loaded)", ""),
        ("  parameters", format_bytes(mem["parameters"])),
        ("  gradients", format_bytes(mem["gradients"])),
        ("  optimizer states", format_bytes(mem["optimizer_states"])),
        ("  activations", format_bytes(mem["activations"])),
        ("  total", format_bytes(mem["total"]) + ("" if r["fits"] else "  (exceeds the device's memory)")),
        ("memory per stage", ", ".join(format_bytes(x) for x in r["memory_bytes_per_stage"])),
        ("communication per rank and iteration", ""),
    ]
    rows += [(f"  {kind.replace('_', ' ')}", f"{format_bytes(comm[kind])} ({r['collectives'][kind]})") for kind in comm]
    rows += [
        ("time per iteration", ""),
        ("  compute", format_seconds(time["compute"])),
        ("  exposed communication", format_seconds(time["communication_exposed"])),
        ("  bubble", format_seconds(time["bubble"])),
        ("  iteration", format_seconds(time["iteration"])),
        ("bubble fraction", f"{r['bubble_fraction']:.4f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}".rstrip() for name, value in rows)
