"""Machine calibration (distperf.measure.calibrate): the α-β fit, and a quick calibration whose
profile the hardware loader and `predict --hardware FILE` accept."""
from __future__ import annotations

import json
import statistics

import pytest

from distperf.cli import main as cli
from distperf.hardware import load_profile
from distperf.cost.collectives import ring_terms
from distperf.measure.alpha_beta import fit_alpha_beta, fit_collectives, fit_issued
from distperf.measure.calibrate import sidecar_path
from distperf.measure.rounds import least_contention
from distperf.cost.kernels import RECOMPUTE_WRAPPERS
from distperf.measure.kernels import LINEAR_SIZES_QUICK


@pytest.mark.parametrize("collective", ["all-reduce", "all-gather", "reduce-scatter", "send"])
def test_fit_recovers_alpha_and_beta_of_ring_times(collective):
    alpha, beta = 3.7e-5, 2.1e9
    points = []
    for n in ([2] if collective == "send" else [2, 3, 4]):
        for m in (4, 1024, 65536, 1 << 20, 4 << 20):
            steps, volume = ring_terms(collective, n, m)
            points.append((collective, n, m, steps * alpha + volume / beta))
    fit = fit_alpha_beta(points)
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-9) and fit["beta"] == pytest.approx(beta, rel=1e-9)
    assert fit["rms_relative_error"] < 1e-9 and "note" not in fit


def test_fit_keeps_alpha_positive_when_the_intercept_is_not():
    rows = [{"collective": "all-reduce", "ranks": 2, "bytes": m, "seconds": m / 1e9 - 1e-5}  # intercept < 0
            for m in (1 << 16, 1 << 20, 4 << 20)]
    fit = fit_collectives(rows)["all-reduce"]["ranks"]["2"]
    assert fit["alpha"] > 0 and fit["beta"] > 0 and "alpha" in fit["note"]


def test_a_collective_without_a_positive_time_as_issued_keeps_its_fit_alone():
    """Issued times are differences (the burst with the collective − the burst alone): on a busy machine every size
    of one collective can come out at zero, and the calibration then keeps that collective's fit alone."""
    alone = fit_collectives([{"collective": c, "ranks": 2, "bytes": m, "seconds": 1e-4 + m / 1e9}
                             for c in ("all-reduce", "all-gather") for m in (1 << 10, 1 << 16, 1 << 20)])
    issued = [{"collective": "all-reduce", "ranks": 2, "bytes": m, "seconds": 2e-4 + m / 5e8} for m in (1 << 10, 1 << 20)]
    issued += [{"collective": "all-gather", "ranks": 2, "bytes": m, "seconds": 0.0} for m in (1 << 10, 1 << 20)]
    issued.append({"collective": "all-reduce", "ranks": 2, "bytes": 1 << 16, "seconds": 0.0})  # left out of the fit
    assert set(fit_collectives(issued)) == {"all-reduce"} and fit_collectives(issued)["all-reduce"]["all"]["points"] == 2
    fits = fit_issued(issued, alone)
    assert fits["all-gather"]["all"] == alone["all-gather"]["all"] and "alone" in fits["all-gather"]["note"]
    assert fits["all-reduce"]["all"]["beta"] == pytest.approx(5e8) and "note" not in fits["all-reduce"]


def test_the_profile_keeps_each_contention_ratio_at_its_least_round():
    rounds = [{"memory": 1.44, "compute": 1.92}, {"memory": 1.11, "compute": 1.87}, {"memory": 1.30, "compute": 1.03}]
    assert least_contention(rounds) == {"memory": 1.11, "compute": 1.03}  # per ratio, not one round's pair
    assert least_contention(rounds[:1]) == rounds[0]


def test_the_profile_keeps_the_layers_contention_at_its_rounds_median():
    rounds = [{"memory": 1.44, "compute": 1.92, "layer": 1.18}, {"memory": 1.11, "compute": 1.87, "layer": 1.0},
              {"memory": 1.30, "compute": 1.03, "layer": 1.06}]
    assert least_contention(rounds) == {"memory": 1.11, "compute": 1.03, "layer": 1.06}
    older = [rounds[0], {"memory": 1.2, "compute": 1.1}]  # a round without the layer's probe: no layer ratio
    assert least_contention(older) == {"memory": 1.2, "compute": 1.1}


