"""Starting and stopping the processes of a run: torch's launcher for the ranks, and a clean stop.

:func:`launch` runs :mod:`distperf.train` on ``world_size`` local ranks under torch's own launcher,
``python -m torch.distributed.run --standalone`` (gloo on CPU, NCCL on CUDA), or one launcher per emulated
node (:mod:`distperf.emulation`), and returns rank 0's result. It is bounded by a timeout: a rank that
raises, exits or hangs ends the launch with :class:`LaunchError`, which names the rank and its error.

Every process of a launch carries a tag in its environment (``NAME=tag``, inherited even by a process
that left its process group), so :func:`tagged_processes` finds them all and :func:`stop_launchers` leaves
none behind. ``run``, ``sweep`` and the emulated-link benchmark (:mod:`distperf.measure.link_bench`) all
start their processes here.

**Placement of the ranks.** Every rank of a launch runs on this machine (one torchrun, or one per emulated
node). :func:`rank_environment` gives each the same number of threads, the user's ``OMP_NUM_THREADS`` when
set, else the cores shared out (``cores // ranks``, at least one), and tells the ranks how many of them share
the machine; each rank then pins itself (:func:`pin_rank`) to cores of its own, ``threads`` of them (at most
``cores // ranks``), when the machine has at least as many cores as the launch has ranks. The rank's
result records the cores and the threads, or why it was not pinned (``placement``).
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

from .rendezvous import BACKEND, LOOPBACK

TAG = "DISTPERF_LAUNCH_TAG"
RANKS_HERE = "DISTPERF_RANKS_HERE"  # how many ranks of the launch share this machine (set by rank_environment)
THREADS_FROM = "DISTPERF_THREADS_FROM"  # where OMP_NUM_THREADS came from: "user" or "cores"


class LaunchError(RuntimeError):
    """The launch failed, hung past its timeout, or a rank failed."""


def tagged_processes(name: str, tag: str, strict: bool = False) -> list[int]:
    """PIDs of this user's processes (not this one) whose environment holds ``name=tag``. Where ``/proc`` cannot be
    read (another system) the answer is empty, unless ``strict`` (the tests that check that nothing is left): then
    OSError when /proc cannot be listed or this process's own environment cannot be read there."""
    needle, found = f"{name}={tag}".encode(), []
    try:
        entries = os.listdir("/proc")
        if strict:
            with open(f"/proc/{os.getpid()}/environ", "rb") as f:
                f.read()
    except OSError:
        if strict:
            raise
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def reap(proc: subprocess.Popen, wait_s: float = 5.0) -> None:
    """Wait for a child that was sent SIGKILL, without ``Popen.wait()``'s blocking lock: a stop signal whose handler
    raises while ``Popen.poll()`` holds that lock (between its non-blocking acquire and its ``try``, in CPython's
    ``subprocess``) leaves it held for good, and a plain ``wait()`` then blocks forever. After ``wait_s`` seconds the
    child is reaped with ``os.waitpid``."""
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        try:
            os.waitpid(proc.pid, 0)
        except ChildProcessError:  # reaped meanwhile
            pass


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


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity mask: a container's cpuset, taskset), in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _user_threads(env) -> int | None:
    value = str(env.get("OMP_NUM_THREADS", "")).strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def threads_per_rank(world_size: int, env: dict | None = None) -> int:
    """OMP threads of each CPU rank: the user's ``OMP_NUM_THREADS`` (in ``env``, default this process's
    environment) when set, else the cores shared out (at least one)."""
    return _user_threads(os.environ if env is None else env) or max(1, len(available_cores()) // world_size)


def rank_environment(world_size: int, device: str = "cpu", env: dict | None = None) -> dict:
    """The environment of the ranks of a launch on this machine: this process's, then ``env``; on CPU
    ``OMP_NUM_THREADS`` (:func:`threads_per_rank`) and where it came from; how many ranks share the machine."""
    child = {**os.environ, **(env or {}), RANKS_HERE: str(world_size)}
    if sys.platform.startswith("linux"):  # gloo's (and tensorpipe's) connections on loopback, unless told otherwise
        child.setdefault("GLOO_SOCKET_IFNAME", "lo")
        child.setdefault("TP_SOCKET_IFNAME", "lo")
    if device != "cuda":
        child[THREADS_FROM] = "user" if _user_threads(child) else "cores"
        child["OMP_NUM_THREADS"] = str(threads_per_rank(world_size, child))
    return child


def pin_rank(rank: int, ranks: int, threads: int, cores: list[int] | None = None) -> dict:
    """Pin this process to cores of its own: rank ``rank`` of the ``ranks`` on this machine gets the k cores
    ``cores[rank·k : (rank+1)·k]``, k = min(threads, len(cores) // ranks), at least one; only when there are
    at least as many cores as ranks (else two ranks would share a core whatever we do, and the scheduler may
    as well move them). Returns the record for the result: ``pinned``, ``cores``, or ``reason``."""
    cores = available_cores() if cores is None else cores
    if len(cores) < ranks:
        return {"pinned": False, "cores": cores, "reason": f"{ranks} ranks on {len(cores)} cores: not pinned"}
    if not 0 <= rank < ranks:
        return {"pinned": False, "cores": cores, "reason": f"rank {rank} is not one of the {ranks} on this machine"}
    k = max(1, min(threads, len(cores) // ranks))
    mine = cores[rank * k:(rank + 1) * k]
    try:
        os.sched_setaffinity(0, mine)
    except (AttributeError, OSError) as e:
        return {"pinned": False, "cores": cores, "reason": f"sched_setaffinity failed: {e}"}
    return {"pinned": True, "cores": mine, "reason": ""}


def set_affinity(cores: list[int]) -> None:
    """Let this process run on ``cores`` (back where it was before :func:`pin_rank`, say); a no-op off Linux."""
    try:
        os.sched_setaffinity(0, cores)
    except (AttributeError, OSError):
        pass


def pin_this_rank(threads: int) -> dict:
    """Pin this rank (:func:`pin_rank`): its place among the ranks on this machine is its global RANK when our
    launcher started every rank here (``DISTPERF_RANKS_HERE``), else LOCAL_RANK of LOCAL_WORLD_SIZE (a foreign
    launcher, one per node); a process without a launcher is rank 0 of 1. Adds ``threads`` and where they came
    from (``threads_from``: the user's OMP_NUM_THREADS, or cores // ranks) to the record."""
    env = os.environ
    if RANKS_HERE in env:
        rank, ranks = int(env.get("RANK", 0)), int(env[RANKS_HERE])
    else:
        rank, ranks = int(env.get("LOCAL_RANK", 0)), int(env.get("LOCAL_WORLD_SIZE", 1))
    record = pin_rank(rank, ranks, threads)
    source = env.get(THREADS_FROM) or ("user" if _user_threads(env) else "default")
    return {**record, "threads": threads, "threads_from": {"user": "OMP_NUM_THREADS", "cores": "cores // ranks"}.get(
        source, "torch's default")}


def launch(spec: dict, world_size: int, timeout_s: float, device: str = "auto", env: dict | None = None,
           network=None, parameters_out: str | None = None) -> dict:
    """Run :mod:`distperf.train` with ``spec`` ({"config", "options"}, :meth:`distperf.config.Config.to_dict`
    and the run options) on ``world_size`` local ranks under ``torch.distributed.run`` (one per emulated
    node with ``network``, a :class:`~distperf.emulation.spec.NetworkSpec`); return rank 0's result. With
    ``parameters_out`` the ranks also write their trained parameters there (:func:`distperf.train.main`).
    Raises LaunchError on a failure or after ``timeout_s``; leaves no process behind (and no namespace:
    :func:`distperf.emulation.topology.emulated`)."""
    from .emulation.topology import emulated

    with tempfile.TemporaryDirectory(prefix="distperf-run-") as tmp:
        spec_path, out_path = (os.path.join(tmp, n) for n in ("spec.json", "result.json"))
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        tag = uuid.uuid4().hex
        child_env = {**rank_environment(world_size, device, env), TAG: tag}
        program = ["-m", "distperf.train", "--spec", spec_path, "--out", out_path]
        if parameters_out:
            program += ["--parameters-out", os.path.abspath(parameters_out)]
        with emulated(network) if network else nullcontext() as topo:
            cmds = launcher_commands(world_size, program, topo, child_env)
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


def launcher_commands(world_size: int, program: list[str], topo=None, env: dict | None = None) -> list[list[str]]:
    """The argv of the launcher(s) that start ``program`` (``-m MODULE ARGS…``) on ``world_size`` ranks: one
    ``torch.distributed.run --standalone``, or one per node of an emulated cluster ``topo`` (then ``env``, the
    ranks' environment, gets the node's network settings)."""
    if topo is None:  # one machine: the rendezvous listens on loopback only (distperf.rendezvous)
        return [[sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", BACKEND, "--rdzv-endpoint",
                 f"{LOOPBACK}:0", "--rdzv-id", uuid.uuid4().hex, "--nnodes", "1", "--nproc-per-node",
                 str(world_size), "--max-restarts", "0", "--monitor-interval", "0.1", *program]]
    from .emulation.launch import torchrun_commands

    if env is not None:
        env.update(topo.env())
    return torchrun_commands(topo, program)


def run_launchers(cmds: list[list[str]], env: dict, log_dir: str, tag: str,
                  timeout_s: float, poll=None) -> tuple[int | None, list[str]]:
    """Start one launcher per argv (each in a session of its own, output to ``log_dir/launch<k>.log``;
    ``env`` must carry ``TAG=tag``) and wait until all end, one fails, ``timeout_s`` passes, or ``poll()``
    (called every 20 ms while they run, if given) returns False; then stop them all (:func:`stop_launchers`).
    Returns (the first non-zero exit status, 0 if all succeeded, None at the timeout or when ``poll`` stopped
    them; the logs)."""
    procs: list[subprocess.Popen] = []
    try:
        logs = start_launchers(cmds, env, log_dir, procs)
        deadline = time.monotonic() + timeout_s
        while True:
            code = launch_status(procs)
            if code != "running":
                return code, logs
            if time.monotonic() > deadline or (poll is not None and poll() is False):
                return None, logs
            time.sleep(0.02)
    finally:
        stop_launchers(procs, tag)


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _child_setup(die_with_parent: bool, memory_limit: int | None = None) -> None:
    """In the child, before exec: take the stop signals again (:func:`spawn` held them off), limit its address
    space to ``memory_limit`` bytes (RLIMIT_AS, inherited by its own children) and, if asked, get SIGKILL when the
    parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if memory_limit is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    if die_with_parent:
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except (OSError, AttributeError):
            pass


def die_with_parent() -> None:
    """In a process started by another (a rank by torchrun's launcher): SIGKILL when that parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``), so that killing ``distperf run``, or the sweep that started it, leaves no rank
    behind; a parent that died before the call ends this process now. Elsewhere, nothing."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    _child_setup(True)
    if os.getppid() != parent or not _carries_our_tag(parent):  # the launcher died before: it will never signal
        os._exit(1)


def _carries_our_tag(pid: int) -> bool:
    """Whether process ``pid`` holds this process's :data:`TAG` (a launcher and its ranks share one; a process
    that inherited an orphan, init or a subreaper, does not). True where there is no tag to compare."""
    tag = os.environ.get(TAG)
    if not tag:
        return True
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{TAG}={tag}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def spawn(argv: list[str], die_with_parent: bool = False, memory_limit: int | None = None,
          **popen) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen)`` with SIGINT and SIGTERM held off while it forks: a stop handler that
    raises KeyboardInterrupt inside fork's own handlers has its exception ignored by Python, and the caller would
    then wait on a child nobody stops. A signal that arrives meanwhile is delivered as soon as the child exists.
    ``memory_limit``: the child's address space in bytes (:func:`_child_setup`)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return subprocess.Popen(argv, preexec_fn=lambda: _child_setup(die_with_parent, memory_limit), **popen)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def start_launchers(cmds: list[list[str]], env: dict, log_dir: str, procs: list) -> list[str]:
    """Start one launcher per argv, each in a session of its own with its output in ``log_dir/launch<k>.log``,
    appending each to ``procs`` as it starts (so that the caller can stop those started, whatever happens);
    return the logs' paths."""
    logs = [os.path.join(log_dir, f"launch{k}.log") for k in range(len(cmds))]
    for cmd, log_path in zip(cmds, logs):
        with open(log_path, "w") as log:
            # a session of its own (a stop reaches the launcher's whole group), and SIGKILL when this process dies,
            # whatever kills it: the ranks follow their launcher (die_with_parent in distperf.train)
            procs.append(spawn(cmd, die_with_parent=sys.platform.startswith("linux"), stdout=log,
                               stderr=subprocess.STDOUT, env=env, start_new_session=True))
    return logs


def launch_status(procs: list[subprocess.Popen]) -> int | str:
    """The first non-zero exit status of the launchers, 0 when all succeeded, else ``"running"``."""
    codes = [p.poll() for p in procs]
    failed = [c for c in codes if c not in (None, 0)]
    if failed:
        return failed[0]
    return 0 if all(c == 0 for c in codes) else "running"


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
        reap(proc)
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
    """torchrun's "Root Cause (first observed failure)": which rank, with which exit status; and any other rank
    killed by a signal other than the SIGTERM torchrun sends itself (a rank killed by SIGKILL, as the out-of-memory
    killer does, while a peer that lost it raised first is the cause, though torchrun may observe the peer first)."""
    with open(log_path, errors="replace") as f:
        text = f.read()
    match = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", text, re.S)
    if not match:
        return ""

    def how(code: int) -> str:
        return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"

    first = int(match.group(1))
    summary = text[text.rfind("Failures:", 0, match.start()):]
    killed = {int(r): int(c) for r, c in re.findall(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", summary, re.S)
              if int(c) < 0 and -int(c) != signal.SIGTERM and int(r) != first}
    return "; ".join([f"rank {first} {how(int(match.group(2)))} first",
                      *(f"rank {r} {how(c)}" for r, c in sorted(killed.items()))])


def log_tail(path: str, lines: int = 5) -> str:
    with open(path, errors="replace") as f:
        tail = [line.strip() for line in f.read().splitlines() if line.strip()][-lines:]
    return " | ".join(tail)[-600:] or "no output"
