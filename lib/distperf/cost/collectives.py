"""Collectives: the bytes each rank sends, two ways, and time under the α-β model.

**Algorithmic bytes** (:func:`sent_bytes`) are the volumes of the textbook ring algorithms (Patarasuk and Yuan
2009; Thakur et al. 2005) on a message of M bytes over n ranks, the volumes the papers quote: reduce-scatter and
all-gather each send (n − 1)/n·M per rank in n − 1 steps; all-reduce is one of each, 2(n − 1)/n·M in 2(n − 1)
steps; a point-to-point send M. A broadcast sends M out of its root (the least any broadcast algorithm must send
from there; the other ranks are counted 0). M is the convention of :mod:`distperf.measure.comm`: the buffer of an
all-reduce, broadcast or send, the gathered output of an all-gather, the input of a reduce-scatter.

**Wire bytes** (:func:`gloo_sent_bytes`) are what gloo's algorithms hand to its transport, the payload on the
wire without gloo's message headers (ProcessGroupGloo in torch 2.13; gloo's ``allreduce.cc``, ``allgather.cc``,
``broadcast.cc``):

- all-reduce: gloo's ring, on 2n segments of ⌈M/2n⌉ bytes (rounded up to the element size): a reduce-scatter
  phase in which rank r sends every segment but its own chunk's two, and an all-gather phase in which it sends
  every segment but those of chunk r − 1, so 2M − |chunk r| − |chunk r − 1| bytes; the ring volume
  2(n − 1)/n·M when the elements divide by 2n;
- reduce-scatter: ``ProcessGroupGloo::reduce_scatter_tensor_coalesced`` (FSDP2's and DTensor's
  ``reduce_scatter_tensor``) clones the input, all-reduces all of it and copies the rank's chunk out: an
  all-reduce of M, twice the ring reduce-scatter;
- all-gather: gloo's ring, (n − 1)/n·M, as the algorithmic count;
- broadcast: a binomial tree rooted at the root: virtual rank v (the rank's distance from the root) sends M to
  each of its children, v + 2^i for every i above v's highest set bit with v + 2^i < n; the root sends
  ⌈log₂ n⌉·M;
- send: M.

gloo's message headers (96 bytes a send and 48 a receive notification in torch 2.13's TCP transport, seen in
``/proc/self/io``) are not counted: ``tests/test_measure_comm.py`` checks the payload against the bytes the
process writes to its sockets.

**Time** (:func:`collective_time`): a step costs the link latency α, a byte 1/β. With ``backend="nccl"`` the
ring algorithms above (a broadcast as a pipelined chain: (n − 1)·α + M/β); with ``backend="gloo"`` gloo's:
a reduce-scatter takes an all-reduce's time, a broadcast ⌈log₂ n⌉ sends of M from the root in turn.
"""
from __future__ import annotations

from functools import lru_cache

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "broadcast", "send")
BACKENDS = ("nccl", "gloo")


def ring_terms(collective: str, n: int, nbytes: float) -> tuple[float, float]:
    """(steps, bytes sent per rank) of the ring algorithm, the coefficients of α and 1/β in t = steps·α + bytes/β
    that the calibration fits (send/recv: one step of M; all-reduce: 2(n − 1) steps of 2(n − 1)M/n; the others
    (n − 1) steps of (n − 1)M/n)."""
    if collective == "send":
        return 1.0, float(nbytes)
    factor = 2 if collective == "all-reduce" else 1
    return factor * (n - 1), factor * (n - 1) / n * nbytes


