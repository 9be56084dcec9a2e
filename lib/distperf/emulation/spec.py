"""The ``--network`` option: ``nodes=N,ranks_per_node=R,inter=RATE[,intra=RATE]``.

A rate is a number with a unit of bits per second, as ``tc`` writes them: ``bit``, ``kbit``, ``mbit``,
``gbit`` (decimal: 1 mbit = 10^6 bit/s), e.g. ``200mbit``, ``1.5gbit``. ``inter`` is the rate of each
node's link to the switch, per direction (the tbf rate on the wire: Ethernet frames with their headers, so
that TCP's payload gets about 1448/1514 = 95.6 % of it with the default 1500-byte MTU). ``intra`` shapes
the ranks of one node among themselves (their loopback); without it they are unshaped.

Every bad key or value raises ``ConfigError("network", rule)``. Pure Python.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..config import ConfigError

UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
KEYS = ("nodes", "ranks_per_node", "inter", "intra")
MIN_RATE_BIT = 1e5  # 100 kbit/s: below, one 1500-byte frame takes over 0.1 s
MAX_RATE_BIT = 1e11  # 100 gbit/s: tbf on a CPU cannot shape faster (and loopback is slower)
_RATE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)$")


def parse_rate(text: str, field: str = "network") -> float:
    """``200mbit`` → 2e8 (bit/s); ConfigError(field, rule) for anything else or out of range."""
    match = _RATE.match(str(text).strip().lower())
    if not match or match.group(2) not in UNITS:
        raise ConfigError(field, f"a rate is a number and one of the units {', '.join(UNITS)} "
                                 f"(e.g. 200mbit), got {text!r}")
    rate = float(match.group(1)) * UNITS[match.group(2)]
    if not MIN_RATE_BIT <= rate <= MAX_RATE_BIT:
        raise ConfigError(field, f"a rate must lie between {format_rate(MIN_RATE_BIT)} and "
                                 f"{format_rate(MAX_RATE_BIT)}, got {text!r}")
    return rate


def format_rate(bits_per_s: float) -> str:
    """2e8 → ``200mbit``: the largest unit that leaves a number ≥ 1, as tc reads it (integer bit/s
    below a kbit)."""
    for unit in ("gbit", "mbit", "kbit"):
        if bits_per_s >= UNITS[unit]:
            return f"{bits_per_s / UNITS[unit]:.6g}{unit}"
    return f"{bits_per_s:.0f}bit"


@dataclass(frozen=True)
class NetworkSpec:
    """N emulated nodes of R ranks each; ``inter``/``intra`` in bit/s (``intra`` None: unshaped).

    Global rank = node · R + local rank (torchrun's numbering with ``--node-rank``)."""

    nodes: int
    ranks_per_node: int
    inter: float
    intra: float | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def text(self) -> str:
        """The option's canonical text (parse(spec.text()) == spec)."""
        out = f"nodes={self.nodes},ranks_per_node={self.ranks_per_node},inter={format_rate(self.inter)}"
        return out + (f",intra={format_rate(self.intra)}" if self.intra else "")

    def columns(self) -> dict:
        """Tidy columns for a result row."""
        return {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node, "inter_bit_per_s": self.inter,
                "intra_bit_per_s": self.intra, "spec": self.text()}


def parse(text: str, inter_optional: bool = False) -> NetworkSpec:
    """``nodes=2,ranks_per_node=2,inter=200mbit[,intra=1gbit]`` → NetworkSpec.

    With ``inter_optional`` (``--network-like`` supplies the rate), a missing ``inter`` is allowed and
    the result's ``inter`` is 0 until the caller replaces it (:func:`distperf.emulation.like.resolve`)."""
    values: dict[str, str] = {}
    for part in str(text).split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError("network", f"must be KEY=VALUE pairs separated by commas ({', '.join(KEYS)}), "
                                         f"got {part.strip()!r}")
        if key not in KEYS:
            raise ConfigError("network", f"unknown key {key!r}; known: {', '.join(KEYS)}")
        if key in values:
            raise ConfigError("network", f"key {key!r} given twice")
        values[key] = value
    for key in ("nodes", "ranks_per_node"):
        if key not in values:
            raise ConfigError("network", f"needs {key}=N")
    counts = {}
    for key, low in (("nodes", 2), ("ranks_per_node", 1)):
        try:
            counts[key] = int(values[key])
        except ValueError:
            counts[key] = None
        if counts[key] is None or counts[key] < low:
            raise ConfigError("network", f"{key} must be an integer of at least {low}, got {values[key]!r}")
    if counts["nodes"] > 250:
        raise ConfigError("network", f"nodes must be at most 250 (one /24 of addresses), got {counts['nodes']}")
    if "inter" not in values and not inter_optional:
        raise ConfigError("network", "needs inter=RATE (e.g. inter=200mbit), or --network-like PRESET")
    inter = parse_rate(values["inter"]) if "inter" in values else 0.0
    intra = parse_rate(values["intra"]) if "intra" in values else None
    return NetworkSpec(counts["nodes"], counts["ranks_per_node"], inter, intra)


def check_world_size(spec: NetworkSpec, world_size: int) -> None:
    """The run's world size must be nodes · ranks_per_node."""
    if spec.world_size != world_size:
        raise ConfigError("network", f"nodes·ranks_per_node ({spec.nodes}·{spec.ranks_per_node} = "
                                     f"{spec.world_size}) must equal the run's world size (pp·dp·tp = {world_size})")
