"""The prediction beside a run, and the signed errors between them (``python -m distperf run``).

The hardware and the layer times the prediction uses are chosen by :mod:`distperf.measure.profiles`; the
JSON says which (``prediction.hardware_source``).

**Two predictions of time** ("analytical" and "profiled"): the cost model with compute as FLOPs over the
calibrated matrix-product rate (or the measured kernel times, scaled to the speed the run's own speed probe measured
where the run and the profile took one: :func:`distperf.measure.speed.at_speed`, ``prediction.at_run_speed``), and
with compute from profiled forward and backward times (:func:`distperf.cost.predict` with ``layer_times``): those the
run's own ranks measured, all at once, on their own shapes, after the measurement steps (``part_times``,
:mod:`distperf.measure.parts`), else one process's per-layer times, every other term as calibrated. Both use the same
α-β communication terms, with the
collective algorithms of the run's backend (gloo's or NCCL's). The prediction counts what the trainer runs
(``convention="trainer"``).

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
  bytes sent against measured ``sent_bytes`` (algorithmic: ring volumes), the most any rank sends per kind;
- ``communication_wire_bytes`` (same keys, gloo runs only): predicted against measured ``wire_bytes``, what
  gloo's algorithms send (:mod:`distperf.cost.collectives`);
- ``exposed_s`` {analytical, profiled}: predicted exposed communication + bubble against the
  measured exposed waiting time of the most exposed rank (its thread blocked on communication or on
  its pipeline neighbours).
"""
from __future__ import annotations

from ..config import COMMUNICATION_KINDS as KINDS
from ..config import MEMORY_CATEGORIES, MODEL_STATES, Config
from ..results import signed_error

COMPARED = MEMORY_CATEGORIES + ("total",)
PARTS = ("layer", "embedding", "head")


def predictions(cfg: Config, result: dict, choice: str) -> dict | None:
    """The ``prediction`` of a run's result: the cost model's output on the chosen hardware, with
    ``hardware_source`` and ``profiled`` (time from profiled layer times) added; None for ``none``."""
    from ..cost import predict
    from .profiles import choose_hardware, layer_times_for
    from .speed import at_speed

    opts = result["options"]
    device = opts.get("device", "cpu")
    threads = result.get("threads_per_rank") if device == "cpu" else None
    hw, side, source = choose_hardware(choice, threads, cfg.layout.world_size, device, cfg.model, cfg.layout.micro_batch)
    if hw is None:
        return None
    bucket = opts.get("bucket_mb", 25.0) * 2**20
    backend = "gloo" if result.get("backend") == "gloo" else "nccl"
    at_run = at_speed(hw, result.get("speed_probe"))  # the analytical mode's rule: the run's own speed
    out = predict(cfg, at_run, bucket_bytes=bucket, check=False, backend=backend)
    out["hardware_source"] = source
    out["at_run_speed"] = at_run is not hw
    if source["kind"] == "preset":
        out["profiled"] = {"unavailable": "a hardware preset has no profiled layer times of this machine"}
        return out
    parts = result.get("part_times")
    if parts is not None:  # measured on the run's own ranks, all at once (measure.parts)
        times = {**{part: (parts[part]["forward_s"], parts[part]["backward_s"]) for part in PARTS},
                 "optimizer": parts["optimizer"], "ranks_at_once": parts["ranks_at_once"]}
        where = "the run's ranks, all at once, after its measurement steps"
    else:
        times, where = layer_times_for(cfg, side, threads, device)
    if times is None:
        out["profiled"] = {"unavailable": where}
        return out
    profiled = predict(cfg, hw, bucket_bytes=bucket, check=False, layer_times=times, backend=backend)
    layer_times = {part: {"forward_s": times[part][0], "backward_s": times[part][1]} for part in PARTS}
    if parts is not None:
        layer_times.update(optimizer=dict(parts["optimizer"]), ranks_at_once=parts["ranks_at_once"])
    out["profiled"] = {"time_s": profiled["time_s"], "bubble_fraction": profiled["bubble_fraction"],
                       "layer_times": layer_times, "layer_times_source": where}
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
    out = {"iteration_time_s": {"analytical": signed_error(prediction["time_s"]["iteration"], measured_time),
                                "profiled": signed_error(profiled["iteration"], measured_time) if profiled else None}}
    memory = result.get("memory_bytes")
    if memory is not None:
        stage = memory["per_rank"]["pipeline_rank"][memory["rank"]]
        pred = prediction["memory_bytes_by_stage"][stage]
        out["memory_bytes"] = {**{k: signed_error(pred[k], memory[k]) for k in COMPARED}, "stage": stage}
        out["memory_bytes_by_stage"] = [{k: signed_error(p[k], m[k]) for k in COMPARED}
                                        for p, m in zip(prediction["memory_bytes_by_stage"],
                                                        _by_stage(memory, COMPARED))]
        out["model_states_at_rest"] = [{k: signed_error(p[k], m[k]) for k in MODEL_STATES}
                                       for p, m in zip(prediction["model_states_at_rest_by_stage"],
                                                       _by_stage(memory, MODEL_STATES, "at_start."))]
    comm = result.get("communication")
    if comm is not None:
        pred = prediction["communication_bytes"]
        sent = comm["sent_bytes"]
        out["communication_bytes"] = {k: signed_error(pred[k], sent.get(k, 0)) for k in KINDS}
        out["communication_bytes"]["total"] = signed_error(sum(pred[k] for k in KINDS), sent["total"])
        wire = comm.get("wire_bytes")
        if wire is not None and prediction.get("backend") == "gloo":
            pred = prediction["communication_wire_bytes"]
            out["communication_wire_bytes"] = {k: signed_error(pred[k], wire.get(k, 0)) for k in KINDS}
            out["communication_wire_bytes"]["total"] = signed_error(sum(pred[k] for k in KINDS), wire["total"])
        exposed = comm["exposed_s"]["total"]
        t = prediction["time_s"]
        out["exposed_s"] = {"analytical": signed_error(t["communication_exposed"] + t["bubble"], exposed),
                            "profiled": signed_error(profiled["communication_exposed"] + profiled["bubble"], exposed)
                            if profiled else None}
    return out


def attach(cfg: Config, result: dict, choice: str) -> dict:
    """Add ``prediction`` and ``error`` to a run's result (in place; also returned)."""
    prediction = predictions(cfg, result, choice)
    result["prediction"] = prediction
    result["error"] = errors(result, prediction) if prediction is not None else None
    return result
