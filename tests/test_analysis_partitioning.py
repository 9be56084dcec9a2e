"""The partitioning chapter's analysis (distperf.analysis.partitioning), on small synthetic tables."""
from __future__ import annotations

import dataclasses
import json
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets  # noqa: E402
from distperf.analysis import partitioning as pt  # noqa: E402
from distperf.analysis import rows  # noqa: E402
from distperf.analysis.pipeline_schedules import chunk_flops  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.config import Config, Layout  # noqa: E402
from distperf.cost import schedules  # noqa: E402
from distperf.cost.predict import predict  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

MODEL = dataclasses.replace(presets.model("tiny"), layers=4)


def config(split=(2, 2), schedule="1f1b", m=4):
    return Config(model=MODEL, layout=Layout(pp=2, schedule=schedule, microbatches=m, partition=split))


def run_row(split=(2, 2), policy="uniform", schedule="1f1b", time=1.0, activations=None, machine="cpu",
            source="fresh"):
    """A row of the partitioning sweep: model states of 100 bytes per layer at rest, and the step's peaks with
    ``activations`` bytes per stage where given (totals 10 bytes above the categories: temporaries)."""
    at_rest = [{"parameters": 100 * n, "gradients": 100 * n, "optimizer_states": 200 * n} for n in split]
    row = {"status": "ok", "machine": machine, "source": source, "arg.partition": policy,
           "iteration_time_s.median": time, "model_state_bytes_at_rest": json.dumps(at_rest),
           **flatten({"config": config(split, schedule).to_dict()})}
    if activations is not None:
        per = [{**x, "activations": a, "total": sum(x.values()) + a + 10} for x, a in zip(at_rest, activations)]
        row.update({f"memory_bytes.per_rank.{c}": json.dumps([p[c] for p in per]) for c in per[0]})
    return row


def test_policy_labels():
    assert [pt.policy_label(p) for p in ("uniform", "params", "time", "flops", np.nan, "3,1")] == [
        "uniform", "by parameters", "by time", "by FLOPs", "fixed", "fixed"]
    assert "fixed" not in pt.REALISTIC and "by FLOPs" in pt.REALISTIC


def test_partition_tables_from_the_step_peaks():
    runs = pd.DataFrame([run_row((2, 2), "uniform", activations=(40, 20)),
                         run_row((3, 1), "time", activations=(60, 10))])
    parts, stages, kind = pt.partition_tables(runs)
    assert kind == rows.PEAK and len(stages) == 2 * 2 * 4
    uniform, by_time = parts.iloc[0], parts.iloc[1]
    assert by_time.partition == "3,1 (by time)" and by_time.split == "3,1" and by_time.first_layers == 3
    assert by_time.measured_states == 400 * 4 and by_time.measured_categories == 1600 + 70
    assert by_time.measured_total == 1600 + 70 + 20 and by_time.measured_peak_stage == 1200 + 60 + 10
    pred = predict(config((3, 1)), check=False)
    assert by_time.predicted_total == sum(pred["memory_bytes_per_stage"])
    assert by_time.predicted_peak_stage == max(pred["memory_bytes_per_stage"])
    assert by_time.predicted_states == sum(s["parameters"] + s["gradients"] + s["optimizer_states"]
                                           for s in pred["memory_bytes_by_stage"])
    assert by_time.flops == chunk_flops(config((3, 1))) and by_time.m == 4 and by_time.measured_s == 1.0
    assert uniform.policy == "uniform"
    cell = stages[(stages.partition == "3,1 (by time)") & (stages.stage == 0)].set_index("category")
    assert cell.loc["activations", "measured"] == 60
    assert cell.loc["activations", "predicted"] == pred["memory_bytes_by_stage"][0]["activations"]


def test_partition_tables_at_rest_have_no_activations():
    parts, stages, kind = pt.partition_tables(pd.DataFrame([run_row((2, 2)), run_row((1, 3), np.nan)]))
    assert kind == rows.AT_REST
    assert stages[stages.category == "activations"].measured.isna().all()
    assert parts.measured_total.tolist() == parts.measured_states.tolist() == [1600, 1600]
    assert parts.policy.tolist() == ["uniform", "fixed"]
    assert pt.partition_tables(pd.DataFrame(columns=["machine"]))[2] == rows.AT_REST


def test_model_line():
    assert pt.model_line(config()) == "4 layers, h = 32, vocabulary 256, s = 16, b = 1, m = 4"


