"""What DTensor's cost per collective each held-out tensor-parallel run implies (distperf.analysis.tp_implied)."""
from dataclasses import replace

import pandas as pd
import pytest

from distperf import presets
from distperf.analysis import tp_implied as ti
from distperf.config import Config, Layout
from distperf.cost import predict
from distperf.cost.kernels import STEP_FIT_MODEL
from test_analysis_time_model import HW, row


def _runs(values, profile=1e-3, **layout):
    """Repeats of a tensor-parallel run of small, each measured as the cost model prices it with DTensor's cost per
    collective at one of ``values``; the profile that judges them prices ``profile``."""
    out = []
    for repeat, c in enumerate(values):
        measured = row("small", 1.0, hw=replace(HW, kernels=replace(HW.kernels, tp_collective_s=c)), tp=2, **layout)
        out.append({**measured, "repeat": repeat})
    return out, replace(HW, kernels=replace(HW.kernels, tp_collective_s=profile))


def test_each_configuration_implies_the_cost_its_repeats_were_measured_with():
    runs, hw = _runs([5e-4, 9e-4, 7e-4], micro_batch=2)
    others = [row(STEP_FIT_MODEL, 1.0, tp=2), row("small", 1.0, dp=2)]  # the fit's preset; no tensor parallelism
    table = ti.implied({"x": pd.DataFrame(runs + others)}, hw)
    assert len(table) == 1
    found = table.iloc[0]
    assert (found.implied_us, found.implied_min_us, found.implied_max_us) == pytest.approx((700, 500, 900))
    assert found.repeats == 3 and found.profile_us == pytest.approx(1000)
    assert found.message_kib == pytest.approx(2 * 128 * 128 * 4 / 1024) and found.collectives > 0
    assert pd.isna(found.tiny_us)  # no sidecar: no tiny steps to set beside it


@pytest.mark.parametrize("profile, wider", [(1e-3, 1), (2e-3, 0)])
def test_the_sentence_says_whether_the_repeats_span_more_than_the_miss(profile, wider):
    runs, hw = _runs([5e-4, 9e-4], profile=profile, micro_batch=2)
    text = ti.sentence(ti.implied({"x": pd.DataFrame(runs)}, hw))
    assert "700 µs, its 2 repeats 500 to 900 µs" in text
    assert f"In {wider} of 1 configurations the repeats span more" in text


def test_the_tiny_step_of_the_nearest_message_is_set_beside_it():
    """The calibration's tiny steps measured as the cost model prices them at 400 µs per collective: the step whose
    message is nearest the run's implies 400 µs."""
    true = replace(HW, kernels=replace(HW.kernels, tp_collective_s=4e-4))

    def step(b):
        cfg = Config(model=presets.model(STEP_FIT_MODEL), layout=Layout(tp=2, micro_batch=b))
        return predict(cfg, true, backend="gloo")["time_s"]["iteration"]

    side = {"conditions": {"paths": {f"tp_b{b}_step_s": step(b) for b in (1, 64, 256)}}}
    runs, hw = _runs([6e-4], micro_batch=8)
    found = ti.implied({"x": pd.DataFrame(runs)}, hw, side).iloc[0]
    assert found.tiny_us == pytest.approx(400) and found.tiny_message_kib == pytest.approx(512)
    assert "the calibration's tiny step of 512 KiB 400 µs" in ti.sentence(ti.implied({"x": pd.DataFrame(runs)}, hw,
                                                                                       side))


def test_no_tensor_parallel_run_or_no_measured_kernels_says_so():
    assert "no held-out run" in ti.sentence(ti.implied({"x": pd.DataFrame([row("small", 1.0, dp=2)])}, HW))
    assert not len(ti.implied({"x": pd.DataFrame(_runs([5e-4])[0])}, replace(HW, kernels=None)))


def _rounds(follow: float, count: int = 120, seed: int = 0):
    """Rounds of the drift experiment whose steps drift slowly; one probe follows the drift with weight ``follow``
    (0: pure noise), the others are noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    drift = 1 + 0.2 * np.sin(np.linspace(0, 6, count))
    table = {"round": range(count), "time_s": 1e9 + 2.3 * np.arange(count),
             "tp_step_s": 0.06 * drift * rng.normal(1, 0.02, count),
             "tp_sp_step_s": 0.14 * drift * rng.normal(1, 0.02, count)}
    for probe in ti.DRIFT_PROBES:
        table[probe] = 1e-3 * rng.normal(1, 0.1, count)
    table["ar_128k_s"] = 1e-3 * (follow * drift + (1 - follow) * rng.normal(1, 0.1, count))
    return pd.DataFrame(table)


@pytest.mark.parametrize("follow", [1.0, 0.0])
def test_a_probe_follows_the_steps_only_where_its_rank_correlation_with_both_reaches_the_threshold(follow):
    found = ti.drift(_rounds(follow)).set_index("measure")
    assert bool(found.follows["ar_128k_s"]) == (follow > 0)
    assert not found.follows.drop("ar_128k_s").any()
    assert found.with_tp_sp_step_s["tp_step_s"] > 0.9  # the steps drift together
    text = ti.drift_sentence(_rounds(follow))
    assert ("an all-reduce of 128 KiB follows both" in text) == (follow > 0)
    assert ("none reaches 0.5 with both" in text) == (follow == 0)


def test_the_one_minute_medians_show_how_far_the_steps_drift():
    low, high = ti.drift_range(_rounds(0.0), "tp_step_s")
    assert 0.75 < low < 0.9 and 1.1 < high < 1.25  # a ±20 % sine, its one-minute medians near its extremes
    assert "has not been run" in ti.drift_sentence(None)
