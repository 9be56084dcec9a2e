"""The findings at a glance (distperf.analysis.findings): verdict records, the landing page's table and figure."""
from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from distperf.analysis import findings  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402

HOLDS = {"median_error": 0.05, "largest_error": 0.20}  # layer_timing: both within the book's time standard
FAILS = {"median_error": 0.30, "largest_error": math.inf}


def test_the_margin_is_relative_to_the_threshold_and_capped():
    assert findings.margin(">=", 0.5, 0.75) == 0.5 and findings.margin(">=", 0.5, 0.25) == -0.5
    assert findings.margin("<=", 0.10, 0.05) == 0.5 and findings.margin("<=", 0.10, 0.15) == pytest.approx(-0.5)
    assert findings.margin("<=", 0.10, 10.0) == -1.0 and findings.margin("<=", 0.10, math.inf) == -1.0
    assert findings.margin("<=", -0.5, -0.9) == pytest.approx(0.8)  # a negative threshold: below it holds
    assert findings.margin(">=", 0.0, 0.1) == 1.0 and findings.margin(">=", 0.0, -0.1) == -1.0
    assert findings.margin(">=", 1.0, 1.0) == 0.0


def test_a_record_follows_the_data_either_way(tmp_path):
    good = findings.record("layer_timing", HOLDS, "machine A, commit x, scale cpu", "cpu")
    bad = findings.record("layer_timing", FAILS, "machine A, commit x, scale cpu", "cpu")
    assert good["verdict"] == "reproduced" and bad["verdict"] == "not reproduced"
    assert [c["met"] for c in good["criteria"]] == [True, True]
    assert [c["met"] for c in bad["criteria"]] == [False, False]
    assert good["question"] == rule("layer_timing").question and good["rule"] == rule("layer_timing").statement()
    assert bad["criteria"][1]["value"] is None and bad["criteria"][1]["margin"] == -1.0  # infinite: strict JSON
    path = findings.write_record(tmp_path, bad)
    assert path.name == "verdict-layer_timing.json" and json.loads(path.read_text()) == bad
    missing = findings.record("layer_timing", {}, "", "cpu")
    assert missing["verdict"] == "not measured" and missing["criteria"][0]["margin"] is None


def test_the_table_counts_and_figure_over_every_chapter(tmp_path):
    findings.write_record(tmp_path, findings.record("layer_timing", HOLDS, "machine A, scale cpu", "cpu"))
    records = findings.read_records(tmp_path, ["layer_timing", "pp_vs_dp"])
    assert records["pp_vs_dp"] is None
    table = findings.summary_table(records)
    assert table.verdict.tolist() == ["reproduced", findings.NOT_BUILT]
    assert table["criteria met"].tolist() == ["2 of 2", "–"]
    assert table["rests on"].tolist() == ["machine A, scale cpu", "–"]
    assert table.rule.tolist()[1] == rule("pp_vs_dp").statement()
    assert findings.counts_text(records) == f"1 reproduced, 1 {findings.NOT_BUILT}"
    fig = findings.draw_summary(records)
    colours = [line.get_color() for line in fig.axes[0].lines if line.get_marker() == "o"]
    assert colours == [findings.VERDICT_COLOURS[True]] * 2
    plt.close(fig)
    findings.write_record(tmp_path, findings.record("layer_timing", FAILS, "machine A, scale cpu", "cpu"))
    records = findings.read_records(tmp_path, ["layer_timing"])
    assert findings.counts_text(records) == "1 not reproduced"
    fig = findings.draw_summary(records)
    colours = [line.get_color() for line in fig.axes[0].lines if line.get_marker() == "o"]
    assert colours == [findings.VERDICT_COLOURS[False]] * 2
    plt.close(fig)
