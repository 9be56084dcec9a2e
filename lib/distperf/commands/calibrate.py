"""``python -m distperf calibrate``: measure this machine and write a hardware profile.

Measures matrix-product rates by size and dtype, memory bandwidth, per-layer forward and backward
times of the model presets in use, and the latency and bandwidth of all-reduce, all-gather,
reduce-scatter and send/recv on 2…N ranks (:mod:`distperf.measure.calibrate`). Writes the profile
(``--out``, default ``data/fresh/<scale>/hardware.json``), which ``predict --hardware FILE`` reads, and
next to it ``<name>.calibration.json`` with every measurement. ``--quick`` takes well under a minute.

With ``--network nodes=N,ranks_per_node=R,inter=RATE`` (or ``--network-like PRESET``) it also measures
all-reduce and send/recv across (and inside) the nodes of an emulated cluster
(:mod:`distperf.measure.link_bench`): the profile's ``inter_*`` (and with R > 1 ``intra_*``) come from
those links, ``devices_per_node`` = R, and the sidecar's ``network`` holds the fits and a table of
measured bandwidth against the set rate. Without root: one line and status 2, before measuring anything.
``--machine-from PROFILE`` takes everything but the links from an earlier calibration of this machine (its profile
and sidecar) instead of measuring it again.

The sidecar's ``background_cpu_share`` is the share of the machine's CPU time that other processes used while
calibrate ran (:mod:`distperf.measure.background`); above 5 % calibrate warns that it measured a busy machine.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="few sizes, short timings, micro-batch 1 unless --micro-batches (for tests and CI)")
    p.add_argument("--out", default=None, help="the profile to write (default data/fresh/<scale>/hardware.json)")
    p.add_argument("--scale", default=None, help="smoke, cpu or gpu: where the default --out goes")
    p.add_argument("--models", default="small", help="presets whose layers to time, comma-separated (default small)")
    p.add_argument("--micro-batches", default=None,
                   help="micro-batch sizes of the layer timings, comma-separated (default 1,2,4; with --quick 1)")
    p.add_argument("--ranks", type=int, default=None,
                   help="collectives on 2..N ranks (default: the CPU cores, at most 8; on CUDA the GPUs)")
    p.add_argument("--threads", type=int, default=None, help="threads of the compute timings (default torch's)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="what to calibrate (default cpu)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds the collective benchmark may take")
    from ..emulation.options import add_network_arguments

    add_network_arguments(p)
    p.add_argument("--machine-from", default=None, metavar="PROFILE",
                   help="with --network: take this machine's measurements from PROFILE (a profile calibrate wrote, "
                        "with its sidecar) and measure only the emulated links")


def _ints(name: str, text: str) -> tuple[int, ...]:
    from ..config import ConfigError

    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(name, f"must be comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(name, f"must be comma-separated positive integers, got {text!r}")
    return values


def main(args: argparse.Namespace) -> int:
    from .. import presets
    from ..config import ConfigError
    from ..results import book_scale, check_scale, fresh_dir

    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    for m in models:
        presets.model(m)  # ConfigError('model', …) for an unknown preset
    micro_batches = _ints("micro_batches", args.micro_batches or ("1" if args.quick else "1,2,4"))
    if args.ranks is not None and args.ranks < 2:
        raise ConfigError("ranks", f"must be at least 2, got {args.ranks}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError("threads", f"must be a positive integer, got {args.threads}")
    if not args.timeout > 0:
        raise ConfigError("timeout", f"must be positive, got {args.timeout}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda was asked for but torch sees no CUDA device")
    try:
        scale = check_scale(args.scale or book_scale())
    except ValueError as e:
        raise ConfigError("scale", str(e).split(": ", 1)[-1]) from None
    out = Path(args.out) if args.out else fresh_dir(scale) / "hardware.json"
    from ..measure.profiles import flops_here
    from ..emulation.options import network_from_args
    from ..launch import LaunchError
    from ..emulation.topology import SetupError, check_privileges

    network, network_info = network_from_args(args, None, lambda: flops_here(None, args.threads))
    if args.machine_from is not None and not network:
        raise ConfigError("machine_from", "only with --network: it keeps a profile's machine measurements and "
                                          "measures the emulated links")
    machine = _machine_from(args.machine_from, args.device) if args.machine_from is not None else None
    if network:
        check_privileges()  # before the calibration's minutes; NotPrivileged ends in one line (cli)

    from ..measure.background import QUIET, Watch
    from ..measure.calibrate import calibrate, write

    log = lambda msg: print(f"calibrate: {msg}", file=sys.stderr)  # noqa: E731
    start, watch = time.monotonic(), Watch().start()
    try:
        hw, sidecar = machine or calibrate(quick=args.quick, models=models, micro_batches=micro_batches,
                                           ranks=args.ranks, threads=args.threads, device=args.device,
                                           timeout=args.timeout, log=log)
        if machine is None and not args.quick and args.device == "cpu" and hw.kernels is not None:
            hw, sidecar["pipeline_waits"] = _pipeline_waits(hw, out, scale, args.timeout, log)
        if network:
            hw, sidecar["network"] = _links(hw, network, network_info, args, log)
        if machine:
            sidecar["seconds"] = round(time.monotonic() - start, 2)  # the links' (the machine's: machine_from)
    except (TimeoutError, LaunchError, SetupError) as e:
        print(f"distperf calibrate: error: {e}", file=sys.stderr)
        return 1
    sidecar["background_cpu_share"] = background = watch.share()
    if background is not None and background > QUIET:
        log(f"warning: other processes used {background:.0%} of this machine's CPU time while it was measured; its "
            "timings and contention factors describe a busy machine (calibrate again on a quiet one)")
    side = write(hw, sidecar, out)
    print(summary(hw, sidecar))
    print(f"profile: {out}\nmeasurements: {side}")
    return 0


def _machine_from(path: str, device: str):
    """(profile, sidecar) of an earlier calibration of this machine, for a ``--network`` calibration that measures
    only the links: the sidecar keeps its measurements, under this calibration's provenance, with the earlier one's
    in ``machine_from``. ConfigError('machine_from', …) when the profile or its sidecar cannot be read."""
    from ..config import ConfigError
    from ..hardware import load_profile
    from ..measure.profiles import read_sidecar
    from ..results import provenance

    try:
        hw = load_profile(path)
    except ConfigError as e:
        raise ConfigError("machine_from", str(e).split(": ", 1)[-1]) from None
    side = read_sidecar(Path(path))
    if side is None:
        raise ConfigError("machine_from", f"{path}: no calibration sidecar next to it (calibrate writes one)")
    earlier = {"path": str(Path(path).resolve()), "provenance": side.get("provenance"), "seconds": side.get("seconds")}
    return hw, {**side, "provenance": provenance(device), "machine_from": earlier}


def _pipeline_waits(hw, profile: Path, scale: str, timeout: float, log):
    """Run the tiny preset's pipelines (:data:`distperf.analysis.pipeline_waits.EXPERIMENT`, into
    ``calibration_pipelines.csv`` beside ``profile``, measured afresh, each run predicted on ``hw``, which is written
    to ``profile`` first) and fit each schedule's part of an action inside communication on them; return the profile
    with the table ``action_waits`` and the sidecar's ``pipeline_waits``."""
    import pandas as pd

    from ..analysis.pipeline_waits import EXPERIMENT, REPEATS, fitted_waits, with_waits
    from ..hardware import save_profile
    from ..runner.grid import Experiment
    from ..runner.sweep import sweep

    log(f"pipeline actions inside communication: the {EXPERIMENT['base']['model']} preset's runs")
    directory = profile.parent
    directory.mkdir(parents=True, exist_ok=True)
    save_profile(hw, profile)  # the runs' own predictions read it
    spec = {**EXPERIMENT, "base": {**EXPERIMENT["base"], "hardware": str(profile.resolve())}}
    exp = Experiment.from_dict({"scale": scale, **spec}, workdir=directory)
    table_path = directory / f"{exp.name}.csv"
    counts = sweep(exp, table_path, timeout=timeout, force=True, device="cpu", progress=False, scale=scale,
                   repeats=REPEATS)
    waits, rows = fitted_waits(pd.read_csv(table_path, low_memory=False), hw)
    fitted = rows[["schedule", "microbatches", "measured_s", "predicted_s"]].to_dict("records") if len(rows) else []
    found = {"table": table_path.name, "runs": counts, "configurations": len(rows), "waits_s": waits, "rows": fitted}
    return (with_waits(hw, waits) if waits else hw), found


