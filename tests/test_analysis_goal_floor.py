import numpy as np
import pandas as pd
import pytest

from distperf.analysis import goal_floor as gf
from distperf.cost.kernels import STEP_FIT_MODEL

GOALS = {"analytical": (0.10, 0.25), "profiled": (0.05, 0.15)}


def _runs(config: str, times, model: str = "small", **layout) -> list[dict]:
    return [{"config_hash": config, "repeat": i, "status": "ok", "iteration_time_s.median": t,
             "config.model.name": model, **{f"config.layout.{k}": v for k, v in layout.items()}}
            for i, t in enumerate(times)]


def _table(spread: float) -> pd.DataFrame:
    """Six configurations of three repeats at −``spread``, +``spread``/2, +``spread``/2 around their means, one of
    the fit preset's, one run once."""
    rows = []
    for i in range(6):
        rows += _runs(f"c{i}", [(1.0 + i) * (1 + d) for d in (-spread, spread / 2, spread / 2)], pp=2 if i % 2 else 1,
                      schedule="1f1b")
    rows += _runs("fit", (1.0, 3.0), model=STEP_FIT_MODEL) + _runs("once", (1.0,), dp=2)
    return pd.DataFrame(rows)


def test_deviations_are_per_repeat_relative_to_the_configurations_mean_and_unshrunk():
    found = gf.repeat_deviations(gf.repeat_times({"pipeline_schedules": _table(0.1), "dp_zero": None}))
    assert len(found) == 18 and set(found.repeats) == {3}  # the fit preset and the single run are left out
    assert found.deviation.to_numpy() == pytest.approx(np.tile([-0.1, 0.05, 0.05], 6) * np.sqrt(1.5))
    assert set(found.strategy) == {"one device", "pipeline (1f1b)"}
    assert gf.repeat_deviations(gf.repeat_times({"pipeline_schedules": _table(0.1).iloc[-1:]})).empty


def test_a_perfect_prediction_misses_the_fold_by_the_drawn_noise():
    assert gf.simulate([0.0], 5, 3, draws=10) == pytest.approx(np.zeros((10, 2)))
    stats = gf.simulate([0.1], 5, 3, draws=10)  # every fold is 1.1: every error |1 − 1.1| / 1.1
    assert stats == pytest.approx(np.full((10, 2), 0.1 / 1.1))
    pool = np.linspace(-0.2, 0.2, 41)
    wide, narrow = gf.simulate(pool, 40, 3, draws=200), gf.simulate(pool, 40, 11, draws=200)
    assert wide[:, 1].max() <= 0.25 + 1e-12  # at most a fold of 0.8: (1 − 0.8) / 0.8
    assert np.median(narrow[:, 0]) < np.median(wide[:, 0])  # more repeats, a tighter fold


@pytest.mark.parametrize("spread, meets", [(0.01, 1.0), (0.3, 0.0)])
def test_the_floor_meets_the_goals_or_not_as_the_runs_repeat(spread, meets):
    table = gf.floor_table(gf.repeat_times({"pipeline_schedules": _table(spread)}), GOALS, draws=300)
    pooled = table[table.pool == "all"]
    assert pooled.repeats.tolist() == [3, gf.MORE_REPEATS] and set(pooled.configurations) == {6}
    assert pooled["meets profiled"].iloc[0] == meets
    assert set(table.pool) == {"all", "one device", "pipeline (1f1b)"}
    assert (table.median_low <= table["median"]).all() and (table["median"] <= table.median_high).all()
    sentence = gf.floor_sentence(table, GOALS)
    assert sentence.startswith("with 3 repeats per configuration a perfect prediction of the 6 held-out")
    assert f"the profiled mode's (5% / 15%) in {meets:.0%}" in sentence


def test_a_build_that_ran_the_larger_number_of_repeats_has_one_row_of_it():
    rows = sum((_runs(f"c{i}", [1.0 + 0.01 * r for r in range(gf.MORE_REPEATS)]) for i in range(3)), [])
    table = gf.floor_table(gf.repeat_times({"pipeline_schedules": pd.DataFrame(rows)}), GOALS, draws=50)
    assert table[table.pool == "all"].repeats.tolist() == [gf.MORE_REPEATS]


def test_no_repeats_no_floor():
    empty = gf.floor_table(gf.repeat_times({"pipeline_schedules": _table(0.1).iloc[-1:]}), GOALS)
    assert empty.empty
    assert gf.floor_sentence(empty, GOALS).startswith("no held-out configuration was measured in two repeats")
