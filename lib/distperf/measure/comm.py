"""Communication accounting: bytes and time by collective and by kind, and the exposed waiting time.

:class:`CommTracker` watches one or more training steps three ways at once:

1. a ``TorchDispatchMode`` sees every collective a rank issues — torch.distributed's ``c10d`` ops
   (``dist.all_reduce``, DDP's bucket all-reduces, FSDP2's all-gathers and reduce-scatters, the
   pipeline's sends and receives) and the functional collectives of DTensor (tensor parallelism) — with
   its tensors and its process group; the group names the **kind** (``roles``: data, tensor or pipeline
   parallel) and the tensors give the **bytes** exactly;
2. ``Work.wait`` is wrapped, so the time the rank's thread is blocked waiting for a collective is seen
   even where the wait happens in Python (FSDP2, pipeline schedules);
3. ``torch.profiler`` records the collectives as they run on the backend's own lanes (``gloo:*`` events
   on gloo's worker threads; NCCL kernels on their streams) and the operators the rank computes.

Definitions (per rank):

- ``bytes``: the message size M of each collective — the tensor handed to it: all-reduce, broadcast,
  send and receive: the buffer; all-gather: the gathered (output) buffer; reduce-scatter: the input
  buffer (the convention of :mod:`distperf.cost.collectives`). ``sent_bytes`` converts M into what a
  rank sends under the ring algorithms of that module, the algorithmic volumes (all-reduce 2(n − 1)/n·M,
  reduce-scatter and all-gather (n − 1)/n·M, send M, a broadcast M from its root and 0 elsewhere,
  receive 0; others M): the cost model's ``communication_bytes``. ``wire_bytes`` is what gloo's
  algorithms make this rank send for the same call (:func:`distperf.cost.collectives.gloo_sent_bytes`:
  a reduce-scatter is an all-reduce of M, a broadcast a binomial tree; gloo's message headers left out),
  the cost model's ``communication_wire_bytes``; on NCCL it is what gloo would have sent, not NCCL's.
- ``time_s``: how long each collective runs: the duration of its event on the backend's lane. Gloo
  runs point-to-point transfers on the caller's thread, completing them in ``wait()``: their time is
  the issuing call plus its wait.
- ``exposed_s``: time the rank's thread is not computing while communication it waits for is in
  flight or it is blocked in a collective call or a wait: |(collective events ∪ blocking calls ∪ waits)
  − compute|, where compute is the union of the operators the thread runs other than collectives (CPU);
  on CUDA, the union of non-NCCL kernels against NCCL kernels (that path is not yet run on a GPU). A pipeline rank waiting for its
  neighbour's activation (a bubble) is exposed waiting too. By kind, each kind's own intervals; the
  kinds may overlap, so ``total`` (the union) can be less than their sum. The ranks start the tracked window together
  (a barrier once each has started its profiler, itself not counted), as the timed steps start at a barrier: a
  neighbour that finished the previous step or started its profiler later is not this rank's waiting. (Without it,
  a rank's first collective waited for the other's late start: in a two-rank run of the tiny model 0.07 s of a
  0.14 s window, against a 0.05 s timed step.)

Collective events are matched to issued collectives by process group lane (each gloo process group
has its own worker threads) and order of issue; events left unmatched (none in our tests) are counted
as ``unattributed``. Tracking costs time: measure communication on a step of its own, not on the
steps that are timed.
"""
from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass_type
from torch.utils._pytree import tree_flatten

from ..config import COMMUNICATION_KINDS as KINDS
from ..cost.collectives import gloo_sent_bytes
from ..cost.collectives import sent_bytes as ring_sent_bytes
from .intervals import length, subtract, union

MESH_ROLES = {"dp": "data_parallel", "tp": "tensor_parallel", "pp": "pipeline_parallel"}
UNATTRIBUTED = "unattributed"
_MARKER = "distperf.comm.thread"
_SPAN = "distperf.comm#"

