"""Peak memory of a training step by category, from exact tensor accounting.

:func:`measure_step_memory` runs a step under :class:`StepMemoryTracker`, a ``TorchDispatchMode`` that
sees every tensor an operator returns, follows its storage until it is freed (a weak reference), and
files the storage under one category. Bytes are storage sizes (``UntypedStorage.nbytes``), each
storage counted once however many views share it; so the numbers are exact for what tensors hold, and
blind to what kernels allocate and free inside one operator (workspaces) and to allocator rounding.

Categories, in order of precedence (a storage keeps the highest it ever gets):

- ``parameters``: storages of the model's parameters (a DTensor's local shard), and FSDP2's gathered
  (unsharded) parameters while they exist: the all-gather outputs its unsharded parameters are views
  of, which it allocates and frees (``UntypedStorage.resize_``) around each unit's forward and
  backward — the cost model's "parameters" of ZeRO-2/3 include the gathered unit too.
- ``gradients``: storages a parameter's ``.grad`` points into — DDP's gradient bucket when gradients
  are bucket views (``gradient_as_bucket_view=True``), counted once — and FSDP2's unsharded gradients
  from their accumulation until the reduce-scatter has consumed them.
- ``optimizer_states``: tensors with at least one dimension in ``optimizer.state`` (Adam's two moments,
  SGD's momentum): the cost model's 8Ψ / 4Ψ (:func:`distperf.cost.model_states.bytes_per_parameter`).
- ``other``: storages that outlive the step but belong to none of the above: Adam's scalar step
  counters, module buffers.
- ``activations``: storages autograd saves for the backward pass (seen by ``saved_tensors_hooks``),
  from the moment they are saved until they are freed. A gathered (unsharded) FSDP parameter saved
  for backward (or its transposed view) is an ``nn.Parameter`` and is not an activation: it stays a
  temporary.
- ``temporaries``: everything else the step allocates: forward values that are not saved, gradients of
  activations in backward, the optimizer's workspace, gathered parameters, communication buffers.

Each category reports its own peak during the measured step(s); ``total`` is the peak of the sum, and
``at_peak`` the breakdown at that moment (so ``total`` = Σ ``at_peak`` ≤ Σ category peaks); ``at_start``
is what is held when the measured step begins: the model states a rank keeps between steps.

Storages allocated before the measurement and reachable from neither the parameters, their gradients
(DDP's bucket views are recognised in the warm-up steps) nor the optimizer are invisible: for example DDP's separate buckets
with ``gradient_as_bucket_view=False``. The tracker is modelled on torch's
``torch.distributed._tools.mem_tracker.MemTracker`` (which works on CPU in torch 2.13); it is ours
because we need a peak per category, activations defined as saved tensors, and the optimizer's
workspace kept apart from its states (MemTracker files all of the step's allocations as optimizer
state and reports categories only at the total's peak).

**Allocator-level memory**, beside the tensor bytes: what the process really took, temporaries, workspaces,
allocator rounding and the tracker's own bookkeeping included (:func:`allocator_peak`). On CUDA the result holds
``cuda_max_allocated`` and ``cuda_max_reserved``, the caching allocator's peaks over the measured step(s)
(``torch.cuda.max_memory_allocated / _reserved``, reset after the warm-up). On CPU it holds ``rss_start`` (the
resident set when the measured step begins), ``rss_peak`` (its high-water mark during the step) and
``rss_peak_increase`` (their difference): Linux resets the high-water mark when "5" is written to
``/proc/self/clear_refs`` and reports it as ``VmHWM`` in ``/proc/self/status`` (kB); ``rss_reset`` says whether
the reset worked (if not, ``rss_peak`` is the process's peak since it started). Before the reset glibc's heap
is trimmed (``malloc_trim``, :func:`trim_heap`), so that memory freed by earlier steps and kept in glibc's
arenas does not absorb the step's allocations; the resident set then follows torch's CPU allocations (Linux
counts it per thread in batches of 64 pages, so it is exact to a few hundred kB). It also counts memory that is
not tensors (the interpreter, libraries, gloo's buffers), which ``rss_start`` holds apart.
"""
from __future__ import annotations

import weakref
from functools import partial

import torch
import torch.nn as nn
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from ..config import MODEL_STATES