def test_quick_calibration_writes_a_profile_that_predict_reads(quick_profile, capsys):
    out, proc = quick_profile  # conftest: calibrate --quick --threads 1 --ranks 2 --models tiny, once per session
    assert proc.returncode == 0, proc.stderr
    hw = load_profile(out)
    side = json.loads(sidecar_path(out).read_text())
    assert side["threads"] == 1 and side["quick"] is True
    rounds = side["conditions"]["rounds"]  # a quick calibration runs one round of the noisy probes
    assert rounds["rounds"] == 1 and len(side["conditions"]["issued_rounds"]) == 1 and not rounds["settled"]
    assert side["conditions"]["issued"] == side["conditions"]["issued_rounds"][0]
    (began, ended), = rounds["threads"]  # rank 0's threads around the path probes, which leave gloo's behind
    assert 0 < began < ended
    from distperf.measure.rounds import BUCKET_IN_FIT, ISSUED_LARGEST

    largest = {r["collective"]: r["bytes"] for r in side["conditions"]["issued"] if r["bytes"] > 1 << 22}
    assert largest == ISSUED_LARGEST  # the all-reduce timed at DDP's bucket too; the fit takes it by the rule
    assert side["issued_fits"]["all-reduce"]["all"]["points"] == sum(
        r["collective"] == "all-reduce" and r["seconds"] > 0 and (BUCKET_IN_FIT or r["bytes"] < largest["all-reduce"])
        for r in side["conditions"]["issued"]) or "note" in side["issued_fits"]["all-reduce"]
    overlap, = side["conditions"]["overlap_rounds"]  # DDP's default bucket, with the 1 MiB rule's beside it
    assert overlap["bucket_bytes"] == 25 * 2**20 and overlap["collective_s"] > 0 and overlap["burst_s"] > 0
    assert 0 <= overlap["overlap_1mib"] <= 1 and hw.kernels.overlap == overlap["overlap"]
    paths = side["conditions"]["paths"]  # the tiny preset's tensor-parallel steps, which the path constants fit
    from distperf.measure.path_fits import TP_FIT_BATCHES

    assert TP_FIT_BATCHES == (1, 4, 16, 64, 256)  # messages of 2 KiB to 512 KiB: a cost per call and one per byte
    assert all(paths[f"{p}_b{b}_step_s"] > 0 for p in ("tp", "tp_sp") for b in TP_FIT_BATCHES)
    assert hw.kernels.tp_collective_byte_s >= 0 and hw.kernels.tp_sp_collective_byte_s >= 0
    # the same steps profiled: the communication a rank saw in them (every step all-reduces, so some), and DTensor's
    # part of it per collective; not compared with the timed step, which ran without the profiler's cost
    assert all(paths[f"{p}_b{b}_wait_s"] > 0 for p in ("tp", "tp_sp") for b in TP_FIT_BATCHES)
    assert hw.kernels.tp_collective_wait_s >= 0 and hw.kernels.tp_sp_collective_wait_s >= 0
    assert 0 <= side["background_cpu_share"] <= 1  # the machine's share other processes used meanwhile
    # the spawned ranks pinned as a run's are: a core each where the machine has a core per rank
    from distperf.launch import available_cores

    # measured for the book's what-ifs and not priced: the waits for the slowest rank, FSDP2's unit table and the
    # stall of a receive from a computing sender
    assert side["conditions"]["skew"]["rows"] and side["conditions"]["fsdp_units"]["rows"]
    assert hw.kernels.skew == () and hw.kernels.fsdp_units == () and hw.kernels.p2p_stall_s == 0.0
    busy = side["conditions"]["busy_sender"]
    assert busy["stall_s"] >= 0 and all(busy[m]["trials"] > 0 and busy[m]["median_s"] > 0 for m in ("busy", "idle"))
    placement = side["conditions"]["placement"]
    assert len(placement) == 2 and all(p["pinned"] == (len(available_cores()) >= 2) for p in placement)
    if placement[0]["pinned"]:
        assert placement[0]["cores"] != placement[1]["cores"] and all(len(p["cores"]) == 1 for p in placement)
    # the profile is made of the sidecar's measurements
    assert hw.flops_fp32 == max(r["flops_per_s"] for r in side["gemm"] if r["dtype"] == "float32")
    fit = side["fits"]["all-reduce"]["all"]
    assert (hw.intra_latency, hw.intra_bandwidth) == (fit["alpha"], fit["beta"])
    assert hw.memory_bandwidth == side["copy"]["bytes_per_s"] and hw.memory_capacity > 2**30
    assert set(side["fits"]) == {"all-reduce", "all-gather", "reduce-scatter", "send"}
    assert all(side["fits"][c]["ranks"]["2"]["alpha"] > 0 for c in side["fits"])
    parts = {(r["part"], r["micro_batch"]) for r in side["layers"]}
    assert parts == {("layer", 1), ("embedding", 1), ("head", 1)}
    assert all(r["forward_s"] > 0 and r["backward_s"] >= 0 for r in side["layers"])
    # where the time went: each logged step with its start, in order, within the whole calibration
    starts = [t for _, t in side["phases_s"]]
    assert side["phases_s"][0][0].startswith("matrix products") and side["phases_s"][1][0] == "memory bandwidth"
    assert starts == sorted(starts) and 0 <= starts[0] and starts[-1] <= side["seconds"]

    # the kernel time model's constants: measured tables, the wrappers, and the one fit, on the tiny preset
    k = hw.kernels
    # the linear sizes stop where the next would pass the per-call budget (a busy machine can stop them earlier)
    sizes = [n for n, _, _ in k.linear_fp32]
    assert len(sizes) >= 2 and sizes == list(LINEAR_SIZES_QUICK[:len(sizes)])
    assert len(k.attention) == 2 * 2 * 2 and len(k.adam) == 6
    # forward times are positive; a backward is net of the engine's start, so a small one may measure 0 on a busy
    # machine, but the largest is well above it
    assert all(r[1] > 0 and r[2] >= 0 for r in k.linear_fp32) and k.linear_fp32[-1][2] > 0
    assert k.tp_layer_s > 0 and k.fsdp_unit_s > 0 and k.module_call_s > 0
    assert k.ddp_tensor_s > 0 and k.ddp_byte_s > 0  # DDP's hook per tensor, its copies per byte
    # checkpoint's hooks and the repeated dispatch: residuals of three timed steps, clamped at 0 (noise on a busy
    # machine can take one to 0, so only their presence and range are checked here; their values are the build's)
    assert all(0 <= getattr(k, name) < 1.0 for name in RECOMPUTE_WRAPPERS)
    assert k.step_s == side["step_fit"]["step_s"]
    assert {r["model"] for r in side["step_fit"]["rows"]} == {"tiny"}
    # the speed probe around the kernel tables, against which each run's probe scales them
    probes = side["speed_probe"]["probes"]  # before each of the five kernel tables and after the step's fit
    assert len(probes) == 6
    assert k.probe == pytest.approx(tuple(statistics.median(q[p] for q in probes)
                                          for p in ("gemm_s", "elementwise_s", "python_s")))

    capsys.readouterr()
    assert cli(["predict", "--model", "tiny", "--dp", "2", "--hardware", str(out), "--json"]) == 0
    prediction = json.loads(capsys.readouterr().out)
    assert prediction["hardware"] == hw.name and prediction["time_s"]["iteration"] > 0
    assert prediction["compute_from"] == "kernels"


