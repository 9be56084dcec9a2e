"""Waiting for the slowest rank: the probe's statistic, the ``skew`` table (a what-if's: no profile sets it), where
the cost model adds the waits when one does, the chapter's rule sentence, and the probe itself on two real gloo
ranks."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from distperf.cost import kernels as kn
from distperf.cost import predict
from distperf.hardware import PRESETS
from distperf.measure.skew import skew_table, waits
from test_kernels import small_cfg, synthetic_costs

TABLE = ((2, 0.010, 0.001), (2, 0.100, 0.004))


def test_the_wait_is_the_slowest_ranks_median_burst_less_the_ranks_median():
    found = waits([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0]])
    assert found["burst_s"] == pytest.approx(1.5)  # the mean of the ranks' medians, 1 and 2
    assert found["wait_s"] == pytest.approx(0.5)  # the slowest per burst: 1, 2, 3, median 2
    assert found["mean_wait_s"] == pytest.approx(0.5)
    assert waits([[2.0, 1.0], [1.0, 2.0]])["wait_s"] == pytest.approx(0.5)  # each rank slowest once
    assert waits([[1.0, 1.0], [1.0, 1.0]])["wait_s"] == 0.0
    assert skew_table([{"ranks": 2, "units": 4, "burst_s": 0.1, "wait_s": 0.004},
                       {"ranks": 2, "units": 1, "burst_s": 0.01, "wait_s": 0.001}]) == TABLE


def test_a_wait_is_interpolated_in_the_burst_and_scaled_to_more_ranks():
    costs = synthetic_costs(skew=TABLE)
    assert kn.sync_wait(costs, 0.010, 2) == pytest.approx(0.001)
    assert kn.sync_wait(costs, 0.055, 2) == pytest.approx(0.0025)  # half way
    assert kn.sync_wait(costs, 0.005, 2) == pytest.approx(0.0005)  # below: proportional
    assert kn.sync_wait(costs, 0.200, 2) == pytest.approx(0.008)  # above: proportional
    assert kn.sync_wait(costs, 0.010, 4) > kn.sync_wait(costs, 0.010, 2)  # the largest of more draws
    assert kn.sync_wait(costs, 0.010, 1) == 0.0 and kn.sync_wait(costs, 0.0, 2) == 0.0
    assert kn.sync_wait(synthetic_costs(), 0.010, 2) == 0.0


def test_a_profile_never_sets_the_table_which_leaves_with_contention_not_with_speed():
    costs = synthetic_costs(skew=TABLE)
    assert "skew" not in costs.to_dict()
    assert kn.KernelCosts.from_dict(costs.to_dict()) == replace(costs, skew=())
    old = {**costs.to_dict(), "skew": [list(row) for row in TABLE]}  # as the profiles of 5 December 2026 carry it
    assert kn.KernelCosts.from_dict(old).skew == ()
    assert costs.without("contention").skew == () and costs.without("framework").skew == TABLE
    assert costs.at_speed({"gemm": 2.0, "elementwise": 2.0, "python": 2.0}).skew == TABLE


def _hw(**changes):
    return replace(PRESETS["A100-80GB"], kernels=synthetic_costs(**changes))


@pytest.mark.parametrize("layout", [dict(dp=2), dict(dp=2, zero=1), dict(tp=2), dict(dp=2, zero=3),
                                    dict(pp=2, schedule="1f1b"), dict()])
def test_the_waits_are_added_where_ranks_synchronize_and_counted_as_communication(layout):
    cfg = small_cfg(microbatches=4, **layout)
    waited, bare = predict(cfg, _hw(skew=TABLE))["time_s"], predict(cfg, _hw())["time_s"]
    added = waited["iteration"] - bare["iteration"]
    assert waited["communication_exposed"] - bare["communication_exposed"] == pytest.approx(added)
    assert waited["compute"] == pytest.approx(bare["compute"])
    if layout in (dict(pp=2, schedule="1f1b"), dict()):  # a pipeline's waits are its schedule's; one rank none
        assert added == 0.0
    else:
        assert added > 0.0
    if layout == dict(dp=2, zero=3):  # FSDP2's gathers: in the unit table; only the step's last stretch waits
        costs = synthetic_costs(skew=TABLE)
        optimizer_only = predict(cfg, _hw(skew=TABLE))["time_s"]["iteration"] - bare["iteration"]
        assert optimizer_only < kn.sync_wait(costs, bare["compute"], 2)


def test_a_tensor_parallel_run_waits_at_every_collective_of_every_microbatch():
    def added(m: int) -> float:
        cfg = small_cfg(tp=2, microbatches=m)
        return predict(cfg, _hw(skew=TABLE))["time_s"]["iteration"] - predict(cfg, _hw())["time_s"]["iteration"]

    one, two, four = added(1), added(2), added(4)
    assert one > 0 and four - two == pytest.approx(2 * (two - one))  # the collectives' waits, per microbatch
    # 16 collectives per microbatch (4 layers, 2 forward and 2 backward), each after a 16th of its compute
    cfg = small_cfg(tp=2, microbatches=2)
    compute = predict(cfg, _hw())["time_s"]["compute"] / 2
    assert two - one == pytest.approx(16 * kn.sync_wait(synthetic_costs(skew=TABLE), compute / 16, 2), rel=0.2)


def test_the_rule_sentence_prices_the_synchronized_runs_with_and_without_the_calibrations_waits():
    from distperf.analysis import time_model as tm
    from test_analysis_time_model import HW, row

    # measured a tenth slower than the analytical mode without waits prices them, and the profiled mode a tenth less
    found = {"dp_zero": pd.DataFrame([row("small", 1.1, 0.9, dp=2), row("small", 1.1, 0.9, dp=2, microbatches=2),
                                      row("small", 1.0, 1.0)])}
    assert tm.skew_rule_sentence(found, HW, None) == "this calibration did not measure the waits for the slowest rank"
    side = {"conditions": {"skew": {"rows": [{"ranks": n, "units": 1, "burst_s": d, "wait_s": w}
                                             for n, d, w in TABLE]}}}
    text = tm.skew_rule_sentence(found, HW, side)
    assert "over the 2 held-out configurations whose ranks wait for each other" in text
    assert "without them (the model)" in text and "The waits would stand" in text
    fast = {"dp_zero": pd.DataFrame([row("small", 0.9, 1.1, dp=2), row("small", 0.9, 1.1, dp=2, microbatches=2)])}
    assert "do not stand" in tm.skew_rule_sentence(fast, HW, side)
    assert tm.skew_rule_sentence({"dp_zero": pd.DataFrame([row("small", 1.0, 1.0)])}, HW, side) == \
        "no held-out run synchronizes its ranks beyond FSDP2's units"


def test_the_probe_times_bursts_on_two_ranks_aligned_before_each():
    from distperf.measure.skew import skew_waits

    found = skew_waits(2, bursts=(1, 2), total=2, timeout=120)
    assert [r["units"] for r in found["rows"]] == [1, 2] and all(r["ranks"] == 2 for r in found["rows"])
    assert all(r["burst_s"] > 0 and r["wait_s"] >= 0 for r in found["rows"])
    assert found["rows"][1]["burst_s"] > found["rows"][0]["burst_s"]
    assert len(found["placement"]) == 2


def test_the_command_refuses_no_rounds(capsys, tmp_path):
    from distperf.measure.skew import main

    out = tmp_path / "skew.json"
    assert main(["--out", str(out), "--rounds", "0"]) == 2
    assert "rounds: must be a whole number of at least 1" in capsys.readouterr().err and not out.exists()