CATEGORIES = MODEL_STATES + ("other", "activations", "temporaries")  # in order of precedence
_RANK = {name: len(CATEGORIES) - i for i, name in enumerate(CATEGORIES)}


class _Entry:
    __slots__ = ("nbytes", "category", "device")

    def __init__(self, nbytes: int, category: str, device: str):
        self.nbytes, self.category, self.device = nbytes, category, device


class StepMemoryTracker(TorchDispatchMode):
    """Live bytes per category and device, and their peaks, while the context is active.

    Register what exists before the step with :meth:`track_model`, :meth:`track_optimizer` and
    :meth:`track_tensor`; everything an operator returns inside the context is tracked from then on.
    """

    def __init__(self):
        super().__init__()
        self._entries = WeakIdKeyDictionary()  # UntypedStorage -> _Entry
        self._refs = []  # keep the weak references (and their callbacks) alive
        self.current: dict[str, dict[str, int]] = {}
        self.peak: dict[str, dict[str, int]] = {}
        self.peak_total: dict[str, int] = {}
        self.at_peak: dict[str, dict[str, int]] = {}
        self._handles = []
        self._orig_resize = None
        self._saved_hooks = None

    # --- bookkeeping -------------------------------------------------------------------------
    def _add(self, device: str, category: str, nbytes: int) -> None:
        cur = self.current.setdefault(device, dict.fromkeys(CATEGORIES, 0))
        cur[category] += nbytes
        peak = self.peak.setdefault(device, dict.fromkeys(CATEGORIES, 0))
        peak[category] = max(peak[category], cur[category])
        total = sum(cur.values())
        if total > self.peak_total.get(device, -1):
            self.peak_total[device] = total
            self.at_peak[device] = dict(cur)

    def _freed(self, entry: _Entry, _ref) -> None:
        self._add(entry.device, entry.category, -entry.nbytes)

    def _mark(self, t: torch.Tensor, category: str) -> None:
        """Track the storages of ``t`` as ``category``, or promote them if already tracked lower."""
        for st in get_untyped_storages(t):
            self.mark_storage(st, category)

    def mark_storage(self, st: torch.UntypedStorage, category: str) -> None:
        if st.device.type == "meta":
            return
        entry = self._entries.get(st)
        if entry is None:
            entry = _Entry(st.nbytes(), category, str(st.device))
            self._entries[st] = entry
            self._refs.append(weakref.ref(st, partial(self._freed, entry)))
            self._add(entry.device, category, entry.nbytes)
        elif _RANK[category] > _RANK[entry.category]:
            self._add(entry.device, entry.category, -entry.nbytes)
            entry.category = category
            self._add(entry.device, category, entry.nbytes)
        elif entry.nbytes != st.nbytes():  # resized behind our back
            self._resized(st)

    def _resized(self, st) -> None:
        entry = self._entries.get(st)
        if entry is not None and entry.nbytes != st.nbytes():
            delta = st.nbytes() - entry.nbytes
            entry.nbytes = st.nbytes()
            self._add(entry.device, entry.category, delta)

    # --- registration of what exists before the step ---------------------------------------
    def track_model(self, *modules: nn.Module) -> None:
        for module in modules:
            for p in module.parameters():
                self._mark(p, "parameters")
                if p.grad is not None:
                    self._mark(p.grad, "gradients")
            for b in module.buffers():
                self._mark(b, "other")
        for fsdp_param in _fsdp_params(modules):  # gathered parameters: storages resized to 0 between uses
            for t in getattr(fsdp_param, "all_gather_outputs", ()):
                self.mark_storage(t.untyped_storage(), "parameters")

    def track_optimizer(self, *optimizers: torch.optim.Optimizer) -> None:
        for opt in optimizers:
            for state in opt.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self._mark(value, "optimizer_states" if value.dim() > 0 else "other")

    def track_tensor(self, t: torch.Tensor, category: str) -> None:
        self._mark(t, category)

    def _step_grads(self, opt: torch.optim.Optimizer) -> None:
        """The gradients an optimizer is about to apply are final: classify them."""
        for p in _optimizer_params(opt):
            if p.grad is not None:
                self._mark(p.grad, "gradients")

    def _grads(self, modules) -> None:
        for module in modules:
            for p in module.parameters():
                if p.grad is not None:
                    self._mark(p.grad, "gradients")

    # --- the context --------------------------------------------------------------------------
    def watch(self, modules, persistent: set[int] = frozenset()) -> None:
        """Hooks that classify gradients as they are accumulated (call before entering). Parameters in
        ``persistent`` (ids) keep their gradient in a storage that outlives the step (DDP's bucket
        views): what autograd accumulates for them first is a temporary that DDP copies away."""
        unsharded = [getattr(f, "_unsharded_param", None) for f in _fsdp_params(modules)]
        params = [p for module in modules for p in module.parameters()] + [p for p in unsharded if p is not None]
        for p in params:
            if p.requires_grad and id(p) not in persistent:
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda q: self._mark(q.grad, "gradients") if q.grad is not None else None))

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not (isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)):  # a weight or its view (Wᵀ)
            self._mark(t, "activations")
        return t

    def __enter__(self):
        self._handles.append(register_optimizer_step_pre_hook(lambda opt, args, kwargs: self._step_grads(opt)))
        self._handles.append(register_optimizer_step_post_hook(lambda opt, args, kwargs: self.track_optimizer(opt)))
        # FSDP2 frees and re-allocates unsharded parameters with UntypedStorage.resize_, which no
        # dispatch mode sees (as MemTracker does, we wrap it while the context is active).
        self._orig_resize = torch.UntypedStorage.resize_
        orig, tracker = self._orig_resize, self

        def resize_(st, size):
            out = orig(st, size)
            tracker._resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._saved_hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._saved_hooks.__exit__(*exc)
        torch.UntypedStorage.resize_ = self._orig_resize
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor or issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor run its local ops, which come back here
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._mark(t, "temporaries")
        return out


