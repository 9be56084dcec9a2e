"""Each schedule's part of a pipeline action inside communication, fitted on the tiny preset's runs
(distperf.analysis.pipeline_waits), and where the cost model and the wait rule use it."""
import json
from dataclasses import replace

import pandas as pd
import pytest

from distperf.analysis import pipeline_waits as pw
from distperf.analysis import time_model as tm
from distperf.cost.kernels import STEP_FIT_MODEL, KernelCosts
from distperf.cost.stage import action_inside
from test_analysis_time_model import HW, row
from test_kernels import small_cfg, synthetic_costs


def _rows(schedule, residuals, chunks=1):
    return [{"schedule": schedule, "microbatches": m, "chunks": chunks, "predicted_s": 0.01, "measured_s": 0.01 + r}
            for m, r in residuals]


def test_the_fit_is_each_schedules_median_residual_per_action_and_never_negative():
    rows = pd.DataFrame(_rows("1f1b", [(2, 4 * 3e-4), (8, 16 * 5e-4)]) + _rows("interleaved", [(2, 8 * 2e-4)], 2)
                        + _rows("2bw", [(2, -1e-3), (8, -2e-3)]))
    found = pw.fit(rows)
    assert found["1f1b"] == pytest.approx(4e-4)  # the median of 300 and 500 µs per action
    assert found["interleaved"] == pytest.approx(2e-4)  # 2·v·m = 8 actions
    assert found["2bw"] == 0.0


def test_the_fit_reads_the_tiny_presets_runs_and_recovers_the_part_that_made_them():
    """Runs of the fit's preset whose measured exposed communication is what the model prices with a part of 300 µs
    per action: the fit finds 300 µs, on them alone (a held-out model's run beside them is not fitted on)."""
    true = replace(HW, kernels=replace(HW.kernels, pp_action_s=1e-3, pp_action_wait_s=3e-4))
    tiny = [row(STEP_FIT_MODEL, 1.0, hw=true, pp=2, schedule="1f1b", microbatches=m) for m in (2, 8)]
    other = row("small", 1.0, hw=true, pp=2, schedule="1f1b", microbatches=4)
    probe = pd.DataFrame([{**r, "communication.exposed_s.pipeline_parallel": 1.0} for r in tiny])
    truth = tm.exposed_errors({"x": probe}, true, pipeline_split=True, held_out_only=False).predicted_s.tolist()
    table = pd.DataFrame([{**r, "communication.exposed_s.pipeline_parallel": t} for r, t in zip(tiny, truth)]
                         + [{**other, "communication.exposed_s.pipeline_parallel": 5.0}])
    waits, rows = pw.fitted_waits(table, true)
    assert list(rows.model) == [STEP_FIT_MODEL] * 2
    assert waits == {"1f1b": pytest.approx(3e-4)}
    assert pw.with_waits(true, waits).kernels.action_waits == (("1f1b", waits["1f1b"]),)
    assert tm.exposed_errors({"x": table}, true).model.tolist() == ["small"]  # the goal judges held-out runs only


def test_the_experiment_runs_only_the_preset_constants_are_fitted_on():
    assert pw.EXPERIMENT["base"]["model"] == STEP_FIT_MODEL
    assert set(pw.EXPERIMENT["grid"]["schedule"]) == set(pw.SCHEDULES)


def test_action_inside_takes_each_schedules_fitted_part_else_the_probes():
    costs = synthetic_costs(pp_action_s=1e-3, pp_action_wait_s=4e-4, twobw_action_s=2e-3, twobw_action_wait_s=5e-4)
    fitted = replace(costs, action_waits=(("gpipe", 1e-4), ("interleaved", 3e-3)))
    gpipe, twobw = small_cfg(pp=2, microbatches=4, schedule="gpipe"), small_cfg(pp=2, microbatches=4, schedule="2bw")
    interleaved = small_cfg(pp=2, microbatches=4, schedule="interleaved", chunks=2)
    assert action_inside(costs, gpipe.layout) == pytest.approx(2 * 4e-4)
    assert action_inside(fitted, gpipe.layout) == pytest.approx(2 * 1e-4)
    assert action_inside(fitted, interleaved.layout) == pytest.approx(2 * 2 * 1e-3)  # at most the action
    assert action_inside(fitted, twobw.layout) == pytest.approx(2 * 5e-4)  # no fitted part: the probe's


def test_a_profiles_fitted_parts_survive_its_json_and_must_be_numbers_at_least_0():
    costs = replace(synthetic_costs(), action_waits=(("1f1b", 3e-4), ("2bw", 4e-4)))
    data = json.loads(json.dumps(costs.to_dict()))
    assert data["action_waits"] == {"1f1b": 3e-4, "2bw": 4e-4}
    assert KernelCosts.from_dict(data) == costs
    assert "action_waits" not in synthetic_costs().to_dict()
    with pytest.raises(ValueError):
        KernelCosts.from_dict({**data, "action_waits": {"1f1b": -1.0}})


def test_the_wait_rule_judges_the_fitted_parts_against_the_whole_action_as_framework():
    true = replace(HW, kernels=replace(HW.kernels, pp_action_s=2e-3, action_waits=(("1f1b", 1.5e-3),)))
    runs = [row("small", 1.0, hw=true, pp=2, schedule="1f1b", microbatches=m) for m in (2, 4)]
    probe = pd.DataFrame([{**r, "communication.exposed_s.pipeline_parallel": 1.0} for r in runs])
    for truth in ("split", "whole"):
        priced = true if truth == "split" else replace(true, kernels=replace(true.kernels, action_waits=()))
        measured = tm.exposed_errors({"x": probe}, priced, pipeline_split=True).predicted_s.tolist()
        table = {"x": pd.DataFrame([{**r, "communication.exposed_s.pipeline_parallel": t}
                                    for r, t in zip(runs, measured)])}
        rule = tm.wait_rule(table, true, "pipeline_parallel")
        assert rule["runs"] == 2 and rule["stands"] == (truth == "split")
        text = tm.wait_rule_sentence(table, true, "pipeline_parallel")
        assert "the tiny preset's runs put inside communication, per action, 1500 µs (1f1b)" in text
        assert ("the split stands" in text) == (truth == "split")
