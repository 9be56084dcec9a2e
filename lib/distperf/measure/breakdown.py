"""Where a training step's time goes, on one rank: the measured counterpart of the cost model's time terms.

:class:`StepBreakdown` profiles one step (``torch.profiler``, CPU activity, no shapes, no dispatch mode: the
lightest record torch offers) and files the rank's main thread's time under one class each:

- ``matrix_products``: ``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear`` and their
  backward kernels — what the cost model prices as FLOPs over a GEMM rate;
- ``attention``: the fused attention kernels (``scaled_dot_product``/``flash_attention`` forward and backward);
- ``optimizer``: every operator inside ``Optimizer.step`` (and ``zero_grad``);
- ``communication``: the collective and point-to-point operators and the waits on them
  (``c10d::*``, ``_c10d_functional::*``, ``record_param_comms``, ``Work.wait``), and the thread's idle time while
  a collective runs on gloo's worker threads — the thread is blocked, not computing;
- ``other_operators``: every other ATen operator (LayerNorm, GELU, softmax, residual additions, dropout, the
  loss, copies, views; memory-bound work and per-operator overhead);
- ``framework``: the rest of the step's wall-clock window — Python between operators (the trainer, DDP's hooks,
  FSDP2's and the pipelining runtime's bookkeeping, DTensor's dispatch in Python) and autograd's engine.

An operator counts under the class of its outermost ATen ancestor (``aten::linear`` holds its ``addmm``),
``optimizer`` wins over the operator's own class, and a collective wins over the operator it runs in (that
operator is waiting); each class's time is the union of its operators' intervals less communication's, so nothing
is counted twice and the classes sum to the window (``window``). ``Work.wait`` runs inside a span of its own while the
step is recorded (:func:`~distperf.measure.comm.waits_as_spans`): a wait the rank's Python issues (FSDP2's, the pipeline
schedules' for a neighbour's activation) is then communication, not Python between operators. With several ranks,
the step's window starts at a barrier once every rank has started its profiler, so a neighbour that reached the step
later is not this rank's waiting. ``communication`` is then the rank's exposed communication on a step that only the
profiler slows down, where the communication step (:class:`~distperf.measure.comm.CommTracker`) sends every operator
through a dispatch mode as well. The profiler itself adds about a
microsecond per operator, which lands in the classes of the operators (mostly ``other_operators`` and
``framework`` for small ones): a breakdown is a measurement of its own step, to be read as shares of that step,
not added to the timed steps. CPU only: on CUDA the host's view says little about the device (``None``).
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from ..config import TIME_CLASSES as CLASSES
from .comm import event_collective, waits_as_spans
from .intervals import intersect, length, subtract, union

MATRIX = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
          "aten::_addmm_activation")
ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention")
COMMUNICATION = ("c10d::", "_c10d_functional", "record_param_comms", "distperf.comm#")
OPTIMIZER = ("Optimizer.step", "Optimizer.zero_grad")
_MARKER = "distperf.breakdown.thread"
_WAIT = "distperf.comm#wait"


class Interval(NamedTuple):
    start: float  # µs from the trace's start
    end: float


class Event:
    """What :func:`breakdown` reads of a profiler event: ``name``, ``thread``, ``time_range`` and ``cpu_parent``."""

    __slots__ = ("name", "thread", "time_range", "cpu_parent")

    def __init__(self, name: str, thread: int, time_range: Interval, cpu_parent: Event | None = None):
        self.name, self.thread, self.time_range, self.cpu_parent = name, thread, time_range, cpu_parent


# the utility events torch's own event list leaves out (torch.autograd.profiler_util._filter_name)
_UTILITY = frozenset(("[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                      "profiler::_record_function_enter_new", "profiler::_record_function_exit", "aten::is_leaf",
                      "aten::output_nr", "aten::_version"))


def profiler_events(prof) -> list[Event]:
    """The events of a finished ``torch.profiler.profile``, as :meth:`~torch.profiler.profile.events` gives them
    for what :func:`breakdown` reads: the same events (utility and hidden ones left out), their threads and times
    (µs from the trace's start), and each synchronous CPU event's innermost enclosing one on its thread
    (``cpu_parent``: one event is another's child when its interval lies inside the other's, as torch nests them).
    Read straight from the profiler's records because torch's own list builds a full object per event in Python
    (shapes, memory, names demangled), which cost about 0.5 s per breakdown step of a pipeline of the `small` model
    on this machine, several times the step itself (6 December 2026)."""
    result = prof.profiler.kineto_results
    origin = result.trace_start_ns()
    out, nested = [], {}
    for k in result.events():
        name = k.name()
        if name in _UTILITY or k.is_hidden_event():
            continue
        thread = k.start_thread_id()
        event = Event(name, thread, Interval((k.start_ns() - origin) / 1000, (k.end_ns() - origin) / 1000))
        out.append(event)
        if not k.is_async() and thread == k.end_thread_id() and k.device_type() == DeviceType.CPU:
            nested.setdefault(thread, []).append(event)
    for events in nested.values():  # torch's nesting (EventList._populate_cpu_children): a stack per thread
        events.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
        stack: list[Event] = []
        for event in events:
            while stack and (event.time_range.start >= stack[-1].time_range.end
                             or event.time_range.end > stack[-1].time_range.end):
                stack.pop()
            if stack:
                event.cpu_parent = stack[-1]
            stack.append(event)
    return out


def _ancestors(event):
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def classify(event) -> str | None:
    """The class of one profiler event on the main thread (an object with ``name`` and ``cpu_parent``), or None
    when an outer operator already counts it or it is not an operator (an annotation)."""
    name = event.name
    outer = list(_ancestors(event))
    if name.startswith(COMMUNICATION):
        return None if any(a.name.startswith(COMMUNICATION) for a in outer) else "communication"
    if any(a.name.startswith(OPTIMIZER) for a in outer) or name.startswith(OPTIMIZER):
        return "optimizer" if name.startswith(("aten::",) + OPTIMIZER) and not any(
            a.name.startswith("aten::") for a in outer) else None
    if not name.startswith("aten::") or any(a.name.startswith(("aten::",) + COMMUNICATION) for a in outer):
        return None
    if any(key in name for key in ATTENTION):
        return "attention"
    return "matrix_products" if name in MATRIX or name.endswith(("mm_backward", "_mm")) else "other_operators"


def breakdown(events, thread, steps: int = 1, start: float | None = None) -> dict:
    """Seconds per step of each class of :data:`CLASSES` for the events of ``thread``, and the ``window`` from
    ``start`` (µs; by default its first event) to the last of its events. Events are the profiler's (``name``, ``thread``, ``time_range.start``/``.end``
    in µs, ``cpu_parent``). ``communication`` also holds the thread's idle time while a collective runs on the
    backend's own threads (gloo's workers: DDP waits for its all-reduce inside its C++ reducer, which the profiler
    does not show as an operator); ``framework`` is what is left of the window."""
    found = _classified(events, thread, start)
    if found is None:
        return {**dict.fromkeys(CLASSES, 0.0), "window": 0.0}
    spans, start, end, busy, waiting, communication = found
    # a collective inside an operator (DTensor's, ZeroRedundancyOptimizer's) is that operator waiting: its time is
    # communication's, not the operator's class
    out = {c: length(subtract(union(spans[c]), communication)) for c in CLASSES
           if c not in ("communication", "framework")}
    out["communication"] = length(communication)
    out["framework"] = length(subtract(subtract([(start, end)], busy), waiting))
    out["window"] = end - start
    return {k: v / 1e6 / steps for k, v in out.items()}


def _classified(events, thread, start: float | None):
    """What :func:`breakdown` files, before it measures: (each class's spans, the window's start and end, the spans of
    every operator, the thread's idle spans while a collective runs on the backend's threads, communication's spans);
    None without events on ``thread``."""
    mine = [e for e in events if e.thread == thread and e.name != _MARKER]
    if not mine:
        return None
    spans: dict[str, list] = {c: [] for c in CLASSES}
    for e in mine:
        cls = classify(e)
        if cls is not None:
            spans[cls].append((e.time_range.start, e.time_range.end))
    start = min(e.time_range.start for e in mine) if start is None else start
    end = max(e.time_range.end for e in mine)
    busy = union([s for c in CLASSES for s in spans[c]])
    in_flight = union([(e.time_range.start, e.time_range.end) for e in events
                       if e.thread != thread and event_collective(e.name) is not None])
    waiting = intersect(subtract([(start, end)], busy), in_flight)
    return spans, start, end, busy, waiting, union(spans["communication"] + waiting)


def communication_spans(events, thread, start: float | None = None) -> list[tuple[float, float]]:
    """The spans :func:`breakdown` files under ``communication`` (µs), in order, inside its window."""
    found = _classified(events, thread, start)
    return [] if found is None else intersect(found[5], [(found[1], found[2])])


class StepBreakdown:
    """``with StepBreakdown() as b: step()``, then ``b.summary(steps)``: :func:`breakdown` of this thread, from a
    barrier of every rank (where torch.distributed is initialised with several) to the end, with ``Work.wait`` as spans."""

    def __enter__(self):
        self._profiler = profile(activities=[ProfilerActivity.CPU])
        self._profiler.__enter__()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # the window starts after it (at the marker): a late neighbour is not this rank's time
        with record_function(_MARKER):
            pass
        self._waits = waits_as_spans(lambda work: _WAIT, threading.get_ident())
        self._waits.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self._waits.__exit__(None, None, None)
        finally:
            self._profiler.__exit__(*exc)
        return False

    def _window(self):
        """(the events from the marker on, the main thread, the window's start in µs), read from the profiler once:
        a traced step asks for both its summary and its timeline."""
        if getattr(self, "_read", None) is None:
            events = profiler_events(self._profiler)
            marker = next(e for e in events if e.name == _MARKER)
            self._read = ([e for e in events if e.time_range.start >= marker.time_range.start], marker.thread,
                          marker.time_range.end)
        return self._read

    def summary(self, steps: int = 1) -> dict:
        events, thread, start = self._window()
        return breakdown(events, thread, steps, start=start)

    def timeline(self, rank: int, stage: int) -> dict:
        """This step's :func:`distperf.measure.timeline.rank_timeline`: its actions, optimizer and communication on
        the machine's clock."""
        from .timeline import rank_timeline

        events, thread, start = self._window()
        origin = self._profiler.profiler.kineto_results.trace_start_ns()
        return rank_timeline(events, thread, start, origin, rank, stage)
