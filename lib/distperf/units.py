"""Sizes and durations as people write them: ``16GiB`` in, ``1.50 GiB`` and ``12.000 ms`` out."""
from __future__ import annotations

import re

from .config import ConfigError

SIZE_UNITS = {"": 2**30, "gib": 2**30, "gb": 1e9, "mib": 2**20, "mb": 1e6, "b": 1}
MAX_SIZE = 2.0**60  # 1 EiB: far beyond any device, and a float the planner can compare with


def parse_size(text: str, field: str = "memory_limit") -> float:
    """``16GiB``, ``16GB``, ``500MiB``, ``12e9B``; a bare number is GiB. ConfigError(field) otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in SIZE_UNITS or float(match.group(1)) <= 0:
        raise ConfigError(field, f"must be a positive size such as 16GiB, 16GB or 500MiB, got {text!r}")
    size = float(match.group(1)) * SIZE_UNITS[match.group(2)]
    if not 1 <= size <= MAX_SIZE:  # a size of infinity (1e400) or below a byte
        raise ConfigError(field, f"must be from 1 B to 1 EiB (2^60 bytes), got {text!r}")
    return size


def format_bytes(n: float, decimals: int = 2) -> str:
    """``n`` bytes in the largest binary unit it reaches, with ``decimals`` places (25 MiB is "25.00 MiB", or
    "25 MiB" with none)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.{decimals}f} {unit}"
    return f"{n:,.0f} B"


def format_seconds(x: float) -> str:
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(x) >= size:
            return f"{x / size:,.3f} {unit}"
    return f"{x * 1e9:,.1f} ns" if x else "0 s"
