"""The emulated cluster (distperf.analysis.network), on small synthetic tables."""
from __future__ import annotations

import dataclasses
import json
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets, results  # noqa: E402
from distperf.analysis import network as net  # noqa: E402
from distperf.analysis import pp_vs_dp  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.config import Config, Layout, validate  # noqa: E402
from distperf.cost import predict  # noqa: E402
from distperf.hardware import PRESETS  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

HW = dataclasses.replace(PRESETS["V100-16GB"], intra_latency=1e-5, intra_bandwidth=1e9)
# a link set to 100 Mbit/s achieved 90% of it in the send/recv fit, with 0.2 ms per message
FITS = {1e8: {"send": {"alpha": 2e-4, "beta": 0.9 * 1e8 / 8}, "all-reduce": {"alpha": 3e-4, "beta": 1.1 * 1e8 / 8}}}


def _row(pp: int = 1, rate: float = 1e8, median: float = 0.1, **extra) -> dict:
    layout = (Layout(pp=2, schedule="1f1b", micro_batch=2, microbatches=4) if pp > 1 else
              Layout(dp=2, micro_batch=2, microbatches=2))
    config = validate(Config(model=presets.model("tiny"), layout=layout))
    return {"status": "ok", "network.inter_bit_per_s": rate, "iteration_time_s.median": median,
            "iteration_time_s.p10": median * 0.9, "iteration_time_s.p90": median * 1.2,
            **flatten({"config": config.to_dict()}), **extra}


def test_rate_text_uses_the_largest_unit_reached():
    assert net.rate_text(1e9) == "1 Gbit/s" and net.rate_text(9.76e8) == "976 Mbit/s"
    assert net.rate_text(1.234e10) == "12.3 Gbit/s" and net.rate_text(999.9e6) == "1e+03 Mbit/s"
    assert net.rate_text(1500) == "1.5 kbit/s" and net.rate_text(12) == "12 bit/s"


def test_measured_rows_or_why_there_are_none(monkeypatch):
    frame = pd.DataFrame({"status": ["failed", "ok"], "message": ["root needed", None]})
    rows, why = net.measured_or_why(frame)
    assert rows.index.tolist() == [1] and why == ""
    assert net.measured_or_why(frame.assign(status="failed")) == (None, "root needed")
    assert net.measured_or_why(frame.assign(status="failed", message=None)) == (None, "no configuration ran")
    assert net.measured_or_why(pd.DataFrame({"status": ["failed"]})) == (None, "no configuration ran")

    def missing(experiment, scale=None):
        raise FileNotFoundError(experiment)

    monkeypatch.setattr(results, "load", missing)
    assert net.measured_rows("network_bucket") == (None, "the experiment notebook has not run at this scale")
    monkeypatch.setattr(results, "load", lambda experiment, scale=None: frame)
    assert net.measured_rows("network_bucket")[0].index.tolist() == [1]
    assert net.measured_rows("network_bucket", repeats=True)[0].index.tolist() == [0, 1]
    monkeypatch.setattr(results, "load", lambda experiment, scale=None: frame.assign(status="failed"))
    assert net.measured_rows("network_bucket", repeats=True) == (None, "root needed")


def _calibration_sections():
    table = [{"set_bit_per_s": 1e8, "bytes": 2**20, "collective": "send", "scope": "inter", "ranks": 2,
              "bandwidth_bit_per_s": 0.95e8, "ratio": 0.95},
             {"set_bit_per_s": 1e8, "bytes": 4 * 2**20, "collective": "all-reduce", "scope": "inter", "ranks": 2,
              "bandwidth_bit_per_s": 0.89e8, "ratio": 0.89},
             {"set_bit_per_s": 1e8, "bytes": 1024, "collective": "send", "scope": "inter", "ranks": 2,
              "bandwidth_bit_per_s": 0.1e8, "ratio": 0.1}]
    return [{"inter_bit_per_s": 1e8, "table": table, "fits": {"inter": FITS[1e8]}},
            {"inter_bit_per_s": 1e9, "table": []}]  # a rate measured without fits


def test_link_calibrations_gather_the_tables_and_the_fits(tmp_path):
    calibration, fits = net.link_calibrations(_calibration_sections())
    assert len(calibration) == 3 and fits == FITS
    empty, no_fits = net.link_calibrations([])
    assert empty.empty and no_fits == {}
    for name, section in zip(("b", "a"), _calibration_sections()):
        (tmp_path / f"network_calibration_{name}.calibration.json").write_text(json.dumps({"network": section}))
    (tmp_path / "network_calibration_c.json").write_text("not a calibration")
    calibration, fits = net.read_link_calibrations(tmp_path)
    assert len(calibration) == 3 and fits == FITS