# op name -> (collective, index of the argument whose bytes are the message M, index of the input)
_C10D = {
    "allreduce_": ("all-reduce", 0, 0), "allreduce_coalesced_": ("all-reduce", 0, 0),
    "_allgather_base_": ("all-gather", 0, 1), "allgather_": ("all-gather", 0, 1),
    "allgather_coalesced_": ("all-gather", 0, 1), "allgather_into_tensor_coalesced_": ("all-gather", 0, 1),
    "_reduce_scatter_base_": ("reduce-scatter", 1, 1), "reduce_scatter_": ("reduce-scatter", 1, 1),
    "reduce_scatter_tensor_coalesced_": ("reduce-scatter", 1, 1),
    "broadcast_": ("broadcast", 0, 0), "send": ("send", 0, 0), "recv_": ("recv", 0, 0),
    "recv_any_source_": ("recv", 0, 0), "alltoall_base_": ("all-to-all", 1, 1), "alltoall_": ("all-to-all", 1, 1),
    "reduce_": ("reduce", 0, 0), "gather_": ("gather", 1, 1), "scatter_": ("scatter", 0, 0),
    "barrier": ("barrier", None, None), "monitored_barrier_": ("barrier", None, None),
}
# functional collectives: op name -> (collective, message = input × group size?)
_FUNCTIONAL = {
    "all_reduce": ("all-reduce", False), "all_reduce_": ("all-reduce", False),
    "all_reduce_coalesced": ("all-reduce", False), "all_reduce_coalesced_": ("all-reduce", False),
    "all_gather_into_tensor": ("all-gather", True), "all_gather_into_tensor_out": ("all-gather", True),
    "all_gather_into_tensor_coalesced": ("all-gather", True),
    "reduce_scatter_tensor": ("reduce-scatter", False), "reduce_scatter_tensor_out": ("reduce-scatter", False),
    "reduce_scatter_tensor_coalesced": ("reduce-scatter", False),
    "all_to_all_single": ("all-to-all", False), "broadcast": ("broadcast", False), "broadcast_": ("broadcast", False),
    "isend": ("send", False), "irecv": ("recv", False),
}
_NCCL = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
         "broadcast": "broadcast", "sendrecv": "send", "send": "send", "recv": "recv", "alltoall": "all-to-all",
         "reduce": "reduce"}


@dataclass
class Call:
    """One collective as issued: what, over which group, how many bytes; its spans (profiler µs) are
    filled in by the analysis."""

    index: int
    collective: str
    group: str
    group_size: int
    nbytes: int
    numel: int
    thread: int
    kind: str = UNATTRIBUTED
    group_rank: int = 0  # this rank's place in the group
    root: int = 0  # a broadcast's source, as a rank of the group
    element_size: int = 4
    label: str = ""  # of the issuing call's span (a batch of point-to-point ops shares one)
    span: tuple | None = None  # the issuing call
    waits: list = field(default_factory=list)  # waits for it
    event: tuple | None = None  # its event on the backend's lane


def _tensors(obj) -> list[torch.Tensor]:
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _nbytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def _numel(obj) -> int:
    return sum(t.numel() for t in _tensors(obj))


