"""``python -m distperf plan``: the PipeDream-2BW planner (:mod:`distperf.planner`).

Prints the configurations that fit, ranked by predicted throughput, and how many of the others were
rejected and why; with ``--json`` the object ``{"plans": [...], "rejected": [...], "inputs": {...}}``.
"""
from __future__ import annotations

import argparse

from .. import jsonout
from ..config import MAX_BATCH, MAX_DEVICES, PRECISIONS, ConfigError, check_finite
from ..flags import add_convention_arguments, add_model_arguments, model_from_args
from ..hardware import DEFAULT, PRESETS, hardware
from ..planner import PLANNED_RECOMPUTE, PLANNED_SCHEDULES, plan
from ..units import format_bytes, format_seconds, parse_size


def _choices(field: str, text: str, allowed: tuple) -> tuple:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ConfigError(field, f"must be a comma-separated subset of {', '.join(allowed)}, got {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, default_model=None)  # a preset (e.g. 2bw-gpt-2.2b) and the same overrides as predict
    p.add_argument("--gpus", type=int, required=True, help="devices N in all")
    p.add_argument("--gpus-per-node", type=int, default=None, help="devices per node k (default: the hardware's)")
    p.add_argument("--hardware", default=DEFAULT,
                   help=f"preset ({', '.join(PRESETS)}) or a profile file (JSON); default {DEFAULT}")
    p.add_argument("--global-batch", type=int, required=True, help="global batch B (samples per optimizer step)")
    p.add_argument("--memory-limit", default=None, help="per device, e.g. 16GiB (default: the hardware's capacity)")
    p.add_argument("--node-gbit", type=float, default=None,
                   help="one network interface per node of this many Gbit/s, shared by the node's devices "
                        "(default: the hardware's per-device inter-node bandwidth)")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed", help="default mixed (fp16/bf16 + fp32 master)")
    p.add_argument("--max-micro-batch", type=int, default=64, help="largest microbatch size tried (powers of 2)")
    p.add_argument("--schedules", default=",".join(PLANNED_SCHEDULES), help=f"pipeline schedules (default {','.join(PLANNED_SCHEDULES)})")
    p.add_argument("--recompute", default=",".join(PLANNED_RECOMPUTE), help="recomputation choices (default none,full)")
    p.add_argument("--no-baselines", action="store_true", help="pipelines only (no data- or tensor-parallel baseline)")
    add_convention_arguments(p)
    p.add_argument("--top", type=int, default=10, help="configurations shown in the table (default 10)")
    p.add_argument("--json", action="store_true", help="print plans and rejected configurations as JSON")


def _count(field: str, value: int, most: int) -> int:
    if not 1 <= value <= most:
        raise ConfigError(field, f"must be a positive integer of at most {most:,}, got {value:,}")
    return value


def main(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    _count("gpus", args.gpus, MAX_DEVICES)
    if args.gpus_per_node is not None:
        _count("gpus_per_node", args.gpus_per_node, MAX_DEVICES)
    _count("global_batch", args.global_batch, MAX_BATCH)
    _count("max_micro_batch", args.max_micro_batch, MAX_BATCH)
    _count("top", args.top, MAX_DEVICES)
    hw = hardware(args.hardware)
    limit = hw.memory_capacity if args.memory_limit is None else parse_size(args.memory_limit)
    node_bandwidth = None
    if args.node_gbit is not None:  # 1 kbit/s to 1 Pbit/s
        node_bandwidth = check_finite("node_gbit", args.node_gbit, 1e-6, 1e6) * 1e9 / 8
    result = plan(model, args.gpus, hw, args.global_batch, memory_limit=limit, gpus_per_node=args.gpus_per_node,
                  node_bandwidth=node_bandwidth, precision=args.precision, max_micro_batch=args.max_micro_batch,
                  schedules=_choices("schedules", args.schedules, PLANNED_SCHEDULES),
                  recompute=_choices("recompute", args.recompute, ("none", "selective", "full")),
                  baselines=not args.no_baselines, convention=args.convention, backend=args.backend)
    inputs = {"model": model.name, "gpus": args.gpus, "gpus_per_node": args.gpus_per_node or hw.devices_per_node,
              "hardware": hw.name, "global_batch": args.global_batch, "memory_limit_bytes": limit,
              "node_bandwidth_bytes_per_s": node_bandwidth, "precision": args.precision,
              "convention": args.convention, "backend": args.backend}
    if args.json:
        print(jsonout.dumps({**result, "inputs": inputs}, indent=2))
    else:
        print(table(result, inputs, args.top))
    return 0


def _describe(e: dict) -> str:
    if e["strategy"] == "pipeline":
        return f"{e['schedule']:<5} w={e['w']:<4} d={e['d']:<4}"
    if e["strategy"] == "tensor-parallel":
        return f"tp    t={e['tp']:<4} dp={e['w']:<3}"
    return f"dp    w={e['w']:<4} d=1   "


def table(result: dict, inputs: dict, top: int) -> str:
    plans, rejected = result["plans"], result["rejected"]
    lines = [f"{inputs['model']} on {inputs['gpus']} × {inputs['hardware']} ({inputs['gpus_per_node']} per node), "
             f"global batch {inputs['global_batch']}, memory limit {format_bytes(inputs['memory_limit_bytes'])}",
             f"{len(plans)} configurations fit, {len(rejected)} rejected", ""]
    if plans:
        lines.append(f"{'rank':>4}  {'configuration':<20} {'b':>3} {'recompute':<9} {'m':>5} {'samples/s':>11} "
                     f"{'iteration':>11} {'memory':>11}")
        for i, e in enumerate(plans[:top], 1):
            lines.append(f"{i:>4}  {_describe(e):<20} {e['micro_batch']:>3} {e['recompute']:<9} {e['accumulation']:>5} "
                         f"{e['throughput']:>11,.2f} {format_seconds(e['iteration_s']):>11} {format_bytes(e['memory_bytes']):>11}")
    else:
        lines.append("nothing fits: raise the memory limit, add devices or allow recomputation")
    groups: dict[str, list] = {}
    for e in rejected:  # out of memory, or invalid by the field whose rule it breaks
        kind = "out of memory" if e["reason"].startswith("out of memory") else "invalid " + e["reason"].split(": ")[1]
        groups.setdefault(kind, []).append(e)
    if groups:
        lines += ["", "rejected (count, reason, first example):"]
        for kind, entries in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            e = entries[0]
            lines.append(f"  {len(entries):>5} × {kind:<22} {_describe(e).strip()} b={e['micro_batch']} "
                         f"recompute={e['recompute']}: {e['reason']}")
    return "\n".join(lines)
