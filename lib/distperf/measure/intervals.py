"""Sets of time intervals ((start, end) pairs, any unit) as the profiler-based measurements use them."""
from __future__ import annotations


def union(intervals) -> list[tuple[float, float]]:
    """The disjoint, sorted intervals covering ``intervals`` (empty ones dropped)."""
    out = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(intervals) -> float:
    """Total length of disjoint ``intervals``."""
    return sum(b - a for a, b in intervals)


def subtract(intervals, minus) -> list[tuple[float, float]]:
    """Parts of the (disjoint, sorted) ``intervals`` not covered by the (disjoint, sorted) ``minus``."""
    out, j = [], 0
    for a, b in intervals:
        while j < len(minus) and minus[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < len(minus) and minus[k][0] < b:
            if minus[k][0] > cur:
                out.append((cur, minus[k][0]))
            cur = max(cur, minus[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def intersect(intervals, other) -> list[tuple[float, float]]:
    """Parts of the (disjoint, sorted) ``intervals`` that ``other`` (disjoint, sorted) covers."""
    return subtract(intervals, subtract(intervals, other))
