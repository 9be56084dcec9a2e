"""Microbenchmarks of the kernels a training step launches: the constants of the cost model's kernel time
(:mod:`distperf.cost.kernels`), measured at generic shapes, never at a preset's or on a run being predicted.

Each is a median over blocks of calls (``Timer.blocked_autorange``'s method); a backward time is (forward + backward)
− forward, each through autograd on a fresh graph, less ``backward_call``: a backward through a bare sum, the
engine's start that a training step pays once per backward pass. So it holds the engine's work for its own nodes.

- ``linear``: ``F.linear`` of a 1×n×n input by an n×n weight with bias (fp32, and bf16 where the device runs it),
  n = 8 … 2048 in ×2 steps: the time of one linear layer at n_eff = n, its forward (one ``addmm``) and its
  backward (two ``mm`` and the bias's sum). A size whose call would take more than :data:`CALL_BUDGET_S` (the
  last size's time × 8) is not measured: bf16 on a CPU without bf16 units runs at 1–3 GFLOP/s, 20–60× below
  fp32, where one call at n = 2048 takes about a minute; the cost model extrapolates a table's last row by n³;
- ``attention``: ``F.scaled_dot_product_attention`` at one and at eight (batch × heads), s = 16 … 1024 and
  d = 8 … 128 in ×4 steps, causal and not: a call's fixed cost and the time per (batch × head);
- ``elementwise``: LayerNorm, GELU, an addition, a copy (``transpose`` then ``reshape``), cross-entropy over rows of
  256 classes, an embedding lookup of 256 rows, at 2^6 … 2^22 elements, forward and backward; ``view``: one view
  (``transpose``) and its backward;
- ``module_call``: calling an ``nn.Module`` whose forward returns its input (Python's cost of a module);
- ``adam``: ``torch.optim.Adam`` (torch's defaults, as the trainers) over 16 tensors of 2^0 … 2^22 elements: seconds
  per tensor;
- ``wrappers`` (:func:`wrapper_times`): what torch's parallel wrappers add to a layer's forward and backward, beyond
  its kernels and collectives — one :class:`distperf.model.Block` of a generic tiny shape (hidden 16, 2 heads,
  8 positions), plain and wrapped as the trainers wrap it (tensor parallel, tensor + sequence parallel, an FSDP2
  unit, DDP) on a one-rank gloo group, where the collectives move nothing: the difference is DTensor's dispatch,
  FSDP2's and DDP's hooks and copies; and DDP's cost per parameter tensor and per byte of gradient, over modules of
  nothing but parameters (:func:`ddp_slopes`). Also Adam per tensor on DTensor parameters (FSDP2's and tensor
  parallelism's), and what recomputation's checkpoint adds beyond the forward it repeats, plain and under DTensor
  (:func:`recompute_times`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..cost.kernels import STEP_FIT_BATCHES, STEP_FIT_MODEL

LINEAR_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
LINEAR_SIZES_QUICK = (8, 32, 128, 512)
ATTENTION_S = (16, 64, 256, 1024)
ATTENTION_D = (8, 32, 128)
ELEMENTS = tuple(2**k for k in range(6, 23, 2))
ELEMENTS_QUICK = tuple(2**k for k in range(6, 19, 4))
ADAM_ELEMENTS = tuple(2**k for k in range(0, 23, 2))
ADAM_ELEMENTS_QUICK = tuple(2**k for k in range(0, 21, 4))
ELEMENTWISE = ("layer_norm", "gelu", "add", "copy", "cross_entropy", "embedding")
CALL_BUDGET_S = 1.0  # the longest single call a size sweep of matrix products measures (see the module's docstring)
WIDTH = 256  # the last dimension of elementwise inputs (classes of the cross-entropy, rows of the embedding)


def median_time(fn, min_run_time: float) -> float:
    """Median seconds per call of ``fn`` over blocks of calls (each block ≥ 1 ms, at least 5 blocks, ≥
    ``min_run_time`` in all) after one warm-up call: ``Timer.blocked_autorange``'s method without its fixed cost,
    which would dominate a calibration of a few hundred points."""
    import statistics
    import time

    start = time.perf_counter()
    fn()
    per_call = max(time.perf_counter() - start, 1e-7)
    block = max(1, int(1e-3 / per_call))
    blocks, spent = [], 0.0
    while len(blocks) < 5 or spent < min_run_time:
        start = time.perf_counter()
        for _ in range(block):
            fn()
        elapsed = time.perf_counter() - start
        blocks.append(elapsed / block)
        spent += elapsed
    return statistics.median(blocks)


def _backward(forward, min_run_time: float) -> float:
    """Seconds of ``forward().float().sum().backward()`` less those of ``forward().float().sum()``."""
    def both():
        forward().float().sum().backward()

    return median_time(both, min_run_time) - median_time(lambda: forward().float().sum(), min_run_time)


def backward_call_time(min_run_time: float = 0.1) -> float:
    """Seconds of a backward call through nothing but a sum: the autograd engine's start, paid once per backward
    pass; the backward times below are net of it."""
    x = torch.zeros(1, requires_grad=True)
    return _backward(lambda: x, min_run_time)


def _forward_backward(forward, min_run_time: float, baseline: float) -> tuple[float, float]:
    """(forward seconds, backward seconds net of ``baseline``) of ``forward()``, whose output's sum is
    differentiated."""
    def fwd():
        with torch.no_grad():
            forward()

    return median_time(fwd, min_run_time), max(_backward(forward, min_run_time) - baseline, 0.0)


def affordable(seconds: float, n: int, next_n: int, budget_s: float = CALL_BUDGET_S) -> bool:
    """Whether a cubic kernel that took ``seconds`` per call at size ``n`` stays within ``budget_s`` at ``next_n``."""
    return seconds * (next_n / n) ** 3 <= budget_s


def linear_times(sizes, dtype=torch.float32, min_run_time: float = 0.1, baseline: float = 0.0) -> list[list[float]]:
    """[[n, forward_s, backward_s]] of ``F.linear`` on an input of n tokens of n features (batch 1, as the model's
    (b, s, h) activations, so that the reshapes a 3-D input costs are in) by an n×n weight, with bias; sizes after
    one that would take longer than :data:`CALL_BUDGET_S` per call are left out."""
    rows = []
    for n in sizes:
        if rows and not affordable(rows[-1][1] + rows[-1][2], rows[-1][0], n):
            break
        x = torch.randn(1, n, n).to(dtype).requires_grad_(True)
        w = torch.randn(n, n).to(dtype).requires_grad_(True)
        bias = torch.randn(n).to(dtype).requires_grad_(True)
        try:
            F.linear(x, w, bias)
        except RuntimeError:
            return []
        rows.append([n, *_forward_backward(lambda: F.linear(x, w, bias), min_run_time, baseline)])
    return rows


def attention_times(s_values=ATTENTION_S, d_values=ATTENTION_D, min_run_time: float = 0.1,
                    baseline: float = 0.0) -> list[list]:
    """[[causal, s, d, forward_call_s, forward_per_head_s, backward_call_s, backward_per_head_s]]: fused attention
    at 1 and 8 (batch × heads), the line through them."""
    rows = []
    for causal in (True, False):
        for s in s_values:
            for d in d_values:
                times = {}
                for bh in (1, 8):
                    q, k, v = (torch.randn(1, bh, s, d, requires_grad=True) for _ in range(3))
                    times[bh] = _forward_backward(
                        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), min_run_time, baseline)
                per_head = [(times[8][i] - times[1][i]) / 7 for i in (0, 1)]
                call = [max(times[1][i] - per_head[i], 0.0) for i in (0, 1)]
                rows.append([causal, s, d, call[0], max(per_head[0], 0.0), call[1], max(per_head[1], 0.0)])
    return rows


def _elementwise(kind: str, elements: int):
    rows = max(elements // WIDTH, 1)
    width = elements // rows
    x = torch.randn(rows, width, requires_grad=True)
    if kind == "layer_norm":
        w, b = torch.ones(width, requires_grad=True), torch.zeros(width, requires_grad=True)
        return lambda: F.layer_norm(x, (width,), w, b)
    if kind == "gelu":
        return lambda: F.gelu(x)
    if kind == "add":
        y = torch.randn(rows, width, requires_grad=True)
        return lambda: x + y
    if kind == "copy":
        return lambda: x.transpose(0, 1).reshape(-1)
    if kind == "cross_entropy":
        targets = torch.randint(0, width, (rows,))
        return lambda: F.cross_entropy(x, targets)
    if kind == "embedding":
        table = torch.randn(WIDTH, width, requires_grad=True)
        index = torch.randint(0, WIDTH, (rows,))
        return lambda: F.embedding(index, table)
    raise ValueError(kind)


def elementwise_times(sizes=ELEMENTS, min_run_time: float = 0.1, baseline: float = 0.0) -> list[list]:
    """[[kind, elements, forward_s, backward_s]] of each kind of :data:`ELEMENTWISE`; an addition's backward,
    which launches no kernel, is 0."""
    rows = []
    for kind in ELEMENTWISE:
        for n in sizes:
            f, b = _forward_backward(_elementwise(kind, n), min_run_time, baseline)
            rows.append([kind, n, f, 0.0 if kind == "add" else b])
    return rows


def view_times(min_run_time: float = 0.1, baseline: float = 0.0) -> list[float]:
    """[forward_s, backward_s] of one ``transpose`` (a view) in a chain of 16."""
    x = torch.randn(4, 4, requires_grad=True)

    def chain():
        y = x
        for _ in range(16):
            y = y.transpose(0, 1)
        return y

    f, b = _forward_backward(chain, min_run_time, baseline)
    return [f / 16, b / 16]


class _Identity(nn.Module):
    def forward(self, x):
        return x


def module_call_time(min_run_time: float = 0.1) -> float:
    """Seconds of calling an ``nn.Module`` (its hooks' machinery, no kernel), over a chain of 16."""
    module, x = _Identity(), torch.zeros(1)

    def chain():
        for _ in range(16):
            module(x)

    return median_time(chain, min_run_time) / 16


def adam_times(sizes=ADAM_ELEMENTS, tensors: int = 16, min_run_time: float = 0.1) -> list[list[float]]:
    """[[elements, seconds per tensor]] of one ``torch.optim.Adam`` step (torch's defaults) over up to ``tensors``
    tensors of ``elements`` each (at most 2^24 elements in all), after two steps that allocate and touch its
    moments."""
    rows = []
    for n in sizes:
        count = max(1, min(tensors, 2**24 // n))
        params = [nn.Parameter(torch.randn(n)) for _ in range(count)]
        for p in params:
            p.grad = torch.randn(n)
        optimizer = torch.optim.Adam(params)
        optimizer.step()
        optimizer.step()
        rows.append([n, median_time(optimizer.step, min_run_time) / count])
    return rows


def kernel_costs(quick: bool = False, log=print, between=lambda: None) -> dict:
    """Every microbenchmark above at this process's thread count, as the ``kernels`` object of a hardware profile
    (:class:`distperf.cost.kernels.KernelCosts`); ``between()`` is called before each table (the calibration's speed
    probes)."""
    def next_table(message):
        log(message)
        between()

    t = 0.01 if quick else 0.1
    base = backward_call_time(t)
    next_table("kernels: linear layers")
    sizes = LINEAR_SIZES_QUICK if quick else LINEAR_SIZES
    out = {"backward_call_s": base, "linear_fp32": linear_times(sizes, torch.float32, t, base),
           "linear_bf16": linear_times(sizes, torch.bfloat16, t, base)}
    next_table("kernels: attention")
    out["attention"] = attention_times(ATTENTION_S[:3:2] if quick else ATTENTION_S,
                                       ATTENTION_D[::2] if quick else ATTENTION_D, t, base)
    next_table("kernels: elementwise operators, views, module calls")
    out["elementwise"] = elementwise_times(ELEMENTS_QUICK if quick else ELEMENTS, t, base)
    out["view"] = view_times(t, base)
    out["module_call_s"] = module_call_time(t)
    next_table("kernels: Adam")
    out["adam"] = adam_times(ADAM_ELEMENTS_QUICK if quick else ADAM_ELEMENTS, min_run_time=t)
    next_table("kernels: parallel wrappers (one-rank group)")
    out["wrappers"] = wrapper_times(t)
    return out


def fit_step_overhead(costs: dict, micro_batches=STEP_FIT_BATCHES, steps: int = 12) -> dict:
    """The trainer's fixed Python per step (``step_s``), the one constant the microbenchmarks cannot give: the
    median over ``micro_batches`` of (measured − predicted) step time of the single-device trainer on the
    :data:`distperf.cost.kernels.STEP_FIT_MODEL` preset, the prediction from ``costs`` alone; floored at 0.
    Returns {step_s, rows}."""
    import statistics
    import time
    from dataclasses import replace

    from .. import presets
    from ..config import Config, Layout, RunOptions, validate
    from ..cost import predict
    from ..cost.kernels import KernelCosts
    from ..hardware import PRESETS
    from ..parallel.single import SingleDeviceTrainer

    hw = replace(PRESETS["A100-80GB"], name="kernels", kernels=KernelCosts.from_dict({**costs, "step_s": 0.0}))
    spec, rows = presets.model(STEP_FIT_MODEL), []
    for b in micro_batches:
        cfg = validate(Config(model=spec, layout=Layout(micro_batch=b)))
        trainer = SingleDeviceTrainer(cfg, RunOptions(seed=0), torch.device("cpu"))
        tokens = torch.randint(0, spec.vocab, (b, spec.seq + 1))
        times = []
        for _ in range(steps + 3):
            start = time.perf_counter()
            trainer.step(tokens[:, :-1], tokens[:, 1:])
            times.append(time.perf_counter() - start)
        measured = statistics.median(times[3:])
        predicted = predict(cfg, hw, check=False)["time_s"]["iteration"]
        rows.append({"model": STEP_FIT_MODEL, "micro_batch": b, "measured_s": measured, "predicted_s": predicted})
    step = max(0.0, statistics.median(r["measured_s"] - r["predicted_s"] for r in rows))
    return {"step_s": step, "rows": rows}


PROBE = dict(name="wrapper-probe", layers=1, hidden=16, heads=2, vocab=16, seq=8)  # no preset's shape


def wrapper_times(min_run_time: float = 0.1) -> dict:
    """{tp_layer_s, tp_sp_layer_s, fsdp_unit_s, ddp_step_s, adam_dtensor_tensor_s}: seconds each wrapper adds to one
    layer's forward + backward (per step for DDP), and Adam per DTensor tensor beyond a plain one, on a one-rank gloo
    group (a file store in a temporary folder; nothing listens on the network); DDP's slopes per tensor and per byte
    (:func:`ddp_slopes`); and the recomputation constants of :func:`recompute_times`."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    from ..config import ModelSpec
    from ..model import Block, layer_input
    from ..parallel.tensor import layer_plan

    spec = ModelSpec(**PROBE)
    out = {}
    with tempfile.TemporaryDirectory(prefix="distperf-wrappers-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            mesh = init_device_mesh("cpu", (1,))
            x = layer_input(spec, 1).requires_grad_(True)

            def layer(wrap=None) -> float:
                torch.manual_seed(0)
                block = Block(spec)
                block = wrap(block) if wrap else block
                return median_time(lambda: block(x).sum().backward(), min_run_time)

            plain = layer()
            out["tp_layer_s"] = max(layer(lambda b: parallelize_module(b, mesh, layer_plan(False))) - plain, 0.0)
            out["tp_sp_layer_s"] = max(layer(lambda b: parallelize_module(b, mesh, layer_plan(True))) - plain, 0.0)
            out["fsdp_unit_s"] = max(layer(lambda b: fully_shard(b, mesh=mesh)) - plain, 0.0)
            out["ddp_step_s"] = max(layer(lambda b: DistributedDataParallel(b, process_group=mesh.get_group()))
                                    - plain, 0.0)
            out.update(ddp_slopes(mesh.get_group(), min_run_time))
            out.update(recompute_times(spec, x, mesh, min_run_time))
            tensors = 16
            plain_params = [nn.Parameter(torch.randn(64)) for _ in range(tensors)]
            dt_params = [nn.Parameter(distribute_tensor(torch.randn(64), mesh, [Shard(0)])) for _ in range(tensors)]
            times = []
            for params in (plain_params, dt_params):
                for p in params:
                    p.grad = torch.zeros_like(p)
                optimizer = torch.optim.Adam(params)
                optimizer.step()
                times.append(median_time(optimizer.step, min_run_time) / tensors)
            out["adam_dtensor_tensor_s"] = max(times[1] - times[0], 0.0)
        finally:
            dist.destroy_process_group()
    return out


class ParametersOnly(nn.Module):
    """``count`` parameter tensors of ``numel`` elements each, whose forward sums each one: a module of nothing but
    parameters, for DDP's cost per tensor and per byte (:func:`ddp_slopes`)."""

    def __init__(self, count: int, numel: int):
        super().__init__()
        torch.manual_seed(0)
        self.tensors = nn.ParameterList([nn.Parameter(torch.randn(numel)) for _ in range(count)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(p.sum() * x for p in self.tensors)


DDP_TENSORS = (1, 64)  # the per-tensor probe: modules of 1 and 64 tensors of DDP_SMALL elements
DDP_SMALL = 64
DDP_BYTES = (1 << 20, 16 << 20)  # the per-byte probe: one tensor of 1 MiB, one of 16 MiB


def ddp_slopes(group, min_run_time: float) -> dict:
    """{ddp_tensor_s, ddp_byte_s}: what DDP adds to a forward + backward per parameter tensor (its autograd hook and
    the gradient's copy into its bucket) and per byte of gradient (that copy, the division by the group's size and
    the copy back out of the bucket), beyond what it adds to a module of one tiny tensor: the slopes of DDP's extra
    time (wrapped − plain, on the one-rank ``group``) over modules of nothing but parameters (:class:`ParametersOnly`),
    from 1 to 64 tensors of 64 elements and from one tensor of 1 MiB to one of 16 MiB. ``ddp_step_s`` (a Block under
    DDP) holds the rest, and the cost model adds these beyond the Block's own tensors
    (:func:`distperf.cost.stage.ddp_time`)."""
    from torch.nn.parallel import DistributedDataParallel

    x = torch.ones(())

    def extra(count: int, numel: int) -> float:
        plain, wrapped = ParametersOnly(count, numel), DistributedDataParallel(ParametersOnly(count, numel),
                                                                           process_group=group)
        return (median_time(lambda: wrapped(x).backward(), min_run_time)
                - median_time(lambda: plain(x).backward(), min_run_time))

    few, many = (extra(n, DDP_SMALL) for n in DDP_TENSORS)
    small, large = (extra(1, b // 4) for b in DDP_BYTES)
    return {"ddp_tensor_s": max((many - few) / (DDP_TENSORS[1] - DDP_TENSORS[0]), 0.0),
            "ddp_byte_s": max((large - small) / (DDP_BYTES[1] - DDP_BYTES[0]), 0.0)}


def recompute_times(spec, x: torch.Tensor, mesh, min_run_time: float) -> dict:
    """What ``torch.utils.checkpoint`` (non-reentrant, as the trainers use it) adds to one layer's forward + backward
    beyond the kernels of the forward it repeats, plain (``recompute_layer_s``, ``recompute_core_s``), tensor-parallel
    (``tp_…``) and sequence-parallel (``tp_sp_…``) on the one-rank ``mesh``: under full recomputation (``…_layer_s``)
    the checkpointed layer's forward + backward less the same layer's without recomputation and less the plain layer's
    forward (the kernels it repeats); under selective recomputation (``…_core_s``) the same with the attention core
    checkpointed, less the plain core's forward. What is left is the hooks that pack and unpack each saved tensor, the
    recomputation's bookkeeping and, for a DTensor layer, the dispatch of the forward it repeats. At least 0 each."""
    from torch.distributed.tensor.parallel import parallelize_module

    from ..model import Block
    from ..parallel.tensor import layer_plan

    def block(sequence_parallel: bool | None, recompute: str = "none") -> nn.Module:
        """A Block, tensor-parallel unless ``sequence_parallel`` is None."""
        torch.manual_seed(0)
        layer = Block(spec)
        if sequence_parallel is not None:
            layer = parallelize_module(layer, mesh, layer_plan(sequence_parallel))
        layer.recompute, layer.attn.recompute = recompute == "full", recompute == "selective"
        return layer

    def step(layer) -> float:
        return median_time(lambda: layer(x).sum().backward(), min_run_time)

    plain = block(None)
    forward = median_time(lambda: plain(x), min_run_time)
    q, k, v = (torch.randn(1, spec.heads, spec.seq, spec.hidden // spec.heads, requires_grad=True) for _ in range(3))
    core = median_time(lambda: plain.attn.core(q, k, v), min_run_time)
    out = {}
    for prefix, sp in (("", None), ("tp_", False), ("tp_sp_", True)):
        base = step(block(sp))
        out[f"{prefix}recompute_layer_s"] = max(step(block(sp, "full")) - base - forward, 0.0)
        out[f"{prefix}recompute_core_s"] = max(step(block(sp, "selective")) - base - core, 0.0)
    return out