def _persistent_gradients(tracker: StepMemoryTracker, accumulated: dict, final: dict) -> set[int]:
    """Ids of the parameters whose final gradient is not what autograd accumulated; their gradient
    storages are registered. (A function of its own: no reference to a storage outlives it.)"""
    persistent = set()
    for key, (param_ref, storage_refs) in final.items():
        storages = [ref() for ref in storage_refs]
        if param_ref() is None or any(st is None for st in storages):
            continue
        if key in accumulated and not accumulated[key] & {st.data_ptr() for st in storages}:
            persistent.add(key)
            for st in storages:
                tracker.mark_storage(st, "gradients")
    return persistent


def _fsdp_params(modules) -> list:
    """FSDP2's per-parameter records (``FSDPParam``) of the ``fully_shard`` units under ``modules``.
    They are private to torch (2.13: ``FSDPModule._get_fsdp_state()._fsdp_param_group.fsdp_params``);
    if that changes, gathered parameters fall back to temporaries."""
    from torch.distributed.fsdp import FSDPModule

    found, seen = [], set()
    for module in modules:
        for sub in module.modules():
            if not isinstance(sub, FSDPModule) or id(sub) in seen:
                continue
            seen.add(id(sub))
            try:
                group = sub._get_fsdp_state()._fsdp_param_group
            except AttributeError:
                continue
            found.extend(group.fsdp_params if group is not None else ())
    return found


