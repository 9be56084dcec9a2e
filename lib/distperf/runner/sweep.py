"""Run every configuration of an experiment in a fresh process and keep one CSV row per configuration.

Each configuration runs as ``python -m distperf run FLAGS --json`` (or the experiment's command) in a
session of its own, with a timeout; at the timeout the whole process group gets SIGINT (``run`` then
stops its ranks itself), then SIGKILL, and so does every process that carries the configuration's tag
in its environment (ranks that started sessions of their own). The child also dies if the sweep is
killed (``PR_SET_PDEATHSIG`` on Linux).

A row holds:

- ``experiment``, ``config_hash`` (:attr:`~distperf.runner.grid.Configuration.hash`), ``status``
  (``ok``, ``failed``, ``timeout``, ``oom``, ``invalid`` with ``skip_invalid``, or ``skipped``: a run on
  an emulated network (``network``) without the privileges it needs, not started), ``message`` (the
  error's last line, or why it was skipped), ``elapsed_s`` (wall time of the process), ``returncode``;
- the configuration: ``arg.NAME`` per flag and ``env.NAME`` per environment variable;
- the command's JSON result flattened into **dotted** columns (``iteration_time_s.median``,
  ``config.layout.dp``); lists are kept as JSON text (``losses``); a result key that would take the
  name of one of the row's own columns gets the prefix ``result.``;
- provenance (:func:`distperf.results.provenance`): ``machine``, ``device_name``, ``torch``,
  ``python``, ``commit``, ``date`` (when the row was written).

After every configuration the whole table is rewritten through
:func:`distperf.results.write_csv_atomic`, so an interrupted sweep leaves the rows done so far and no
partial file. A new sweep skips the configurations whose row is ``ok`` with the same hash on the same
machine (unless ``force``), and replaces the others' rows in place.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..launch import kill_tagged
from ..results import PROVENANCE_COLUMNS, provenance, write_csv_atomic
from .grid import Configuration, Experiment

TAG = "DISTPERF_SWEEP_TAG"
DEFAULT_TIMEOUT = 600.0
ROW_COLUMNS = ("experiment", "config_hash", "status", "message", "elapsed_s", "returncode")
STATUSES = ("ok", "failed", "timeout", "oom", "invalid", "skipped")
_OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.I)
_TIMEOUT = re.compile(r"did not finish within|timed out", re.I)


@dataclass
class Outcome:
    status: str
    message: str
    elapsed_s: float
    returncode: int | None
    result: dict | None


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


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the sweep dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


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
    proc.wait()
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


def run_configuration(cfg: Configuration, timeout: float, cwd: Path) -> Outcome:
    """Run one configuration in a fresh process group; never raises for the child's failures."""
    if cfg.command[:1] == ("distperf",):
        argv = [sys.executable, "-m", "distperf", cfg.command[1], *cfg.flags()]
        if cfg.command[1] == "run" and "timeout" not in cfg.params:
            # let run stop a hung launch itself (and say which rank hung) before we must kill it
            argv += ["--timeout", f"{max(1.0, 0.9 * timeout):g}"]
        argv.append("--json")
    else:
        argv = [*cfg.command, *cfg.flags()]
    tag = uuid.uuid4().hex
    env = {**os.environ, **cfg.env, TAG: tag}
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
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
    if code in (-signal.SIGKILL, 128 + signal.SIGKILL) and not _OOM.search(stderr):
        message = f"killed by SIGKILL (likely the out-of-memory killer) {message}".strip()
        return Outcome("oom", message, elapsed, code, None)
    if _OOM.search(stderr):
        return Outcome("oom", message, elapsed, code, None)
    if _TIMEOUT.search(message):
        return Outcome("timeout", message, elapsed, code, None)
    return Outcome("failed", message or f"exit status {code}", elapsed, code, None)


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


