"""Which hardware profile and which layer times a run's prediction uses (``run --hardware``).

Chosen after the run, so that nothing here disturbs its timing:

- a preset name, or a profile file (``python -m distperf calibrate`` writes one): used as given;
- ``auto`` (the default): ``data/fresh/<scale>/hardware.json``, else ``hardware-<T>threads.json`` next to
  it, if it was calibrated at the thread count T of the run's ranks (a CPU rank with one thread runs
  matrix products at about half the rate of one with two; on CUDA any profile of the GPU serves);
  otherwise a quick calibration of this machine now (``calibrate --quick`` at T threads, collectives on
  the run's number of ranks; a few seconds, not saved);
- ``none``: no prediction.

Profiled layer times (for the prediction with compute from measured per-layer forward and backward times)
come from the calibration sidecar when it holds this model (same hidden size, heads, ffn, vocabulary,
sequence, dropout), this micro-batch and thread count, else they are measured now (quick). They are fp32:
with mixed precision there are none.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..config import Config

SPEC_FIELDS = ("hidden", "heads", "ffn", "vocab", "seq", "dropout", "arch")


def sidecar_path(profile: Path) -> Path:
    """Where the calibration keeps its measurements beside a profile: ``<profile stem>.calibration.json``."""
    profile = Path(profile)
    return profile.with_name(profile.stem + ".calibration.json")


def read_sidecar(profile: Path) -> dict | None:
    """The calibration's measurements next to a profile (:func:`sidecar_path`), or None."""
    path = sidecar_path(profile)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def sidecar_conditions(side: dict | None) -> dict:
    """The sidecar's ``conditions``: what the calibration measured with its ranks at once (the noisy probes' rounds,
    the what-ifs' probes); {} without a sidecar or without them."""
    return (side or {}).get("conditions") or {}


def threads_match(side: dict | None, threads: int | None) -> bool:
    """Whether a profile was calibrated at ``threads`` threads (unknown on either side counts as yes)."""
    return threads is None or side is None or side.get("threads") == threads


def auto_profiles(threads: int | None) -> list[Path]:
    """Where ``auto`` looks for a profile of this machine, in order."""
    from ..results import book_scale, fresh_dir

    base = fresh_dir(book_scale())
    return [base / "hardware.json"] + ([base / f"hardware-{threads}threads.json"] if threads else [])


def choose_hardware(choice: str, threads: int | None, world_size: int, device: str, spec, micro_batch: int):
    """(Hardware or None, sidecar or None, source dict) for ``--hardware choice``."""
    from ..hardware import PRESETS, hardware

    if choice == "none":
        return None, None, {"choice": choice, "kind": "none"}
    if choice != "auto":
        hw = hardware(choice)  # ConfigError('hardware', …) if neither a preset nor a file
        if choice in PRESETS:
            return hw, None, {"choice": choice, "kind": "preset", "name": hw.name}
        side = read_sidecar(Path(choice))
        source = {"choice": choice, "kind": "profile", "path": str(Path(choice).resolve()),
                  "threads": side.get("threads") if side else None, "quick": side.get("quick") if side else None}
        if not threads_match(side, threads):
            source["note"] = (f"calibrated at {side.get('threads')} thread(s), the ranks ran {threads}: "
                              "matrix-product rates and layer times do not apply as measured")
        return hw, side, source
    from ..hardware import load_profile

    path = auto_profile(threads, device)
    if path is not None:
        side = read_sidecar(path)
        return load_profile(path), side, {"choice": "auto", "kind": "profile", "path": str(path),
                                          "threads": side.get("threads") if side else None,
                                          "quick": side.get("quick") if side else None}
    return quick_calibration(threads, world_size, device, spec, micro_batch)


def auto_profile(threads: int | None, device: str) -> Path | None:
    """The profile ``--hardware auto`` reads for ranks of ``threads`` threads on ``device`` (:func:`auto_profiles`,
    the first calibrated at that thread count on a CPU), or None where it calibrates now (:func:`quick_calibration`)."""
    for path in auto_profiles(threads if device == "cpu" else None):
        if path.is_file() and (device != "cpu" or threads_match(read_sidecar(path), threads)):
            return path
    return None


def quick_calibration(threads: int | None, world_size: int, device: str, spec, micro_batch: int):
    """Calibrate this machine now, quickly, at the ranks' thread count (not saved)."""
    import torch

    from .calibrate import calibrate

    before = torch.get_num_threads()
    try:
        hw, side = calibrate(quick=True, models=(spec,), micro_batches=(micro_batch,), ranks=max(2, world_size),
                             threads=threads, device=device, log=lambda msg: None)
    finally:
        torch.set_num_threads(before)
    side.pop("collectives", None)
    return hw, side, {"choice": "auto", "kind": "quick calibration",
                      "note": f"no profile of this machine at {threads} thread(s) in {auto_profiles(threads)[0].parent}; "
                              "calibrated now with calibrate --quick (not saved)", "threads": side["threads"],
                      "quick": True}


