"""The calibration's path probes from round to round (distperf.analysis.round_drift): the rank correlation, the rule
in both directions, and the sentence."""
from __future__ import annotations

import pytest

from distperf.analysis import round_drift


def test_rank_correlation_reads_plus_one_rising_minus_one_falling_and_zero_for_one_value():
    assert round_drift.rank_correlation([1.0, 2.0, 3.0, 5.0]) == pytest.approx(1.0)
    assert round_drift.rank_correlation([5.0, 3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert round_drift.rank_correlation([2.0, 1.0, 4.0, 3.0]) == pytest.approx(0.6)
    assert round_drift.rank_correlation([7.0]) == 0.0


def side(times: list[list[float]], threads=None) -> dict:
    """A sidecar whose rounds time the plain stack and two tensor-parallel steps as ``times`` (one list per round)."""
    names = ("plain_stack_s", "tp_b1_step_s", "tp_sp_b1_step_s")
    rounds = [{**dict(zip(names, row)), "tp_b1_wait_s": 1.0} for row in times]
    record = {"rounds": len(rounds)} | ({"threads": [[t, t + 90] for t in threads]} if threads else {})
    return {"conditions": {"path_rounds": rounds, "rounds": record}}


def test_rounds_that_rise_drift_and_rounds_that_scatter_do_not():
    rising = side([[0.010 * (1 + 0.1 * r), 0.02 * (1 + 0.05 * r), 0.04 + 0.001 * r] for r in range(6)])
    found = round_drift.drift(rising)
    assert found["drifts"] and found["correlation"] == pytest.approx(1.0) and found["probes"] == 3
    assert found["plain"] == pytest.approx(0.5) and found["threads"] is None
    assert "the rounds drift" in round_drift.sentence(rising) and "same processes" in round_drift.sentence(rising)
    scatter = side([[0.010, 0.021, 0.040], [0.012, 0.020, 0.043], [0.009, 0.022, 0.041], [0.011, 0.019, 0.039],
                    [0.010, 0.020, 0.042], [0.0105, 0.0205, 0.038]], threads=[4] * 6)
    found = round_drift.drift(scatter)
    assert not found["drifts"] and found["correlation"] < round_drift.DRIFT_BELOW and found["threads"] == [4] * 6
    said = round_drift.sentence(scatter)
    assert "do not drift" in said and "fresh processes" in said and "4 to 4 threads" in said


def test_fewer_than_three_rounds_cannot_tell():
    assert round_drift.drift(side([[0.01, 0.02, 0.04]] * 2)) is None
    assert round_drift.drift(None) is None
    assert "fewer than three rounds" in round_drift.sentence(None)


def test_chance_is_the_share_of_the_rounds_orders_that_reach_the_median_found():
    three = [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]  # rising: only the order measured reaches +1
    assert round_drift.median_correlation(three) == pytest.approx(1.0)
    assert round_drift.chance(three) == pytest.approx(1 / 6)
    falling = [[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]]  # every order reaches -1
    assert round_drift.chance(falling) == pytest.approx(1.0)
    rising = [[float(r) for r in range(6)]] * 3
    assert round_drift.chance(rising) == pytest.approx(1 / 720)
    many = [[float(r) for r in range(9)]] * 3  # sampled orders, the measured one among them
    assert 1 / round_drift.ORDERS <= round_drift.chance(many) < 0.01
    said = round_drift.sentence(side([[0.010, 0.02, 0.04], [0.011, 0.021, 0.041], [0.012, 0.022, 0.042]]))
    assert "the rounds drift" in said and said.endswith("17% of the orders of these 3 rounds reach that median by chance")
