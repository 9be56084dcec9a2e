"""Run every configuration of an experiment, ``repeats`` times each in fresh processes, and keep one CSV row per
configuration and repeat.

``distperf run`` configurations run many to a launch (:mod:`distperf.runner.batch`): the configurations of one
repeat round that share a world size, an environment and a network train one after another in the same process
group, and each repeat round has launches of its own, so that the repeats of a configuration are independent
processes. Only repeat 0 measures memory and communication (byte counts, the same in every run; every repeat still
breaks one step's time down by class on CPU, ``run --breakdown``), unless the
configuration sets ``measure`` itself (``measure: true`` measures every repeat: waiting times vary). With
``batch=False`` (``sweep --one-per-process``), in an experiment with a ``memory_limit`` (each of its processes
limited to that address space) and for any other command, each configuration runs as ``python -m distperf run
FLAGS --json`` (or the experiment's command) in a session of its own, with a timeout; at the timeout
the whole process group gets SIGINT (``run`` then stops its ranks itself), then SIGKILL, and so does every process
that carries the configuration's tag in its environment (ranks that started sessions of their own). The child also
dies if the sweep is killed (``PR_SET_PDEATHSIG`` on Linux).

A row holds:

- ``experiment``, ``config_hash`` (:attr:`~distperf.runner.grid.Configuration.hash`, the same for every repeat),
  ``repeat`` (0 … repeats − 1), ``status`` (``ok``, ``failed``, ``timeout``, ``oom``, ``invalid`` with
  ``skip_invalid``, or ``skipped``: a run on an emulated network (``network``) without the privileges it needs,
  not started), ``message`` (the error's last line, or why it was skipped), ``elapsed_s`` (wall time of the
  process, or in a launch of many the time from the end of the configuration before it), ``returncode``,
  ``background_cpu_share`` (the share of the machine's CPU time that processes other than the sweep's used while
  the row was measured, from the row before it: :mod:`distperf.measure.background`; 0 is a quiet machine);
- ``launch.id``, ``launch.position``, ``launch.configurations`` (a launch of many: which one, the configuration's
  place in it, how many it ran);
- the configuration: ``arg.NAME`` per flag and ``env.NAME`` per environment variable;
- the command's JSON result flattened into **dotted** columns (``iteration_time_s.median``,
  ``config.layout.dp``); lists are kept as JSON text (``losses``); a result key that would take the
  name of one of the row's own columns gets the prefix ``result.``;
- provenance (:func:`distperf.results.provenance`): ``machine``, ``device_name``, ``torch``,
  ``python``, ``commit``, ``date`` (when the row was written).

The table, and resuming a sweep where it stopped, are :mod:`distperf.runner.resume`'s, which
:func:`sweep_points` shares: it runs points of an experiment measured in the calling process (a notebook's),
with the same rows, resume and provenance.
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
from collections.abc import Callable
from pathlib import Path

from ..config import ConfigError
from ..launch import kill_tagged, reap, spawn
from ..measure.background import Watch
from ..results import PROVENANCE_COLUMNS, provenance
from .batch import batchable, prepare, run_jobs
from .grid import Configuration, Experiment
from .resume import ROW_COLUMNS, Item, Outcome, config_hash, failure_status, run_all, timestamp

TAG = "DISTPERF_SWEEP_TAG"
DEFAULT_TIMEOUT = 600.0


def flatten(obj: dict, prefix: str = "") -> dict:
    """Nested dicts → dotted keys; lists → JSON text; scalars as they are."""
    out = {}
    for key, value in obj.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name) if value else {name: "{}"})
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, tag: str, grace: float = 3.0) -> None:
    """SIGINT to the process group, then after ``grace`` seconds SIGKILL to it and to every tagged process."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)
    kill_tagged(TAG, tag, wait_s=0.0)
    reap(proc)
    kill_tagged(TAG, tag)


def _parse_json(text: str) -> dict | None:
    text = text.strip()
    candidates = [text]
    lines = text.splitlines()
    candidates += ["\n".join(lines[i:]) for i, line in enumerate(lines) if line.startswith("{")]
    for c in candidates:
        try:
            value = json.loads(c)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"error|exception|traceback|killed|fault", line, re.I):
            return line[:500]
    return (lines[-1] if lines else "")[:500]


