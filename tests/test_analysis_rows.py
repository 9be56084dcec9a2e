"""Reading sweep tables (distperf.analysis.rows), on small synthetic tables."""
import json
import math

import pandas as pd
import pytest

from distperf import presets
from distperf.analysis import rows
from distperf.config import Config, Layout, Training, validate
from distperf.hardware import PRESETS
from distperf.results import write_csv_atomic
from distperf.runner.sweep import flatten


def test_a_configuration_survives_a_csv_round_trip(tmp_path):
    configs = [
        validate(Config(model=presets.model("tiny"), layout=Layout(pp=2, schedule="1f1b", microbatches=4, partition=(1, 1)))),
        validate(Config(model=presets.model("bert-tiny"), layout=Layout(dp=2, tp=2, sequence_parallel=True, zero=3),
                        training=Training(precision="mixed", optimizer="sgd", momentum=False))),
    ]
    table = [{"status": "ok", **flatten({"config": c.to_dict()})} for c in configs]
    table.append({"status": "failed"})  # a failed row has no result: integer columns become floats
    frame = pd.read_csv(write_csv_atomic(pd.DataFrame(table), tmp_path / "runs.csv"))
    assert [rows.config_of_row(r) for _, r in rows.ok(frame).iterrows()] == configs


def test_ok_has_json_and_truthy_read_what_a_csv_gives_back():
    frame = pd.DataFrame({"status": ["ok", "failed", "ok"], "x": [1.0, None, 3.0], "empty": [None, None, None],
                          "flag": ["True", "False", "true"], "losses": ["[1.0, 0.5]", None, "[2.0]"]})
    assert rows.ok(frame).index.tolist() == [0, 2]
    assert rows.has(frame, "x") and not rows.has(frame, "empty") and not rows.has(frame, "missing")
    assert rows.truthy(frame.flag).tolist() == [True, False, True]
    assert [rows.json_cell(v) for v in frame.losses] == [[1.0, 0.5], None, [2.0]]


def _memory_row(measured: bool) -> pd.Series:
    at_rest = [{"parameters": 10, "gradients": 10, "optimizer_states": 20},
               {"parameters": 30, "gradients": 30, "optimizer_states": 60}]
    row = {"model_state_bytes_at_rest": json.dumps(at_rest)}
    if measured:
        per = {"parameters": [10, 30], "gradients": [11, 31], "optimizer_states": [20, 60], "activations": [5, 7]}
        per["total"] = [sum(v[r] for v in per.values()) for r in range(2)]
        row.update({f"memory_bytes.per_rank.{c}": json.dumps(v) for c, v in per.items()})
        row.update({f"memory_bytes.{c}": v[1] for c, v in per.items()})
    return pd.Series(row)


def test_measured_memory_per_rank_from_the_step_or_at_rest():
    per, kind = rows.measured_memory(_memory_row(True))
    assert kind == rows.PEAK and per[1] == {"parameters": 30, "gradients": 31, "optimizer_states": 60,
                                            "activations": 7, "total": 128}
    per, kind = rows.measured_memory(_memory_row(False))
    assert kind == rows.AT_REST and per[0]["total"] == 40 and math.isnan(per[0]["activations"])


def test_the_most_loaded_rank():
    assert rows.most_loaded_memory(_memory_row(True), peak=True)["gradients"] == 31
    assert rows.most_loaded_memory(_memory_row(False), peak=False) == {"parameters": 30, "gradients": 30,
                                                                       "optimizer_states": 60}


def test_predictions_beside_rows_use_each_rows_configuration_and_bucket():
    cfg = validate(Config(model=presets.model("tiny"), layout=Layout(dp=2)))
    base = {"status": "ok", "iteration_time_s.median": 0.5, **flatten({"config": cfg.to_dict()})}
    frame = pd.DataFrame([base, base])
    out = rows.with_predictions(frame, PRESETS["V100-16GB"], bucket_mb=pd.Series([0.001, 25.0]))
    assert out.measured_s.tolist() == [0.5, 0.5] and out.profiled_s.isna().all()
    small, large = out.predicted_exposed_s
    assert small > large  # many tiny buckets pay the latency many times
    assert out.predicted_s.iloc[1] == pytest.approx(out.prediction.iloc[1]["time_s"]["iteration"])
    own = rows.with_predictions(frame.assign(**{"options.bucket_mb": [0.001, 25.0]}), PRESETS["V100-16GB"])
    assert own.predicted_exposed_s.tolist() == out.predicted_exposed_s.tolist()  # each run at the bucket it used
    unknown = rows.with_predictions(frame, PRESETS["V100-16GB"])  # torch's default where a row has none
    assert unknown.predicted_exposed_s.tolist() == [large, large]