def _optimizer_params(opt: torch.optim.Optimizer):
    return (p for group in opt.param_groups for p in group["params"])


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_kib(field: str) -> int | None:
    """A ``/proc/self/status`` field in kB (``VmRSS``, ``VmHWM``), or None where there is none (not Linux)."""
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def trim_heap() -> bool:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim(0)``), so that the resident set holds
    what is in use: glibc keeps freed blocks in its arenas (and, once a large block is freed, raises its mmap
    threshold so that later ones come from the arenas too), which would hide the step's allocations from the
    high-water mark. Whether it could (glibc only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def reset_rss_peak() -> bool:
    """Reset this process's resident-set high-water mark (``echo 5 > /proc/self/clear_refs``); whether it worked."""
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def allocator_peak(step_fn, device: torch.device) -> tuple[dict, object]:
    """Run ``step_fn()`` and return (the allocator's peaks over it, its result): on CUDA ``cuda_max_allocated``
    and ``cuda_max_reserved``; on CPU ``rss_start``, ``rss_peak``, ``rss_peak_increase`` (bytes) and
    ``rss_reset`` (see the module docstring). Empty where neither can be read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = step_fn()
        torch.cuda.synchronize(device)
        return {"cuda_max_allocated": int(torch.cuda.max_memory_allocated(device)),
                "cuda_max_reserved": int(torch.cuda.max_memory_reserved(device))}, out
    trim_heap()
    reset = reset_rss_peak()
    start = _status_kib("VmRSS")
    out = step_fn()
    peak = _status_kib("VmHWM")
    if start is None or peak is None:
        return {}, out
    return {"rss_start": start * 1024, "rss_peak": peak * 1024, "rss_peak_increase": (peak - start) * 1024,
            "rss_reset": reset}, out


def measure_step_memory(model, optimizer, step_fn, warmup: int = 1, steps: int = 1, device=None,
                        extra: dict | None = None) -> dict:
    """Peak bytes by category of ``steps`` calls of ``step_fn()`` after ``warmup`` unmeasured ones.

    ``model`` and ``optimizer`` may be one object or a list (pipeline stages, several optimizers).
    ``extra`` registers tensors that exist before the step under a category, e.g. ``{"parameters":
    pipeline.weight_buffers()}`` for PipeDream-2BW's second weight version. At least one warm-up step
    is needed to recognise DDP's bucket-view gradients.
    Returns ``{parameters, gradients, optimizer_states, other, activations, temporaries, total,
    at_peak, at_start, device}`` for ``device`` (default: the device of the first parameter), bytes, and the
    allocator's peaks of :func:`allocator_peak` (CUDA: ``cuda_max_*``; CPU: ``rss_*``). Storages on other
    devices are summed in ``other_devices`` ({device: peak total}).
    """
    modules, optimizers = _as_list(model), _as_list(optimizer)
    # In the warm-up steps, compare each gradient as autograd accumulates it with the gradient the
    # optimizer finally applies: where they differ, the final one lives in a buffer of its own that
    # outlives the step (DDP's bucket views), and what autograd accumulates is a temporary copy.
    accumulated: dict[int, int] = {}
    final: dict[int, tuple[weakref.ref, list]] = {}

    def on_accumulate(p):
        if p.grad is not None:
            accumulated[id(p)] = {st.data_ptr() for st in get_untyped_storages(p.grad)}

    def on_step(opt, args, kwargs):
        for p in _optimizer_params(opt):
            if p.grad is not None:
                final[id(p)] = (weakref.ref(p), [weakref.ref(st) for st in get_untyped_storages(p.grad)])

    handles = [p.register_post_accumulate_grad_hook(on_accumulate)
               for m in modules for p in m.parameters() if p.requires_grad]
    handles.append(register_optimizer_step_pre_hook(on_step))
    try:
        for _ in range(warmup):
            step_fn()
    finally:
        for h in handles:
            h.remove()
    if device is None:
        first = next((p for m in modules for p in m.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)

    tracker = StepMemoryTracker()
    tracker.track_model(*modules)
    tracker.track_optimizer(*optimizers)
    for category, tensors in (extra or {}).items():
        if category not in CATEGORIES:
            raise ValueError(f"extra: unknown category {category!r}; one of {', '.join(CATEGORIES)}")
        for t in tensors:
            tracker.track_tensor(t, category)
    tracker.watch(modules, _persistent_gradients(tracker, accumulated, final))
    at_start = dict(tracker.current.get(str(device), dict.fromkeys(CATEGORIES, 0)))

    def measured():
        with tracker:
            for _ in range(steps):
                step_fn()
            tracker._grads(modules)  # gradients assigned without an accumulation hook (FSDP2's shards)
            tracker.track_optimizer(*optimizers)

    allocator, _ = allocator_peak(measured, device)

    key = str(device) if str(device) in tracker.peak else next(
        (k for k in tracker.peak if k.split(":")[0] == device.type), str(device))
    peak = tracker.peak.get(key, dict.fromkeys(CATEGORIES, 0))
    result = {name: int(peak[name]) for name in CATEGORIES}
    result["total"] = int(tracker.peak_total.get(key, 0))
    result["at_peak"] = {name: int(v) for name, v in tracker.at_peak.get(key, dict.fromkeys(CATEGORIES, 0)).items()}
    result["at_start"] = {name: int(v) for name, v in at_start.items()}
    result["device"] = key
    others = {k: int(v) for k, v in tracker.peak_total.items() if k != key}
    if others:
        result["other_devices"] = others
    result.update(allocator)
    return result
