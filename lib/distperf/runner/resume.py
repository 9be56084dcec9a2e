"""One resume mechanism for every experiment: a result table whose rows are keyed by configuration and machine.

A table is a CSV with one row per configuration and repeat: ``experiment``, ``config_hash`` (a hash of the
configuration), ``repeat`` (0, 1, … for the independent repeats of a configuration; tables written before repeats
existed have none, which counts as repeat 0), ``status`` (``ok``, ``failed``, ``timeout``, ``oom``, ``invalid``,
``skipped``), ``message``, ``elapsed_s``, the configuration's and the result's columns, and provenance
(:func:`distperf.results.provenance`). After every row the whole table is rewritten through
:func:`distperf.results.write_csv_atomic`, so an interrupted experiment leaves the rows done so far and no partial
file. A new run skips the (configuration, repeat) pairs whose row is ``ok`` with the same hash on the same machine
(unless ``force``), and replaces the others' rows. Rows are kept in the order of the items (repeat by repeat, in
grid order within one), whatever the order they were run in; rows of other items stay after them.

:func:`run_all` drives it: the sweep runner (:mod:`distperf.runner.sweep`) hands it configurations that run as
processes, a notebook hands it points measured in its own process (:func:`distperf.runner.sweep.sweep_points`).
Items run one by one (each ``item.run()``), or all together through an ``execute`` function that yields rows as
they are done (the sweep's launches of many configurations, :mod:`distperf.runner.batch`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..results import PROVENANCE_COLUMNS, write_csv_atomic

ROW_COLUMNS = ("experiment", "config_hash", "repeat", "status", "message", "elapsed_s", "returncode",
               "background_cpu_share")
STATUSES = ("ok", "failed", "timeout", "oom", "invalid", "skipped")


OOM = re.compile(r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory|can't allocate memory", re.I)
KILLED = re.compile(r"killed by signal 9\b")
TIMED_OUT = re.compile(r"did not finish within|timed out", re.I)
KILLED_NOTE = "killed by SIGKILL (likely the out-of-memory killer)"


def failure_status(code: int | None, message: str, *logs: str) -> tuple[str, str]:
    """The status of a run that failed, from its exit status, its error ``message`` and its ``logs``: ``oom`` when
    they name memory (torch's ``DefaultCPUAllocator: can't allocate memory`` under an address-space limit, CUDA's
    out of memory, Python's MemoryError), ``timeout`` when the message says it ran out of time, ``oom`` again when it
    or one of its ranks was killed by SIGKILL (what the kernel's out-of-memory killer sends), else ``failed``; and a
    note to put in front of the message (:data:`KILLED_NOTE` for a SIGKILL, else empty)."""
    texts = (message, *logs)
    if any(OOM.search(t) for t in texts):
        return "oom", ""
    if TIMED_OUT.search(message):
        return "timeout", ""
    if code in (-signal.SIGKILL, 128 + signal.SIGKILL) or any(KILLED.search(t) for t in texts):
        return "oom", KILLED_NOTE
    return "failed", ""


@dataclass
class Outcome:
    status: str
    message: str
    elapsed_s: float
    returncode: int | None
    result: dict | None


@dataclass(frozen=True)
class Item:
    """One configuration (one repeat of it) to run: its hash, a label for the progress bar and messages, how to run
    it (``run()`` returns the table row, with a ``status``), and which repeat it is."""

    hash: str
    label: str
    run: Callable[[], dict]
    repeat: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return self.hash, self.repeat


def config_hash(obj) -> str:
    """sha256 of canonical JSON, first 16 hex digits: the key of a configuration."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def read_rows(path: Path) -> list[dict]:
    """The rows of a result table (none if it does not exist); ConfigError('out') if it is not one."""
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


def write_rows(rows: list[dict], path: Path) -> None:
    """The table, atomically: bookkeeping columns first, then the configuration's, the results, provenance last."""
    import pandas as pd

    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    front = [c for c in ROW_COLUMNS if c in columns]
    args = [c for c in columns if c.startswith(("arg.", "env.")) and c not in front]
    back = [c for c in PROVENANCE_COLUMNS if c in columns]
    rest = [c for c in columns if c not in front + args + back]
    write_csv_atomic(pd.DataFrame(rows, columns=front + args + rest + back), path)


def repeat_of(row: dict) -> int:
    """The repeat a row holds: its ``repeat`` column, 0 where it has none (tables written before repeats)."""
    value = row.get("repeat")
    return 0 if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def row_key(row: dict) -> tuple[str, int]:
    return str(row.get("config_hash")), repeat_of(row)


def done_keys(rows: list[dict], machine: str) -> set[tuple[str, int]]:
    """The (configuration hash, repeat) pairs already done on ``machine``: their row is ``ok``."""
    return {row_key(r) for r in rows if r.get("status") == "ok" and r.get("machine", machine) == machine}


def one_by_one(items: list[Item]) -> Iterator[dict]:
    """Run the items in order, each on its own (``item.run()``), yielding each row."""
    for item in items:
        yield item.run()


@contextmanager
def table_lock(out: Path):
    """Hold the table ``out`` for one sweep: a second sweep on the same table (which would lose rows: the last
    writer wins) is refused with ConfigError('out'). An exclusive ``flock`` on ``.<name>.lock`` beside the table,
    released by the kernel if the holder dies, removed when the sweep ends; a directory that cannot be written is
    the same one-line error."""
    import fcntl

    from ..config import ConfigError

    lock = out.with_name(f".{out.name}.lock")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as e:
        raise ConfigError("out", f"{out.parent}: cannot write there ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError("out", f"{out}: another sweep is writing this table; wait for it to end, or write to "
                                 "another file") from None
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _write(rows: list[dict], out: Path) -> None:
    """:func:`write_rows`, a failure to write (read-only directory, full disk) as ConfigError('out'): the table as
    it was stays, and no temporary file (:func:`distperf.results.write_csv_atomic`)."""
    from ..config import ConfigError

    try:
        write_rows(rows, out)
    except OSError as e:
        raise ConfigError("out", f"{out}: cannot write the table ({e.strerror}); it stays as it was before this "
                                 "row") from None


def run_all(name: str, items: Iterable[Item], out: Path, machine: str, force: bool = False,
            progress: bool = True, execute: Callable[[list[Item]], Iterator[dict]] | None = None) -> dict:
    """Run the items not yet done on ``machine`` (through ``execute``, which yields the rows of the items it is
    given, in any order; default :func:`one_by_one`), writing the table after each row, the table held for this
    sweep alone (:func:`table_lock`); return counts by status of this run's items, and ``done``: those already
    done."""
    with table_lock(Path(out)):
        return _run_all(name, list(items), Path(out), machine, force, progress, execute)


def _run_all(name, items, out, machine, force, progress, execute) -> dict:
    rows = read_rows(out)
    index = {(*row_key(r), str(r.get("machine"))): i for i, r in enumerate(rows)}
    done = set() if force else done_keys(rows, machine)
    todo = [item for item in items if item.key not in done]
    labels = {item.key: item.label for item in todo}
    position = {item.key: i for i, item in enumerate(items)}
    counts = {s: 0 for s in STATUSES}
    counts["done"] = len(items) - len(todo)
    bar = _progress(len(items), counts["done"], name, progress)
    try:
        for row in (execute or one_by_one)(todo):
            key = (*row_key(row), str(row.get("machine")))
            if key in index:
                rows[index[key]] = row
            else:
                index[key] = len(rows)
                rows.append(row)
            _write(_in_order(rows, position), out)
            counts[row["status"]] += 1
            if row["status"] != "ok":
                bar.write(f"{name}: {labels.get(row_key(row), row_key(row))}: {row['status']}: {row['message']}")
            bar.update(1)
            bar.set_postfix_str(f"{bar.total - bar.n} left, last {row['status']}")
    finally:
        bar.close()
    return counts


def _in_order(rows: list[dict], position: dict) -> list[dict]:
    """The rows of the items in the items' order, then the others as they were."""
    late = len(position)
    return [r for _, r in sorted(enumerate(rows), key=lambda ir: (position.get(row_key(ir[1]), late), ir[0]))]


def timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _progress(total: int, initial: int, name: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="config", file=sys.stderr, disable=not enabled,
                bar_format="{desc}: {n}/{total} configurations done |{bar}| elapsed {elapsed}, "
                           "about {remaining} to go{postfix}")