def test_calibration_provenance(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "git_commit", lambda: "abc123")
    monkeypatch.setattr(results, "device_name", lambda device: "Some CPU")
    monkeypatch.setattr(results, "machine_slug", lambda device: "cpu-2c")
    monkeypatch.delenv("DISTPERF_FROM", raising=False)
    calibration, _ = net.link_calibrations(_calibration_sections())
    assert net.calibration_provenance(calibration, "smoke", tmp_path) == (  # files without provenance: this machine
        "Some CPU (cpu-2c, this build), calibration under emulation, commit abc123, scale smoke")
    for name, date in (("a", "2026-12-01T11:15:00Z"), ("b", "2026-12-02T09:00:00Z")):
        (tmp_path / f"network_calibration_{name}.calibration.json").write_text(json.dumps({"provenance": {
            "machine": "cpu-8c", "device_name": "Other CPU", "commit": "def456", "date": date}}))
    assert net.calibration_provenance(calibration, "cpu", tmp_path) == (  # what the calibration files record
        "Other CPU (cpu-8c, this build), calibration under emulation, 2026-12-01 to 2026-12-02, commit def456, "
        "scale cpu")
    monkeypatch.setenv("DISTPERF_FROM", "reference")
    assert "(cpu-8c, reference data)" in net.calibration_provenance(calibration, "cpu", tmp_path)
    assert net.calibration_provenance(pd.DataFrame(), "smoke").startswith("the cost model alone, no measurement")


def test_calibration_rows_table_and_sentences():
    calibration, fits = net.link_calibrations(_calibration_sections())
    big = net.calibration_rows(calibration)
    assert big.MiB.tolist() == [1, 4] and big["set rate"].tolist() == ["100 Mbit/s"] * 2  # small messages dropped
    assert big["signed error"].tolist() == pytest.approx([-0.05, -0.11])
    assert net.calibration_table(big, "").columns.tolist() == ["set rate", "collective", "scope", "ranks", "MiB",
                                                                "measured (Mbit/s)", "signed error"]
    assert net.calibration_texts(big, fits) == {
        "net-calib-worst": "-11.0% (all-reduce, 4 MiB at 100 Mbit/s)",
        "net-calib-within": "1 of 2",
        "net-calib-beta": "100 Mbit/s: all-reduce +10.0%, send -10.0%"}
    # within 10% includes 10% itself
    assert net.calibration_texts(big.assign(**{"signed error": [-0.05, -0.10]}), fits)["net-calib-within"] == "2 of 2"


def test_nothing_calibrated():
    assert net.calibration_rows(pd.DataFrame()) is None
    assert net.calibration_texts(None, {}) == {"net-calib-worst": "not measured", "net-calib-within": "none",
                                               "net-calib-beta": "not measured"}
    assert net.calibration_table(None, "root needed").to_dict("list") == {"not measured": ["root needed"]}
    assert net.calibration_table(None, "").to_dict("list") == {"not measured": ["no calibration under emulation"]}
    assert net.missing_table("why").to_dict("list") == {"not measured": ["why"]}
    assert net.not_measured_texts(("a", "b"), "why") == {"a": "not measured (why)", "b": "not measured (why)"}


def test_link_hardware_uses_the_nearest_calibrated_rate():
    plain = net.link_hardware(HW, {}, 8e8, 2)
    assert plain.inter_bandwidth == 8e8 / 8 / 2 and plain.inter_latency == HW.intra_latency
    assert plain.devices_per_node == 2 and plain.intra_bandwidth == HW.intra_bandwidth
    fitted = net.link_hardware(HW, FITS, 2e8, 1)  # the only calibrated rate: 90% of the set rate, its α
    assert fitted.inter_bandwidth == pytest.approx(0.9 * 2e8 / 8) and fitted.inter_latency == 2e-4
    fits = {**FITS, 1e9: {"send": {"alpha": 1e-4, "beta": 0.5 * 1e9 / 8}}}
    assert net.link_hardware(HW, fits, 2.9e8, 1).inter_latency == 2e-4  # nearer 100 Mbit/s than 1 Gbit/s in log
    assert net.link_hardware(HW, fits, 3.3e8, 1).inter_bandwidth == pytest.approx(0.5 * 3.3e8 / 8)


