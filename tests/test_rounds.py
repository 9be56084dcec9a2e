"""When the calibration's noisy probes have been repeated enough (distperf.measure.rounds)."""
from __future__ import annotations

import pytest

from distperf.cost.collectives import ring_terms
from distperf.measure import rounds as rd


def issued(alpha: float, beta: float, outlier: float = 0.0) -> list[dict]:
    rows = []
    for nbytes in (4, 1024, 65536, 1048576):
        steps, volume = ring_terms("all-reduce", 2, nbytes)
        rows.append({"collective": "all-reduce", "ranks": 2, "bytes": nbytes,
                     "seconds": steps * alpha + volume / beta + (outlier if nbytes < 65536 else 0.0)})
    return rows


def test_median_rows_take_each_points_median_over_the_rounds():
    rows = rd.median_rows([issued(1e-4, 1e9), issued(1e-4, 1e9, outlier=3e-3), issued(1e-4, 1e9, outlier=1e-5)])
    assert [r["bytes"] for r in rows] == [4, 1024, 65536, 1048576]
    assert rows[0]["seconds"] == pytest.approx(issued(1e-4, 1e9, outlier=1e-5)[0]["seconds"])  # not the 3 ms one


def test_an_outlier_round_moves_the_watched_alpha_and_a_quiet_one_does_not():
    paths = [{"tp_layer_s": 0.03}] * 3
    quiet = rd.moves([issued(1e-4, 1e9)] * 3, paths)
    assert quiet["all-reduce alpha"] == pytest.approx(0.0, abs=1e-9) and quiet["tp_layer_s"] == 0.0
    loud = rd.moves([issued(1e-4, 1e9), issued(1e-4, 1e9, outlier=3e-3)], paths[:2])
    assert loud["all-reduce alpha"] > rd.SETTLED and rd.settled(quiet) and not rd.settled(loud)


def test_rounds_go_on_until_settled_within_the_least_the_most_and_the_budget():
    loud, quiet = {"x": rd.SETTLED * 2}, {"x": rd.SETTLED / 2}
    assert rd.another_round(1, 0.0, {}) and rd.another_round(rd.ROUNDS_MIN - 1, 1e9, quiet)  # below the least
    assert rd.another_round(rd.ROUNDS_MIN, 10.0, loud) and not rd.another_round(rd.ROUNDS_MIN, 10.0, quiet)
    assert not rd.another_round(rd.ROUNDS_MAX, 10.0, loud)
    assert not rd.another_round(rd.ROUNDS_MIN, rd.ROUNDS_BUDGET_S + 1, loud)
    assert not rd.another_round(1, 0.0, {}, least=1, most=1)  # a quick calibration: one round


def test_a_path_median_that_moves_is_watched():
    moved = rd.moves([], [{"tp_layer_s": 0.02}, {"tp_layer_s": 0.04}, {"tp_layer_s": 0.05}])
    assert moved == {"tp_layer_s": pytest.approx(0.04 / 0.03 - 1)}  # median 0.03 of two rounds, then 0.04
