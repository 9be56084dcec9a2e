"""``python -m distperf run``: train one configuration on torch.distributed and measure it.

The layout is checked before any process starts (a bad one ends with one line and status 2). A
single-device layout runs in this process; any other starts pp·dp·tp ranks through torch's own
launcher, ``python -m torch.distributed.run --standalone`` (gloo on CPU, NCCL on CUDA), each rank
running :mod:`distperf.train`. The launch is bounded by ``--timeout``: a rank that raises, exits or
hangs ends the run with status 1 and one line naming the rank and its error, and no process of the
launch is left behind (they all carry a tag in their environment, and whatever still runs is killed).

Output: a summary, or with ``--json`` the result: ``losses`` (global mean loss of each optimizer
step), ``iteration_time_s`` {``median``, ``p10``, ``p90``} (after ``--warmup`` steps), ``tokens_per_s``
(global batch · seq / median step time), ``config``, and the model-state bytes each rank holds between
steps (``model_state_bytes_at_rest``). Unless ``--no-measure``, three more optimizer steps after the
timed ones measure ``memory_bytes`` (peak bytes by category of the most loaded rank, the keys of
``predict`` plus temporaries, with every rank's in ``per_rank``) and ``communication`` (``bytes``,
``sent_bytes``, ``time_s``, ``exposed_s`` by kind; :mod:`distperf.measure.steps`, ``measured_steps``).
Then, in this process, ``prediction`` (the cost model on this machine's hardware profile, ``--hardware``)
and ``error`` (signed relative errors; :mod:`distperf.measure.compare`).

With ``--network nodes=N,ranks_per_node=R,inter=RATE`` (or ``--network-like PRESET``) the ranks run as
the hosts of an emulated cluster (:mod:`distperf.emulation`): one torchrun per node inside its network
namespace, nodes joined by links shaped to RATE; the result then has ``network`` (the spec, and the
derivation of ``--network-like``). Without root the run ends with one line and status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from ..cli_args import add_config_arguments
from ..config import ConfigError
from ..emulation.options import add_network_arguments, network_from_args
from ..processes import tagged_processes
from ..train import add_run_arguments, check_run, config_and_policy, config_to_json, options_from_args

TAG = "DISTPERF_LAUNCH_TAG"


class LaunchError(RuntimeError):
    """The launch failed, hung past its timeout, or a rank failed."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    add_run_arguments(p)
    p.add_argument("--hardware", default="auto",
                   help="the hardware of the prediction beside the run: auto (this machine's profile from "
                        "python -m distperf calibrate at the ranks' thread count, else a quick calibration now), "
                        "a preset, a profile file, or none (default auto)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_network_arguments(p)


def main(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ..measure.compare import attach, check_choice

    cfg, policy = config_and_policy(args)
    opts = options_from_args(args)
    check_run(cfg, opts)
    check_choice(args.hardware)
    if policy == "time":
        from ..parallel.partition import resolve

        cfg = resolve(cfg, "time", _timing_device(opts.device))
    from ..emulation.like import flops_here
    from ..emulation.topology import SetupError
    from ..parallel.loop import needs_distributed

    world = cfg.layout.world_size
    network, network_info = network_from_args(args, world, lambda: flops_here(args.hardware, _threads(world)))
    if network and _timing_device(opts.device) == "cuda":
        raise ConfigError("network", "shapes the links of CPU ranks (gloo); NCCL between GPUs of one machine "
                                     "would bypass them (shared memory, NVLink): use --device cpu")
    try:
        if needs_distributed(cfg) or network:
            result = launch({"config": config_to_json(cfg), "options": asdict(opts)}, world,
                            opts.timeout_s, opts.device, network=network)
        else:
            from ..parallel.loop import run_training

            result = run_training(cfg, opts)
    except (LaunchError, SetupError) as e:
        print(f"distperf run: error: {e}", file=sys.stderr)
        return 1
    if network:
        result["network"] = network_info
    attach(cfg, result, args.hardware)
    print(json.dumps(result, indent=1) if args.json else summary(result))
    return 0


def _timing_device(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _threads(world_size: int) -> int:
    """OMP threads of each CPU rank: the cores shared out (at least one)."""
    return max(1, (os.cpu_count() or 1) // world_size)


def launch(spec: dict, world_size: int, timeout_s: float, device: str = "auto", env: dict | None = None,
           network=None) -> dict:
    """Run :mod:`distperf.train` on ``world_size`` local ranks under ``torch.distributed.run`` (one per
    emulated node with ``network``, a :class:`~distperf.emulation.spec.NetworkSpec`); return rank 0's
    result. Raises LaunchError on a failure or after ``timeout_s``; leaves no process behind (and no
    namespace: :func:`distperf.emulation.topology.emulated`)."""
    from contextlib import nullcontext

    from ..emulation.launch import torchrun_commands
    from ..emulation.topology import emulated

    with tempfile.TemporaryDirectory(prefix="distperf-run-") as tmp:
        spec_path, out_path = (os.path.join(tmp, n) for n in ("spec.json", "result.json"))
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        tag = uuid.uuid4().hex
        child_env = {**os.environ, **(env or {}), TAG: tag}
        if device != "cuda" and "OMP_NUM_THREADS" not in os.environ:
            child_env["OMP_NUM_THREADS"] = str(_threads(world_size))
        program = ["-m", "distperf.train", "--spec", spec_path, "--out", out_path]
        with emulated(network) if network else nullcontext() as topo:
            if topo is None:
                cmds = [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                         "--nproc-per-node", str(world_size), "--max-restarts", "0", "--monitor-interval", "0.1",
                         *program]]
            else:
                cmds = torchrun_commands(topo, program)
                child_env.update(topo.env())
            code, logs = run_launchers(cmds, child_env, tmp, tag, timeout_s)
        errors = _rank_errors(out_path, world_size)
        if code is None:
            raise LaunchError(f"the run did not finish within --timeout {timeout_s:g} s; all {world_size} ranks "
                              f"were stopped" + (f" ({errors})" if errors else ""))
        if code != 0 or not os.path.exists(out_path):
            detail = "; ".join(d for d in (*(_root_cause(log) for log in logs), errors) if d) \
                or " | ".join(_log_tail(log) for log in logs)
            raise LaunchError(f"the launch failed (torch.distributed.run exit status {code}): {detail}")
        with open(out_path) as f:
            return json.load(f)


def run_launchers(cmds: list[list[str]], env: dict, log_dir: str, tag: str, timeout_s: float) -> tuple[int | None, list[str]]:
    """Start one launcher per argv (each in a session of its own, output to ``log_dir/launch<k>.log``)
    and wait until all end, one fails, or ``timeout_s`` passes; then stop them all (:func:`_stop`).
    Returns (the first non-zero exit status, 0 if all succeeded, None at the timeout; the logs)."""
    logs = [os.path.join(log_dir, f"launch{k}.log") for k in range(len(cmds))]
    procs: list[subprocess.Popen] = []
    try:
        for cmd, log_path in zip(cmds, logs):
            with open(log_path, "w") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                return failed[0], logs
            if all(c == 0 for c in codes):
                return 0, logs
            if time.monotonic() > deadline:
                return None, logs
            time.sleep(0.02)
    finally:
        _stop(procs, tag)


def _tagged_processes(tag: str) -> list[int]:
    """Processes (ours) whose environment carries the launch tag: the launcher and every rank."""
    return tagged_processes(TAG, tag)


def _stop(procs: list[subprocess.Popen], tag: str) -> None:
    """Stop the launchers and all ranks: SIGTERM to each launcher (it stops its workers), then SIGKILL
    to whatever carries the tag after a grace period."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and (any(p.poll() is None for p in procs) or _tagged_processes(tag)):
        time.sleep(0.05)
    for pid in _tagged_processes(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5.0
    while _tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.05)


def _rank_errors(out_path: str, world_size: int) -> str:
    """The errors the ranks wrote, the earliest first (later ones are usually peers losing it)."""
    found = []
    for rank in range(world_size):
        path = f"{out_path}.rank{rank}.error"
        if os.path.exists(path):
            with open(path) as f:
                lines = [line.strip() for line in f.read().splitlines() if line.strip()]
            found.append((os.path.getmtime(path), f"rank {rank}: {' '.join(lines)[:300]}"))
    return "; ".join(text for _, text in sorted(found))


def _root_cause(log_path: str) -> str:
    """torchrun's "Root Cause (first observed failure)": which rank, with which exit status."""
    with open(log_path, errors="replace") as f:
        text = f.read()
    match = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text, re.S)
    if not match:
        return ""
    rank, code = match.groups()
    how = f"was killed by signal {-int(code)}" if int(code) < 0 else f"exited with status {code}"
    return f"rank {rank} {how} first"


def _log_tail(path: str, lines: int = 5) -> str:
    with open(path, errors="replace") as f:
        tail = [line.strip() for line in f.read().splitlines() if line.strip()][-lines:]
    return " | ".join(tail)[-600:] or "no output"


def summary(result: dict) -> str:
    it = result["iteration_time_s"]
    lay = result["config"]["layout"]
    losses = result["losses"]
    return "\n".join([
        f"model {result['config']['model']['name']}  dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} "
        f"schedule={lay['schedule']} zero={lay['zero']} recompute={lay['recompute']}  "
        f"world size {result['world_size']} on {result['options']['device']}",
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps",
        f"step time median {it['median'] * 1e3:.1f} ms (p10 {it['p10'] * 1e3:.1f}, p90 {it['p90'] * 1e3:.1f})",
        f"throughput {result['tokens_per_s']:,.0f} tokens/s",
    ] + _comparison(result))


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
