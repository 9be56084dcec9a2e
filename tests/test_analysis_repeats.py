"""Run-to-run spread of repeated configurations (distperf.analysis.repeats), on small synthetic tables."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from distperf.analysis import repeats


@pytest.mark.parametrize("df, t", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)])
def test_t_quantile_matches_the_printed_tables(df, t):
    assert repeats.t_quantile(df) == pytest.approx(t, abs=5e-4)


def test_t_coverage_is_a_distribution_function():
    assert repeats.t_coverage(0.0, 3) == 0.0
    assert repeats.t_coverage(1e9, 5) == pytest.approx(1.0)
    assert repeats.t_coverage(1.0, 1) == pytest.approx(0.5)  # Cauchy: P(|T| <= 1) = 1/2
    with pytest.raises(ValueError):
        repeats.t_coverage(1.0, 0)


def test_interval_is_the_t_interval_of_the_mean():
    mean, low, high = repeats.interval([1.0, 2.0, 3.0])
    half = 4.3027 * 1.0 / math.sqrt(3)  # t(0.975, 2) · s / √n, s = 1
    assert mean == 2.0 and low == pytest.approx(2.0 - half, abs=1e-3) and high == pytest.approx(2.0 + half, abs=1e-3)
    one = repeats.interval([5.0])
    assert one[0] == 5.0 and math.isnan(one[1]) and math.isnan(one[2])


def test_median_interval_is_distribution_free():
    assert repeats.median_interval(range(10)) == (1.0, 8.0)  # 1 − 2·P(Bin(10, ½) ≤ 1) = 97.9 %; k = 3: 89 %
    assert repeats.median_interval([5.0, 0.0, 4.0, 1.0, 3.0, 2.0]) == (0.0, 5.0)  # 6 values: 96.9 % at k = 1
    assert repeats.median_interval(range(20)) == (5.0, 14.0)
    assert all(math.isnan(x) for x in repeats.median_interval(range(5)))  # 93.8 %: too few at 95 %
    assert repeats.median_interval(range(5), level=0.9) == (0.0, 4.0)
    assert all(math.isnan(x) for x in repeats.median_interval([]))


def _row(config, repeat, median, status="ok", machine="m1", p10=None, p90=None):
    return {"experiment": "e", "config_hash": config, "repeat": repeat, "status": status, "machine": machine,
            "arg.dp": 2 if config == "b" else 1, "iteration_time_s.median": median,
            "iteration_time_s.p10": p10 if p10 is not None else 0.9 * median,
            "iteration_time_s.p90": p90 if p90 is not None else 1.1 * median}


def test_by_configuration_takes_the_median_over_repeats_and_the_interval_of_their_medians():
    table = pd.DataFrame([
        _row("a", 0, 1.00, p10=0.95, p90=1.20), _row("a", 1, 1.10, p10=1.00, p90=1.30),
        _row("a", 2, 1.30, p10=1.20, p90=1.40),
        _row("a", 3, 9.99, status="failed"),  # a failed repeat does not count
        _row("b", 0, 2.0), _row("b", 1, 2.0), _row("b", 2, 2.0),  # no spread at all
        _row("c", 0, 0.5),  # one repeat: no interval
        _row("a", 0, 3.0, machine="m2"), _row("a", 1, 3.2, machine="m2"),  # another machine is another group
    ])
    out = repeats.by_configuration(table).set_index(["machine", "config_hash"])
    a = out.loc[("m1", "a")]
    assert a.repeats == 3 and a.median_s == pytest.approx(1.10)
    mean, low, high = repeats.interval([1.0, 1.1, 1.3])
    assert a.mean_s == pytest.approx(mean) and a.ci_low_s == pytest.approx(low) and a.ci_high_s == pytest.approx(high)
    assert a.ci_half_rel == pytest.approx((high - low) / 2 / 1.10)
    assert a.p10_s == pytest.approx(1.00) and a.p90_s == pytest.approx(1.30)  # medians of the runs' own p10, p90
    assert a["arg.dp"] == 1
    b = out.loc[("m1", "b")]
    assert b.repeats == 3 and b.ci_half_rel == 0.0 and b.ci_low_s == b.ci_high_s == 2.0 and b["arg.dp"] == 2
    c = out.loc[("m1", "c")]
    assert c.repeats == 1 and c.median_s == 0.5 and math.isnan(c.ci_low_s) and math.isnan(c.ci_half_rel)
    assert out.loc[("m2", "a")].repeats == 2 and out.loc[("m2", "a")].median_s == pytest.approx(3.1)


def test_a_table_without_repeats_is_one_repeat_per_configuration():
    table = pd.DataFrame([_row("a", 0, 1.0), _row("b", 0, 2.0)]).drop(columns="repeat")
    out = repeats.by_configuration(table)
    assert out.repeats.tolist() == [1, 1] and out.median_s.tolist() == [1.0, 2.0] and out.ci_half_rel.isna().all()
    assert repeats.spread_summary(out)["configurations"] == 0


def test_spread_summary_says_how_many_intervals_are_within_the_goal():
    per = pd.DataFrame({"ci_half_rel": [0.01, 0.04, 0.10, math.nan]})
    s = repeats.spread_summary(per, goal=0.05)
    assert s == {"configurations": 3, "median_half_rel": 0.04, "max_half_rel": 0.10, "within_goal": pytest.approx(2 / 3)}


def test_fold_gives_one_row_per_configuration_with_the_median_over_repeats():
    rows = [_row("a", 0, 1.0, p10=0.9, p90=1.2), _row("a", 1, 1.2, p10=1.1, p90=1.3), _row("a", 2, 1.6, p10=1.5, p90=1.7),
            _row("b", 1, 2.0), _row("b", 0, 2.2, status="failed"),  # b's repeat 0 failed: its repeat 1 stands in
            _row("a", 0, 3.0, machine="m2")]
    for r in rows:
        r.update({"memory_bytes.total": 100.0 if r["repeat"] == 0 else math.nan, "tokens_per_s": 64 / r[repeats.TIME],
                  "error.iteration_time_s.analytical": 0.5 / r[repeats.TIME] - 1})  # predicted 0.5 s every time
    folded = repeats.fold(pd.DataFrame(rows))
    assert folded.config_hash.tolist() == ["a", "b", "a"] and folded.machine.tolist() == ["m1", "m1", "m2"]
    a = folded.iloc[0]
    assert a[repeats.TIME] == pytest.approx(1.2) and a.repeats == 3 and a["repeat"] == 0
    assert a[repeats.P10] == pytest.approx(1.1) and a[repeats.P90] == pytest.approx(1.3)
    assert a["memory_bytes.total"] == 100.0  # from repeat 0, which measured it
    assert a["tokens_per_s"] == pytest.approx(64 / 1.2)
    assert a["error.iteration_time_s.analytical"] == pytest.approx(0.5 / 1.2 - 1)
    _, low, high = repeats.interval([1.0, 1.2, 1.6])
    assert a["iteration_time_s.ci_low"] == pytest.approx(low) and a["iteration_time_s.ci_high"] == pytest.approx(high)
    b = folded.iloc[1]
    assert b["repeat"] == 1 and b.repeats == 1 and b[repeats.TIME] == 2.0 and math.isnan(b["memory_bytes.total"])
    assert math.isnan(b["iteration_time_s.ci_half_rel"])
    plain = pd.DataFrame(rows).drop(columns="repeat")
    assert len(repeats.fold(plain)) == 5  # no repeats: the ok rows as they are


def test_fold_takes_the_profiled_mode_from_every_repeat_whose_ranks_timed_their_parts():
    layer, iteration = "prediction.profiled.layer_times.layer.forward_s", "prediction.profiled.time_s.iteration"
    rows = [_row("a", 0, 1.0), _row("a", 1, 1.2), _row("a", 2, 1.6),  # every repeat timed its own parts
            _row("b", 0, 2.0), _row("b", 1, 2.4), _row("b", 2, 2.2)]  # an older table: repeat 0 only
    for r, (part, predicted, at_once) in zip(rows, [(1.0, 0.9, 2), (3.0, 1.5, 2), (2.0, 1.1, 2),
                                                    (5.0, 2.5, 2), (9.0, 9.0, None), (7.0, 7.0, None)]):
        r.update({layer: part, iteration: predicted, repeats.AT_ONCE: at_once,
                  "prediction.profiled.layer_times_source": "the run's ranks" if at_once else "one process",
                  "error.iteration_time_s.profiled": predicted / r[repeats.TIME] - 1})
    folded = repeats.fold(pd.DataFrame(rows)).set_index("config_hash")
    a, b = folded.loc["a"], folded.loc["b"]
    assert a[layer] == 2.0 and a[iteration] == 1.1  # medians over the three repeats
    assert a["error.iteration_time_s.profiled"] == pytest.approx(1.1 / 1.2 - 1)
    assert b[layer] == 5.0 and b[iteration] == 2.5  # the one-process times of later repeats are not mixed in
    assert b["error.iteration_time_s.profiled"] == pytest.approx(2.5 / 2.2 - 1)
    assert b["prediction.profiled.layer_times_source"] == "the run's ranks"


def test_spread_and_its_permutation_p_value():
    assert repeats.spread([[1.0, 1.0], [2.0, 2.0], []]) == pytest.approx(1.0)
    assert math.isnan(repeats.spread([[1.0]]))
    apart = [[1.0, 1.01, 0.99], [1.5, 1.51, 1.49], [2.0, 2.02, 1.98], [1.2, 1.21, 1.19]]
    p = repeats.permutation_p(apart)
    assert p < 0.01 and p == repeats.permutation_p(apart)  # seeded: the same answer every time
    mixed = [[1.0, 1.5, 2.0], [2.0, 1.0, 1.5], [1.5, 2.0, 1.0]]  # the same values in every group
    assert repeats.permutation_p(mixed) == 1.0
    # two groups of three: only 20 relabellings, and the spread is symmetric, so p is never below 2/20
    assert repeats.permutation_p([[1.0, 1.01, 0.99], [2.0, 2.01, 1.99]]) > 0.09
    assert math.isnan(repeats.permutation_p([[1.0], [2.0], [3.0]]))


def test_fold_takes_the_time_breakdown_from_every_repeat_that_broke_its_step_down():
    per_rank = repeats.PER_RANK
    rows = [_row("a", 0, 1.0), _row("a", 1, 1.2), _row("a", 2, 1.6),  # every repeat took the step
            _row("b", 0, 2.0), _row("b", 1, 2.4), _row("b", 2, 2.2)]  # an older table: repeat 0 only
    steps = {("a", 0): ([0.2, 0.1], [1.0, 0.9]), ("a", 1): ([0.4, 0.3], [1.0, 1.3]), ("a", 2): ([0.3, 0.5], [0.8, 1.2]),
             ("b", 0): ([0.6, 0.2], [2.0, 2.1])}
    for r in rows:
        comm, window = steps.get((r["config_hash"], r["repeat"]), (None, None))
        slowest = None if window is None else window.index(max(window))
        r.update({f"{per_rank}communication": None if comm is None else json.dumps(comm),
                  f"{per_rank}window": None if window is None else json.dumps(window),
                  "time_breakdown_s.communication": None if comm is None else comm[slowest],
                  "time_breakdown_s.window": None if window is None else window[slowest],
                  "time_breakdown_s.rank": slowest})
    folded = repeats.fold(pd.DataFrame(rows)).set_index("config_hash")
    a, b = folded.loc["a"], folded.loc["b"]
    assert json.loads(a[f"{per_rank}communication"]) == [0.3, 0.3] and json.loads(a[f"{per_rank}window"]) == [1.0, 1.2]
    assert a["time_breakdown_s.rank"] == 1 and a["time_breakdown_s.window"] == 1.2  # the longest median window
    assert a["time_breakdown_s.communication"] == 0.3 and a["time_breakdown_s.repeats"] == 3
    assert b["time_breakdown_s.rank"] == 1 and b["time_breakdown_s.window"] == 2.1  # repeat 0's, as it was
    assert b["time_breakdown_s.communication"] == 0.2 and b["time_breakdown_s.repeats"] == 1