def sent_bytes(kind: str, buffer_bytes: float, n: int) -> float:
    """Algorithmic bytes the busiest rank sends: all-reduce 2(n − 1)/n·M; reduce-scatter and all-gather
    (n − 1)/n·M; send and broadcast (its root) M."""
    if kind in ("send", "broadcast"):
        return buffer_bytes
    factor = 2 if kind == "all-reduce" else 1
    return factor * (n - 1) / n * buffer_bytes


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _gloo_chunk(total: int, n: int, chunk: int, element_size: int) -> int:
    """Bytes of chunk ``chunk`` (segments 2·chunk and 2·chunk + 1) of gloo's ring all-reduce on ``total`` bytes."""
    segment = _round_up(_round_up(total, 2 * n) // (2 * n), element_size)  # ⌈total/2n⌉, whole elements
    return sum(max(0, min(segment, total - j * segment)) for j in (2 * chunk, 2 * chunk + 1))


@lru_cache(maxsize=4096)
def binomial_children(vrank: int, n: int) -> int:
    """Messages virtual rank ``vrank`` (distance from the root) sends in gloo's binomial-tree broadcast over n."""
    dim = (n - 1).bit_length()  # ⌈log₂ n⌉
    mask, sends = (1 << dim) - 1, 0
    for i in range(dim):
        mask ^= 1 << i
        if vrank & mask:
            continue
        peer = vrank ^ (1 << i)
        if peer < n and not vrank & (1 << i):
            sends += 1
    return sends


@lru_cache(maxsize=65536)
def gloo_sent_bytes(kind: str, buffer_bytes: int, n: int, rank: int | None = None, root: int = 0,
                    element_size: int = 4) -> int:
    """Bytes rank ``rank`` of n hands to gloo's transport for one collective on M = ``buffer_bytes`` (see the
    module docstring); ``rank=None``: the most any rank sends. ``root``: a broadcast's; ``element_size``: of the
    all-reduce's (and reduce-scatter's) elements, which gloo's segments are rounded to.

    The chunks of the ring are full but the last non-empty one, so the two consecutive chunks a rank does not
    send are smallest at the end: the most any rank sends is 2M − |chunk n − 1| − |chunk n − 2|."""
    if n == 1 and kind != "send":
        return 0
    if kind == "send":
        return buffer_bytes
    if kind == "all-gather":
        return (n - 1) * (buffer_bytes // n)
    if kind == "broadcast":
        if rank is None:
            return binomial_children(0, n) * buffer_bytes
        return binomial_children((rank - root) % n, n) * buffer_bytes
    if kind in ("all-reduce", "reduce-scatter"):
        total = int(buffer_bytes)
        first, second = (n - 1, n - 2) if rank is None else (rank, (rank - 1) % n)
        return 2 * total - _gloo_chunk(total, n, first, element_size) - _gloo_chunk(total, n, second, element_size)
    raise ValueError(f"unknown collective {kind!r}; one of {', '.join(COLLECTIVES)}")


def collective_time(kind: str, buffer_bytes: float, n: int, latency: float, bandwidth: float,
                    backend: str = "nccl") -> float:
    """α-β time: steps·α + sent/β, with 2(n − 1) steps for all-reduce, n − 1 for reduce-scatter and all-gather,
    1 for a send; a broadcast (n − 1)·α + M/β as a pipelined chain. ``backend="gloo"``: a reduce-scatter is an
    all-reduce, a broadcast ⌈log₂ n⌉·(α + M/β) (see the module docstring)."""
    if kind == "send":
        return latency + buffer_bytes / bandwidth
    if n == 1:
        return 0.0
    if backend == "gloo":
        if kind == "reduce-scatter":
            kind = "all-reduce"
        elif kind == "broadcast":
            return (n - 1).bit_length() * (latency + buffer_bytes / bandwidth)
    if kind == "broadcast":
        return (n - 1) * latency + buffer_bytes / bandwidth
    steps = (2 if kind == "all-reduce" else 1) * (n - 1)
    return steps * latency + sent_bytes(kind, buffer_bytes, n) / bandwidth


def bucketed_exposed_time(total_bytes: float, bucket_bytes: float, compute_time: float, kind: str, n: int,
                          latency: float, bandwidth: float, first_bucket_bytes: float | None = None,
                          backend: str = "nccl") -> float:
    """Communication left after compute when gradients are reduced bucket by bucket during backward.

    Gradients appear at a steady rate over ``compute_time``; a bucket is ready once its last gradient is, and
    the buckets go out one after another (PyTorch DDP's overlap, Li et al. 2020, §3.2). With c_k the time of
    bucket k and r_k its ready time, the last finishes at max_k (r_k + Σ_{j≥k} c_j); the exposed part is what
    lies past the end of the backward. The first bucket holds ``first_bucket_bytes`` (default: a full bucket),
    the others are full but the last.

    DDP's first bucket: torch 2.13 rebuilds its buckets after the first iteration in the order gradients
    became ready, with a first bucket of ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) only when
    ``bucket_cap_mb`` is left unset (``BucketCapacityConfig``); the trainers pass ``bucket_cap_mb``, so their
    first bucket is a full one.
    """
    if total_bytes <= 0 or n == 1:
        return 0.0
    first = min(total_bytes, bucket_bytes if first_bucket_bytes is None else first_bucket_bytes)
    c_first = collective_time(kind, first, n, latency, bandwidth, backend)
    rate = compute_time / total_bytes  # seconds of backward per byte of gradient
    if first == total_bytes:  # one bucket, ready when the backward ends
        return max(compute_time, first * rate + c_first) - compute_time
    full, last = divmod(total_bytes - first, bucket_bytes)
    full = int(full)
    c_full = collective_time(kind, bucket_bytes, n, latency, bandwidth, backend) if full else 0.0
    c_last = collective_time(kind, last, n, latency, bandwidth, backend) if last else 0.0
    finish = compute_time + c_last  # the last bucket is ready when the backward ends
    finish = max(finish, first * rate + c_first + full * c_full + c_last)
    if full:
        # r_k + Σ_{j≥k} c_j is linear in k over the full buckets: its maximum is at the first or the last
        finish = max(finish, (first + bucket_bytes) * rate + full * c_full + c_last,
                     (first + full * bucket_bytes) * rate + c_full + c_last)
    return finish - compute_time


@lru_cache(maxsize=4096)
def ddp_bucket_count(before: tuple[int, ...], layer: tuple[int, ...], layers: int, after: tuple[int, ...],
                     cap: int) -> int:
    """How many buckets torch's DDP makes of a rank's gradients, given their bytes in the order they become ready:
    ``before`` (the head's tensors), then ``layers`` times ``layer`` (one layer's, last computed first), then
    ``after`` (the embeddings').

    After its first iteration DDP rebuilds its buckets in that order (``Reducer::rebuild_buckets`` in torch 2.13)
    with ``compute_bucket_assignment_by_size``: each tensor joins the open bucket whole, and the bucket closes as
    soon as it holds ``cap`` bytes or more. A tensor is never split, so a tensor of ``cap`` bytes or more fills a
    bucket of its own and a small cap makes far fewer buckets than total/cap. The layers repeat: once a layer starts
    with a partly filled bucket of a size seen at an earlier layer's start, the layers in between recur until the
    end, and are counted without packing them again (a 2,240-layer stage packs a few layers)."""
    buckets, filled = _pack(before, 0, 0, cap)
    seen: dict[int, tuple[int, int]] = {}  # bytes in the open bucket at a layer's start -> (that layer, buckets)
    done = 0
    while done < layers:
        if filled in seen:
            start, before_count = seen.pop(filled)
            period, per_period = done - start, buckets - before_count
            repeats = (layers - done) // period
            buckets, done = buckets + repeats * per_period, done + repeats * period
            seen.clear()
            if done == layers:
                break
        seen[filled] = (done, buckets)
        buckets, filled = _pack(layer, buckets, filled, cap)
        done += 1
    buckets, filled = _pack(after, buckets, filled, cap)
    return buckets + (filled > 0)


def _pack(sizes: tuple[int, ...], buckets: int, filled: int, cap: int) -> tuple[int, int]:
    """:func:`ddp_bucket_count`'s packing of ``sizes`` after ``buckets`` closed buckets and ``filled`` bytes in the
    open one."""
    for size in sizes:
        filled += size
        if filled >= cap:
            buckets, filled = buckets + 1, 0
    return buckets, filled
