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


def test_this_builds_verdicts_stand_beside_the_reference_builds_and_their_agreement_follows_the_data(
        tmp_path, monkeypatch):
    from distperf import reference, results

    build, archive = tmp_path / "figures", tmp_path / "reference" / "m"
    archive.mkdir(parents=True)
    (archive / reference.MANIFEST).write_text(json.dumps({"machine": "m", "scale": "cpu", "tables": {}}))
    findings.write_record(build, findings.record("layer_timing", HOLDS, "machine m", "cpu"))
    reference.archive_verdicts(build, archive)
    monkeypatch.setattr(results, "archive_dir", lambda scale: archive)
    chapters = ["layer_timing", "pp_vs_dp"]
    name, archived = findings.reference_records(chapters, "cpu")
    assert name.startswith("m, verdicts computed at commit ") and archived["pp_vs_dp"] is None

    own = findings.read_records(build, chapters)
    table = findings.summary_table(own, archived)
    assert table.columns.tolist()[:3] == ["question", "verdict", findings.REFERENCE_COLUMN]
    assert table[findings.REFERENCE_COLUMN].tolist() == ["reproduced", findings.NOT_ARCHIVED]
    assert findings.agreement_text(own, archived, name).startswith("1 of 1 verdicts agree")

    findings.write_record(build, findings.record("layer_timing", FAILS, "machine n", "cpu"))  # this build differs
    own = findings.read_records(build, chapters)
    text = findings.agreement_text(own, archived, name)
    assert text.startswith("0 of 1 verdicts agree") and "this build: not reproduced; reference: reproduced" in text
    assert rule("layer_timing").question in text

    def none_at(scale):
        raise FileNotFoundError(scale)

    monkeypatch.setattr(results, "archive_dir", none_at)
    assert findings.reference_records(chapters, "smoke") == (None, {})
    assert findings.agreement_text(own, {}, None).startswith("no reference build")