def test_like_rates(tmp_path):
    assert net.like_rates({"V100-16GB": "25mbit", "A100": "1gbit"}) == {"V100-16GB": 25e6, "A100": 1e9}
    assert net.read_like_rates(tmp_path) == {}
    (tmp_path / "network_like.json").write_text(json.dumps({"V100-16GB": "25mbit"}))
    assert net.read_like_rates(tmp_path) == {"V100-16GB": 25e6}


def _pp_runs(pp_times, dp_times, rates):
    rows = [_row(1, r, t) for r, t in zip(rates, dp_times)] + [_row(2, r, t) for r, t in zip(rates, pp_times)]
    return net.pp_vs_dp_rows(pd.DataFrame(rows), HW, FITS)


def test_pipeline_against_data_rows_ratio_and_crossovers():
    pp = _pp_runs([0.2, 0.2, 0.2], [0.1, 0.2, 0.4], [1e9, 1e8, 1e7])
    assert pp.layout.tolist() == [pp_vs_dp.DP_LAYOUT] * 3 + [pp_vs_dp.PP_LAYOUT] * 3
    assert pp.samples.tolist() == [8] * 6 and pp.measured.tolist() == [80, 40, 20, 40, 40, 40]
    config = validate(Config(model=presets.model("tiny"), layout=Layout(dp=2, micro_batch=2, microbatches=2)))
    assert pp.predicted.iloc[0] == pytest.approx(8 / predict(config, net.link_hardware(HW, FITS, 1e9, 1))
                                                 ["time_s"]["iteration"])
    assert pp.error.iloc[0] == pytest.approx(pp.predicted.iloc[0] / 80 - 1)
    ratio = net.measured_ratio(pp)
    assert ratio.index.tolist() == [1e7, 1e8, 1e9] and ratio.tolist() == [2.0, 1.0, 0.5]
    curve = net.predicted_ratio(pp, HW, FITS, rates=[1e6, 1e10])
    assert curve[0] > curve[1]  # a slow link favours the pipeline
    measured_x, predicted_x = net.crossovers(ratio, curve, rates=[1e6, 1e10])
    assert measured_x == pytest.approx(1e8) and predicted_x == pp_vs_dp.crossover([1e6, 1e10], curve)
    assert net.crossovers(ratio * 4, np.array([4.0, 2.0]), rates=[1e6, 1e10]) == (None, None)
    one_layout = pp[pp.layout == pp_vs_dp.DP_LAYOUT].iloc[:1].assign(rate=5e8)
    assert net.measured_ratio(pd.concat([pp, one_layout])).index.tolist() == [1e7, 1e8, 1e9]  # needs both layouts


def test_pipeline_sentences_with_and_without_a_crossover():
    pp = _pp_runs([0.2, 0.2], [0.1, 0.4], [1e9, 1e7])
    ratio = net.measured_ratio(pp)
    texts = net.pp_texts(pp, ratio, 1e8, None, {"V100-16GB": 1e7, "A100": 3e8})
    assert texts["net-pp-model"] == "tiny (2 layers, h = 32), global batch 8, microbatch 2"
    assert texts["net-pp-measured-x"] == "100 Mbit/s"
    assert texts["net-pp-predicted-x"] == "none between 1 Mbit/s and 10 Gbit/s"
    assert texts["net-pp-ratio"] == "0.50 at 1 Gbit/s and 2.00 at 10 Mbit/s"
    assert texts["net-pp-like"] == "like V100-16GB (10 Mbit/s): PP/DP 2.00"  # only rates that were measured
    errors = pp.error
    assert texts["net-pp-err"] == f"{errors.median():+.0%} (from {errors.min():+.0%} to {errors.max():+.0%})"
    texts = net.pp_texts(pp, ratio, None, 2e9, {})
    assert texts["net-pp-measured-x"] == "none in the measured range" and texts["net-pp-predicted-x"] == "2 Gbit/s"
    assert texts["net-pp-like"] == "not measured"
    assert set(texts) == set(net.PP_KEYS)


def test_the_ratio_interval_per_rate_and_a_section_from_every_repeat():
    rates = (1e9, 1e7)
    rows = pd.DataFrame([_row(pp, rate, t * (1 + 0.02 * k), config_hash=f"{pp}{rate}", repeat=k,
                              **{"network.inter_bit_per_s": rate})
                         for rate, dp_t, pp_t in zip(rates, (0.2, 0.2), (0.1, 0.4))
                         for pp, t in ((1, dp_t), (2, pp_t)) for k in range(3)])
    bounds = net.ratio_intervals(rows)
    assert bounds.index.tolist() == [1e7, 1e9]
    assert bounds.loc[1e7, "low"] < 0.5 < bounds.loc[1e7, "high"] < 1 < bounds.loc[1e9, "low"]
    pp, measured_x, predicted_x, fig, texts, prov = net.pp_section(rows.assign(machine="m", date="2026-12-01",
                                                                               commit="c", device_name="CPU"),
                                                                    "", HW, FITS, {})
    assert len(pp) == 4 and measured_x == pytest.approx(1e8)  # one row per configuration, repeats folded
    plt.close(fig)


