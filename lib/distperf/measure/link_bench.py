"""``python -m distperf.measure.link_bench``: all-reduce and send/recv across and inside emulated nodes.

One process per rank, started by torchrun on every emulated node (:mod:`distperf.emulation.launch`), N
nodes of R ranks (``--ranks-per-node``). Measured, with
:func:`distperf.measure.calibrate.time_collective` (median of ``--reps`` after a barrier each; a point is
the slowest rank's median):

- ``inter``: all-reduce over all N·R ranks (gloo's ring then crosses every node's link, one flow each way
  per node), and send/recv between rank 0 and rank R (the first ranks of nodes 0 and 1);
- ``intra`` (R > 1 only): all-reduce over node 0's ranks and send/recv between ranks 0 and 1.

Rank 0 writes ``[{collective, scope, ranks, bytes, seconds}]`` as JSON to ``--out``. :func:`measure`
starts it in an emulated cluster; :func:`summarize` fits α-β per collective and scope and tabulates the
bandwidth of every message against the set rate.

Bandwidth of a point: the bytes one rank sends over the time, i.e. 2(n − 1)/n·M/t for the ring
all-reduce and M/t for send/recv (:func:`distperf.measure.calibrate.ring_terms`), in bit/s; with gloo's
ring over N·R ranks in rank order, each node's link carries exactly one such flow per direction, so
this is the rate one link achieves. ``ratio`` = bandwidth / the link's set rate (tbf on the wire; TCP
payload over 1500-byte frames can reach at most 1448/1514 ≈ 0.956 of it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .. import atomic


def measurements(world: int, ranks_per_node: int) -> list[tuple[str, str, list[int], tuple[int, int]]]:
    """[(collective, scope, group ranks, send peers)], in the order every rank runs them."""
    out = [("all-reduce", "inter", list(range(world)), (0, 0)),
           ("send", "inter", list(range(world)), (0, ranks_per_node))]
    if ranks_per_node > 1:
        node0 = list(range(ranks_per_node))
        out += [("all-reduce", "intra", node0, (0, 0)), ("send", "intra", node0, (0, 1))]
    return out


def measure(spec, sizes, reps: int, timeout: float) -> list[dict]:
    """Set up the emulated cluster of ``spec`` (:class:`~distperf.emulation.spec.NetworkSpec`), run the
    benchmark on its N·R ranks and return rank 0's rows. Raises NotPrivileged, SetupError, or
    TimeoutError / LaunchError when the benchmark does not finish."""
    import tempfile
    import uuid

    from ..launch import TAG, LaunchError, run_launchers
    from ..emulation.launch import torchrun_commands
    from ..emulation.topology import emulated

    with tempfile.TemporaryDirectory(prefix="distperf-links-") as tmp, emulated(spec) as topo:
        out = os.path.join(tmp, "rows.json")
        program = ["-m", "distperf.measure.link_bench", "--sizes", ",".join(str(int(m)) for m in sizes),
                   "--reps", str(reps), "--ranks-per-node", str(spec.ranks_per_node), "--timeout", f"{timeout:g}",
                   "--out", out]
        env = {**os.environ, **topo.env(), "OMP_NUM_THREADS": "1", TAG: uuid.uuid4().hex}
        code, logs = run_launchers(torchrun_commands(topo, program), env, tmp, env[TAG], timeout)
        if code is None:
            raise TimeoutError(f"the link benchmark on {spec.text()} did not finish within {timeout:g} s")
        if code != 0 or not os.path.exists(out):
            tail = " | ".join(open(log, errors="replace").read().strip().splitlines()[-1:][0] if
                              os.path.getsize(log) else "no output" for log in logs)
            raise LaunchError(f"the link benchmark failed (exit status {code}): {tail}"[:600])
        with open(out) as f:
            return json.load(f)


BANDWIDTH_BYTES = 1 << 20  # messages from this size on fit β (see summarize)


def _slope_beta(points) -> float | None:
    """β = 1/slope of the least-squares line time = c + volume/β through ``points`` (one collective and
    rank count, so the α term is the constant c); None unless the slope is positive."""
    import numpy as np

    from ..cost.collectives import ring_terms

    volume = np.array([ring_terms(c, n, m)[1] for c, n, m, _ in points], dtype=np.float64)
    seconds = np.array([t for *_, t in points], dtype=np.float64)
    slope = np.polyfit(volume, seconds, 1)[0]
    return float(1.0 / slope) if slope > 0 else None


def summarize(rows: list[dict], spec) -> dict:
    """{"fits": {scope: {collective: α-β fit}}, "table": [rows with bandwidth_bit_per_s, set_bit_per_s, ratio]}.

    Each fit has α from all message sizes (:func:`~distperf.measure.alpha_beta.fit_alpha_beta`) but β
    from messages of :data:`BANDWIDTH_BYTES` and more (``beta_all_sizes`` keeps the other): tbf lets a
    full bucket (its burst, a millisecond at the rate) through at the veth's own speed, so messages of
    tens of KiB beat the set rate, and a fit over all sizes, which weighs relative errors alike, puts β
    up to 50 % above it."""
    from ..cost.collectives import ring_terms
    from .alpha_beta import fit_alpha_beta

    fits: dict = {}
    table = []
    for r in rows:
        rate = spec.inter if r["scope"] == "inter" else spec.intra
        volume = ring_terms(r["collective"], r["ranks"], r["bytes"])[1]
        bw = 8 * volume / r["seconds"] if r["seconds"] > 0 else None
        table.append({**r, "bandwidth_bit_per_s": bw, "set_bit_per_s": rate,
                      "ratio": bw / rate if bw and rate else None})
    for scope in sorted({r["scope"] for r in rows}):
        fits[scope] = {}
        for collective in sorted({r["collective"] for r in rows if r["scope"] == scope}):
            mine = [r for r in rows if r["scope"] == scope and r["collective"] == collective]
            points = [(collective, r["ranks"], r["bytes"], r["seconds"]) for r in mine]
            fit = fit_alpha_beta(points)
            large = [p for p in points if p[2] >= BANDWIDTH_BYTES]
            if len(large) >= 2:
                beta = _slope_beta(large)
                if beta:
                    fit = {**fit, "beta_all_sizes": fit["beta"], "beta": beta,
                           "beta_from": f"messages of {BANDWIDTH_BYTES} bytes and more"}
            fits[scope][collective] = fit
    return {"fits": fits, "table": table}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m distperf.measure.link_bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", required=True, help="message bytes, comma-separated")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--ranks-per-node", type=int, required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import datetime

    import torch
    import torch.distributed as dist

    from .calibrate import time_collective
    from .speed import slowest

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    rows = []
    for collective, scope, members, peers in measurements(world, a.ranks_per_node):
        group = dist.new_group(members) if len(members) < world else dist.group.WORLD
        for nbytes in (int(x) for x in a.sizes.split(",")):
            size, median = time_collective(collective, group, peers, nbytes, a.reps, device) \
                if rank in members else (nbytes, None)
            seconds = slowest(median, device)
            if rank == 0:
                rows.append({"collective": collective, "scope": scope,
                             "ranks": 2 if collective == "send" else len(members), "bytes": size, "seconds": seconds})
    dist.barrier()
    if rank == 0:
        atomic.write_text(a.out, json.dumps(rows))
    dist.destroy_process_group()
    return 0


def apply(hw, summary: dict, spec):
    """The profile with the emulated links: ``inter_latency`` = α and ``inter_bandwidth`` = β/R of the
    inter-node all-reduce fit (β is one node link's rate, shared by its R ranks when they all cross nodes
    at once: the presets' per-device meaning), ``devices_per_node`` = R, and with R > 1 ``intra_*`` from
    the all-reduce inside a node."""
    from dataclasses import replace

    inter = summary["fits"]["inter"]["all-reduce"]
    changes = {"inter_latency": inter["alpha"], "inter_bandwidth": inter["beta"] / spec.ranks_per_node,
               "devices_per_node": spec.ranks_per_node, "name": f"{hw.name}-{spec.text()}"}
    if "intra" in summary["fits"]:
        intra = summary["fits"]["intra"]["all-reduce"]
        changes.update(intra_latency=intra["alpha"], intra_bandwidth=intra["beta"])
    return replace(hw, **changes)


if __name__ == "__main__":
    sys.exit(main())
