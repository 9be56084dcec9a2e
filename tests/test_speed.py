"""The speed probe (distperf.measure.speed) and what the analytical mode does with it: kernel times scaled by a run's
probe over the calibration's, per class."""
import math
from dataclasses import replace

import pandas as pd
import pytest

from distperf.analysis import repeats, rows
from distperf.analysis import time_model as tm
from distperf.cost import kernels as kn
from distperf.cost.kernels import STEP_FIT_MODEL
from distperf.measure import speed
from distperf.runner.sweep import flatten
from dist_harness import spawn
from test_analysis_time_model import HW, row
from test_kernels import synthetic_costs

PROBE = {"gemm_s": 4e-4, "elementwise_s": 8e-5, "python_s": 1.5e-6}
PROBED = replace(HW, kernels=replace(HW.kernels, probe=tuple(PROBE[k] for k in speed.PARTS)))


def slower(gemm=1.0, elementwise=1.0, python=1.0) -> dict:
    return {"gemm_s": PROBE["gemm_s"] * gemm, "elementwise_s": PROBE["elementwise_s"] * elementwise,
            "python_s": PROBE["python_s"] * python}


def test_a_probe_times_three_kernels():
    p = speed.probe(min_run_time=0.005)
    assert set(p) == set(speed.PARTS) and all(v > 0 and math.isfinite(v) for v in p.values())


def test_ratios_need_both_probes_whole():
    assert speed.ratios(slower(2, 3, 4), PROBE) == pytest.approx({"gemm": 2, "elementwise": 3, "python": 4})
    assert speed.ratios(None, PROBE) is None and speed.ratios(PROBE, None) is None
    assert speed.ratios({**PROBE, "gemm_s": float("nan")}, PROBE) is None
    assert speed.ratios({**PROBE, "python_s": 0.0}, PROBE) is None
    assert speed.ratios({"gemm_s": 1.0}, PROBE) is None


def test_a_run_is_priced_at_its_speed_class_by_class():
    costs = synthetic_costs()
    fast = costs.at_speed({"gemm": 2.0, "elementwise": 3.0, "python": 5.0})
    assert kn.linear(fast, 64, 64, 64, False) == pytest.approx([2 * t for t in kn.linear(costs, 64, 64, 64, False)])
    assert kn.attention(fast, True, 4, 256, 32) == pytest.approx(
        [2 * t for t in kn.attention(costs, True, 4, 256, 32)])
    assert kn.elementwise(fast, "gelu", 4096) == pytest.approx([3 * t for t in kn.elementwise(costs, "gelu", 4096)])
    assert kn.adam_tensor(fast, 1024) == pytest.approx(3 * kn.adam_tensor(costs, 1024))
    assert fast.view == pytest.approx((3e-6, 6e-6))
    assert (fast.module_call_s, fast.backward_call_s, fast.step_s) == pytest.approx((5e-6, 5e-5, 5e-4))
    wrapped = replace(costs, tp_layer_s=1e-4).at_speed({"gemm": 1.0, "elementwise": 1.0, "python": 2.0})
    assert wrapped.tp_layer_s == pytest.approx(2e-4)
    assert (fast.contention_compute, fast.contention_memory, fast.overlap) == (
        costs.contention_compute, costs.contention_memory, costs.overlap)  # ratios of times: unchanged


def test_a_profile_keeps_its_probe_through_json():
    costs = replace(synthetic_costs(), probe=(1e-4, 2e-5, 1e-6))
    data = costs.to_dict()
    assert data["probe"] == {"gemm_s": 1e-4, "elementwise_s": 2e-5, "python_s": 1e-6}
    assert kn.KernelCosts.from_dict(data) == costs
    assert "probe" not in synthetic_costs().to_dict() and kn.KernelCosts.from_dict(synthetic_costs().to_dict()).probe == ()
    with pytest.raises(ValueError):
        kn.KernelCosts.from_dict({**data, "probe": {**data["probe"], "gemm_s": -1.0}})


def test_at_speed_changes_nothing_without_both_probes():
    assert speed.at_speed(HW, slower(2)) is HW  # the profile took no probe
    assert speed.at_speed(PROBED, None) is PROBED  # the run took none
    assert speed.at_speed(replace(HW, kernels=None), slower(2)).kernels is None
    scaled = speed.at_speed(PROBED, slower(2, 2, 2))
    assert scaled.kernels.step_s == pytest.approx(2 * PROBED.kernels.step_s)


def with_probe(r: dict, **ratios) -> dict:
    return {**r, **{f"{speed.COLUMN}{k}": v for k, v in slower(**ratios).items()}}


