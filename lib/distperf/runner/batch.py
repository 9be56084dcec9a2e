"""Many configurations per launch: how the sweep runs ``distperf run`` configurations without paying, for each,
a process start, the imports of torch, a rendezvous and a launcher.

The configurations of one repeat round that share a world size, an environment, an emulated network, a device and
a collective timeout form a *group*. A group runs as one launch, the way ``distperf run`` starts its ranks
(:mod:`distperf.launch`: torch's launcher on this machine, or one per emulated node; a single process when the
configurations need no process group): every rank runs :mod:`distperf.train` ``--batch``, which trains the
group's configurations one after another in the same process group, each with a fresh mesh and trainer, and
writes each result (with ``run``'s prediction beside it) as soon as it is done; the sweep turns it into a row at
once, and only then lets the ranks start the next configuration, so that nothing of the sweep's runs while a
configuration is timed. Each configuration has the sweep's timeout, counted from the end of the one before it
(from the start of the launch for the first).

A failure ends the launch: a rank that raises or exits, a launcher that dies, or a configuration that runs past
its timeout (its processes are then stopped, hung ones killed by their tag). That configuration's row is
``failed``, ``oom`` or ``timeout`` with the first rank's error; the group's remaining configurations go on in a
fresh launch.

Repeat rounds run one after another, each in launches of its own, so that the repeats of a configuration are
independent processes, started minutes apart. Only repeat 0 measures memory and communication (``--measure``):
both are byte counts, the same in every run (``tests/test_batch.py`` checks that two runs agree). Every repeat still
breaks its steps' time down by class on CPU (``--breakdown``: :mod:`distperf.measure.steps`): a time, which varies
between runs.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace

from ..config import Config, ConfigError, RunOptions
from .grid import Configuration, parser_for
from .resume import Outcome, failure_status

@dataclass
class Job:
    """One configuration's repeat, checked and ready to run in a launch."""

    cfg: Configuration  # as the grid gave it
    repeat: int
    config: Config
    policy: str | None  # "time": the partition is measured at the start of the run (rank 0)
    options: RunOptions
    hardware: str  # run's --hardware: the prediction beside the run
    network: object  # a distperf.emulation.spec.NetworkSpec, or None
    network_info: dict
    device: str  # cpu or cuda
    threads: int  # each rank's threads (launch.threads_per_rank)

    @property
    def group(self) -> tuple:
        """What the configurations of one launch share."""
        from ..config import needs_distributed

        process_group = needs_distributed(self.config) or self.network is not None
        return (self.repeat, self.config.layout.world_size, process_group, tuple(sorted(self.cfg.env.items())),
                json.dumps(self.network_info, sort_keys=True), self.device, self.options.timeout_s)

    @property
    def calibrates_now(self) -> bool:
        """Whether its prediction would calibrate the machine now (``--hardware auto`` and no profile of it): a quick
        calibration starts process groups of its own, which cannot run inside a launch's ranks."""
        from ..measure.profiles import auto_profile

        return self.hardware == "auto" and auto_profile(self.threads, self.device) is None

    def spec(self) -> dict:
        return {"config": self.config.to_dict(), "options": asdict(self.options), "policy": self.policy,
                "hardware": self.hardware}


def batchable(cfg: Configuration) -> bool:
    """Whether the configuration is one the launches of many can run: ``distperf run``, valid, writing no
    parameters file."""
    return cfg.command == ("distperf", "run") and not cfg.invalid and "parameters-out" not in cfg.params


def prepare(cfg: Configuration, repeat: int, timeout: float) -> Job:
    """The configuration's repeat as a job: its flags parsed and checked as ``distperf run`` does; repeats after
    the first do not measure memory and communication unless the configuration sets ``measure``. Raises
    ConfigError as ``run`` would (status 2)."""
    from ..emulation.options import network_from_args
    from ..flags import config_and_policy, options_from_args
    from ..hardware import check_choice
    from ..launch import threads_per_rank
    from ..measure.profiles import flops_here
    from ..parallel.rules import check_run
    from ..results import resolve_device

    args = parser_for(cfg.command).parse_args(cfg.flags())
    config, policy = config_and_policy(args)
    options = options_from_args(args)
    check_run(config, options)
    check_choice(args.hardware)
    if "timeout" not in cfg.params:  # as the sweep gives run: stop a hung launch before the sweep must kill it
        options = replace(options, timeout_s=max(1.0, 0.9 * timeout))
    if repeat > 0 and "measure" not in cfg.params:
        options = replace(options, measure=False)
    device = resolve_device(options.device)
    world = config.layout.world_size
    threads = threads_per_rank(world, {**os.environ, **cfg.env})
    network, info = network_from_args(args, world, lambda: flops_here(args.hardware, threads))
    if network and device == "cuda":
        raise ConfigError("network", "shapes the links of CPU ranks (gloo); NCCL between GPUs of one machine "
                                     "would bypass them (shared memory, NVLink): use --device cpu")
    return Job(cfg, repeat, config, policy, options, args.hardware, network, info, device, threads)


