"""The prediction beside a run, and the signed errors between them (``python -m distperf run``).

**Hardware** (``run --hardware``), chosen after the run, so that nothing here disturbs its timing:

- a preset name, or a profile file (``python -m distperf calibrate`` writes one): used as given;
- ``auto`` (the default): ``data/fresh/<scale>/hardware.json``, else ``hardware-<T>threads.json`` next to
  it, if it was calibrated at the thread count T of the run's ranks (a CPU rank with one thread runs
  matrix products at about half the rate of one with two; on CUDA any profile of the GPU serves);
  otherwise a quick calibration of this machine now (``calibrate --quick`` at T threads, collectives on
  the run's number of ranks; a few seconds, not saved);
- ``none``: no prediction.

The JSON says which (``prediction.hardware_source``).

**Two predictions of time** (the issue's "analytical" and "profiled"): the cost model with compute as
FLOPs over the calibrated matrix-product rate, and with compute from profiled per-layer forward and
backward times (:func:`distperf.cost.predict` with ``layer_times``). Layer times come from the
calibration sidecar when it holds this model (same hidden size, heads, ffn, vocabulary, sequence,
dropout), this micro-batch and thread count, else they are measured now (quick). Both use the same
α-β communication terms. Layer times are fp32: with mixed precision the profiled prediction is left out.

**Errors** are signed and relative, (predicted − measured)/measured
(:func:`distperf.results.signed_error`): negative means the model under-predicts. Where the
measurement is 0 the error is 0 if the prediction is 0 too, else undefined (null).

- ``iteration_time_s`` {analytical, profiled}: against the median measured step;
- ``memory_bytes`` {parameters, gradients, optimizer_states, activations, total}: the measured most
  loaded rank (largest total) against the prediction for its pipeline rank (``stage``; the cost
  model's own most loaded rank may be another one, when temporaries, which it leaves out, tip the
  balance); measured ``total`` also holds temporaries and ``other``. ``memory_bytes_by_stage``: the
  same for every pipeline rank (its most loaded replica);
- ``model_states_at_rest``: what a rank keeps between steps, per pipeline rank (max over its
  replicas); exact storage accounting on both sides, so 0 unless the model and the trainer disagree;
- ``communication_bytes`` {data_parallel, tensor_parallel, pipeline_parallel, total}: predicted
  bytes sent against measured ``sent_bytes`` (ring volumes), the most any rank sends per kind;
- ``exposed_s`` {analytical, profiled}: predicted exposed communication + bubble against the
  measured exposed waiting time of the most exposed rank (its thread blocked on communication or on
  its pipeline neighbours).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..config import Config, ConfigError
from ..results import signed_error

MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "total")
STATE_CATEGORIES = ("parameters", "gradients", "optimizer_states")
KINDS = ("data_parallel", "tensor_parallel", "pipeline_parallel")
SPEC_FIELDS = ("hidden", "heads", "ffn", "vocab", "seq", "dropout", "arch")


def error(predicted, measured):
    """Signed relative error; 0 when both are 0; None when only the measurement is 0 or either is missing."""
    if predicted is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return float(signed_error(predicted, measured))


# --- hardware ----------------------------------------------------------------------------------------

def _sidecar(profile: Path) -> dict | None:
    from .calibrate import sidecar_path

    path = sidecar_path(profile)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _threads_match(side: dict | None, threads: int | None) -> bool:
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
        side = _sidecar(Path(choice))
        source = {"choice": choice, "kind": "profile", "path": str(Path(choice).resolve()),
                  "threads": side.get("threads") if side else None, "quick": side.get("quick") if side else None}
        if not _threads_match(side, threads):
            source["note"] = (f"calibrated at {side.get('threads')} thread(s), the ranks ran {threads}: "
                              "matrix-product rates and layer times do not apply as measured")
        return hw, side, source
    from ..hardware import load_profile

    for path in auto_profiles(threads if device == "cpu" else None):
        if path.is_file():
            side = _sidecar(path)
            if device != "cpu" or _threads_match(side, threads):
                return load_profile(path), side, {"choice": "auto", "kind": "profile", "path": str(path),
                                                  "threads": side.get("threads") if side else None,
                                                  "quick": side.get("quick") if side else None}
    return quick_calibration(threads, world_size, device, spec, micro_batch)


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


# --- layer times ---------------------------------------------------------------------------------------

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


# --- prediction and errors -------------------------------------------------------------------------------

def predictions(cfg: Config, result: dict, choice: str) -> dict | None:
    """The ``prediction`` of a run's result: the cost model's output on the chosen hardware, with
    ``hardware_source`` and ``profiled`` (time from profiled layer times) added; None for ``none``."""
    from ..cost import predict

    opts = result["options"]
    device = opts.get("device", "cpu")
    threads = result.get("threads_per_rank") if device == "cpu" else None
    hw, side, source = choose_hardware(choice, threads, cfg.layout.world_size, device, cfg.model, cfg.layout.micro_batch)
    if hw is None:
        return None
    bucket = opts.get("bucket_mb", 25.0) * 2**20
    out = predict(cfg, hw, bucket_bytes=bucket, check=False)
    out["hardware_source"] = source
    if source["kind"] == "preset":
        out["profiled"] = {"unavailable": "a hardware preset has no profiled layer times of this machine"}
        return out
    times, where = layer_times_for(cfg, side, threads, device)
    if times is None:
        out["profiled"] = {"unavailable": where}
        return out
    profiled = predict(cfg, hw, bucket_bytes=bucket, check=False, layer_times=times)
    out["profiled"] = {"time_s": profiled["time_s"], "bubble_fraction": profiled["bubble_fraction"],
                       "layer_times": {part: {"forward_s": f, "backward_s": b} for part, (f, b) in times.items()},
                       "layer_times_source": where}
    return out


def _by_stage(memory: dict, keys, prefix: str = "") -> list[dict]:
    """Per pipeline rank: the categories of its most loaded replica (largest total) or, for the states
    at rest, the largest of each."""
    per = memory["per_rank"]
    stages = sorted(set(per["pipeline_rank"]))
    out = []
    for stage in stages:
        ranks = [i for i, s in enumerate(per["pipeline_rank"]) if s == stage]
        if prefix:
            out.append({k: max(per[prefix + k][i] for i in ranks) for k in keys})
        else:
            top = max(ranks, key=lambda i: per["total"][i])
            out.append({k: per[k][top] for k in keys})
    return out


def errors(result: dict, prediction: dict) -> dict:
    """The ``error`` of a run's result against its ``prediction`` (see the module docstring)."""
    measured_time = result["iteration_time_s"]["median"]
    profiled = prediction.get("profiled", {}).get("time_s")
    out = {"iteration_time_s": {"analytical": error(prediction["time_s"]["iteration"], measured_time),
                                "profiled": error(profiled["iteration"], measured_time) if profiled else None}}
    memory = result.get("memory_bytes")
    if memory is not None:
        stage = memory["per_rank"]["pipeline_rank"][memory["rank"]]
        pred = prediction["memory_bytes_by_stage"][stage]
        out["memory_bytes"] = {**{k: error(pred[k], memory[k]) for k in MEMORY_CATEGORIES}, "stage": stage}
        out["memory_bytes_by_stage"] = [{k: error(p[k], m[k]) for k in MEMORY_CATEGORIES}
                                        for p, m in zip(prediction["memory_bytes_by_stage"],
                                                        _by_stage(memory, MEMORY_CATEGORIES))]
        out["model_states_at_rest"] = [{k: error(p[k], m[k]) for k in STATE_CATEGORIES}
                                       for p, m in zip(prediction["model_states_at_rest_by_stage"],
                                                       _by_stage(memory, STATE_CATEGORIES, "at_start."))]
    comm = result.get("communication")
    if comm is not None:
        pred = prediction["communication_bytes"]
        sent = comm["sent_bytes"]
        out["communication_bytes"] = {k: error(pred[k], sent.get(k, 0)) for k in KINDS}
        out["communication_bytes"]["total"] = error(sum(pred[k] for k in KINDS), sent["total"])
        exposed = comm["exposed_s"]["total"]
        t = prediction["time_s"]
        out["exposed_s"] = {"analytical": error(t["communication_exposed"] + t["bubble"], exposed),
                            "profiled": error(profiled["communication_exposed"] + profiled["bubble"], exposed)
                            if profiled else None}
    return out


def attach(cfg: Config, result: dict, choice: str) -> dict:
    """Add ``prediction`` and ``error`` to a run's result (in place; also returned)."""
    prediction = predictions(cfg, result, choice)
    result["prediction"] = prediction
    result["error"] = errors(result, prediction) if prediction is not None else None
    return result


def check_choice(choice: str) -> None:
    """Refuse a --hardware value that is neither auto, none, a preset nor a readable profile, before any run."""
    from ..hardware import PRESETS, load_profile

    if choice in ("auto", "none") or choice in PRESETS:
        return
    if not os.path.isfile(choice):
        raise ConfigError("hardware", f"{choice!r} is neither auto, none, a preset ({', '.join(PRESETS)}) "
                                      "nor a profile file")
    load_profile(choice)
