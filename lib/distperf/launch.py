"""Starting and stopping the processes of a run: torch's launcher for the ranks, and a clean stop.

:func:`launch` runs :mod:`distperf.train` on ``world_size`` local ranks under torch's own launcher,
``python -m torch.distributed.run --standalone`` (gloo on CPU, NCCL on CUDA), or one launcher per emulated
node (:mod:`distperf.emulation`), and returns rank 0's result. It is bounded by a timeout: a rank that
raises, exits or hangs ends the launch with :class:`LaunchError`, which names the rank and its error.

Every process of a launch carries a tag in its environment (``NAME=tag``, inherited even by a process
that left its process group), so :func:`tagged_processes` finds them all and :func:`stop_launchers` leaves
none behind. ``run``, ``sweep`` and the emulated-link benchmark (:mod:`distperf.measure.link_bench`) all
start their processes here.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext

TAG = "DISTPERF_LAUNCH_TAG"


class LaunchError(RuntimeError):
    """The launch failed, hung past its timeout, or a rank failed."""


def tagged_processes(name: str, tag: str) -> list[int]:
    """PIDs of this user's processes (not this one) whose environment holds ``name=tag``."""
    needle, found = f"{name}={tag}".encode(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_tagged(name: str, tag: str, wait_s: float = 5.0) -> None:
    """SIGKILL every process that carries ``name=tag``, and wait (up to ``wait_s``) until none is left."""
    for pid in tagged_processes(name, tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while tagged_processes(name, tag) and time.monotonic() < deadline:
        time.sleep(0.05)


def threads_per_rank(world_size: int) -> int:
    """OMP threads of each CPU rank: the cores shared out (at least one)."""
    return max(1, (os.cpu_count() or 1) // world_size)


def launch(spec: dict, world_size: int, timeout_s: float, device: str = "auto", env: dict | None = None,
           network=None) -> dict:
    """Run :mod:`distperf.train` with ``spec`` ({"config", "options"}, :meth:`distperf.config.Config.to_dict`
    and the run options) on ``world_size`` local ranks under ``torch.distributed.run`` (one per emulated
    node with ``network``, a :class:`~distperf.emulation.spec.NetworkSpec`); return rank 0's result.
    Raises LaunchError on a failure or after ``timeout_s``; leaves no process behind (and no namespace:
    :func:`distperf.emulation.topology.emulated`)."""
    from .emulation.launch import torchrun_commands
    from .emulation.topology import emulated

    with tempfile.TemporaryDirectory(prefix="distperf-run-") as tmp:
        spec_path, out_path = (os.path.join(tmp, n) for n in ("spec.json", "result.json"))
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        tag = uuid.uuid4().hex
        child_env = {**os.environ, **(env or {}), TAG: tag}
        if device != "cuda" and "OMP_NUM_THREADS" not in os.environ:
            child_env["OMP_NUM_THREADS"] = str(threads_per_rank(world_size))
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
        errors = rank_errors(out_path, world_size)
        if code is None:
            raise LaunchError(f"the run did not finish within --timeout {timeout_s:g} s; all {world_size} ranks "
                              f"were stopped" + (f" ({errors})" if errors else ""))
        if code != 0 or not os.path.exists(out_path):
            detail = "; ".join(d for d in (*(root_cause(log) for log in logs), errors) if d) \
                or " | ".join(log_tail(log) for log in logs)
            raise LaunchError(f"the launch failed (torch.distributed.run exit status {code}): {detail}")
        with open(out_path) as f:
            return json.load(f)


def run_launchers(cmds: list[list[str]], env: dict, log_dir: str, tag: str,
                  timeout_s: float) -> tuple[int | None, list[str]]:
    """Start one launcher per argv (each in a session of its own, output to ``log_dir/launch<k>.log``;
    ``env`` must carry ``TAG=tag``) and wait until all end, one fails, or ``timeout_s`` passes; then stop
    them all (:func:`stop_launchers`). Returns (the first non-zero exit status, 0 if all succeeded, None at
    the timeout; the logs)."""
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
        stop_launchers(procs, tag)


def stop_launchers(procs: list[subprocess.Popen], tag: str) -> None:
    """Stop the launchers and all ranks: SIGTERM to each launcher's group (it stops its workers), then
    SIGKILL to whatever carries the tag after a grace period."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and (any(p.poll() is None for p in procs) or tagged_processes(TAG, tag)):
        time.sleep(0.05)
    for pid in tagged_processes(TAG, tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    kill_tagged(TAG, tag)


def rank_errors(out_path: str, world_size: int) -> str:
    """The errors the ranks wrote (``<out>.rank<R>.error``), the earliest first (later ones are usually
    peers losing it)."""
    found = []
    for rank in range(world_size):
        path = f"{out_path}.rank{rank}.error"
        if os.path.exists(path):
            with open(path) as f:
                lines = [line.strip() for line in f.read().splitlines() if line.strip()]
            found.append((os.path.getmtime(path), f"rank {rank}: {' '.join(lines)[:300]}"))
    return "; ".join(text for _, text in sorted(found))


def root_cause(log_path: str) -> str:
    """torchrun's "Root Cause (first observed failure)": which rank, with which exit status."""
    with open(log_path, errors="replace") as f:
        text = f.read()
    match = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text, re.S)
    if not match:
        return ""
    rank, code = match.groups()
    how = f"was killed by signal {-int(code)}" if int(code) < 0 else f"exited with status {code}"
    return f"rank {rank} {how} first"


def log_tail(path: str, lines: int = 5) -> str:
    with open(path, errors="replace") as f:
        tail = [line.strip() for line in f.read().splitlines() if line.strip()][-lines:]
    return " | ".join(tail)[-600:] or "no output"