def test_the_analytical_mode_prices_each_run_at_its_own_speed_and_its_calibrated_variant_does_not():
    slow = with_probe(row("small", 1.0, dp=2), gemm=2, elementwise=2, python=2)
    same = with_probe(row("small", 1.0, tp=2))
    plain = row("small", 1.0)  # measured before the probe existed
    frame = pd.DataFrame([slow, same, plain])
    calibrated = rows.with_predictions(frame, PROBED, check=False, speed=False)
    at_speed = rows.with_predictions(frame, PROBED, check=False)  # the rule: each run at its own speed
    assert calibrated.predicted_s.to_numpy() == pytest.approx(
        rows.with_predictions(frame, HW).predicted_s.to_numpy())  # HW has no probe: its runs stay as calibrated
    assert at_speed.predicted_s.iloc[0] > 1.5 * calibrated.predicted_s.iloc[0]  # every kernel twice as long
    assert at_speed.predicted_s.iloc[1:].to_numpy() == pytest.approx(calibrated.predicted_s.iloc[1:].to_numpy())
    assert rows.run_hardware(PROBED, slow).kernels.step_s == pytest.approx(2 * PROBED.kernels.step_s)
    assert rows.run_hardware(PROBED, pd.Series(plain)) is PROBED
    errs, before = tm.errors({"regimes": frame}, PROBED), tm.errors({"regimes": frame}, PROBED, speed=False)
    assert before.analytical.to_numpy() == pytest.approx([0.0] * 3)  # the rows were made on HW's prediction
    assert errs.analytical.iloc[0] > 0.5 and errs.analytical.iloc[1:].to_numpy() == pytest.approx([0.0, 0.0])


def test_repeats_fold_the_probe_by_its_median():
    base = row("small", 1.0, dp=2)
    ranks = flatten({"speed_probe": {"before": {"ranks": {k: [1.0, 2.0] for k in speed.PARTS}}}})  # JSON text
    table = pd.DataFrame([{**with_probe(base, gemm=g), **ranks, "repeat": i} for i, g in enumerate((1.0, 3.0, 2.0))])
    folded = repeats.fold(table)
    assert len(folded) == 1
    assert folded[f"{speed.COLUMN}gemm_s"].iloc[0] == pytest.approx(2 * PROBE["gemm_s"])
    assert folded[f"{speed.COLUMN}before.ranks.gemm_s"].iloc[0] == "[1.0, 2.0]"  # each rank's: repeat 0's


def test_the_speed_sentence_reads_the_probes_or_says_there_are_none():
    runs = pd.DataFrame([with_probe(row("small", 1.0, dp=2), gemm=1.5), with_probe(row("small", 1.0, tp=2))])
    for when, factor in (("before", 1.0), ("after", 1.2)):
        for k in speed.PARTS:
            runs[f"{speed.COLUMN}{when}.{k}"] = runs[f"{speed.COLUMN}{k}"] * factor
    speeds = tm.speed_ratios({"regimes": runs}, PROBED)
    assert speeds.gemm.tolist() == pytest.approx([1.5, 1.0]) and speeds.python_apart.tolist() == pytest.approx([0.2] * 2)
    text = tm.speed_sentence(speeds, tm.errors({"regimes": runs}, PROBED, speed=False),
                             tm.errors({"regimes": runs}, PROBED))
    assert "over 2 held-out configurations" in text and "matrix product 1.25 (1.00–1.50)" in text
    assert "the analytical mode scores a median |error| of" in text
    assert text.endswith("at the calibration's speed it would score 0.0% and 0%")
    assert tm.speed_ratios({"regimes": runs}, HW).empty  # a profile without a probe
    plain = tm.errors({"regimes": runs}, HW)
    assert tm.speed_sentence(tm.speed_ratios({"regimes": runs}, HW), plain, plain).startswith("none of its runs")
    tiny = runs.assign(**{"config.model.name": STEP_FIT_MODEL})  # a smoke build: every run on the fit's preset
    assert tm.speed_sentence(tm.speed_ratios({"regimes": tiny}, PROBED), tm.errors({"regimes": tiny}, PROBED),
                             pd.DataFrame()).startswith("it has no held-out configuration")


def _probe_in_turn(rank_probes):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    speed.probe = lambda: rank_probes[dist.get_rank()]  # this child's copy of the module
    return speed.probe_alone(True)


