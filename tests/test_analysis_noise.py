"""The noise floor (distperf.analysis.noise), on small synthetic sweep tables."""
import math

import pandas as pd
import pytest

from distperf.analysis import noise


def run(hash_, repeat, seconds, dp=1, tp=1, pp=1, zero=0, schedule="none", sp=False, source="fresh"):
    """One row of a sweep table: one repeat of one configuration."""
    return {"experiment": "x", "config_hash": hash_, "repeat": repeat, "status": "ok", "source": source,
            "iteration_time_s.median": seconds, "iteration_time_s.p10": 0.9 * seconds,
            "iteration_time_s.p90": 1.1 * seconds,
            "config.layout.dp": dp, "config.layout.tp": tp, "config.layout.pp": pp, "config.layout.zero": zero,
            "config.layout.schedule": schedule, "config.layout.sequence_parallel": sp}


@pytest.mark.parametrize("layout, expected", [
    ({}, "one device"),
    ({"config.layout.dp": 2}, "data parallel"),
    ({"config.layout.dp": 2, "config.layout.zero": 3}, "ZeRO-3"),
    ({"config.layout.tp": 2, "config.layout.sequence_parallel": "True"}, "tensor + sequence parallel"),
    ({"config.layout.tp": 2, "config.layout.sequence_parallel": False}, "tensor parallel"),
    ({"config.layout.pp": 2, "config.layout.schedule": "2bw", "config.layout.dp": 2},
     "pipeline (2bw) × data parallel"),
])
def test_the_strategy_of_a_row(layout, expected):
    assert noise.strategy(pd.Series(layout)) == expected


def tables():
    dp = pd.DataFrame([run("a", r, s, dp=2) for r, s in enumerate([1.00, 1.005, 0.995])]
                      + [run("b", r, s, dp=2) for r, s in enumerate([2.0, 2.4, 1.6])]
                      + [run("c", 0, 5.0, dp=2, zero=1)]  # one repeat: no interval
                      + [run("a", r, 9.0, dp=2, source="reference") for r in range(3)])  # not this build
    pipe = pd.DataFrame([run("p", r, s, pp=2, schedule="1f1b") for r, s in enumerate([3.0, 3.015, 2.985])])
    return {"dp_zero": dp, "pipeline_schedules": pipe, "planner": None}


def test_intervals_per_configuration_of_this_builds_rows():
    per = noise.intervals(tables())
    assert sorted(per.config_hash) == ["a", "b", "c", "p"]
    a = per[per.config_hash == "a"].iloc[0]
    half = 4.302653 * 0.005 / math.sqrt(3)  # t(0.975, 2) · s / √3 with s = 0.005
    assert a.experiment == "dp_zero" and a.strategy == "data parallel" and a.repeats == 3
    assert a.ci_half_rel == pytest.approx(half, rel=1e-5)
    assert math.isnan(per[per.config_hash == "c"].iloc[0].ci_half_rel)


def test_the_floor_per_strategy_and_the_goal():
    table = noise.floor(noise.intervals(tables()))
    assert table.strategy.tolist() == ["data parallel", "pipeline (1f1b)"]  # widest first; ZeRO-1 has no interval
    dp = table.iloc[0]
    assert dp.configurations == 2 and dp.repeats == 3 and dp["within goal"] == 0.5
    assert dp["within a run"] == pytest.approx(0.1)
    assert dp["largest half-width"] == pytest.approx(4.302653 * 0.4 / math.sqrt(3) / 2.0, rel=1e-5)
    assert not noise.within_goal(table)
    sd = noise.run_to_run_sd(dp["median half-width"], 3)
    assert dp["run-to-run sd"] == pytest.approx(sd) and sd == pytest.approx(dp["median half-width"] * 3**0.5 / 4.302653)
    needed = dp["repeats for the goal"]
    half = [noise.t_quantile(r - 1) * sd / r**0.5 for r in (needed - 1, needed)]
    assert half[1] <= 0.02 < half[0]  # the fewest repeats that reach the goal
    text = noise.summary(table)
    assert text.startswith("1 of 2 strategies have a median half-width above 2%: data parallel (")
    assert text.endswith(f"takes {needed} to {needed} repeats per configuration instead of 3")
    tight = table[table.strategy == "pipeline (1f1b)"]
    assert noise.within_goal(tight) and noise.within_goal(tight, goal=0.01) is False
    assert noise.summary(tight).startswith("every strategy's median half-width is within 2% (the widest, pipeline")
    assert "%" in noise.styled_floor(table).to_html()


def test_repeats_needed_for_a_spread():
    assert noise.repeats_needed(0.0) == 2
    assert noise.repeats_needed(0.03) == 12  # t(0.975, 10) · 3 % / √11 = 2.015 %, t(0.975, 11) · 3 % / √12 = 1.91 %
    assert noise.repeats_needed(5.0, most=50) is None


def test_no_interval_at_all():
    single = {"dp_zero": pd.DataFrame([run("a", 0, 1.0, dp=2)])}
    table = noise.floor(noise.intervals(single))
    assert len(table) == 0 and noise.within_goal(table) is None
    assert noise.summary(table) == "no configuration ran twice at this scale, so there is no interval to read"
    assert len(noise.floor(noise.intervals({}))) == 0


def test_background_reads_the_runs_and_calibrations_shares_and_says_when_they_were_not_recorded():
    quiet = pd.DataFrame({"background_cpu_share": [0.01, 0.02, 0.5]})
    old = pd.DataFrame({"iteration_time_s.median": [1.0]})
    text = noise.background({"a": quiet, "b": old}, {"the calibration": {"background_cpu_share": 0.031},
                                                     "the second calibration": {}})
    assert text.startswith("other processes used a median 2.0% of the machine's CPU time")
    assert "(largest 50%; 1 of 3 runs above 5%)" in text
    assert text.endswith("; 3.1% during the calibration, not recorded for the second calibration")
    assert noise.background({"b": old}, {}) == "the runs predate the record of other processes' use of the machine"