def run_jobs(jobs: list[Job], timeout: float) -> Iterator[tuple[Job, Outcome]]:
    """Run the jobs, a launch per group (in the order the groups first appear), yielding each job's outcome as
    soon as it is known."""
    groups: dict[tuple, list[Job]] = {}
    for job in jobs:
        groups.setdefault(job.group, []).append(job)
    for group in groups.values():
        pending = list(group)
        while pending:
            for job, outcome in launch_once(list(pending), timeout):
                pending.remove(job)
                yield job, outcome


def launch_once(jobs: list[Job], timeout: float) -> Iterator[tuple[Job, Outcome]]:
    """One launch of the jobs' configurations, in order; yields the outcome of each configuration that finished,
    then, if the launch failed or a configuration ran past ``timeout``, that configuration's. The configurations
    after a failure are not yielded (the caller runs them in a fresh launch)."""
    from ..emulation.topology import SetupError, emulated
    from ..launch import TAG, launch_status, launcher_commands, rank_environment, start_launchers, stop_launchers

    first = jobs[0]
    world = first.config.layout.world_size
    launch_id = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="distperf-batch-") as tmp:
        spec_path, out_dir = os.path.join(tmp, "batch.json"), os.path.join(tmp, "out")
        os.mkdir(out_dir)
        with open(spec_path, "w") as f:
            json.dump({"runs": [job.spec() for job in jobs], "handshake": True}, f)
        env = {**rank_environment(world, first.device, first.cfg.env), TAG: launch_id}
        program = ["-m", "distperf.train", "--batch", spec_path, "--out-dir", out_dir]
        procs: list = []
        done, start, failure = 0, time.monotonic(), None
        try:
            with emulated(first.network) if first.network is not None else nullcontext() as topo:
                if first.group[2]:
                    cmds = launcher_commands(world, program, topo, env)
                else:  # one process, no process group
                    cmds = [[sys.executable, *program]]
                logs = start_launchers(cmds, env, tmp, procs)
                while done < len(jobs):
                    path = os.path.join(out_dir, f"{done}.json")
                    if os.path.exists(path):
                        yield jobs[done], _ok(jobs[done], path, time.monotonic() - start, launch_id, done, len(jobs))
                        # the row is written: let the ranks go on (nothing of ours runs while they are timed)
                        open(os.path.join(out_dir, f"{done}.next"), "w").close()
                        done, start = done + 1, time.monotonic()
                        continue
                    code = launch_status(procs)
                    if code != "running":
                        if not os.path.exists(path):  # its result may have come just before the exit
                            failure = _failed(code, os.path.join(out_dir, str(done)), world, logs)
                            break
                        continue
                    if time.monotonic() - start > timeout:
                        failure = Outcome("timeout", f"no result within {timeout:g} s; its processes were killed",
                                          time.monotonic() - start, None, None)
                        break
                    time.sleep(0.02)
        except SetupError as e:
            failure = Outcome("failed", f"distperf run: error: {e}"[:500], time.monotonic() - start, 1, None)
        finally:
            stop_launchers(procs, launch_id)
        if failure is not None:
            failure.elapsed_s = time.monotonic() - start
            yield jobs[done], failure


def _ok(job: Job, path: str, elapsed: float, launch_id: str, position: int, size: int) -> Outcome:
    with open(path) as f:
        result = json.load(f)
    if job.network is not None:
        result["network"] = job.network_info
    result["launch"] = {"id": launch_id[:12], "position": position, "configurations": size}
    return Outcome("ok", "", elapsed, 0, result)


def _failed(code: int, where: str, world: int, logs: list[str]) -> Outcome:
    """The outcome of the configuration a failed launch was running: the launcher's root cause and the ranks'
    errors (``<where>.rank<R>.error``, the earliest first), else the end of the launcher's log; ``oom`` when they
    name memory or a rank was killed by SIGKILL."""
    from ..launch import log_tail, rank_errors, root_cause

    causes = [root_cause(log) for log in logs]
    detail = "; ".join(d for d in (*causes, rank_errors(where, world)) if d) or " | ".join(log_tail(log) for log in logs)
    what = "the launch ended without a result" if code == 0 else f"the launch failed (exit status {code})"
    message = f"{what}: {detail}"
    texts = "".join(open(log, errors="replace").read()[-20000:] for log in logs if os.path.exists(log))
    status, note = failure_status(code, detail, texts)
    message = f"{note} {message}".strip()
    return Outcome(status, message[:500], 0.0, code, None)