def _parts(**columns):
    base = dict(machine="cpu", source="fresh", schedule="1f1b", m=4)
    n = max(len(v) for v in columns.values() if isinstance(v, list))
    return pd.DataFrame({**{k: [v] * n for k, v in base.items() if k not in columns}, **columns})


def test_times_are_fitted_on_the_uniform_split_of_the_same_schedule_and_machine():
    parts = _parts(policy=["uniform", "by time", "uniform", "fixed"], schedule=["1f1b", "1f1b", "gpipe", "1f1b"],
                   machine=["cpu", "cpu", "cpu", "gpu"], flops=[[1.0, 1.0], [1.5, 0.5], [1.0, 1.0], [1.0, 1.0]],
                   measured_s=[10.0, 9.0, 12.0, 1.0])
    fitted = pt.fitted_times(parts)
    assert fitted[0] == 10.0 and fitted[2] == 12.0  # the uniform split is its own reference
    c = 10.0 / schedules.pipeline_time("1f1b", [1.0, 1.0], 4, 1)
    assert fitted[1] == c * schedules.pipeline_time("1f1b", [1.5, 0.5], 4, 1)
    assert math.isnan(fitted[3])  # no uniform split on "gpu"


def test_compared_columns_follow_what_was_measured():
    assert pt.compared_columns(rows.PEAK) == ("measured_categories", "predicted_total")
    assert pt.compared_columns(rows.AT_REST) == ("measured_states", "predicted_states")
    assert pt.total_column(rows.PEAK) == "measured_total" and pt.total_column(rows.AT_REST) == "measured_states"


def _totals(**columns):
    mib = 2**20
    return _parts(**{**dict(partition=["2,2 (uniform)", "3,1 (by time)"], policy=["uniform", "by time"],
                            split=["2,2", "3,1"], measured_total=[4 * mib, 5 * mib],
                            measured_categories=[2 * mib, 3 * mib], predicted_total=[2 * mib, 4 * mib],
                            measured_states=[mib, mib], predicted_states=[mib, 2 * mib], measured_s=[0.01, 0.02],
                            predicted_s=[0.01, 0.01]), **columns})


def test_error_table_in_mib_and_ms_with_signed_errors():
    table = pt.error_table(_totals(), rows.PEAK).set_index("partition")
    assert table.loc["3,1 (by time)", "measured peak, all tensors (MiB)"] == 5.0
    assert table.loc["3,1 (by time)", "measured, modelled categories (MiB)"] == 3.0
    assert table.loc["3,1 (by time)", "memory error"] == pytest.approx(1 / 3)
    assert table.loc["3,1 (by time)", "time error"] == -0.5 and table.loc["3,1 (by time)", "measured (ms)"] == 20.0
    assert set(pt.ERROR_TABLE_FORMAT) <= set(table.columns)
    at_rest = pt.error_table(_totals(), rows.AT_REST).set_index("partition")
    assert at_rest.loc["3,1 (by time)", "memory error"] == 1.0
    assert pt.memory_error_range(_totals(), rows.PEAK) == "+0.0% to +33.3%"


def test_total_rises_against_the_uniform_split():
    rises, findings = pt.total_rises(_totals(), rows.PEAK)
    assert rises["1f1b"] == (0.25, "3,1 (by time)", 1.0)
    assert findings == ["under 1f1b the largest measured total (3,1 (by time)) is +25.0% against the uniform "
                        "split's (predicted: the largest is +100.0%)"]
    assert pt.findings_sentence(findings) == findings[0]
    rises, findings = pt.total_rises(_totals(), rows.AT_REST)
    assert rises["1f1b"][0] == 0.0
    no_uniform = _totals(policy=["fixed", "by time"])
    assert pt.total_rises(no_uniform, rows.PEAK) == ({}, [])
    lopsided = _totals(policy=["uniform", "fixed"])  # only realistic partitioners count for the verdict
    assert pt.total_rises(lopsided, rows.PEAK)[0]["1f1b"][0] == 0.25
    assert pt.total_rises(lopsided, rows.PEAK, pt.REALISTIC)[0]["1f1b"][0] == 0.0
    assert pt.findings_sentence([]) == "no uniform reference was measured"


