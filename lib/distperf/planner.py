"""The PipeDream-2BW planner on distperf's cost model (Narayanan et al. 2021, arXiv 2006.09503, §4.2,
Algorithm 1 and App. A.1).

Given a model, N devices (k per node), a global batch B and a memory limit M per device, it searches

* every equi-replicated pipeline: width w (replicas of each stage) × depth d (stages) = N, d ≤ layers
  (a depth that does not divide the layers gets the uniform partition, the remainder on the first stages);
* every microbatch size b = 1, 2, 4, … ≤ ``max_micro_batch``; b·w must divide B, and the gradient
  accumulation that follows is m = B/(w·b) microbatches per pipeline and optimizer step (the paper's
  g = m/d = B/(N·b));
* activation recomputation off or on (``full``: each layer keeps only its input);
* the schedules 2BW, PipeDream-Flush (1F1B) and GPipe; 2BW and Flush need m ≥ d (2BW coalesces
  gradients over m ≥ d microbatches, §3.1; torch's Schedule1F1B refuses fewer);

and two baselines without pipelining: data parallelism alone (w = N, d = 1) and Megatron tensor
parallelism (tensor-parallel degree t > 1 dividing N and the heads, data parallelism N/t over it).
Algorithm 1 keeps the configuration of highest THROUGHPUT(w, d, b, r) among those with
MEMORY(w, d, b, r) ≤ M; here every candidate is kept, ranked by predicted throughput, and the others
are listed with why they were rejected.

THROUGHPUT and MEMORY are :func:`distperf.cost.predict`: throughput = B / iteration time, memory = the
peak of the most loaded device (its weight versions, optimizer states and stashed activations), so
GPipe's m stashed microbatches and 2BW's second weight version are counted as App. A.1.2 counts them.

Topology (App. A.1.1, "bwdth_width(w) = B_high if w < GPUs per server else B_low"): ranks are laid out
tensor-parallel fastest, then the replicas of a stage, then the stages (:mod:`distperf.parallel.mesh`),
so the replicas of a stage sit inside one node when t·w ≤ k ("orienting parallel pipelines") and their
all-reduce uses the node's links; otherwise it crosses nodes. With ``node_bandwidth`` (one network
interface per node, as the paper's p3.16xlarge servers with 25 Gbit/s), the devices of a node that
talk across nodes at the same time share it: min(t·w, k) of them — all k when the replicas or the
tensor-parallel group span nodes, else the w replicas of the stage that sends its activations to the
next node — so each gets node_bandwidth / min(t·w, k).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .config import Config, ConfigError, Layout, ModelSpec, Training, validate
from .cost import predict
from .hardware import Hardware

PLANNED_SCHEDULES = ("2bw", "1f1b", "gpipe")
PLANNED_RECOMPUTE = ("none", "full")
STRATEGIES = ("pipeline", "data-parallel", "tensor-parallel")


@dataclass(frozen=True)
class Candidate:
    """One configuration the planner considers."""

    strategy: str  # pipeline, data-parallel or tensor-parallel
    schedule: str  # 2bw, 1f1b, gpipe; none for the baselines
    w: int  # data-parallel width (replicas of each stage)
    d: int  # pipeline depth
    tp: int
    micro_batch: int
    recompute: str

    def layout(self, global_batch: int) -> Layout:
        """The layout; raises ConfigError when b·w does not divide the global batch."""
        if global_batch % (self.micro_batch * self.w):
            raise ConfigError("global_batch", f"must be divisible by micro_batch·w ({self.micro_batch}·{self.w}), "
                                              f"got {global_batch}")
        return Layout(dp=self.w, tp=self.tp, pp=self.d, schedule=self.schedule, micro_batch=self.micro_batch,
                      microbatches=global_batch // (self.micro_batch * self.w), recompute=self.recompute)


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def candidates(model: ModelSpec, gpus: int, max_micro_batch: int = 64, schedules=PLANNED_SCHEDULES,
               recompute=PLANNED_RECOMPUTE, baselines: bool = True) -> list[Candidate]:
    """The search space (see the module docstring), pipelines first, in a fixed order."""
    sizes = [1 << i for i in range(max_micro_batch.bit_length()) if 1 << i <= max_micro_batch]
    found = []
    for d in divisors(gpus):
        if d == 1:
            continue  # one stage is data parallelism, a baseline
        for schedule in schedules:
            found += [Candidate("pipeline", schedule, gpus // d, d, 1, b, r) for r in recompute for b in sizes]
    if baselines:
        found += [Candidate("data-parallel", "none", gpus, 1, 1, b, r) for r in recompute for b in sizes]
        found += [Candidate("tensor-parallel", "none", gpus // t, 1, t, b, r)
                  for t in divisors(gpus) if t > 1 and model.heads % t == 0 for r in recompute for b in sizes]
    return found


def topology(hw: Hardware, gpus_per_node: int | None, node_bandwidth: float | None, tp: int, w: int) -> Hardware:
    """The hardware one candidate sees: k devices per node and, with a shared node interface, the
    bandwidth each device gets when min(t·w, k) of a node's devices cross nodes at once."""
    k = gpus_per_node or hw.devices_per_node
    if node_bandwidth is None:
        return hw if k == hw.devices_per_node else replace(hw, devices_per_node=k)
    return replace(hw, devices_per_node=k, inter_bandwidth=node_bandwidth / min(tp * w, k))


