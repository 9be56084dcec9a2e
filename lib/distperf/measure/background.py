"""How busy the machine was with work that is not the measurement's own.

Every timing on the CPU machine assumes its ranks have the cores to themselves: two ranks on two cores that share
them with a third process run up to twice as slowly, and a calibration taken then prices every later prediction
(an earlier archive of this study calibrated its ranks' contention at 2.1×, a calibration of the idle machine at
1.05×, and nothing recorded whether other work ran beside the first). So a measurement records the share of the
machine that other processes used while it ran:

    background = (Δ busy CPU-seconds of the machine − Δ CPU-seconds of this process and its descendants)
                 / (Δ wall-clock seconds × CPUs),

the machine's from the first line of ``/proc/stat`` (user, nice, system, irq, softirq and steal time), this
process tree's from ``/proc/<pid>/stat`` (user and system time of each live process, plus what it reaped of its
children). 0 is a quiet machine; 0.5 on two cores, one core's worth of other work. On a system without ``/proc``
the share is unknown (None). The clock ticks 100 times a second, so a window shorter than a second says little;
a process of another tree that started and ended inside the window is counted, one of this tree that exited
unreaped is not. What it cannot see is the machine's own speed, which drifts on this virtual machine with nothing
else running: in one build of the study, a 512 × 512 fp32 matrix product took 4.66 ms in its first calibration and
2.93 ms in its second, 71 minutes later.
"""
from __future__ import annotations

import os
import time

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal of /proc/stat's "cpu" line
QUIET = 0.05  # a share above this is reported as a busy machine (calibrate's warning, the chapters)


def machine_busy_s() -> float | None:
    """CPU-seconds every core of the machine has been busy since boot, or None without ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(x) for x in fields[1:]]
    return sum(values[i] for i in BUSY_FIELDS if i < len(values)) / TICK


def _stats() -> dict[int, tuple[int, float]]:
    """{pid: (parent pid, CPU-seconds: user + system + reaped children's)} of every process in ``/proc``."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:  # ended meanwhile
            continue
        rest = text[text.rfind(")") + 2:].split()  # after "pid (command)": state ppid …; utime is field 14
        out[int(name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / TICK)
    return out


def tree_cpu_s(root: int | None = None) -> float | None:
    """CPU-seconds of process ``root`` (default this one) and its live descendants, each with what it reaped of its
    own children; None without ``/proc``."""
    root = os.getpid() if root is None else root
    try:
        stats = _stats()
    except OSError:
        return None
    if root not in stats:
        return None
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


class Watch:
    """The background share of a window: ``start()``, then ``share()`` at its end; each ``share()`` closes a window
    and opens the next, so that a loop can call it once per measurement."""

    def __init__(self):
        self._start = None

    def start(self) -> "Watch":
        self._start = (time.monotonic(), machine_busy_s(), tree_cpu_s())
        return self

    def share(self) -> float | None:
        """Other processes' share of the machine's CPU time since the window opened (rounded to 0.001), or None
        when ``/proc`` cannot be read; opens the next window."""
        if self._start is None:
            raise RuntimeError("Watch.share() before start()")
        (wall, busy, own), now = self._start, (time.monotonic(), machine_busy_s(), tree_cpu_s())
        self._start = now
        if None in (busy, own, now[1], now[2]) or now[0] <= wall:
            return None
        other = (now[1] - busy) - (now[2] - own)
        return round(min(1.0, max(0.0, other / ((now[0] - wall) * (os.cpu_count() or 1)))), 3)
