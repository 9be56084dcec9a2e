"""distperf.analysis.gpu_steps: one device's measured steps beside the framework's prediction. The datasheet
prediction it recomputes is the one each run printed beside its measurement; the fixed part of a step is the
intercept of the line through two microbatch sizes, measured and predicted."""
import math

import pandas as pd
import pytest

from distperf import results
from distperf.analysis import gpu_steps

CONSTANTS = (0.69, 1.0, 2.0)


def archived():
    try:
        return results.load(gpu_steps.EXPERIMENT, archived=True)
    except FileNotFoundError:
        pytest.skip("no gpu_step_time table in data/reference/")


def test_intercept_is_the_line_through_two_points_at_zero():
    assert gpu_steps.intercept(1, 0.03, 8, 0.10) == pytest.approx(0.02)
    assert gpu_steps.intercept(2, 5.0, 4, 5.0) == pytest.approx(5.0)


def test_datasheet_prediction_is_the_one_each_run_printed():
    frame = archived()
    steps = gpu_steps.table(frame, CONSTANTS)
    printed = frame[frame["repeat"] == 0]
    assert len(steps) == len(printed)
    assert sorted(steps["datasheet_s"]) == pytest.approx(sorted(printed["prediction.time_s.iteration"]), rel=1e-9)
    assert (steps["fitted_s"] > steps["datasheet_s"]).all()  # a fitted efficiency below 1 slows every step
    assert (steps["repeats"] == 3).all()
    assert ((steps["ci_low_s"] <= steps["measured_s"]) & (steps["measured_s"] <= steps["ci_high_s"])).all()


def synthetic_steps(fixed_s=0.02, per_sample_s=0.01):
    rows = []
    for b in (1, 8):
        rows.append(dict(machine="m", model="gpt2", precision="fp32", recompute="none", micro_batch=b,
                         measured_s=fixed_s + per_sample_s * b, fitted_s=0.001 + per_sample_s * b,
                         datasheet_error=-0.5, fitted_error=-0.1))
    rows.append(dict(machine="m", model="gpt2", precision="mixed", recompute="none", micro_batch=1, measured_s=0.1,
                     fitted_s=0.01, datasheet_error=-0.9, fitted_error=-0.8))
    return pd.DataFrame(rows)


def test_fixed_part_measures_the_intercept_and_skips_a_single_microbatch():
    fixed = gpu_steps.fixed_part(synthetic_steps())
    assert len(fixed) == 1  # the mixed-precision configuration has one microbatch size only
    row = fixed.iloc[0]
    assert row["measured_fixed_s"] == pytest.approx(0.02) and row["fitted_fixed_s"] == pytest.approx(0.001)
    assert row["share_of_small_step"] == pytest.approx(0.02 / 0.03)


def test_sentence_reads_the_numbers_and_says_when_nothing_was_measured():
    steps = synthetic_steps(fixed_s=0.03)
    text = gpu_steps.sentence(steps, gpu_steps.fixed_part(steps))
    assert "median |signed error| 50%" in text and "-90% to -50%" in text and "30.0 to 30.0 ms" in text
    assert "no step's fixed part is under 20%" in text  # 30 ms of the 110 ms microbatch-8 step
    quick = gpu_steps.sentence(steps, gpu_steps.fixed_part(synthetic_steps(fixed_s=0.01)))
    assert "the 1 larger-microbatch steps" in quick and "(gpt2 fp32)" in quick
    no_step = gpu_steps.sentence(steps.iloc[0:0], gpu_steps.fixed_part(steps.iloc[0:0]))
    assert no_step.startswith("no GPU step")
    assert not math.isnan(gpu_steps.fixed_part(steps)["measured_fixed_s"].iloc[0])
