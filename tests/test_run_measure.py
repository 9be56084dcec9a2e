"""Measurement steps of a run beside the cost model's prediction (distperf.measure.steps, .compare).

On real gloo ranks with the tiny model (4 layers) and Adam: for every strategy and hybrid, the model states
measured by exact tensor accounting equal the cost model's bytes, between steps and at their peak in a step
(FSDP2's gathered units and unsharded gradients included); the activations agree within 2 %; and the bytes
each kind of parallelism sends equal the cost model's, algorithmic and on gloo's wire. ``python -m distperf
run --json`` carries memory, communication, prediction and errors that follow from its own numbers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dist_harness import spawn, tiny_spec
from distperf import cli, presets
from distperf.commands import run as run_command
from distperf.config import Config, Layout, Training, validate
from distperf.cost import predict
from distperf.measure import speed
from distperf.measure.breakdown import CLASSES
from distperf.measure.steps import BREAKDOWN_STEPS, STEP_KEYS

STATES = ("parameters", "gradients", "optimizer_states")
KINDS = ("data_parallel", "tensor_parallel", "pipeline_parallel")
STATE_TOLERANCE, ACTIVATION_TOLERANCE = 0.005, 0.02  # the acceptance bounds; most points are exact

# name -> (layout, model overrides, precision): every strategy and hybrid, each recomputation mode somewhere
CASES = {
    "dp-math-dropout": (Layout(dp=2, micro_batch=2), {"attention": "math", "dropout": 0.1}, "fp32"),
    "zero1": (Layout(dp=2, micro_batch=2, zero=1), {}, "fp32"),
    "zero2": (Layout(dp=2, micro_batch=1, microbatches=2, zero=2), {}, "fp32"),
    "zero3": (Layout(dp=2, micro_batch=2, zero=3, recompute="selective"), {}, "fp32"),
    "tp": (Layout(tp=2, micro_batch=2, recompute="full"), {}, "fp32"),
    "tp+sp-math": (Layout(tp=2, sequence_parallel=True, microbatches=2, recompute="full"), {"attention": "math"},
                   "fp32"),
    "pp-gpipe-mixed": (Layout(pp=2, schedule="gpipe", micro_batch=2, microbatches=2), {}, "mixed"),
    "pp-1f1b": (Layout(pp=2, schedule="1f1b", micro_batch=1, microbatches=2, recompute="selective"), {}, "fp32"),
    "pp-interleaved": (Layout(pp=2, schedule="interleaved", chunks=2, micro_batch=2, microbatches=2), {}, "fp32"),
    "pp-2bw": (Layout(pp=2, schedule="2bw", micro_batch=1, microbatches=2), {}, "fp32"),
    "dp×pp": (Layout(dp=2, pp=2, schedule="1f1b", microbatches=2, recompute="full"), {}, "fp32"),
    "dp×tp-mixed": (Layout(dp=2, tp=2, microbatches=2), {}, "mixed"),
    "tp+sp×pp": (Layout(tp=2, pp=2, sequence_parallel=True, schedule="1f1b", microbatches=2), {}, "fp32"),
    "zero1-dp4": (Layout(dp=4, micro_batch=1, zero=1), {}, "fp32"),
}


def _measure_job(cfg, opts):
    from distperf.parallel.loop import run_training

    result = run_training(cfg, opts)
    return {key: result[key] for key in ("memory_bytes", "communication", "measured_steps", "losses")}


def _breakdown_job(cfg, opts):
    from distperf.parallel.loop import run_training

    result = run_training(cfg, opts)
    return {key: result.get(key) for key in ("memory_bytes", "communication", "measured_steps", "time_breakdown_s")}


@pytest.mark.parametrize("breakdown", [True, False])
def test_a_run_without_measurement_still_breaks_its_step_down_unless_told_not_to(breakdown):
    from distperf.config import RunOptions

    cfg = validate(Config(model=tiny_spec(), layout=Layout(pp=2, microbatches=2, schedule="1f1b")))
    opts = RunOptions(steps=1, warmup=0, device="cpu", measure=False, breakdown=breakdown)
    results = spawn(_breakdown_job, 2, cfg, opts, timeout=120)
    assert all(r["memory_bytes"] is None and r["communication"] is None for r in results)
    if not breakdown:
        assert all(r["time_breakdown_s"] is None and r["measured_steps"] is None for r in results)
        return
    found = results[0]["time_breakdown_s"]
    assert all(r["time_breakdown_s"] == found for r in results)  # gathered: the same on every rank
    assert len(found["per_rank"]["window"]) == 2 and found["window"] == max(found["per_rank"]["window"])
    assert found["per_rank"]["communication"][found["rank"]] == found["communication"] > 0  # a pipeline waits
    assert results[0]["measured_steps"]["memory"] == results[0]["measured_steps"]["communication"] == 0


def _per_stage_max(per_rank: dict, key: str, stage: int) -> int:
    return max(v for v, s in zip(per_rank[key], per_rank["pipeline_rank"]) if s == stage)


def _error(predicted, measured) -> float:
    return abs(predicted - measured) / measured if measured else abs(predicted)


@pytest.mark.parametrize("name", CASES)
def test_every_strategy_measured_equals_the_cost_model(name):
    from distperf.config import RunOptions

    layout, overrides, precision = CASES[name]
    cfg = validate(Config(model=tiny_spec(**overrides), layout=layout, training=Training(precision, "adam")))
    opts = RunOptions(steps=1, warmup=0, device="cpu", measure=True)
    results = spawn(_measure_job, layout.world_size, cfg, opts, timeout=120)
    assert all(r["memory_bytes"] == results[0]["memory_bytes"] for r in results)  # combined, on every rank
    measured, pred = results[0]["memory_bytes"], predict(cfg, backend="gloo")
    per = measured["per_rank"]
    assert len(results[0]["losses"]) == 1 and results[0]["measured_steps"]["after_timed_steps"]
    for stage in range(layout.pp):
        at_rest, peak = pred["model_states_at_rest_by_stage"][stage], pred["memory_bytes_by_stage"][stage]
        for key in STATES:
            assert _per_stage_max(per, f"at_start.{key}", stage) == at_rest[key], (stage, key)
            assert _error(peak[key], _per_stage_max(per, key, stage)) <= STATE_TOLERANCE, (stage, key)
        assert _error(peak["activations"], _per_stage_max(per, "activations", stage)) <= ACTIVATION_TOLERANCE, stage
    assert measured["total"] == max(per["total"]) and measured["rank"] == per["total"].index(measured["total"])
    assert measured["total"] >= sum(measured["at_peak"][k] for k in STATES)
    assert all(increase > 0 for increase in per["rss_peak_increase"]) and all(per["rss_reset"])
    comm = results[0]["communication"]
    for kind in KINDS:  # what the tracker counts, algorithmic and on gloo's wire
        assert comm["sent_bytes"][kind] == pred["communication_bytes"][kind], kind
        assert comm["wire_bytes"][kind] == pred["communication_wire_bytes"][kind], kind


def _relative(predicted, measured):
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return (predicted - measured) / measured


def test_run_json_has_measurements_prediction_and_errors_from_its_own_numbers(quick_profile):
    from distperf.hardware import load_profile

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    profile, cal = quick_profile  # conftest: calibrate --quick at one thread, the threads of the run below
    assert cal.returncode == 0, cal.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "distperf", "run", "--model", "tiny", "--device", "cpu", "--steps", "2",
                           "--dp", "2", "--micro-batch", "2", "--hardware", str(profile), "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)

    assert len(r["iteration_time_s"]["steps"]) == 2 and len(r["losses"]) == 2  # measurement steps are not timed
    assert r["measured_steps"]["after_timed_steps"] is True
    mem = r["memory_bytes"]
    for key in ("parameters", "gradients", "optimizer_states", "activations", "temporaries", "total"):
        assert mem[key] > 0 and len(mem["per_rank"][key]) == 2
    for section in ("bytes", "time_s", "exposed_s"):
        assert set(KINDS) | {"total"} <= set(r["communication"][section])
    assert r["communication"]["bytes"]["data_parallel"] > 0 and r["communication"]["bytes"]["tensor_parallel"] == 0
    split = r["time_breakdown_s"]  # where the slowest rank's breakdown step went, every class, both ranks
    assert r["measured_steps"]["breakdown"] == BREAKDOWN_STEPS and split["rank"] in (0, 1)
    for key in STEP_KEYS:  # every rank's steps one by one, whose mean the classes are
        assert [len(steps) for steps in split["per_step"][key]] == [BREAKDOWN_STEPS] * 2
    assert sum(split["per_step"]["window"][split["rank"]]) / BREAKDOWN_STEPS == pytest.approx(split["window"])
    assert sum(split[c] for c in CLASSES) == pytest.approx(split["window"]) and split["matrix_products"] > 0
    assert split["communication"] > 0 and all(len(split["per_rank"][c]) == 2 for c in CLASSES)

    # the prediction is the cost model's for this configuration on the given profile, its analytical time at the
    # speed the run's own probe measured (both took one: the run on CPU, the calibration before its kernel tables)
    pred = r["prediction"]
    cfg = validate(Config(model=presets.model("tiny"), layout=Layout(dp=2, micro_batch=2)))
    hw = load_profile(profile)
    assert hw.kernels.probe and all(r["speed_probe"][k] > 0 for k in speed.PARTS)
    expected = predict(cfg, speed.at_speed(hw, r["speed_probe"]), backend="gloo")
    assert pred["at_run_speed"] is True
    assert pred["memory_bytes"] == expected["memory_bytes"] and pred["time_s"] == expected["time_s"]
    assert pred["hardware_source"]["kind"] == "profile" and pred["hardware_source"]["threads"] == 1
    # the profiled mode composes the parts both ranks timed at once after the measurement steps (measure.parts)
    parts = r["part_times"]
    assert parts["ranks_at_once"] == 2 and len(parts["per_rank"]) == 2
    assert pred["profiled"]["layer_times_source"].startswith("the run's ranks, all at once")
    for part in ("layer", "embedding", "head"):
        assert pred["profiled"]["layer_times"][part] == parts[part]
        for i, phase in enumerate(("forward_s", "backward_s")):  # each part's mean over the ranks
            assert parts[part][phase] == pytest.approx(sum(rank[part][i] for rank in parts["per_rank"]) / 2)
        assert parts[part]["forward_s"] > 0
    assert parts["optimizer"]["layer_s"] == pytest.approx(sum(r["optimizer"]["layer_s"] for r in parts["per_rank"]) / 2)
    assert pred["profiled"]["layer_times"]["optimizer"] == parts["optimizer"]
    times = {**{part: (parts[part]["forward_s"], parts[part]["backward_s"]) for part in ("layer", "embedding", "head")},
             "optimizer": parts["optimizer"], "ranks_at_once": 2}
    assert pred["profiled"]["time_s"] == predict(cfg, hw, backend="gloo", layer_times=times)["time_s"]  # as calibrated

    # every error follows from the numbers in the JSON
    err = r["error"]
    median = r["iteration_time_s"]["median"]
    assert err["iteration_time_s"]["analytical"] == pytest.approx(_relative(pred["time_s"]["iteration"], median))
    assert err["iteration_time_s"]["profiled"] == pytest.approx(_relative(pred["profiled"]["time_s"]["iteration"], median))
    stage = mem["per_rank"]["pipeline_rank"][mem["rank"]]
    for key in ("parameters", "gradients", "optimizer_states", "activations", "total"):
        assert err["memory_bytes"][key] == pytest.approx(_relative(pred["memory_bytes_by_stage"][stage][key], mem[key]))
    for key in STATES:
        assert err["memory_bytes"][key] == 0.0  # fp32 DDP: the model states are exact
    assert all(x > 0 for x in mem["per_rank"]["rss_peak_increase"]) and mem["rss_peak"] >= mem["rss_start"]
    sent, wire = r["communication"]["sent_bytes"], r["communication"]["wire_bytes"]
    assert pred["backend"] == "gloo" and pred["convention"] == "trainer"
    for kind in KINDS:
        assert err["communication_bytes"][kind] == _relative(pred["communication_bytes"][kind], sent[kind])
        assert err["communication_wire_bytes"][kind] == _relative(pred["communication_wire_bytes"][kind],
                                                                  wire[kind])
    exposed = r["communication"]["exposed_s"]["total"]
    t = pred["time_s"]
    assert err["exposed_s"]["analytical"] == pytest.approx(_relative(t["communication_exposed"] + t["bubble"], exposed))


def test_auto_hardware_reads_this_machines_profile_at_the_ranks_threads_else_calibrates_now(quick_profile, tmp_path,
                                                                                           monkeypatch):
    import shutil

    from distperf.measure import calibrate, profiles

    profile, cal = quick_profile
    assert cal.returncode == 0, cal.stderr[-2000:]
    calls = []

    def calibrate_now(**kwargs):
        calls.append(kwargs)
        return "measured now", {"threads": kwargs["threads"], "collectives": []}

    here = tmp_path / "hardware.json"
    monkeypatch.setattr(calibrate, "calibrate", calibrate_now)
    monkeypatch.setattr(profiles, "auto_profiles", lambda threads: [here])
    tiny = presets.model("tiny")
    hw, _, source = profiles.choose_hardware("auto", 1, 4, "cpu", tiny, 2)  # no profile of this machine
    assert hw == "measured now" and source["kind"] == "quick calibration" and source["threads"] == 1
    assert calls[0]["quick"] and calls[0]["ranks"] == 4 and calls[0]["micro_batches"] == (2,)
    shutil.copy(profile, here)
    shutil.copy(calibrate.sidecar_path(profile), calibrate.sidecar_path(here))
    hw, side, source = profiles.choose_hardware("auto", 1, 2, "cpu", tiny, 2)  # one at the ranks' thread count
    assert source["kind"] == "profile" and source["path"] == str(here) and side["threads"] == 1 and len(calls) == 1
    profiles.choose_hardware("auto", 2, 2, "cpu", tiny, 2)  # not at two threads: calibrated now
    assert len(calls) == 2 and calls[1]["threads"] == 2


def test_a_bad_hardware_is_refused_before_any_process_starts(monkeypatch, capsys):
    def no_launch(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(run_command, "launch", no_launch)
    monkeypatch.setattr(subprocess, "Popen", no_launch)
    assert cli.main(["run", "--model", "tiny", "--dp", "2", "--hardware", "no-such-gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("distperf run: error: hardware:") and "\n" not in err
