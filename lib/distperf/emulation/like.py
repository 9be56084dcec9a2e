"""``--network-like PRESET``: the link rate that gives this machine a target cluster's FLOP per byte.

A GPU cluster does 10^3 to 10^4 floating-point operations in the time its network moves one byte to a
GPU; a CPU core on loopback, about 10^2. To put this machine in the target's regime, keep that ratio:

    per-rank rate  b = F_here · B_target / F_target
    node link rate   = R · b          (``inter``; R = ranks_per_node)

- ``F_here``: the fp32 matrix-product rate one rank achieves here (``flops_fp32`` × efficiency of this
  machine's calibrated profile, measured at the ranks' thread count; or measured now:
  :func:`distperf.measure.profiles.flops_here`);
- ``F_target``: the target's mixed-precision (16-bit tensor-core) rate, ``flops_16bit`` × its
  ``flops_efficiency`` (1 in the presets: datasheet peak) — the precision the target trains in, while the
  ranks here train in fp32;
- ``B_target``: the target's inter-node bandwidth per GPU and direction (one NIC per GPU: 25 Gbit/s per
  V100 of a p3.16xlarge as in the PipeDream-2BW paper, 400 Gbit/s per H100); here one link carries a
  node's R ranks, hence R · b.

Limits: only bandwidth is scaled. Latency is not (a shaped veth adds about 0.1 ms of software latency
per message, more than InfiniBand's microseconds, and tbf's queue adds more under load); the intra-node
links are not scaled (a node's ranks share its loopback, unshaped unless ``intra`` is set); memory
bandwidth and capacity are not scaled either. A derived rate under
:data:`~distperf.emulation.spec.MIN_RATE_BIT` is refused: tbf cannot shape it sensibly (a 1500-byte
frame would take over 0.1 s).
"""
from __future__ import annotations

from dataclasses import replace

from ..config import ConfigError
from .spec import MAX_RATE_BIT, MIN_RATE_BIT, NetworkSpec, format_rate


def derived_rate(flops_here: float, target, ranks_per_node: int) -> dict:
    """{per_rank_bytes_per_s, inter_bit_per_s, flop_per_byte, …} for a target :class:`Hardware`."""
    f_target = target.flops("mixed")
    flop_per_byte = f_target / target.inter_bandwidth
    per_rank = flops_here / flop_per_byte
    return {"target": target.name, "target_flops": f_target, "target_inter_bandwidth": target.inter_bandwidth,
            "flop_per_byte": flop_per_byte, "flops_here": flops_here, "per_rank_bytes_per_s": per_rank,
            "inter_bit_per_s": 8 * per_rank * ranks_per_node}


def resolve(spec: NetworkSpec, preset: str, flops_here: float) -> tuple[NetworkSpec, dict]:
    """``spec`` with ``inter`` derived from the target ``preset``; ConfigError if ``spec`` sets inter too,
    if the preset is unknown, or if the rate is outside what tbf can shape."""
    from ..hardware import PRESETS
    from ..hardware import preset as find_preset

    if spec.inter:
        raise ConfigError("network_like", "derives inter; give --network without inter=RATE, or no --network-like")
    target = find_preset(preset)
    if target is None:
        raise ConfigError("network_like", f"must be a hardware preset ({', '.join(PRESETS)}), got {preset!r}")
    info = derived_rate(flops_here, target, spec.ranks_per_node)
    rate = info["inter_bit_per_s"]
    if rate < MIN_RATE_BIT:
        raise ConfigError("network_like", f"the derived link rate {rate:.3g} bit/s is below "
                                          f"{format_rate(MIN_RATE_BIT)}, which tbf cannot shape sensibly (a "
                                          "1500-byte frame would take over 0.1 s); use a larger model or more "
                                          "threads per rank, or set inter=RATE")
    if rate > MAX_RATE_BIT:
        raise ConfigError("network_like", f"the derived link rate {format_rate(rate)} is above "
                                          f"{format_rate(MAX_RATE_BIT)}, more than tbf on this machine can shape")
    return replace(spec, inter=rate), info


def describe(info: dict, spec: NetworkSpec) -> str:
    """One line: the derivation with its numbers."""
    return (f"network like {info['target']}: {info['target_flops'] / 1e12:.4g} TFLOP/s (16-bit) over "
            f"{info['target_inter_bandwidth'] * 8 / 1e9:.4g} Gbit/s per GPU = {info['flop_per_byte']:,.0f} FLOP/byte; "
            f"here {info['flops_here'] / 1e9:.3g} GFLOP/s (fp32) per rank -> {info['per_rank_bytes_per_s'] * 8 / 1e6:.3g} "
            f"Mbit/s per rank, inter={format_rate(spec.inter)} per node of {spec.ranks_per_node} rank(s)")

