"""The command-line options ``--network`` and ``--network-like`` of ``run``, ``sweep`` and ``calibrate``."""
from __future__ import annotations

import argparse
import sys

from .spec import NetworkSpec, check_world_size, parse


def add_network_arguments(p: argparse.ArgumentParser, like: bool = True) -> None:
    g = p.add_argument_group("emulated interconnect (needs root)")
    g.add_argument("--network", default=None, metavar="SPEC",
                   help="run the ranks as hosts of an emulated cluster: nodes=N,ranks_per_node=R,inter=RATE"
                        "[,intra=RATE], rates in bit/s like 200mbit or 1gbit (tbf on the wire); "
                        "see distperf.emulation")
    if like:
        g.add_argument("--network-like", default=None, metavar="PRESET",
                       help="derive inter from a target cluster (a hardware preset, e.g. V100-16GB or H100-80GB) "
                            "so that FLOP/s over link bandwidth here equals the target's; see distperf.emulation.like")


def network_from_args(args: argparse.Namespace, world_size: int | None, flops_here=None) -> tuple[NetworkSpec | None, dict]:
    """(spec or None, information for the result). ``flops_here()`` gives this machine's per-rank fp32
    rate for ``--network-like`` (called only then). Raises ConfigError('network'|'network_like', rule)."""
    from ..config import ConfigError
    from .like import describe, resolve

    like = getattr(args, "network_like", None)
    if args.network is None:
        if like:
            raise ConfigError("network_like", "needs --network nodes=N,ranks_per_node=R (the rate is derived)")
        return None, {}
    spec = parse(args.network, inter_optional=bool(like))
    if world_size is not None:
        check_world_size(spec, world_size)
    info = {}
    if like:
        spec, info = resolve(spec, like, flops_here())
        print(f"distperf: {describe(info, spec)}", file=sys.stderr)
    return spec, {**spec.columns(), **({"like": info} if info else {})}