def _links(hw, network, info: dict, args, log):
    """Measure the emulated links; return the profile with them and the sidecar's ``network``."""
    from ..measure.calibrate import MESSAGE_BYTES_FULL, MESSAGE_BYTES_QUICK
    from ..measure.link_bench import apply, measure, summarize

    sizes = MESSAGE_BYTES_QUICK + (4 << 20,) if args.quick else MESSAGE_BYTES_FULL
    if not args.quick and 8 * (16 << 20) / network.inter <= 1.0:  # 16 MiB too, where it takes at most 1 s
        sizes += (16 << 20,)
    log(f"emulated links: {network.text()}")
    rows = measure(network, sizes, reps=5 if args.quick else 10, timeout=args.timeout)
    found = summarize(rows, network)
    node = found["fits"]["inter"]["all-reduce"]["beta"]
    return apply(hw, found, network), {**info, "node_bandwidth": node, **found}


def summary(hw, sidecar: dict) -> str:
    g = lambda x: f"{x / 1e9:,.1f} G"  # noqa: E731
    background = sidecar.get("background_cpu_share")
    lines = [f"{hw.name}: {sidecar['threads']} thread(s), collectives on 2..{sidecar['ranks']} ranks, "
             f"{sidecar['seconds']:.0f} s" + ("" if background is None else
                                              f"; other processes used {background:.0%} of the CPU time meanwhile")]
    for dtype in sorted({r["dtype"] for r in sidecar["gemm"]}):
        rates = ", ".join(f"{r['n']}: {g(r['flops_per_s'])}" for r in sidecar["gemm"] if r["dtype"] == dtype)
        lines.append(f"  matmul {dtype} FLOP/s by n: {rates}")
    lines.append(f"  copy bandwidth {g(sidecar['copy']['bytes_per_s'])}B/s; memory {hw.memory_capacity / 2**30:,.1f} GiB")
    for r in sidecar["layers"]:
        lines.append(f"  {r['model']} {r['part']} b={r['micro_batch']}: forward {r['forward_s'] * 1e3:.3f} ms, "
                     f"backward {r['backward_s'] * 1e3:.3f} ms")
    for coll, fit in sidecar["fits"].items():
        for n, f in fit["ranks"].items():
            lines.append(f"  {coll} {n} ranks: alpha {f['alpha'] * 1e6:.1f} µs, beta {g(f['beta'])}B/s "
                         f"(rms rel. error {f['rms_relative_error']:.2f})")
    for r in sidecar.get("network", {}).get("table", []):
        if r["bytes"] >= 2**20:
            lines.append(f"  emulated {r['scope']} {r['collective']} {r['ranks']} ranks, {r['bytes'] / 2**20:g} MiB: "
                         f"{r['bandwidth_bit_per_s'] / 1e6:,.1f} Mbit/s"
                         + (f" = {r['ratio']:.3f} of the set {r['set_bit_per_s'] / 1e6:,.1f} Mbit/s" if r["ratio"] else ""))
    return "\n".join(lines)
