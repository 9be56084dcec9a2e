"""A pipeline step action by action, on every rank: when each stage computed each microbatch's forward and backward,
and when its thread waited, on one clock.

The pipeline engines mark their compute with :func:`action_span` (a profiler span named ``distperf.pp#F:<stage>:<i>``
or ``…#B:…``, the forward or backward of microbatch i on global stage ``stage``, without the waits for its input:
torch's stages through :class:`distperf.parallel.pipeline._Stage`, the 2BW engine through its own). The breakdown
step (:class:`~distperf.measure.breakdown.StepBreakdown`) already profiles a step from a barrier of the ranks;
:func:`rank_timeline` reads from it the actions, the optimizer steps and the communication spans (the breakdown's
own: :func:`~distperf.measure.breakdown.communication_spans`) of the rank's main thread, with the window's start on
the machine's clock, so that the ranks' timelines line up (one machine, one clock; across machines, only to the
clocks' agreement). :func:`chrome_trace` writes them as one trace in the Chrome trace-event format, one process per
rank, which Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open; :mod:`distperf.measure.pipeline_replay`
reads it and says what each wait waited for.
"""
from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path

from torch.profiler import record_function

from ..atomic import write_text

PREFIX = "distperf.pp#"
_ACTION = re.compile(r"^distperf\.pp#([FB]):(\d+):(\d+)$")
KINDS = {"F": "forward", "B": "backward"}


def action_name(kind: str, stage: int, microbatch: int) -> str:
    """The span's name of one action: ``kind`` "F" or "B", the global stage, the microbatch."""
    return f"{PREFIX}{kind}:{stage}:{microbatch}"


def parse_action(name: str) -> tuple[str, int, int] | None:
    """(kind, stage, microbatch) of an action's span name, or None."""
    m = _ACTION.match(name)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


@contextmanager
def action_span(kind: str, stage: int, microbatch: int):
    """A profiler span around one action's compute (a no-op but for a few µs when no profiler records)."""
    with record_function(action_name(kind, stage, microbatch)):
        yield


def rank_timeline(events, thread: int, start: float, origin_ns: int, rank: int, stage: int) -> dict:
    """One rank's timeline from its profiler ``events`` (:func:`~distperf.measure.breakdown.profiler_events`, µs from
    the trace's start at ``origin_ns`` on the machine's clock) on ``thread``, from ``start`` (µs: the window's start)
    on: ``rank``, ``stage`` (its pipeline rank), ``origin_us`` (the window's start on the machine's clock, µs),
    ``actions`` ([kind, global stage, microbatch, start, end]), ``optimizer`` and ``communication`` ([start, end]
    each), times in µs from the window's start."""
    from .breakdown import OPTIMIZER, communication_spans
    from .intervals import union

    mine = [e for e in events if e.thread == thread and e.time_range.start >= start]
    actions = []
    for e in mine:
        parsed = parse_action(e.name)
        if parsed is not None:
            actions.append([*parsed, e.time_range.start - start, e.time_range.end - start])
    actions.sort(key=lambda a: a[3])
    optimizer = union([(e.time_range.start, e.time_range.end) for e in mine if e.name.startswith(OPTIMIZER)])
    return {"rank": rank, "stage": stage, "origin_us": origin_ns / 1000 + start, "actions": actions,
            "optimizer": [[a - start, b - start] for a, b in optimizer],
            "communication": [[a - start, b - start] for a, b in communication_spans(events, thread, start)]}


def chrome_trace(timelines: list[dict], about: dict | None = None) -> dict:
    """The ranks' timelines (:func:`rank_timeline`) as one Chrome trace: a process per rank (named by its rank and
    stage), complete events ("ph": "X") in µs from the earliest rank's window start; each rank's timeline whole under
    ``distperf.timelines`` too (the times as kept, with each rank's ``origin_us``), and ``about`` under
    ``distperf.about``."""
    zero = min(t["origin_us"] for t in timelines)
    events = []
    for t in timelines:
        shift, pid = t["origin_us"] - zero, t["rank"]
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {pid} (stage {t['stage']})"}})
        for kind, stage, i, a, b in t["actions"]:
            events.append({"name": f"{KINDS[kind]} {i}", "cat": "compute", "ph": "X", "pid": pid, "tid": 0,
                           "ts": a + shift, "dur": b - a, "args": {"stage": stage, "microbatch": i}})
        for cat, spans in (("optimizer", t["optimizer"]), ("communication", t["communication"])):
            for a, b in spans:
                events.append({"name": cat, "cat": cat, "ph": "X", "pid": pid, "tid": 1 if cat == "communication" else 0,
                               "ts": a + shift, "dur": b - a})
    return {"traceEvents": events, "displayTimeUnit": "ms", "distperf.timelines": timelines,
            "distperf.about": about or {}}


def write_trace(path: str | Path, timelines: list[dict], about: dict | None = None) -> None:
    """:func:`chrome_trace` written to ``path`` at once (no half-written file)."""
    write_text(Path(path), json.dumps(chrome_trace(timelines, about)))
