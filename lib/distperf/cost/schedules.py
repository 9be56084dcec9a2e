"""Pipeline schedules: microbatches in flight, weight versions, bubble and pipeline time.

Schedules (p ranks, m microbatches per iteration, v model chunks per rank):

* ``none``: no pipeline; m microbatches accumulate one after another.
* ``gpipe`` (Huang et al. 2019): all forwards, then all backwards, then a flush.
* ``1f1b`` = PipeDream-Flush (Narayanan et al. 2021, arXiv 2006.09503, §3.2): rank r runs p − r − 1
  warm-up forwards, then alternates one forward and one backward, then flushes.
* ``interleaved`` (Narayanan et al. 2021, arXiv 2104.04473, §2.2): 1F1B over v chunks per rank, with
  torch's ``ScheduleInterleaved1F1B`` warm-up.
* ``2bw`` = PipeDream-2BW (arXiv 2006.09503, §3.1): the 1F1B order without flushes; two weight versions.
* ``pipedream`` (Narayanan et al. 2019): 1F1B without flushes, a weight update per microbatch, one
  stashed weight version per microbatch in flight.
"""
from __future__ import annotations

from functools import lru_cache

FLUSHING = ("none", "gpipe", "1f1b", "interleaved", "2bw-flush")
ONE_F_ONE_B = ("1f1b", "2bw", "2bw-flush")  # the 1F1B order: torch's, and the 2BW engine's with or without flush


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle fraction of a flushing pipeline with equal stages: (p − 1)/(m + p − 1) for GPipe and 1F1B,
    (p − 1)/(v·m + p − 1) interleaved (Narayanan et al. 2021, arXiv 2104.04473, §2.2: a bubble of
    (p − 1)/(v·m) of the ideal time; as a share of the whole iteration divide by 1 + that)."""
    return (p - 1) / (v * m + p - 1)


def microbatches_per_round(p: int, m: int) -> int:
    """Microbatches torch's interleaved schedule runs on one chunk before moving to the next: m / max(1, ⌊m/p⌋)."""
    return m // max(1, m // p)


def in_flight(schedule: str, p: int, m: int, v: int, rank: int) -> tuple[int, ...]:
    """Microbatches whose activations rank ``rank`` holds at its peak, one count per local chunk.

    GPipe: all m (App. A.1.2 of arXiv 2006.09503). 1F1B, 2BW: min(p − r, m), at most the pipeline depth
    and p − r at stage r (arXiv 2006.09503, §3). Original PipeDream: p − r, it admits microbatches
    without a flush. Interleaved (torch ``ScheduleInterleaved1F1B``): warm-up w = (v − 1)·g + 2(p − 1 − r)
    forwards (g = :func:`microbatches_per_round`), capped at v·m, then one more forward before the first
    backward; forward k runs on local chunk ⌊k/g⌋ mod v. Without a pipeline: 1.
    """
    if schedule == "none":
        return (1,)
    if schedule == "gpipe":
        return (m,)
    if schedule in ONE_F_ONE_B:
        return (min(p - rank, m),)
    if schedule == "pipedream":
        return (p - rank,)
    g = microbatches_per_round(p, m)
    warmup = min((v - 1) * g + 2 * (p - 1 - rank), v * m)
    peak = min(warmup + 1, v * m)
    rounds, rest = divmod(peak, g)
    counts = [g * (rounds // v)] * v
    for k in range(rounds % v):
        counts[k] += g
    counts[rounds % v] += rest
    return tuple(counts)


@lru_cache(maxsize=4096)
def in_flight_per_rank(schedule: str, p: int, m: int, v: int) -> tuple[tuple[int, ...], ...]:
    """:func:`in_flight` for ranks 0 … p − 1 (cached: a sweep asks for the same few)."""
    if schedule in ONE_F_ONE_B:
        return tuple((min(p - r, m),) for r in range(p))
    if schedule == "pipedream":
        return tuple((p - r,) for r in range(p))
    if schedule in ("none", "gpipe"):
        return ((1 if schedule == "none" else m,),) * p
    return tuple(in_flight(schedule, p, m, v, r) for r in range(p))


def weight_versions(schedule: str, p: int, rank: int) -> int:
    """Weight versions held at stage r: 2 for PipeDream-2BW (arXiv 2006.09503, §3.1), p − r for PipeDream
    with weight stashing (one per microbatch in flight, Narayanan et al. 2019, §3.3), else 1."""
    if schedule == "2bw":
        return 2
    if schedule == "pipedream":
        return p - rank
    return 1


def pipeline_time(schedule: str, per_rank: list[float], m: int, v: int) -> float:
    """Time for m microbatches through ranks whose per-microbatch time (forward + backward) is t_r.

    Flushing schedules: m·max t + (Σ t − max t)/v, the (m + p − 1)·t of GPipe and 1F1B for equal stages
    and m·t + (p − 1)·t/v interleaved; the fill and drain cross every rank once, a chunk at a time.
    2BW and PipeDream never flush: in steady state an iteration takes m·max t.
    """
    slowest = max(per_rank)
    if schedule in FLUSHING:
        return m * slowest + (sum(per_rank) - slowest) / v
    return m * slowest


def pipedream_2bw_memory(weights: float, activations_total: float, activations_input: float, depth: int) -> float:
    """Per-worker memory of PipeDream-2BW with recomputation (arXiv 2006.09503, §3.1 and App. A.1.2):
    2|W|/d + |A_total(b)|/d + d·|A_input(b)|."""
    return 2 * weights / depth + activations_total / depth + depth * activations_input


def gpipe_memory(weights: float, activations_total: float, activations_input: float, depth: int, m: int) -> float:
    """Per-worker memory of GPipe with recomputation (arXiv 2006.09503, App. A.1.2):
    |W|/d + |A_total(b)|/d + m·|A_input(b)|."""
    return weights / depth + activations_total / depth + m * activations_input