@pytest.mark.parametrize("kind, rises, expected, because", [
    (rows.AT_REST, {"1f1b": (0.5, "3,1", 0.1)}, "not measured", "only the model states between steps"),
    (rows.PEAK, {"1f1b": (0.03, "3,1 (by time)", 0.1)}, "reproduced", "the 3,1 (by time) split holds 3.0% more"),
    (rows.PEAK, {"1f1b": (0.02, "3,1", 0.1)}, "reproduced", "the 3,1 split holds 2.0% more"),
    (rows.PEAK, {"1f1b": (0.019, "3,1", 0.1)}, "not reproduced", "no partition raised"),
    (rows.PEAK, {"gpipe": (0.5, "3,1", 0.1)}, "not measured", "no partition raised"),
])
def test_verdict_on_each_side_of_the_threshold(kind, rises, expected, because):
    assert rule("partitioning").verdict(pt.statistics(kind, rises)) == expected
    assert because in pt.reason(kind, rises)


def test_the_splits_each_policy_chose_and_why_the_time_split_matters():
    f = _totals()
    assert pt.policy_splits(f) == {"by time": "3,1", "by parameters": "not measured"}
    assert pt.time_split_reason(f).startswith("it put more layers on the first stage")
    assert pt.time_split_reason(f.assign(split=["2,2", "1,3"])).startswith("it did not put more layers")
    assert pt.time_split_reason(f[f.policy == "uniform"]).startswith("it did not put more layers")


def test_finding_with_and_without_a_1f1b_run():
    assert pt.finding({"1f1b": (0.25, "3,1 (by time)", 0.5)}, rows.PEAK) == (
        "Under 1F1B on two stages the 3,1 (by time) partition changes total memory by +25.0% (peak in a step) "
        "against the uniform split; the framework predicts +50.0% at most.")
    assert pt.finding({}, rows.PEAK) == "No 1F1B partitioning run was measured."


def test_the_figures_draw():
    import matplotlib.pyplot as plt

    runs = pd.DataFrame([run_row((2, 2), "uniform", activations=(40, 20)),
                         run_row((3, 1), "time", activations=(60, 10)),
                         run_row((2, 2), "uniform", schedule="gpipe", activations=(80, 80))])
    parts, stages, kind = pt.partition_tables(runs)
    fig = pt.draw_stages(stages, parts, kind)
    assert [ax.get_title() for ax in fig.axes] == ["1f1b", "gpipe"]
    peak_lines = pt.draw_total(parts, kind).axes[0].get_lines()
    parts, _, kind = pt.partition_tables(runs.drop(columns=[c for c in runs if c.startswith("memory_bytes")]))
    rest_lines = pt.draw_total(parts, kind).axes[0].get_lines()
    assert len(rest_lines) == len(peak_lines) + 2  # at rest: a dotted predicted total per schedule
    assert [line.get_linestyle() for line in rest_lines[-2:]] == [":", ":"]
    plt.close("all")


def test_the_allocator_beside_the_tensors():
    with_rss = run_row((3, 1), "time", activations=(60, 10))
    with_rss["memory_bytes.per_rank.rss_peak_increase"] = json.dumps([1000, 3000])
    without = run_row((2, 2), "uniform")
    table = pt.allocator_totals(pd.DataFrame([with_rss, without]))
    assert table.allocator_total[0] == 4000 and table.allocator_kind[0] == "resident-set rise"
    assert table.partition[0] == "3,1 (by time)"
    assert math.isnan(table.allocator_total[1]) and table.allocator_kind[1] == "not measured"


def test_predicted_depths_against_the_uniform_split():
    cfg = Config(model=dataclasses.replace(presets.model("small"), vocab=4096), layout=Layout(
        pp=2, schedule="1f1b", microbatches=4, micro_batch=2, partition=(3, 1)))
    table = pt.predicted_depths(cfg, depths=(2, 4), layers=8)
    assert table.depth.tolist() == [2, 2, 2, 4, 4, 4]
    assert table.policy.tolist()[:3] == ["uniform", "by parameters", "by FLOPs"]
    assert table[table.policy == "uniform"].rise.tolist() == [0.0, 0.0]
    assert table[table.policy == "uniform"].split.tolist() == ["4,4", "2,2,2,2"]
    flops4 = table[(table.policy == "by FLOPs") & (table.depth == 4)].iloc[0]
    assert sum(map(int, flops4.split.split(","))) == 8 and flops4.split != "2,2,2,2"
    assert (table.largest <= table.total).all()
    fig = pt.draw_depths(table)
    assert len(fig.axes[0].get_lines()) == 4  # three partitioners and the zero line
    import matplotlib.pyplot as plt

    plt.close(fig)
