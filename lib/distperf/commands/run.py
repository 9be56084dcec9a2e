"""``python -m distperf run``: train one configuration on torch.distributed and measure it.

The layout is checked before any process starts (a bad one ends with one line and status 2). A
single-device layout runs in this process; any other starts pp·dp·tp ranks through torch's own
launcher, ``python -m torch.distributed.run --standalone`` (gloo on CPU, NCCL on CUDA), each rank
running :mod:`distperf.train`. The launch is bounded by ``--timeout``: a rank that raises, exits or
hangs ends the run with status 1 and one line naming the rank and its error, and no process of the
launch is left behind (they all carry a tag in their environment, and whatever still runs is killed).

Output: a summary, or with ``--json`` the result: ``losses`` (global mean loss of each optimizer
step), ``iteration_time_s`` {``median``, ``p10``, ``p90``} (after ``--warmup`` steps; the ranks meet at a
barrier before each step, ``barrier_before_each_step``, except under 2BW), ``tokens_per_s``
(global batch · seq / median step time), ``config``, the model-state bytes each rank holds between
steps (``model_state_bytes_at_rest``), and ``placement`` (the cores each rank was pinned to, or why not, and
its threads: :func:`distperf.launch.pin_rank`). Unless ``--no-measure``, three more optimizer steps after the
timed ones measure ``memory_bytes`` (peak bytes by category of the most loaded rank, the keys of
``predict`` plus temporaries, with every rank's in ``per_rank``) and ``communication`` (``bytes``,
``sent_bytes``, ``time_s``, ``exposed_s`` by kind; :mod:`distperf.measure.steps`, ``measured_steps``).
An fp32 run, measuring or not, ends by timing what each of its ranks computes, all ranks at once (``part_times``,
:mod:`distperf.measure.parts`). Then, in this process, ``prediction`` (the cost model on this machine's hardware
profile, ``--hardware``, its kernel times at the speed the run's own probe measured, ``at_run_speed``; and the
profiled mode from those parts) and ``error`` (signed relative errors; :mod:`distperf.measure.compare`).

With ``--network nodes=N,ranks_per_node=R,inter=RATE`` (or ``--network-like PRESET``) the ranks run as
the hosts of an emulated cluster (:mod:`distperf.emulation`): one torchrun per node inside its network
namespace, nodes joined by links shaped to RATE; the result then has ``network`` (the spec, and the
derivation of ``--network-like``). Without root the run ends with one line and status 2.

The flags are :func:`distperf.flags.add_run_command_arguments`; the processes start in :mod:`distperf.launch`.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from ..config import ConfigError
from ..emulation.options import network_from_args
from ..flags import add_run_command_arguments as add_arguments  # noqa: F401 (the dispatcher's interface)
from ..flags import config_and_policy, options_from_args
from ..launch import LaunchError, launch, threads_per_rank
from ..results import resolve_device


def main(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..hardware import check_choice
    from ..measure.compare import attach
    from ..parallel.rules import check_run

    cfg, policy = config_and_policy(args)
    opts = options_from_args(args)
    check_run(cfg, opts)
    check_choice(args.hardware)
    if args.parameters_out and not os.path.isdir(os.path.dirname(os.path.abspath(args.parameters_out))):
        raise ConfigError("parameters-out", f"its directory must exist, got {args.parameters_out!r}")
    if policy == "time":
        from ..parallel.partition import resolve

        cfg = resolve(cfg, "time", resolve_device(opts.device))
    from ..config import needs_distributed
    from ..emulation.topology import SetupError
    from ..measure.profiles import flops_here

    world = cfg.layout.world_size
    network, network_info = network_from_args(args, world, lambda: flops_here(args.hardware, threads_per_rank(world)))
    # the device is resolved by the ranks: this process imports torch only where it must decide now
    if network and resolve_device(opts.device) == "cuda":
        raise ConfigError("network", "shapes the links of CPU ranks (gloo); NCCL between GPUs of one machine "
                                     "would bypass them (shared memory, NVLink): use --device cpu")
    # a polite stop (SIGTERM) unwinds like Ctrl-C: the launch's own clean-up stops every rank it started
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if needs_distributed(cfg) or network:
            result = launch({"config": cfg.to_dict(), "options": asdict(opts)}, world,
                            opts.timeout_s, opts.device, network=network, parameters_out=args.parameters_out)
        else:  # one rank, in this process: pinned as a launched rank would be, for the training only
            from ..launch import available_cores, set_affinity
            from ..parallel.loop import run_training
            from ..train import place_ranks

            allowed = available_cores()
            try:
                placement = place_ranks(False)
                result = {**run_training(cfg, opts, parameters=bool(args.parameters_out)), "placement": placement}
                if args.parameters_out:
                    from ..parallel.loop import save_parameters

                    save_parameters(result.pop("parameters"), args.parameters_out)
            finally:
                set_affinity(allowed)
    except (LaunchError, SetupError) as e:
        print(f"distperf run: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("distperf run: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if network:
        result["network"] = network_info
    attach(cfg, result, args.hardware)
    print(json.dumps(result, indent=1) if args.json else summary(result))
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def summary(result: dict) -> str:
    it = result["iteration_time_s"]
    lay = result["config"]["layout"]
    losses = result["losses"]
    return "\n".join([
        f"model {result['config']['model']['name']}  dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} "
        f"schedule={lay['schedule']} zero={lay['zero']} recompute={lay['recompute']}  "
        f"world size {result['world_size']} on {result['options']['device']}",
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps",
        f"step time median {it['median'] * 1e3:.1f} ms (p10 {it['p10'] * 1e3:.1f}, p90 {it['p90'] * 1e3:.1f})"
        + ("" if it.get("barrier_before_each_step", True) or result["world_size"] == 1
           else "; no barrier between steps (2BW's steps overlap)"),
        f"throughput {result['tokens_per_s']:,.0f} tokens/s",
    ] + _placement(result.get("placement")) + _comparison(result))


def _placement(place: dict | None) -> list[str]:
    if not place:
        return []
    threads = f"{place['threads']} thread(s) per rank ({place['threads_from']})"
    if place["pinned"]:
        return [f"ranks pinned to cores {' '.join(','.join(map(str, c)) for c in place['cores'])}; {threads}"]
    return [f"ranks not pinned: {place['reason']}; {threads}"]


def _comparison(result: dict) -> list[str]:
    pred, err, mem = result.get("prediction"), result.get("error"), result.get("memory_bytes")
    lines = []
    if mem is not None:
        lines.append("memory of the most loaded rank (MiB): " + ", ".join(
            f"{k.replace('_', ' ')} {mem[k] / 2**20:.2f}" for k in
            ("parameters", "gradients", "optimizer_states", "activations", "temporaries", "total")))
    if pred is None:
        return lines
    pct = lambda x: "n/a" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
    t = err["iteration_time_s"]
    lines.append(f"predicted step time {pred['time_s']['iteration'] * 1e3:.1f} ms (error {pct(t['analytical'])}); "
                 f"from profiled layer times "
                 + (f"{pred['profiled']['time_s']['iteration'] * 1e3:.1f} ms (error {pct(t['profiled'])})"
                    if "time_s" in pred.get("profiled", {}) else "n/a")
                 + f"; hardware {pred['hardware']} ({pred['hardware_source']['kind']})")
    if "memory_bytes" in err:
        lines.append("memory error: " + ", ".join(f"{k.replace('_', ' ')} {pct(v)}"
                                                  for k, v in err["memory_bytes"].items() if k != "stage"))
    return lines