def make_row(exp: Experiment, cfg: Configuration, outcome: Outcome, prov: dict) -> dict:
    row = {"experiment": exp.name, "config_hash": cfg.hash, "status": outcome.status, "message": outcome.message,
           "elapsed_s": round(outcome.elapsed_s, 3), "returncode": outcome.returncode}
    row.update({f"arg.{k}": v for k, v in cfg.params.items()})
    row.update({f"env.{k}": v for k, v in cfg.env.items()})
    reserved = set(ROW_COLUMNS) | set(PROVENANCE_COLUMNS) | set(row)
    for key, value in flatten(outcome.result or {}).items():
        row[f"result.{key}" if key in reserved else key] = value
    row.update(prov)
    row["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return row


def read_rows(path: Path) -> list[dict]:
    """The rows of a sweep table (none if it does not exist); ConfigError('out') if it is not one."""
    import pandas as pd

    from ..config import ConfigError

    if not path.exists():
        return []
    try:
        frame = pd.read_csv(path, dtype={"config_hash": str})
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same error for the user
        raise ConfigError("out", f"{path}: exists but is not a readable CSV ({e.__class__.__name__})") from None
    if "config_hash" not in frame.columns or "status" not in frame.columns:
        raise ConfigError("out", f"{path}: exists but is not a sweep table (no config_hash/status columns)")
    return [{k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
            for row in frame.to_dict("records")]


def _write_rows(rows: list[dict], path: Path) -> None:
    import pandas as pd

    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    front = [c for c in ROW_COLUMNS if c in columns]
    args = [c for c in columns if c.startswith(("arg.", "env.")) and c not in front]
    back = [c for c in PROVENANCE_COLUMNS if c in columns]
    rest = [c for c in columns if c not in front + args + back]
    write_csv_atomic(pd.DataFrame(rows, columns=front + args + rest + back), path)


def _key(row: dict) -> tuple:
    return str(row.get("config_hash")), str(row.get("machine"))


def sweep(exp: Experiment, out: Path, timeout: float | None = None, force: bool = False, device: str = "auto",
          progress: bool = True) -> dict:
    """Run the experiment's configurations not yet done; return counts by status of this sweep's runs,
    and ``done``: those already done."""
    timeout = timeout or exp.timeout or DEFAULT_TIMEOUT
    prov = provenance(device_of(exp, device))
    rows = read_rows(out)
    index = {_key(r): i for i, r in enumerate(rows)}
    done = {k for k, i in index.items() if rows[i].get("status") == "ok"} if not force else set()
    todo = [c for c in exp.configurations if (c.hash, prov["machine"]) not in done]
    counts = {s: 0 for s in STATUSES}
    counts["done"] = len(exp.configurations) - len(todo)
    bar = _progress(len(exp.configurations), counts["done"], exp.name, progress)
    try:
        for cfg in todo:
            bar.set_postfix_str(f"{bar.total - bar.n} left, now {cfg.label(exp.varying)[:60]}")
            skip = network_skip(cfg)
            if cfg.invalid:
                outcome = Outcome("invalid", cfg.invalid[:500], 0.0, None, None)
            elif skip:
                outcome = skip
            else:
                outcome = run_configuration(cfg, timeout, exp.workdir)
            row = make_row(exp, cfg, outcome, prov)
            key = _key(row)
            if key in index:
                rows[index[key]] = row
            else:
                index[key] = len(rows)
                rows.append(row)
            _write_rows(rows, out)
            counts[outcome.status] += 1
            if outcome.status != "ok":
                bar.write(f"{exp.name}: {cfg.label(exp.varying)}: {outcome.status}: {outcome.message}")
            bar.update(1)
            bar.set_postfix_str(f"{bar.total - bar.n} left, last {outcome.status}")
    finally:
        bar.close()
    return counts


def _progress(total: int, initial: int, name: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="config", file=sys.stderr, disable=not enabled,
                bar_format="{desc}: {n}/{total} configurations done |{bar}| elapsed {elapsed}, "
                           "about {remaining} to go{postfix}")