@pytest.mark.parametrize("argv, field", [
    (["--ranks", "1"], "ranks"),
    (["--models", "small,bogus"], "model"),
    (["--micro-batches", "1,x"], "micro_batches"),
])
def test_bad_calibration_input_is_one_line_and_status_2(argv, field, capsys):
    assert cli(["calibrate", "--quick", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"distperf calibrate: error: {field}:") and "\n" not in err


def _mean_job(values):
    import torch.distributed as dist

    from distperf.measure.calibrate import mean_over_ranks

    dist.init_process_group("gloo")
    return mean_over_ranks(values[dist.get_rank()])


def test_the_pipeline_probe_takes_the_mean_over_the_ranks_not_the_largest():
    from dist_harness import spawn

    assert spawn(_mean_job, 2, (0.001, 0.004), timeout=60) == [pytest.approx(0.0025)] * 2


def test_each_round_of_the_training_conditions_runs_in_fresh_processes(monkeypatch):
    """A full calibration's rounds: one spawn each, the contention probe's three rounds in the first alone, the
    profile's paths the rounds' medians; the rounds stop once the watched constants settle."""
    from distperf.measure import calibrate as cal

    spawns = []

    def fake_spawn(target, ranks, args, timeout, what):
        n = len(spawns)
        _, _, _, contention, _ = args("out")
        spawns.append(contention)
        issued = [{"collective": "all-reduce", "ranks": 2, "bytes": b, "seconds": 1e-4 + b * 1e-9}
                  for b in (8, 1 << 20)]
        return {"issued": issued, "overlap": {"overlap": 0.1 * n}, "paths": {"plain_stack_s": 0.02 + 0.001 * (n % 2)},
                "contention_rounds": [{"memory": 1.5, "compute": 1.1, "layer": 1.0}] * contention,
                "compute_between_s": 1e-3, "placement": [{"pinned": False}] * 2, "threads": [4, 100]}

    monkeypatch.setattr(cal, "spawned_ranks", fake_spawn)
    out = cal.training_conditions(2, (8, 1 << 20), reps=15)
    assert spawns == [cal.CONTENTION_ROUNDS] + [0] * (len(spawns) - 1) and len(spawns) == cal.ROUNDS_MIN
    assert out["rounds"]["rounds"] == len(spawns) and out["rounds"]["settled"]
    assert out["rounds"]["threads"] == [[4, 100]] * len(spawns)
    assert out["paths"]["plain_stack_s"] == statistics.median(0.02 + 0.001 * (n % 2) for n in range(len(spawns)))
    assert out["contention"]["overlap"] == pytest.approx(0.1) and out["contention"]["memory"] == 1.5
    spawns.clear()
    assert cal.training_conditions(2, (8,), reps=5)["rounds"]["rounds"] == 1 and spawns == [1]  # quick: one round