def check_inputs(model: ModelSpec, gpus: int, global_batch: int, memory_limit: float, gpus_per_node: int | None,
                 node_bandwidth: float | None, max_micro_batch: int) -> None:
    """Bad planner input raises ConfigError naming the field and the rule."""
    for name, value in (("gpus", gpus), ("global_batch", global_batch), ("max_micro_batch", max_micro_batch)):
        if type(value) is not int or value < 1:
            raise ConfigError(name, f"must be a positive integer, got {value!r}")
    if gpus_per_node is not None and (type(gpus_per_node) is not int or gpus_per_node < 1):
        raise ConfigError("gpus_per_node", f"must be a positive integer, got {gpus_per_node!r}")
    if gpus_per_node is not None and gpus > gpus_per_node and gpus % gpus_per_node:
        raise ConfigError("gpus_per_node", f"gpus ({gpus}) must fill whole nodes of {gpus_per_node}")
    if not memory_limit > 0:
        raise ConfigError("memory_limit", f"must be positive, got {memory_limit!r}")
    if node_bandwidth is not None and not node_bandwidth > 0:
        raise ConfigError("node_bandwidth", f"must be positive, got {node_bandwidth!r}")
    validate(Config(model=model))


def plan(model: ModelSpec, gpus: int, hw: Hardware, global_batch: int, memory_limit: float | None = None,
         gpus_per_node: int | None = None, node_bandwidth: float | None = None, precision: str = "mixed",
         optimizer: str = "adam", max_micro_batch: int = 64, schedules=PLANNED_SCHEDULES, recompute=PLANNED_RECOMPUTE,
         baselines: bool = True, layer_times: dict | None = None, convention: str = "trainer",
         backend: str = "nccl") -> dict:
    """Rank every candidate by predicted throughput; returns ``{"plans": [...], "rejected": [...]}``.

    Each plan: strategy, schedule, w, d, tp, micro_batch, recompute, accumulation (m = B/(w·b)
    microbatches per pipeline and optimizer step), throughput (samples/s), memory_bytes (peak per
    device), iteration_s, bubble_fraction. Each rejected candidate: the same configuration fields and
    ``reason`` (``out of memory: …`` with its memory_bytes, or ``invalid: <field>: <rule>``).

    ``layer_times``: {micro_batch: {"layer": (forward_s, backward_s), "embedding": …, "head": …}}, profiled
    on one device, as the paper's planner profiles its blocks (§4.2); compute time then comes from them
    instead of FLOPs over the achieved rate, and a microbatch size without times is rejected.

    ``convention`` and ``backend``: as for :func:`distperf.cost.predict` — what the trainers run
    (``"trainer"``) or what the papers count (``"paper"``: ZeRO's mixed-precision bytes, unfused attention's
    count, reduce-scatter + all-gather for ZeRO-1), and whose collective algorithms are timed.
    """
    limit = hw.memory_capacity if memory_limit is None else memory_limit
    check_inputs(model, gpus, global_batch, limit, gpus_per_node, node_bandwidth, max_micro_batch)
    training = Training(precision=precision, optimizer=optimizer)
    plans, rejected = [], []
    for c in candidates(model, gpus, max_micro_batch, schedules, recompute, baselines):
        entry = asdict(c)
        try:
            layout = c.layout(global_batch)
            if c.schedule in ("2bw", "1f1b") and layout.microbatches < c.d:
                raise ConfigError("microbatches", f"{c.schedule} needs m = B/(w·b) >= d microbatches "
                                                  f"(m={layout.microbatches} < d={c.d})")
            cfg = validate(Config(model=model, layout=layout, training=training))
            if layer_times is not None and c.micro_batch not in layer_times:
                raise ConfigError("micro_batch", f"no profiled layer times for micro_batch {c.micro_batch}")
        except ConfigError as e:
            rejected.append({**entry, "accumulation": None, "reason": f"invalid: {e}"})
            continue
        times = None if layer_times is None else layer_times[c.micro_batch]
        r = predict(cfg, topology(hw, gpus_per_node, node_bandwidth, c.tp, c.w), check=False, layer_times=times,
                    convention=convention, backend=backend)
        entry.update(accumulation=layout.microbatches, memory_bytes=r["memory_bytes"]["total"],
                     iteration_s=r["time_s"]["iteration"], throughput=global_batch / r["time_s"]["iteration"],
                     bubble_fraction=r["bubble_fraction"])
        if entry["memory_bytes"] > limit:
            rejected.append({**entry, "reason": f"out of memory: {entry['memory_bytes'] / 2**30:.2f} GiB > "
                                                f"{limit / 2**30:.2f} GiB"})
        else:
            plans.append(entry)
    plans.sort(key=lambda e: (-e["throughput"], e["memory_bytes"]))
    return {"plans": plans, "rejected": rejected}


def best(model: ModelSpec, gpus: int, hw: Hardware, global_batch: int, **kwargs) -> dict | None:
    """Algorithm 1's answer: the highest-throughput configuration that fits, or None."""
    plans = plan(model, gpus, hw, global_batch, **kwargs)["plans"]
    return plans[0] if plans else None