def test_the_figures():
    pp = _pp_runs([0.2, 0.2], [0.1, 0.4], [1e9, 1e7])
    ratio = net.measured_ratio(pp)
    fig = net.draw_pp_vs_dp(pp, ratio, np.array([3.0, 0.3]), {"V100-16GB": 1e7}, rates=[1e6, 1e10])
    left, right = fig.axes
    # left: 2 layouts × (measured, predicted) + one target rate; right: measured (with 2 caps), predicted, the line
    # at 1 and the target rate
    assert len(left.lines) == 5 and len(right.lines) == 6
    assert [t.get_text() for t in right.texts] == ["like V100-16GB"]
    plt.close(fig)
    fig = net.draw_not_measured("root needed")
    assert fig.axes[0].texts[0].get_text() == "not measured: root needed"
    plt.close(fig)


def _bucket_runs(exposed: bool):
    extra = [{"communication.exposed_s.data_parallel": e} if exposed else {} for e in (0.05, 0.02)]
    rows = [_row(1, 2e7, 0.12, **{"options.bucket_mb": 0.01}, **extra[0]),
            _row(1, 2e7, 0.10, **{"options.bucket_mb": 25}, **extra[1])]
    return net.bucket_rows(pd.DataFrame(rows[::-1]), HW, FITS)


def test_bucket_rows_sentences_and_figure():
    bucket = _bucket_runs(exposed=True)
    assert bucket.bucket_mb.tolist() == [0.01, 25] and bucket.measured_s.tolist() == [0.12, 0.10]
    small, large = bucket.predicted_exposed_s
    assert small > large  # many small buckets pay the link's latency many times
    texts = net.bucket_texts(bucket)
    assert texts["net-bucket-rate"] == "20 Mbit/s"
    assert texts["net-bucket-range"] == "100 ms with 25 MiB buckets to 120 ms with 0.01 MiB"
    assert texts["net-bucket-measured-best"] == "25 MiB"
    assert texts["net-bucket-predicted-best"] == "25 MiB"
    assert texts["net-bucket-spread"] == "30%" and texts["net-bucket-exposed"] == "31%"  # median of 5/12, 2/10
    assert set(texts) == set(net.BUCKET_KEYS)
    fig = net.draw_bucket(bucket)
    assert len(fig.axes[0].lines) == 4
    plt.close(fig)
    bucket = _bucket_runs(exposed=False)
    assert net.bucket_texts(bucket)["net-bucket-exposed"] == "not measured"
    fig = net.draw_bucket(bucket)
    assert len(fig.axes[0].lines) == 3
    plt.close(fig)


def test_placement_across_nodes_swaps_the_links():
    inside = net.placed_hardware(HW, FITS, 1e8, net.INSIDE)
    across = net.placed_hardware(HW, FITS, 1e8, net.ACROSS)
    assert inside == net.link_hardware(HW, FITS, 1e8, 2)
    assert (across.intra_bandwidth, across.intra_latency) == (inside.inter_bandwidth, inside.inter_latency)
    assert (across.inter_bandwidth, across.inter_latency) == (inside.intra_bandwidth, inside.intra_latency)


def _placement(inside_time: float, across_time: float, rates=(2e7,), repeats=1, noise=0.01):
    rows = []
    for rate in rates:
        for k in range(repeats):
            jitter = 1 + noise * (k - (repeats - 1) / 2)
            rows += [_row(2, rate, inside_time * jitter, **{"options.mesh_order": "pp,dp,tp"}),
                     _row(2, rate, across_time * jitter, **{"options.mesh_order": "dp,pp,tp"})]
    return net.placement_rows(pd.DataFrame(rows), HW, FITS)