def _group(arg) -> tuple[str, int, int]:
    """(name, size, this rank's rank in it) of a process group given as a boxed ProcessGroup or a registered
    group name."""
    if isinstance(arg, str):
        from torch.distributed.distributed_c10d import _resolve_process_group

        pg = _resolve_process_group(arg)
    elif isinstance(arg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(arg)
    else:
        pg = arg
    return pg.group_name, pg.size(), pg.rank()


def roles_from_mesh(mesh) -> dict[str, str]:
    """{group name: kind} for a DeviceMesh whose dimensions are named dp, tp, pp (others keep their name)."""
    roles = {}
    for dim in mesh.mesh_dim_names or ():
        roles[mesh.get_group(dim).group_name] = MESH_ROLES.get(dim, dim)
    return roles


def _normalise_roles(roles) -> dict[str, str]:
    """Accept {group name: kind}, {kind: group or [groups]} or a DeviceMesh; return {group name: kind}."""
    if roles is None:
        return {}
    if hasattr(roles, "mesh_dim_names"):
        return roles_from_mesh(roles)
    out = {}
    for key, value in roles.items():
        if isinstance(key, str) and isinstance(value, str) and key not in KINDS:
            out[key] = value  # group name -> kind
            continue
        groups = value if isinstance(value, (list, tuple, set)) else [value]
        for g in groups:
            out[g if isinstance(g, str) else g.group_name] = key
    return out


class _Recorder(TorchDispatchMode):
    def __init__(self, tracker: "CommTracker"):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(is_traceable_wrapper_subclass_type(t) for t in types):
            # DTensor and AsyncCollectiveTensor unwrap themselves and issue their collectives and
            # waits on plain tensors, which come back here
            return NotImplemented
        kwargs = kwargs or {}
        namespace, name = func.namespace, func.__name__.split(".")[0]
        if not ((namespace == "c10d" and name in _C10D) or namespace in ("_c10d_functional",
                                                                         "_c10d_functional_autograd")):
            return func(*args, **kwargs)
        label = self.tracker._label()
        with record_function(label):  # the call's span, on the profiler's clock
            out = func(*args, **kwargs)
        if namespace == "c10d":
            self.tracker._c10d(name, args, out, label)
        else:
            self.tracker._functional(name, args, kwargs, out, label)
        return out


@contextmanager
def waits_as_spans(label: Callable[[object], str], thread: int):
    """While inside, ``Work.wait`` called on ``thread`` runs inside a profiler span named ``label(work)``: a wait that a
    rank's Python issues (FSDP2's, the pipelining runtime's, PipeDream-2BW's) is then on the profiler's clock, where it
    is otherwise no operator at all (the thread is blocked in C++ while gloo completes the transfer). Waits on other
    threads are left alone."""
    cls = dist.distributed_c10d.Work
    original = cls.wait

    def wait(work, *args, **kwargs):
        if threading.get_ident() != thread:
            return original(work, *args, **kwargs)
        with record_function(label(work)):
            return original(work, *args, **kwargs)

    cls.wait = wait
    try:
        yield
    finally:
        cls.wait = original


def event_collective(name: str) -> str | None:
    """The collective a profiler event runs on the backend's own lane (gloo's worker threads, NCCL's kernels), or
    None."""
    if name.startswith("gloo:"):
        return name[5:].replace("_", "-")
    if "nccl" in name.lower():
        m = re.search(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", name)
        return _NCCL.get(m.group(1).lower(), m.group(1).lower()) if m else "nccl"
    return None


def _compatible(call: Call, collective: str, numel: int | None) -> bool:
    same = call.collective == collective or (call.collective == "reduce-scatter" and collective == "all-reduce") \
        or (collective == "send" and call.collective == "recv")  # NCCL's SendRecv kernel
    return same and (numel is None or call.collective == "barrier" or numel == call.numel)


def _event_numel(event) -> int | None:
    shapes = [s for s in (event.input_shapes or []) if s]
    return sum(math.prod(s) for s in shapes) if shapes else None


class CommTracker:
    """Context manager: ``with CommTracker(roles) as ct: step()``, then ``ct.summary(steps)``.

    ``roles`` maps process groups to kinds: ``{"data_parallel": dp_group, ...}``, ``{group name:
    kind}``, or a DeviceMesh with dimensions named dp/tp/pp (:func:`roles_from_mesh`). Collectives
    of other groups are of kind ``other``.
    """

    def __init__(self, roles=None):
        self.roles = _normalise_roles(roles)
        self.calls: list[Call] = []
        self._labels: dict[str, tuple[str, Call | None]] = {}  # span label -> ("call" | "wait", call)
        self._works: dict[int, tuple[object, Call]] = {}
        self._functional_out: dict[int, Call] = {}
        self.thread = threading.get_ident()
        self._profiler = None
        self._recorder = _Recorder(self)
        self._waits = None
        self.unmatched: list[tuple] = []
        self._counter = itertools.count()

    # --- recording -----------------------------------------------------------------------------
    def _label(self) -> str:
        return f"{_SPAN}{next(self._counter)}"

    def _add(self, collective, group, nbytes, numel, label, root: int = 0, element_size: int = 4) -> Call:
        name, size, rank = _group(group)
        call = Call(len(self.calls), collective, name, size, nbytes, numel, threading.get_ident(),
                    kind=self.roles.get(name, "other"), group_rank=rank, root=root, element_size=element_size,
                    label=label)
        self.calls.append(call)
        self._labels[label] = ("call", None)
        return call

    def _c10d(self, name, args, out, label) -> None:
        collective, msg, inp = _C10D[name]
        group = next(a for a in args if isinstance(a, torch.ScriptObject))
        nbytes = _nbytes(args[msg]) if msg is not None else 0
        numel = _numel(args[inp]) if inp is not None else 0
        tensors = _tensors(args[msg]) if msg is not None else []
        call = self._add(collective, group, nbytes, numel, label, root=args[2] if collective == "broadcast" else 0,
                         element_size=tensors[0].element_size() if tensors else 4)
        work = out[-1] if isinstance(out, (tuple, list)) else out
        if isinstance(work, torch.ScriptObject):
            try:
                w = dist.distributed_c10d.Work.unbox(work)
            except RuntimeError:
                return
            self._works[id(w)] = (w, call)  # pybind hands the same object to the caller's wait()

    def _functional(self, name, args, kwargs, out, label) -> None:
        if name == "wait_tensor":
            self._labels[label] = ("wait", self._functional_out.get(args[0].untyped_storage().data_ptr()))
            return
        if name == "batch_p2p_ops":
            ops, tensors, group = args[0], args[3], args[4]
            outs = _tensors(out)
            for i, (op, t) in enumerate(zip(ops, tensors)):
                call = self._add("send" if "send" in op else "recv", group, _nbytes(t), t.numel(), label)
                if i < len(outs):
                    self._functional_out[outs[i].untyped_storage().data_ptr()] = call
            return
        if name not in _FUNCTIONAL:
            return
        collective, gathered = _FUNCTIONAL[name]
        group = kwargs.get("group_name", args[-1])
        inputs = args[0]
        size = _group(group)[1]
        nbytes = _nbytes(inputs) * (size if gathered else 1)
        tensors = _tensors(inputs)
        call = self._add(collective, group, nbytes, _numel(inputs), label,
                         root=args[1] if collective == "broadcast" else 0,
                         element_size=tensors[0].element_size() if tensors else 4)
        for t in _tensors(out):
            self._functional_out[t.untyped_storage().data_ptr()] = call

    def _wait_label(self, work) -> str:
        entry = self._works.get(id(work))
        label = self._label()
        self._labels[label] = ("wait", entry[1] if entry is not None and entry[0] is work else None)
        return label

    # --- the context ---------------------------------------------------------------------------
    def __enter__(self):
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities, record_shapes=True)
        self._profiler.__enter__()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # the ranks start together: a neighbour that starts late is not this rank's waiting
        with record_function(_MARKER):  # marks the tracking thread and the start of the window (after the barrier)
            pass
        self._waits = waits_as_spans(self._wait_label, self.thread)
        self._waits.__enter__()
        self._recorder.__enter__()
        return self

    def __exit__(self, *exc):
        try:
            self._recorder.__exit__(*exc)
        finally:
            self._waits.__exit__(None, None, None)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self._profiler.__exit__(*exc)
        self._analyse()
        self._works.clear()
        return False

    # --- analysis ------------------------------------------------------------------------------
    def _analyse(self) -> None:
        events = list(self._profiler.events())
        marker = next(e for e in events if e.name == _MARKER)
        main = marker.thread
        events = [e for e in events if e.time_range.start >= marker.time_range.start]  # not the barrier before it
        device = torch.autograd.DeviceType.CUDA
        on_device = any(e.device_type == device for e in events)
        free_waits, comm_events, compute, blocked = [], [], [], []
        for e in events:
            span = (e.time_range.start, e.time_range.end)
            if e.name.startswith(_SPAN):
                what, call = self._labels.get(e.name, (None, None))
                if what == "call":
                    for c in self.calls:
                        if c.label == e.name:
                            c.span = span
                elif what == "wait":
                    (call.waits if call is not None else free_waits).append(span)
                if e.thread == main:
                    blocked.append(span)
                continue
            coll = event_collective(e.name)
            if coll is not None and (e.device_type == device or e.name.startswith("gloo:")):
                lane = ("cuda", e.device_index, e.device_resource_id) if e.device_type == device else ("cpu", e.thread)
                comm_events.append((span[0], span[1], lane, coll, _event_numel(e)))
            elif on_device:
                if e.device_type == device:
                    compute.append(span)
            elif e.thread == main and not e.is_user_annotation and e.name != _MARKER:
                (blocked if e.name.startswith(("c10d::", "_c10d_functional", "record_param_comms")) else compute).append(span)
        for c in self.calls:
            if c.span is None:  # a call issued on another thread, unseen by the profiler
                c.span = (math.inf, -math.inf)

        # match events to issued collectives: per lane, in order of issue; an event on the issuing
        # thread (gloo's point-to-point) lies inside its call or its wait
        taken = [False] * len(self.calls)
        lane_group: dict = {}
        for start, end, lane, coll, numel in sorted(comm_events):
            best = None
            for i, c in enumerate(self.calls):
                if taken[i] or c.span[0] > start or not _compatible(c, coll, numel):
                    continue
                if lane == ("cpu", main):
                    if end <= _finish(c):
                        best = i
                        break
                    continue
                if lane_group.get(lane, c.group) == c.group:
                    best = i
                    break
            if best is None:
                self.unmatched.append((start, end, lane, coll))
                continue
            taken[best] = True
            self.calls[best].event = (start, end)
            if lane != ("cpu", main):
                lane_group[lane] = self.calls[best].group

        # an operator that waits for a collective (an AsyncCollectiveTensor's first use) does not
        # compute while it waits: collective operators, calls and waits are taken out of compute
        self._compute = subtract(union(compute), union(blocked)) if not on_device else union(compute)
        self._intervals: dict[str, list] = {}
        for c in self.calls:
            spans = [c.event] if c.event else []
            if not on_device:
                spans += [c.span] + c.waits
            self._intervals.setdefault(c.kind, []).extend(spans)
        for start, end, _, _ in self.unmatched:
            self._intervals.setdefault(UNATTRIBUTED, []).append((start, end))
        if not on_device:
            self._intervals.setdefault(UNATTRIBUTED, []).extend(free_waits)
        times = [t for e in events if e.name != _MARKER for t in (e.time_range.start, e.time_range.end)]
        self._window_us = (max(times) - min(times)) if times else 0.0

    @staticmethod
    def _call_time_us(c: Call) -> float:
        """The event's duration on its own lane; else (gloo's point-to-point, run by the issuing thread)
        the call plus its waits."""
        if c.event is not None and not (c.span[0] <= c.event[0] and c.event[1] <= _finish(c)):
            return c.event[1] - c.event[0]
        if c.span[0] > c.span[1]:
            return 0.0
        return (c.span[1] - c.span[0]) + sum(b - a for a, b in c.waits)

    def summary(self, steps: int = 1) -> dict:
        """Per-step totals: ``bytes``, ``sent_bytes``, ``wire_bytes``, ``time_s``, ``exposed_s`` (by kind and ``total``),
        ``calls`` by kind, ``by_collective`` {kind: {collective: {calls, bytes, time_s}}}, ``compute_s``,
        ``window_s`` and ``unmatched_events``."""
        kinds = list(KINDS) + sorted({c.kind for c in self.calls} - set(KINDS))
        out = {"bytes": dict.fromkeys(kinds, 0), "sent_bytes": dict.fromkeys(kinds, 0.0),
               "wire_bytes": dict.fromkeys(kinds, 0), "time_s": dict.fromkeys(kinds, 0.0),
               "calls": dict.fromkeys(kinds, 0), "by_collective": {}}
        for c in self.calls:
            t = self._call_time_us(c) / 1e6
            out["bytes"][c.kind] += c.nbytes
            out["sent_bytes"][c.kind] += _sent(c)
            out["wire_bytes"][c.kind] += _wire(c)
            out["time_s"][c.kind] += t
            out["calls"][c.kind] += 1
            agg = out["by_collective"].setdefault(c.kind, {}).setdefault(c.collective,
                                                                         {"calls": 0, "bytes": 0, "time_s": 0.0})
            agg["calls"] += 1
            agg["bytes"] += c.nbytes
            agg["time_s"] += t
        exposed = {}
        for kind in kinds + ([UNATTRIBUTED] if self._intervals.get(UNATTRIBUTED) else []):
            exposed[kind] = length(subtract(union(self._intervals.get(kind, [])), self._compute)) / 1e6
        every = union([i for spans in self._intervals.values() for i in spans])
        exposed["total"] = length(subtract(every, self._compute)) / 1e6
        out["exposed_s"] = exposed
        if self.unmatched:
            out["time_s"][UNATTRIBUTED] = sum(b - a for a, b, _, _ in self.unmatched) / 1e6
        out["compute_s"] = length(self._compute) / 1e6
        out["window_s"] = self._window_us / 1e6
        out["unmatched_events"] = len(self.unmatched)
        for section in ("bytes", "sent_bytes", "wire_bytes", "time_s", "calls", "exposed_s", "compute_s", "window_s"):
            if isinstance(out[section], dict):
                out[section] = {k: _per_step(v, steps, section) for k, v in out[section].items()}
            else:
                out[section] = out[section] / steps
        for per_kind in out["by_collective"].values():
            for agg in per_kind.values():
                for k in agg:
                    agg[k] = _per_step(agg[k], steps, k)
        return out


def _finish(c: Call) -> float:
    """When the issuing thread was last busy with the call: its end or its last wait's end."""
    return max([c.span[1]] + [b for _, b in c.waits])


def _per_step(value, steps: int, section: str):
    if section in ("bytes", "calls", "wire_bytes") and value % steps == 0:
        return value // steps
    return value / steps


def _sent(c: Call) -> float:
    """Algorithmic bytes this rank sends for the call (module docstring)."""
    if c.collective in ("all-reduce", "reduce-scatter", "all-gather", "send"):
        return ring_sent_bytes(c.collective, c.nbytes, c.group_size)
    if c.collective == "broadcast":
        return float(c.nbytes) if c.group_rank == c.root else 0.0
    return 0.0 if c.collective in ("recv", "barrier") else float(c.nbytes)


def _wire(c: Call) -> int:
    """Bytes gloo's algorithms make this rank send for the call (module docstring)."""
    if c.collective in ("all-reduce", "reduce-scatter", "all-gather", "send", "broadcast"):
        return gloo_sent_bytes(c.collective, c.nbytes, c.group_size, c.group_rank, c.root, c.element_size)
    return 0 if c.collective in ("recv", "barrier") else c.nbytes