def run_configuration(cfg: Configuration, timeout: float, cwd: Path, repeat: int = 0,
                      memory_limit: float | None = None) -> Outcome:
    """Run one configuration in a fresh process group, each of its processes limited to ``memory_limit`` bytes of
    address space if given; never raises for the child's failures. A repeat after the first of ``run`` measures no
    memory or communication (``--no-measure``) unless the configuration sets ``measure`` itself."""
    if cfg.command[:1] == ("distperf",):
        argv = [sys.executable, "-m", "distperf", cfg.command[1], *cfg.flags()]
        if cfg.command[1] == "run" and "timeout" not in cfg.params:
            # let run stop a hung launch itself (and say which rank hung) before we must kill it
            argv += ["--timeout", f"{max(1.0, 0.9 * timeout):g}"]
        if cfg.command[1] == "run" and repeat > 0 and "measure" not in cfg.params:
            argv.append("--no-measure")
        argv.append("--json")
    else:
        argv = [*cfg.command, *cfg.flags()]
    tag = uuid.uuid4().hex
    env = {**os.environ, **cfg.env, TAG: tag}
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = spawn(argv, die_with_parent=sys.platform.startswith("linux"), stdout=out, stderr=err, env=env, cwd=cwd,
                     start_new_session=True, memory_limit=None if memory_limit is None else int(memory_limit))
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            stop(proc, tag)  # also on KeyboardInterrupt: no process of the configuration outlives it
        elapsed = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    code = proc.returncode
    if timed_out:
        return Outcome("timeout", f"no result within {timeout:g} s; its processes were killed", elapsed, code, None)
    result = _parse_json(stdout) if code == 0 else None
    if code == 0 and result is not None:
        return Outcome("ok", "", elapsed, code, result)
    message = _last_error_line(stderr) or _last_error_line(stdout)
    if code == 0:
        return Outcome("failed", f"exit status 0 but no JSON object on stdout: {message}"[:500], elapsed, code, None)
    status, note = failure_status(code, message, stderr)
    return Outcome(status, f"{note} {message or f'exit status {code}'}".strip()[:500], elapsed, code, None)


def network_skip(cfg: Configuration) -> Outcome | None:
    """A ``skipped`` outcome, with the reason and the network's columns, for a run on an emulated
    network that this process may not set up (:func:`distperf.emulation.topology.check_privileges`,
    reading the configuration's environment too); None otherwise."""
    network = cfg.params.get("network")
    if cfg.command != ("distperf", "run") or not network:
        return None
    from ..emulation.spec import parse
    from ..emulation.topology import NotPrivileged, check_privileges

    try:
        check_privileges({**os.environ, **cfg.env})
    except NotPrivileged as e:
        columns = parse(network, inter_optional=True).columns()
        if not columns["inter_bit_per_s"]:
            columns.update(inter_bit_per_s=None, spec=network)
        return Outcome("skipped", f"not run: {e}", 0.0, None, {"network": columns})
    return None


def device_of(exp: Experiment, device: str = "auto") -> str:
    """The device the experiment runs on ('cpu' or 'cuda'): its ``device`` flag, else ``device``."""
    from ..results import resolve_device

    dev = exp.configurations[0].params.get("device", device)
    return resolve_device(dev if dev in ("auto", "cpu", "cuda") else "auto")


def make_row(exp: Experiment, cfg: Configuration, outcome: Outcome, prov: dict, repeat: int = 0) -> dict:
    """The table row of one repeat of a configuration (see the module docstring)."""
    row = {"experiment": exp.name, "config_hash": cfg.hash, "repeat": repeat, "status": outcome.status,
           "message": outcome.message, "elapsed_s": round(outcome.elapsed_s, 3), "returncode": outcome.returncode}
    row.update({f"arg.{k}": v for k, v in cfg.params.items()})
    row.update({f"env.{k}": v for k, v in cfg.env.items()})
    reserved = set(ROW_COLUMNS) | set(PROVENANCE_COLUMNS) | set(row)
    for key, value in flatten(outcome.result or {}).items():
        row[f"result.{key}" if key in reserved else key] = value
    row.update(prov)
    row["date"] = timestamp()
    return row



