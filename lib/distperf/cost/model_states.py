"""Model states: parameters, gradients and optimizer states, and how ZeRO shards them.

Bytes per parameter (ZeRO paper, Rajbhandari et al. 2020, §3.1): mixed precision keeps 16-bit
parameters (2) and gradients (2) and, in the optimizer, an fp32 master copy (4) plus Adam's two moments
(4 + 4): K = 12, 16 bytes in all. fp32 keeps 4 + 4 and Adam's 8. SGD with momentum keeps one moment;
without momentum nothing, except the fp32 master in mixed precision.
"""
from __future__ import annotations

import heapq
from functools import lru_cache


@lru_cache(maxsize=16)
def bytes_per_parameter(precision: str, optimizer: str, momentum: bool = True) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter."""
    mixed = precision == "mixed"
    moments = 2 if optimizer == "adam" else (1 if momentum else 0)
    return (2, 2, 4 + 4 * moments) if mixed else (4, 4, 4 * moments)


def zero_model_state_bytes(psi: float, n: int, stage: int, param_bytes: float = 2, grad_bytes: float = 2,
                           optimizer_bytes: float = 12) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer states) bytes per data-parallel rank (ZeRO paper, §5 and Fig. 1).

    With mixed precision and Adam (2 + 2 + 12): stage 0 → 16Ψ; stage 1 (P_os) → 4Ψ + 12Ψ/N;
    stage 2 (P_os+g) → 2Ψ + 14Ψ/N; stage 3 (P_os+g+p) → 16Ψ/N.
    """
    return (psi * param_bytes / (n if stage >= 3 else 1),
            psi * grad_bytes / (n if stage >= 2 else 1),
            psi * optimizer_bytes / (n if stage >= 1 else 1))


def fsdp_shard_elements(tensors: tuple[tuple[int, int, int], ...], n: int) -> int:
    """Elements on the most loaded of n ranks when every tensor is cut along dim 0 into ceil(d0/n)-row
    chunks, as FSDP2 ``fully_shard`` does (rank 0 holds a full chunk of every tensor).

    ``tensors`` holds (count, dim-0 size, elements) triples.
    """
    return sum(count * -(-d0 // n) * (numel // d0) for count, d0, numel in tensors)


@lru_cache(maxsize=65536)
def greedy_partition_max(tensors: tuple[tuple[int, int, int], ...], n: int) -> int:
    """Elements on the most loaded of n ranks when whole tensors are dealt out largest first, each to the
    rank holding the fewest elements so far: torch's ZeroRedundancyOptimizer (``_partition_parameters``).

    ``tensors`` holds (count, dim-0 size, elements) triples. Which of several equally loaded ranks gets
    a tensor does not change the multiset of loads, so only load values are tracked. Once the loads
    lie within one tensor's size of each other, the next n tensors of that size go one to each rank,
    so whole rounds are added at once.
    """
    if n == 1:
        return sum(count * numel for count, _, numel in tensors)
    counts: dict[int, int] = {}
    for count, _, numel in tensors:
        counts[numel] = counts.get(numel, 0) + count
    loads = [0] * n  # a heap: loads[0] is the least loaded rank, the next owner
    top = 0
    for numel in sorted(counts, reverse=True):
        left = counts[numel]
        while left:
            if left >= n and top - loads[0] <= numel:
                rounds = left // n
                loads = [load + rounds * numel for load in loads]
                top += rounds * numel
                left -= rounds * n
                continue
            grown = loads[0] + numel
            heapq.heapreplace(loads, grown)
            top = max(top, grown)
            left -= 1
    return top
