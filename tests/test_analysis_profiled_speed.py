"""The profiled mode with the terms its parts leave out at the run's speed (time_model.profiled_prediction's
``speed``), and the rule of 6 December 2026 that judges it (time_model.profiled_speed_rule)."""
from dataclasses import replace

import pandas as pd
import pytest

from distperf.analysis import time_model as tm
from test_analysis_time_model import HW, row

# a profile whose speed probe the runs' probes compare with, and a step's Python large enough to show the speed
PROFILE = replace(HW, kernels=replace(HW.kernels, probe=(1e-4, 1e-5, 1e-6), step_s=5e-3, tp_collective_s=1e-3))


def _runs(truth: str) -> pd.DataFrame:
    """Runs whose Python ran twice as slow as the calibration's, measured as the profiled mode prices them with the
    terms beyond their parts at the run's speed (``truth`` "speed") or at the calibration's."""
    out = []
    for layout in ({}, {"dp": 2}, {"tp": 2}):
        r = {**row("small", 1.0, 1.0, hw=PROFILE, **layout), "speed_probe.gemm_s": 1e-4,
             "speed_probe.elementwise_s": 1e-5, "speed_probe.python_s": 2e-6}
        r["iteration_time_s.median"] = tm.profiled_prediction(pd.Series(r), PROFILE, speed=truth == "speed")
        out.append(r)
    return pd.DataFrame(out)


def test_the_run_speed_prices_the_terms_beyond_the_parts_slower_where_python_ran_slower():
    r = _runs("calibration").iloc[0]
    assert tm.profiled_prediction(r, PROFILE, speed=True) > tm.profiled_prediction(r, PROFILE, speed=False)
    no_probe = r.drop(["speed_probe.gemm_s", "speed_probe.elementwise_s", "speed_probe.python_s"])
    assert tm.profiled_prediction(no_probe, PROFILE, speed=True) == tm.profiled_prediction(no_probe, PROFILE)


@pytest.mark.parametrize("truth", ["speed", "calibration"])
def test_the_rule_stands_only_where_the_runs_went_at_their_own_speed(truth):
    rule = tm.profiled_speed_rule({"x": _runs(truth)}, PROFILE)
    assert rule["runs"] == 3 and rule["stands"] == (truth == "speed")
    assert rule[truth] == pytest.approx((0.0, 0.0), abs=1e-9)
    text = tm.profiled_speed_rule_sentence({"x": _runs(truth)}, PROFILE)
    assert ("the run's speed stands" in text) == (truth == "speed")
    assert "over the 3 held-out configurations" in text


def test_without_profiled_parts_the_rule_says_so():
    runs = pd.DataFrame([row("small", 1.0, hw=PROFILE)])
    assert tm.profiled_speed_rule({"x": runs}, PROFILE) is None
    assert tm.profiled_speed_rule_sentence({"x": runs}, PROFILE) == "no held-out run has profiled parts"