def test_every_rank_probes_and_their_geometric_mean_counts():
    probes = [{"gemm_s": 1.0, "elementwise_s": 5.0, "python_s": 1.0}, {"gemm_s": 4.0, "elementwise_s": 5.0,
                                                                     "python_s": 3.0}]
    found = spawn(_probe_in_turn, 2, probes)
    for f in found:  # not the slowest rank's: the larger of two noisy readings overstates the machine's slowness
        assert {k: f[k] for k in speed.PARTS} == pytest.approx({"gemm_s": 2.0, "elementwise_s": 5.0,
                                                                "python_s": math.sqrt(3.0)})
        assert f["ranks"] == {"gemm_s": [1.0, 4.0], "elementwise_s": [5.0, 5.0], "python_s": [1.0, 3.0]}
    # and the ranks' contention, read on rank 0 and shared: together over alone, at least 1
    assert found[0] == found[1] and all(found[0][k] >= 1.0 and math.isfinite(found[0][k]) for k in speed.CONTENTION)


def test_a_run_is_priced_with_its_own_contention_where_it_measured_one():
    both = {**PROBE, "contention_memory": 2.0, "contention_compute": 3.0}
    assert speed.combine({**both, "contention_compute": 12.0}, both)["contention_compute"] == 3.0  # the lesser
    assert set(speed.combine(both, PROBE)) == set(speed.PARTS)  # one reading alone is no pair
    costs = speed.at_contention(HW, both).kernels
    assert (costs.contention_memory, costs.contention_compute) == (2.0, 3.0)
    assert replace(costs, contention_memory=HW.kernels.contention_memory,
                   contention_compute=HW.kernels.contention_compute) == HW.kernels  # nothing else moves
    for run in (None, PROBE, {**both, "contention_compute": float("nan")}):
        assert speed.at_contention(HW, run) is HW
    gpu = replace(HW, kernels=None)
    assert speed.at_contention(gpu, both) is gpu

    contended = {f"{speed.COLUMN}contention_memory": 3.0, f"{speed.COLUMN}contention_compute": 3.0}
    frame = pd.DataFrame([{**with_probe(row("small", 1.0, dp=2)), **contended},
                          {**with_probe(row("small", 1.0)), f"{speed.COLUMN}contention_memory": math.nan,
                           f"{speed.COLUMN}contention_compute": math.nan}])
    plain, own = tm.errors({"regimes": frame}, HW), tm.errors({"regimes": frame}, HW, contention=True)
    assert own.analytical.iloc[0] > plain.analytical.iloc[0] + 0.1  # three times contended: slower
    assert own.analytical.iloc[1] == pytest.approx(plain.analytical.iloc[1])  # one rank: nothing to contend
    assert own.profiled.equals(plain.profiled)
    text = tm.contention_sentence({"regimes": frame}, HW, plain, own)
    assert text.startswith("over 1 held-out configurations of several ranks") and "compute-bound 3.00×" in text
    assert f"against the calibration's {HW.kernels.contention_compute:.2f}×" in text
    before = frame.drop(columns=list(contended))
    assert tm.contention_sentence({"regimes": before}, HW, plain, plain).startswith("none of its runs measured")


def test_a_run_can_be_followed_part_way_to_its_speed():
    assert speed.at_speed(PROBED, slower(4, 4, 4), 0.5).kernels.step_s == pytest.approx(2 * PROBED.kernels.step_s)
    assert speed.at_speed(PROBED, slower(4, 4, 4), 0.0).kernels.step_s == pytest.approx(PROBED.kernels.step_s)
    slow = pd.Series(with_probe(row("small", 1.0, dp=2), gemm=4, elementwise=4, python=4))
    assert rows.run_hardware(PROBED, slow, 0.5).kernels.module_call_s == pytest.approx(
        2 * PROBED.kernels.module_call_s)
    assert rows.run_hardware(PROBED, slow).kernels.module_call_s == pytest.approx(4 * PROBED.kernels.module_call_s)


@pytest.mark.parametrize("truth", [0.5, 1.0])
def test_the_elasticity_rule_stands_only_where_the_runs_went_halfway_to_their_probe(truth):
    frame = pd.DataFrame([with_probe(row("small", 1.0, **layout), gemm=2, elementwise=3, python=4)
                          for layout in ({}, {"dp": 2}, {"tp": 2})])
    frame["iteration_time_s.median"] = rows.with_predictions(frame, PROBED, check=False, speed=truth).predicted_s
    rule = tm.elasticity_rule({"regimes": frame}, PROBED)
    assert rule["configurations"] == 3 and rule["stands"] == (truth == 0.5)
    assert rule["half" if truth == 0.5 else "full"] == pytest.approx((0.0, 0.0), abs=1e-9)
    assert rule["none"][0] > 0.1  # every run slower than the calibration
    text = tm.elasticity_rule_sentence({"regimes": frame}, PROBED)
    assert ("halfway stands" in text) == (truth == 0.5) and "over the 3 held-out configurations" in text
    assert tm.elasticity_rule({"regimes": frame}, HW) is None  # a profile without a probe
    assert tm.elasticity_rule_sentence({"regimes": frame}, HW).startswith("no held-out run took a speed probe")