def layer_times_for(cfg: Config, side: dict | None, threads: int | None, device: str) -> tuple[dict | None, str]:
    """({part: (forward_s, backward_s)}, where they come from) for this model and micro-batch, from
    the sidecar when it has them, else measured now; (None, reason) when they cannot serve."""
    if cfg.training.precision != "fp32":
        return None, "profiled layer times are fp32; this run is mixed precision"
    spec, b = cfg.model, cfg.layout.micro_batch
    rows = [r for r in (side or {}).get("layers", []) if r.get("micro_batch") == b
            and all(r.get(f, getattr(spec, f)) == getattr(spec, f) for f in SPEC_FIELDS)
            and (r.get("threads", side.get("threads")) == threads or threads is None)
            and (r.get("model") == spec.name or "heads" in r)]
    times = {r["part"]: (r["forward_s"], r["backward_s"]) for r in rows}
    if {"layer", "embedding", "head"} <= set(times):
        return times, "calibration sidecar"
    import torch

    from .calibrate import layer_times

    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        rows = layer_times(spec, (b,), device, min_run_time=0.05)
    finally:
        torch.set_num_threads(before)
    return {r["part"]: (r["forward_s"], r["backward_s"]) for r in rows}, \
        f"measured now (quick, {threads or before} thread(s)): the calibration has none for this model and micro-batch"


def this_machine(scale: str) -> Path:
    """This machine's profile at ``scale``, ``data/fresh/<scale>/hardware.json``: the calibration notebook writes
    it; when it has not (a notebook run on its own), a quick calibration (one thread per rank) makes it now."""
    import subprocess
    import sys

    from ..results import fresh_dir

    profile = fresh_dir(scale) / "hardware.json"
    if not profile.exists():
        subprocess.run([sys.executable, "-m", "distperf", "calibrate", "--quick", "--scale", scale, "--out",
                        str(profile)], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return profile


# calibrate's flags for the book's profile of this machine, per scale (notebooks/calibration.ipynb, and the second
# calibration of notebooks/time_breakdown.ipynb)
CALIBRATION_FLAGS = {
    "smoke": ["--quick", "--models", "small"],
    "cpu": ["--models", "tiny,small", "--micro-batches", "1,2,4"],
    "gpu": ["--models", "gpt2,gpt2-medium", "--micro-batches", "1,2,4,8"],
}
AGAIN = "hardware-again.json"  # the second calibration, next to hardware.json


def calibrate_once(profile: Path, flags: list[str], device: str = "cpu", timeout: float = 900.0) -> dict:
    """Run ``python -m distperf calibrate FLAGS --out PROFILE`` with one thread (every rank of the book's runs
    computes with one), unless a profile is already there: it is kept, but for a quick one when ``flags`` ask
    for a full calibration. Returns the calibration's sidecar (its measurements)."""
    import subprocess
    import sys

    side = read_sidecar(profile)
    if side is None or (side["quick"] and "--quick" not in flags):
        cmd = [sys.executable, "-m", "distperf", "calibrate", "--out", str(profile), "--device", device,
               "--threads", "1", *flags]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        print(" ".join(cmd[1:]), done.stdout[-4000:], sep="\n")
        if done.returncode:
            raise RuntimeError(f"calibrate failed ({done.returncode}): {done.stderr[-2000:]}")
        side = json.loads(sidecar_path(profile).read_text())
    else:
        print(f"kept {profile} (measured {side['provenance']['date']})")
    return side


def flops_here(hardware: str | None, threads: int | None) -> float:
    """This machine's fp32 matrix-product rate per rank: from ``hardware`` when it is a profile file,
    else from this machine's calibrated profile at ``threads`` threads (:func:`auto_profiles`), else measured
    now (a few matrix products at that thread count, under a second)."""
    from ..hardware import load_profile

    if hardware and Path(hardware).is_file():
        return load_profile(hardware).flops("fp32")
    for path in auto_profiles(threads):
        if path.is_file() and threads_match(read_sidecar(path), threads):
            return load_profile(path).flops("fp32")
    import torch

    from .calibrate import SIZES_QUICK, gemm_rates

    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        return max(r["flops_per_s"] for r in gemm_rates(SIZES_QUICK, [torch.float32], "cpu", 0.05))
    finally:
        torch.set_num_threads(before)

