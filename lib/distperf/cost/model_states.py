"""Model states: parameters, gradients and optimizer states, and how ZeRO shards them.

Bytes per parameter (ZeRO paper, Rajbhandari et al. 2020, §3.1): mixed precision keeps 16-bit
parameters (2) and gradients (2) and, in the optimizer, an fp32 master copy (4) plus Adam's two moments
(4 + 4): K = 12, 16 bytes in all. fp32 keeps 4 + 4 and Adam's 8. SGD with momentum keeps one moment;
without momentum nothing, except the fp32 master in mixed precision.

The trainers' mixed precision is bf16 autocast over fp32 parameters (:mod:`distperf.parallel.parallelize`): the
parameters are the fp32 master weights and their gradients are fp32, so they keep 4 + 4 bytes and the
optimizer its moments alone, in either precision (:func:`trainer_bytes_per_parameter`); the 16-bit copies
autocast makes for each forward are activations (:mod:`distperf.cost.activations`).
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


@lru_cache(maxsize=16)
def trainer_bytes_per_parameter(optimizer: str, momentum: bool = True) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter as the trainers keep them, in fp32 and under
    bf16 autocast alike: fp32 parameters (4) and gradients (4), and the optimizer's fp32 moments."""
    return (4, 4, 4 * (2 if optimizer == "adam" else (1 if momentum else 0)))


def state_bytes(training, convention: str) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter of a :class:`~distperf.config.Training` under
    ``convention``: the papers' (:func:`bytes_per_parameter`) or the trainer's (:func:`trainer_bytes_per_parameter`)."""
    if convention == "paper":
        return bytes_per_parameter(training.precision, training.optimizer, training.momentum)
    return trainer_bytes_per_parameter(training.optimizer, training.momentum)


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


@lru_cache(maxsize=4096)
def zero_partition_loads(tensors: tuple[tuple[int, int, int], ...], n: int) -> tuple[int, ...]:
    """Elements each of n ranks owns, by rank, when torch's ZeroRedundancyOptimizer deals out whole tensors
    (``_partition_parameters``, torch 2.13): largest first (a stable sort), each to the first of the least
    loaded ranks (``_get_min_index``). ``tensors`` holds (count, dim-0 size, elements) triples; which of several
    equal tensors goes where does not change the loads, so only sizes are needed. While the loads lie strictly
    within one tensor's size of each other, the next n tensors of that size go one to each rank (each rank
    served rises above all the others), so whole rounds are added at once."""
    counts: dict[int, int] = {}
    for count, _, numel in tensors:
        counts[numel] = counts.get(numel, 0) + count
    loads = [0] * n
    heap = [(0, rank) for rank in range(n)]  # (load, rank): the least load, then the first rank
    for numel in sorted(counts, reverse=True):
        left = counts[numel]
        while left:
            if left >= n and max(loads) - heap[0][0] < numel:
                rounds = left // n
                loads = [load + rounds * numel for load in loads]
                heap = sorted((load, rank) for rank, load in enumerate(loads))
                left -= rounds * n
                continue
            load, rank = heap[0]
            loads[rank] = load + numel
            heapq.heapreplace(heap, (load + numel, rank))
            left -= 1
    return tuple(loads)