def sweep(exp: Experiment, out: Path, timeout: float | None = None, force: bool = False, device: str = "auto",
          progress: bool = True, repeats: int | None = None, scale: str | None = None, batch: bool = True) -> dict:
    """Run the experiment's (configuration, repeat) pairs not yet done, ``repeats`` of each (default: the
    experiment's, :meth:`~distperf.runner.grid.Experiment.repeats_at` ``scale``), repeat round after repeat round;
    ``run`` configurations many to a launch unless ``batch`` is False. Return counts by status of this sweep's
    runs, and ``done``: those already done (:func:`distperf.runner.resume.run_all`)."""
    timeout = timeout or exp.timeout or DEFAULT_TIMEOUT
    prov = provenance(device_of(exp, device))
    rounds = repeats or exp.repeats_at(scale)

    def runner(cfg: Configuration, repeat: int):
        def run() -> dict:
            if cfg.invalid:
                outcome = Outcome("invalid", cfg.invalid[:500], 0.0, None, None)
            else:
                outcome = network_skip(cfg) or run_configuration(cfg, timeout, exp.workdir, repeat, exp.memory_limit)
            return make_row(exp, cfg, outcome, prov, repeat)
        return run

    configurations = {cfg.hash: cfg for cfg in exp.configurations}

    def execute(todo: list[Item]):
        watch = Watch().start()  # each row: the share of the machine other processes used since the row before
        for row in _execute(todo):
            yield {**row, "background_cpu_share": watch.share()}

    def _execute(todo: list[Item]):
        for repeat in sorted({item.repeat for item in todo}):
            jobs = []
            for item in (i for i in todo if i.repeat == repeat):
                cfg = configurations[item.hash]
                if not batch or exp.memory_limit or not batchable(cfg) or network_skip(cfg) is not None:
                    yield item.run()
                    continue
                try:
                    job = prepare(cfg, repeat, timeout)
                except ConfigError as e:  # what run would have said, in one line
                    yield make_row(exp, cfg, Outcome("failed", f"distperf run: error: {e}"[:500], 0.0, 2, None),
                                   prov, repeat)
                    continue
                if job.calibrates_now:  # run calibrates in its own process, outside the ranks' process group
                    yield item.run()
                    continue
                jobs.append(job)
            for job, outcome in run_jobs(jobs, timeout):
                yield make_row(exp, job.cfg, outcome, prov, job.repeat)

    items = [Item(cfg.hash, cfg.label(exp.varying) + (f" (repeat {r})" if rounds > 1 else ""), runner(cfg, r), r)
             for r in range(rounds) for cfg in exp.configurations]
    return run_all(exp.name, items, out, prov["machine"], force, progress, execute)


def sweep_points(name: str, points: list[dict], measure: Callable[[dict], dict], out: Path, device: str = "cpu",
                 force: bool = False, progress: bool = True) -> dict:
    """Measure each point (a dict of the experiment's variables) in this process, resumably: a row per point
    holds the bookkeeping columns of :mod:`distperf.runner.resume`, the point's variables as columns, what
    ``measure(point)`` returns (flattened) and provenance. A point whose measurement raises becomes a ``failed``
    row with the error's last line; points already ``ok`` on this machine are skipped."""
    prov = provenance(device)

    def runner(point: dict):
        def run() -> dict:
            start, watch = time.perf_counter(), Watch().start()
            try:
                result, status, message = measure(point), "ok", ""
            except Exception as e:  # noqa: BLE001 - the row says what went wrong; the other points go on
                result, status, message = {}, "failed", f"{type(e).__name__}: {e}".splitlines()[0][:500]
            row = {"experiment": name, "config_hash": config_hash(point), "status": status, "message": message,
                   "elapsed_s": round(time.perf_counter() - start, 3), "background_cpu_share": watch.share(), **point}
            reserved = set(ROW_COLUMNS) | set(PROVENANCE_COLUMNS) | set(row)
            row.update({f"result.{k}" if k in reserved else k: v for k, v in flatten(result).items()})
            return {**row, **prov, "date": timestamp()}
        return run

    items = [Item(config_hash(p), " ".join(f"{k}={v}" for k, v in p.items()), runner(p)) for p in points]
    return run_all(name, items, out, prov["machine"], force, progress)


REPEATS_VARIABLE = "DISTPERF_REPEATS"  # what `make data REPEATS=N` sets


def build_repeats(exp: Experiment, scale: str) -> int | None:
    """The repeats a build asks of every configuration of a timed experiment (``DISTPERF_REPEATS``, which ``make data
    REPEATS=N`` sets), in place of the experiment's own; None where it is unset or where the experiment runs each
    configuration once at ``scale`` (smoke, and what does not time). Raise ConfigError unless a whole number ≥ 1."""
    value = os.environ.get(REPEATS_VARIABLE, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(REPEATS_VARIABLE, f"must be a whole number of at least 1, got {value!r}")
    return int(value) if exp.repeats_at(scale) > 1 else None


def run_experiment(spec: dict, scale: str, device: str = "auto", progress: bool = True) -> dict:
    """An experiment described as a dictionary (the keys of an experiment file, :mod:`distperf.runner.grid`, with
    ``repeats``), checked by :meth:`~distperf.runner.grid.Experiment.from_dict` and run resumably into
    ``data/fresh/<scale>/<name>.csv``, each configuration as many times as the build asks (:func:`build_repeats`),
    else as the experiment's ``repeats`` says; prints the counts of :func:`sweep` and the time it took; returns the
    counts."""
    from ..results import fresh_dir

    out = fresh_dir(scale)
    exp = Experiment.from_dict({"scale": scale, **spec}, workdir=out)
    repeats = build_repeats(exp, scale)
    start = time.perf_counter()
    counts = sweep(exp, out / f"{exp.name}.csv", device=device, progress=progress, scale=scale, repeats=repeats)
    print(f"{exp.name}: {counts} in {time.perf_counter() - start:.0f} s")
    return counts
