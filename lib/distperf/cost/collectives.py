"""Collectives: bytes each rank sends, and time under the α-β model.

Ring algorithms (Patarasuk and Yuan 2009; Thakur et al. 2005) on a buffer of M bytes over n ranks:
reduce-scatter and all-gather each send (n − 1)/n·M per rank in n − 1 steps; all-reduce is one of each,
2(n − 1)/n·M in 2(n − 1) steps. A step costs the link latency α, a byte 1/β. Point-to-point: α + M/β.
"""
from __future__ import annotations

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "send")


def sent_bytes(kind: str, buffer_bytes: float, n: int) -> float:
    """Bytes one rank sends: all-reduce 2(n − 1)/n·M; reduce-scatter and all-gather (n − 1)/n·M; send M."""
    if kind == "send":
        return buffer_bytes
    factor = 2 if kind == "all-reduce" else 1
    return factor * (n - 1) / n * buffer_bytes


def collective_time(kind: str, buffer_bytes: float, n: int, latency: float, bandwidth: float) -> float:
    """α-β time: steps·α + sent/β, with 2(n − 1) steps for all-reduce, n − 1 for the others, 1 for a send."""
    if kind == "send":
        return latency + buffer_bytes / bandwidth
    if n == 1:
        return 0.0
    steps = (2 if kind == "all-reduce" else 1) * (n - 1)
    return steps * latency + sent_bytes(kind, buffer_bytes, n) / bandwidth


def bucketed_exposed_time(total_bytes: float, bucket_bytes: float, compute_time: float, kind: str, n: int,
                          latency: float, bandwidth: float) -> float:
    """Communication left after compute when gradients are reduced bucket by bucket during backward.

    Gradients appear at a steady rate over ``compute_time``; a bucket of B bytes is ready once its last
    gradient is, i.e. at (k + 1)·B/G of the backward, and the buckets go out one after another
    (PyTorch DDP's overlap, Li et al. 2020, §3.2). With c_k the time of bucket k and r_k its ready
    time, the last finishes at max_k (r_k + Σ_{j≥k} c_j); the exposed part is what lies past the end
    of the backward. Buckets are all full except the last.
    """
    if total_bytes <= 0 or n == 1:
        return 0.0
    full, last = divmod(total_bytes, bucket_bytes)
    full = int(full)
    c_full = collective_time(kind, bucket_bytes, n, latency, bandwidth)
    c_last = collective_time(kind, last, n, latency, bandwidth) if last else 0.0
    finish = compute_time + c_last  # the last bucket is ready when the backward ends
    if full:
        step = compute_time * bucket_bytes / total_bytes  # time between two full buckets being ready
        # r_k + Σ_{j≥k} c_j is linear in k over the full buckets: its maximum is at the first or the last
        finish = max(finish, step + full * c_full + c_last, full * step + c_full + c_last)
    return finish - compute_time
