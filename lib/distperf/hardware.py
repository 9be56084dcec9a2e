"""The hardware a configuration runs on: named presets, or a profile file written by calibration.

A :class:`Hardware` gives the cost model what it needs to turn FLOPs and bytes into seconds: peak
FLOP/s per precision, the fraction of it that matrix products reach, memory bandwidth and capacity,
and the α-β parameters (latency, bandwidth per direction) of the links inside a node and between nodes.

Preset numbers are vendor datasheet peaks (dense, no sparsity); fp32 means plain fp32 (no TF32, as
PyTorch's default for matrix products); "16bit" is fp16/bf16 tensor-core peak. Intra-node bandwidth
is NVLink per direction; inter-node bandwidth is one NIC per GPU. Latencies are order-of-magnitude
assumptions, not measurements. ``flops_efficiency`` is 1.0 and ``memory_passes`` 0 in presets (the
memory-bound operators are left out, :func:`distperf.cost.activations.layer_traffic_bytes`): an uncalibrated
prediction is an ideal lower bound on time.

A profile file is a JSON object with exactly the fields of :class:`Hardware` (``flops_efficiency``,
``memory_passes`` and ``kernels`` optional); ``python -m distperf calibrate`` writes one for this machine.
``kernels`` (:class:`distperf.cost.kernels.KernelCosts`: the measured time of each kind of kernel by shape)
switches the compute term from FLOPs over one rate to the kernels a step launches; ``collectives`` ([kind, α, β]
rows) times each kind of collective inside a node with its own fit; the presets have neither.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from typing import TYPE_CHECKING

from .config import ConfigError

if TYPE_CHECKING:  # distperf.cost imports this module
    from .cost.kernels import KernelCosts

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Hardware:
    name: str
    flops_fp32: float  # peak FLOP/s, fp32
    flops_16bit: float  # peak FLOP/s, fp16/bf16 matrix products
    memory_bandwidth: float  # bytes/s
    memory_capacity: float  # bytes per device
    intra_bandwidth: float  # bytes/s per direction, device to device inside a node
    intra_latency: float  # s per message inside a node
    inter_bandwidth: float  # bytes/s per direction per device, between nodes
    inter_latency: float  # s per message between nodes
    devices_per_node: int
    flops_efficiency: float = 1.0  # achieved / peak for the model's matrix products
    memory_passes: float = 0.0  # memory-bound traffic per layer in stashed bytes (cost.activations); 0: left out
    kernels: KernelCosts | None = None  # measured kernel times by shape (calibrate), else FLOPs over the rate
    collectives: tuple = ()  # ((kind, α s, β bytes/s), …): each collective as a step issues it, inside a node
    collectives_on: tuple = ()  # (intra_latency, intra_bandwidth) of the calibration the fits belong to

    def __post_init__(self):
        # the cost model caches per hardware: hash the fields once, not on every lookup
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        return self._hash

    def flops(self, precision: str) -> float:
        """Achieved FLOP/s for the given training precision (fp32 or mixed)."""
        return (self.flops_16bit if precision == "mixed" else self.flops_fp32) * self.flops_efficiency

    def link(self, group_span: int) -> tuple[float, float]:
        """(latency, bandwidth) of a group whose ranks lie within ``group_span`` consecutive devices."""
        if group_span <= self.devices_per_node:
            return self.intra_latency, self.intra_bandwidth
        return self.inter_latency, self.inter_bandwidth

    def fitted(self, kind: str, group_span: int) -> tuple[float, float] | None:
        """(α, β) fitted for collectives of ``kind`` inside a node by calibration, on the ring algorithm's steps and
        volume (:func:`distperf.measure.calibrate.ring_terms`), or None: none fitted, a group across nodes, or a
        profile whose intra-node link is no longer the one of the calibration (``collectives_on``)."""
        if not self.collectives or group_span > self.devices_per_node:
            return None
        if tuple(self.collectives_on) != (self.intra_latency, self.intra_bandwidth):
            return None
        return next(((a, b) for k, a, b in self.collectives if k == kind), None)


def _gpu(name, fp32_tflops, bf16_tflops, hbm_gbs, capacity_gib, nvlink_gbs, nic_gbs, per_node=8):
    return Hardware(name=name, flops_fp32=fp32_tflops * 1e12, flops_16bit=bf16_tflops * 1e12,
                    memory_bandwidth=hbm_gbs * GB, memory_capacity=capacity_gib * GIB,
                    intra_bandwidth=nvlink_gbs * GB, intra_latency=5e-6,
                    inter_bandwidth=nic_gbs * GB, inter_latency=1e-5, devices_per_node=per_node)


PRESETS: dict[str, Hardware] = {
    h.name: h
    for h in [
        # V100 SXM2: NVLink2 300 GB/s total; p3.16xlarge networking 25 Gbit/s (the 2BW paper's servers).
        _gpu("V100-16GB", 15.7, 125, 900, 16, 150, 3.125),
        # A100 SXM4: NVLink3 600 GB/s total; HDR InfiniBand 200 Gbit/s per GPU (DGX A100).
        _gpu("A100-40GB", 19.5, 312, 1555, 40, 300, 25),
        _gpu("A100-80GB", 19.5, 312, 2039, 80, 300, 25),
        # H100 / H200 SXM5: NVLink4 900 GB/s total; NDR InfiniBand 400 Gbit/s per GPU (DGX H100/H200).
        _gpu("H100-80GB", 67, 989, 3350, 80, 450, 50),
        _gpu("H200", 67, 989, 4800, 141, 450, 50),
    ]
}

DEFAULT = "A100-80GB"


def load_profile(path: str | Path) -> Hardware:
    """Read a hardware profile (JSON); a malformed one raises ConfigError('hardware', rule)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError("hardware", f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("hardware", f"{path}: cannot be read ({e.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ConfigError("hardware", f"{path}: must hold a JSON object")
    known = {f.name: f for f in fields(Hardware)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError("hardware", f"{path}: unknown field(s) {', '.join(unknown)}")
    missing = [n for n, f in known.items()
               if n not in data and n not in ("name", "flops_efficiency", "memory_passes", "kernels", "collectives",
                                           "collectives_on")]
    if missing:
        raise ConfigError("hardware", f"{path}: missing field(s) {', '.join(missing)}")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("hardware", f"{path}: name must be a non-empty string, got {name!r}")
    values = {"name": name}
    if data.get("kernels") is not None:
        from .cost.kernels import KernelCosts

        try:
            values["kernels"] = KernelCosts.from_dict(data["kernels"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ConfigError("hardware", f"{path}: kernels is malformed ({e.__class__.__name__}: {e})") from None
    if data.get("collectives"):
        rows = data["collectives"]
        if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
                    for x in r[1:]) for r in rows):
            raise ConfigError("hardware", f"{path}: collectives must be a list of [kind, alpha, beta] with positive "
                                          "finite numbers")
        values["collectives"] = tuple((r[0], float(r[1]), float(r[2])) for r in rows)
        link = data.get("collectives_on")
        if not (isinstance(link, list) and len(link) == 2 and all(isinstance(x, (int, float)) for x in link)):
            raise ConfigError("hardware", f"{path}: collectives_on must be [intra_latency, intra_bandwidth] of the "
                                          "calibration the collectives were fitted with")
        values["collectives_on"] = (float(link[0]), float(link[1]))
    for name in known:
        if name in ("name", "kernels", "collectives", "collectives_on") or name not in data:
            continue
        value = data[name]
        if name == "memory_passes" and value == 0:  # 0 leaves the memory-bound operators out
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError("hardware", f"{path}: {name} must be a positive number, got {value!r}")
        if name == "devices_per_node" and int(value) != value:
            raise ConfigError("hardware", f"{path}: devices_per_node must be an integer, got {value!r}")
        if name == "flops_efficiency" and value > 1:
            raise ConfigError("hardware", f"{path}: flops_efficiency must lie in (0, 1], got {value!r}")
        values[name] = int(value) if name == "devices_per_node" else float(value)
    return Hardware(**values)


def save_profile(hw: Hardware, path: str | Path) -> None:
    data = {f.name: getattr(hw, f.name) for f in fields(Hardware)}
    data["kernels"] = hw.kernels.to_dict() if hw.kernels is not None else None
    data["collectives"] = [list(row) for row in hw.collectives]
    data["collectives_on"] = list(hw.collectives_on)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def preset(name: str) -> Hardware | None:
    """A hardware preset by name, in any case (``v100-16gb`` is ``V100-16GB``); None when there is none."""
    return PRESETS.get(name) or next((hw for key, hw in PRESETS.items() if key.lower() == str(name).lower()), None)


def hardware(name_or_path: str) -> Hardware:
    """A preset by name (any case), else a profile file by path; neither raises ConfigError('hardware', …)."""
    if (found := preset(name_or_path)) is not None:
        return found
    if Path(name_or_path).is_file():
        return load_profile(name_or_path)
    raise ConfigError("hardware", f"{name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a profile file")


def check_choice(choice: str) -> None:
    """Refuse a ``run --hardware`` value that is neither auto, none, a preset nor a readable profile, before any
    run (:mod:`distperf.measure.profiles` resolves ``auto`` after the run)."""
    if choice in ("auto", "none") or preset(choice) is not None:
        return
    if not Path(choice).is_file():
        raise ConfigError("hardware", f"{choice!r} is neither auto, none, a preset ({', '.join(PRESETS)}) "
                                      "nor a profile file")
    load_profile(choice)