def test_placement_rows_gain_table_and_counts():
    place = _placement(0.1, 0.2)
    assert place.placement.tolist() == [net.INSIDE, net.ACROSS] and place.measured.tolist() == [80, 40]
    gain = net.placement_gain(place)
    predicted = place.predicted.iloc[0] / place.predicted.iloc[1]
    assert gain.link.tolist() == ["20 Mbit/s"] and gain["measured inside/across"].tolist() == pytest.approx([2.0])
    assert gain["predicted inside/across"].tolist() == pytest.approx([predicted])
    assert net.placement_gain_text(gain) == f"20 Mbit/s: measured 2.00×, predicted {predicted:.2f}×"
    assert predicted > 1  # the gradients cross the slow link when the replicas sit across nodes
    assert net.placement_counts(gain) == (0, 0, 0)  # one run decides nothing
    repeated = net.placement_gain(_placement(0.1, 0.2, repeats=3))
    assert repeated.low.iloc[0] > 1 and net.placement_counts(repeated) == (1, 1, 1)
    assert "measured 2.00× [" in net.placement_gain_text(repeated)
    table = net.placement_table(place)
    assert table.columns.tolist() == ["link", "placement", "measured samples/s", "predicted samples/s", "signed error"]
    assert table.placement.tolist() == [net.ACROSS, net.INSIDE]  # sorted by rate, then placement
    one_sided = pd.concat([place, _placement(0.1, 0.2, rates=(1e9,)).iloc[:1]])
    assert net.placement_gain(one_sided).link.tolist() == ["20 Mbit/s"]  # a rate with one placement is dropped


def test_placement_counts_on_each_side_of_one():
    gain = pd.DataFrame({"measured inside/across": [1.2, 0.8, 1.1, 0.9, 1.05],
                         "low": [1.1, 0.7, 1.05, 0.8, 0.9], "high": [1.3, 0.9, 1.2, 0.95, 1.2],
                         "predicted inside/across": [1.5, 1.5, 0.9, 0.9, 1.5]})
    # right at the first and the fourth rate; inside wins beyond the interval at two; the last is a tie
    assert net.placement_counts(gain) == (2, 2, 4)
    assert net.placement_counts(gain.iloc[:0]) == (0, 0, 0)


def test_the_network_verdict():
    def verdict(*args):
        return rule("network").verdict(net.statistics(*args))

    assert verdict(False, None, None, 0, 0, 0) == "not measured"
    assert verdict(True, 1e8, 2.9e8, 2, 2, 2) == "reproduced"  # within a factor of three
    assert verdict(True, 1e8, 3.1e8, 2, 2, 2) == "depends"  # beyond it
    assert verdict(True, 1e8, 1e8, 1, 2, 2) == "depends"  # the framework misses one placement
    assert verdict(True, 1e8, 1e8, 2, 1, 2) == "depends"  # inside a node loses at one rate
    assert verdict(True, 1e8, None, 2, 2, 2) == "depends"  # no measured crossover
    assert verdict(True, None, 1e8, 1, 1, 2) == "not reproduced"
    assert verdict(True, 1e8, 1e8, 0, 0, 0) == "reproduced"  # no placement runs: the crossover alone decides
    # the framework's placements are judged on the decisive rates only
    assert verdict(True, 1e8, 1e8, 1, 2, 2, 1) == "reproduced" and verdict(True, 1e8, 1e8, 0, 2, 2, 1) == "depends"


def test_the_network_finding():
    assert net.finding(False, None, None, 0, 0) == "emulated links need root; not measured here"
    assert net.finding(True, 1e8, 2e8, 2, 2) == ("PP/DP crosses 1 at 100 Mbit/s (predicted 200 Mbit/s); replicas "
                                                 "inside a node won (2 of 2 rates)")
    assert net.finding(True, None, None, 1, 2) == ("PP/DP crosses 1 at no measured rate (predicted none); replicas "
                                                   "inside a node did not always win (1 of 2 rates)")
    assert net.finding(True, None, None, 0, 0).endswith("did not always win (0 of 0 rates)")
    assert math.isclose(net.PREDICTED_RATES[0], 1e6) and math.isclose(net.PREDICTED_RATES[-1], 1e10)


def test_a_section_that_did_not_run_says_so_in_every_sentence():
    rows, measured_x, predicted_x, fig, texts, prov = net.pp_section(None, "needs root", None, {}, {})
    assert rows is None and measured_x is None and predicted_x is None and "cost model alone" in prov
    assert set(texts) == set(net.PP_KEYS) and all(t == "not measured (needs root)" for t in texts.values())
    plt.close(fig)
    fig, texts, prov = net.bucket_section(None, "needs root", None, {})
    assert set(texts) == set(net.BUCKET_KEYS) and all("needs root" in t for t in texts.values())
    plt.close(fig)
