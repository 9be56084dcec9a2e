"""Measurement beside prediction (distperf.analysis.measured_vs_predicted), on small synthetic tables."""
import json
import math
from types import SimpleNamespace

import pandas as pd

from distperf.analysis import measured_vs_predicted as mvp

MiB = 2**20
PREDICTED = {"parameters": 100, "gradients": 100, "optimizer_states": 200, "activations": 50, "total": 450}


def run(label, peak=True, **values):
    """One run's row: its prediction and what it measured (each category's peak, else the states at rest)."""
    row = {"label": label, "prediction": {"memory_bytes": PREDICTED},
           "model_state_bytes_at_rest": json.dumps([{"parameters": 100, "gradients": 100, "optimizer_states": 100},
                                                    {"parameters": 90, "gradients": 90, "optimizer_states": 90}])}
    if peak:
        row.update({"memory_bytes.parameters": 100, "memory_bytes.gradients": 80,
                    "memory_bytes.optimizer_states": 250, "memory_bytes.activations": 40})
    return {**row, **values}


def test_the_hardware_line_and_the_kind_of_memory():
    hw = SimpleNamespace(intra_latency=20e-6, intra_bandwidth=1.5e9, flops_fp32=100e9, flops_efficiency=0.5)
    assert mvp.hardware_line(hw) == "α = 20 µs, β = 1.50 GB/s, 50 GFLOP/s"
    assert mvp.memory_kind(True).startswith("the peak of a training step")
    assert "model_state_bytes_at_rest" in mvp.memory_kind(False)


def test_memory_by_category_from_each_steps_peaks():
    memory = mvp.memory_by_category(pd.DataFrame([run("a", layout="x"), run("b", layout="y")]), peak=True,
                                    keep=("label", "layout"))
    assert list(memory.columns) == ["label", "layout", "category", "measured", "predicted", "error"]
    assert memory.category.tolist()[:4] == ["parameters", "gradients", "optimizer states", "activations"]
    assert memory.layout.tolist() == ["x"] * 4 + ["y"] * 4
    assert memory.error.tolist()[:4] == [0.0, 0.25, -0.2, 0.25]
    assert mvp.model_state_rows(memory).category.tolist() == ["parameters", "gradients", "optimizer states"] * 2


def test_memory_by_category_at_rest_takes_the_most_loaded_rank():
    memory = mvp.memory_by_category(pd.DataFrame([run("a", peak=False)]), peak=False)
    assert memory.category.tolist() == ["parameters", "gradients", "optimizer states"]
    assert memory.measured.tolist() == [100, 100, 100] and memory.error.tolist() == [0.0, 0.0, 1.0]


def test_memory_and_time_rows_of_the_error_table():
    memory = pd.DataFrame({"label": ["a"], "category": ["gradients"], "measured": [2 * MiB], "predicted": [3 * MiB]})
    assert mvp.memory_rows(memory) == [dict(quantity="memory: gradients", configuration="a", measured=2.0,
                                            predicted=3.0, unit="MiB")]
    timed = pd.Series(dict(label="a", measured_s=0.002, predicted_s=0.001, profiled_s=float("nan")))
    assert mvp.time_rows(timed) == [dict(quantity="iteration time", configuration="a", measured=2.0, predicted=1.0,
                                         unit="ms")]
    profiled = mvp.time_rows(timed.copy().replace({float("nan"): 0.003}))
    assert [r["quantity"] for r in profiled] == ["iteration time", "iteration time (profiled)"]
    assert profiled[1]["predicted"] == 3.0


def test_the_error_table_leaves_no_infinite_error():
    table = mvp.error_table([dict(quantity="q", configuration="a", measured=2.0, predicted=3.0, unit="ms"),
                             dict(quantity="q", configuration="b", measured=0.0, predicted=1.0, unit="ms"),
                             dict(quantity="r", configuration="a", measured=4.0, predicted=3.0, unit="ms")])
    assert list(table.columns) == ["quantity", "configuration", "measured", "predicted", "unit", "error"]
    assert table.error[0] == 0.5 and math.isnan(table.error[1]) and table.error[2] == -0.25
    html = mvp.styled_error_table(table).to_html()
    assert "signed error" in html and "+50%" in html and "–" in html
    assert mvp.errors_of(table, "q").tolist() == [0.5]
    assert mvp.error_range(mvp.errors_of(table, "q")) == "+50% to +50%"
    assert mvp.error_range(table.error) == "-25% to +50%"
