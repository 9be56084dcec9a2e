"""Pipeline against data parallelism (distperf.analysis.pp_vs_dp), on small synthetic tables."""
from __future__ import annotations

import dataclasses
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets  # noqa: E402
from distperf.analysis import pp_vs_dp as ana  # noqa: E402
from distperf.analysis import rows  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.config import Config, Layout, Training, validate  # noqa: E402
from distperf.cost import predict  # noqa: E402
from distperf.hardware import PRESETS  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

HW = PRESETS["V100-16GB"]
TWO_NODES = dataclasses.replace(HW, devices_per_node=1)


def _config(pp: int, microbatches: int = 4, micro_batch: int = 2):
    layout = (Layout(pp=2, schedule="1f1b", micro_batch=micro_batch, microbatches=microbatches) if pp > 1 else
              Layout(dp=2, micro_batch=micro_batch, microbatches=microbatches // 2))
    return validate(Config(model=presets.model("tiny"), layout=layout))


def _run(pp: int, tokens_per_s: float, median=0.1, p10=0.09, p90=0.12, status="ok", **extra):
    return {"status": status, "tokens_per_s": tokens_per_s, "iteration_time_s.median": median,
            "iteration_time_s.p10": p10, "iteration_time_s.p90": p90, **flatten({"config": _config(pp).to_dict()}),
            **extra}


def _ratio_frame(rows, repeats=3):
    """A runs frame as measured_runs leaves it, from (model, B, layout, measured, predicted, profiled, spread): the
    repeats' times lie at 1/measured · (1 − spread, 1, 1 + spread) (one repeat: 1/measured alone)."""
    frame = pd.DataFrame(rows, columns=["model", "B", "layout", "measured", "predicted", "profiled", "spread"])
    frame["repeat_times"] = [[1 / m * (1 + k * sp) for k in ((-1, 0, 1) if repeats > 1 else (0,))]
                             for m, sp in zip(frame.measured, frame.spread)]
    return frame


def test_layout_names_global_batch_and_pp_over_dp():
    frame = pd.DataFrame({"config.layout.pp": [1, 2], "config.layout.dp": [2, 1],
                          "config.layout.micro_batch": [2, 2], "config.layout.microbatches": [2, 4]})
    assert ana.layout_names(frame).tolist() == [ana.DP_LAYOUT, ana.PP_LAYOUT]
    assert rows.global_batch(frame).tolist() == [8, 8]
    wide = pd.DataFrame({ana.DP_LAYOUT: [2.0, 4.0], ana.PP_LAYOUT: [3.0, 2.0]})
    assert ana.pp_over_dp(wide).tolist() == [1.5, 0.5]


def test_the_crossover_interpolates_log_linearly_between_the_rates_around_it():
    # log PP/DP goes from log 2 to −log 2 between 1 and 100 Mbit/s: it crosses 0 half-way in log, at 10 Mbit/s
    assert ana.crossover([1e6, 1e8], [2.0, 0.5]) == pytest.approx(1e7)
    assert ana.crossover([1e6, 1e8, 1e10], [4.0, 2.0, 0.5]) == pytest.approx(1e9)  # the bracket that changes sign
    assert ana.crossover([1e6, 1e8], [0.5, 2.0]) == pytest.approx(1e7)  # either direction
    assert ana.crossover([1e6, 1e7, 1e8], [3.0, 1.0, 0.5]) == pytest.approx(1e7)  # a ratio of exactly 1
    assert ana.crossover([1e6, 1e7], [1.0, 0.5]) == pytest.approx(1e6)
    assert ana.crossover([1e6, 1e7], [2.0, 1.0]) is None  # a 1 at the last rate only touches: no crossing in range
    assert ana.crossover([1e6, 1e8], [2.0, 1.5]) is None  # the pipeline wins everywhere
    assert ana.crossover([1e6], [2.0]) is None and ana.crossover([], []) is None


def test_the_last_rate_at_which_the_pipeline_still_wins():
    assert ana.last_pipeline_win([1, 2, 5, 10], [3.0, 1.5, 0.9, 0.5]) == 2
    assert ana.last_pipeline_win([1, 2, 5], [3.0, 0.5, 1.2]) == 5  # the highest, not the first crossing
    assert ana.last_pipeline_win([1, 2], [1.0, 0.5]) is None  # a tie at 1 is no win
    assert ana.last_pipeline_win([], []) is None


def test_measured_runs_derive_batch_tokens_predictions_and_errors():
    runs = pd.DataFrame([_run(1, 100.0), _run(2, 200.0, **{"prediction.profiled.time_s.iteration": 0.2}),
                         _run(2, 1.0, status="failed")])
    out = ana.measured_runs(runs, HW)
    assert len(out) == 2 and out.layout.tolist() == [ana.DP_LAYOUT, ana.PP_LAYOUT]
    assert out.model.tolist() == ["tiny", "tiny"] and out.B.tolist() == [8, 8]
    assert out.tokens.tolist() == [8 * 16, 8 * 16]
    iteration = predict(_config(2), HW)["time_s"]["iteration"]
    assert out.predicted.iloc[1] == pytest.approx(128 / iteration)
    assert out.error.iloc[1] == pytest.approx(out.predicted.iloc[1] / 200.0 - 1)
    assert math.isnan(out.profiled.iloc[0]) and out.profiled.iloc[1] == pytest.approx(128 / 0.2)
    assert out.profiled_error.iloc[1] == pytest.approx(640 / 200 - 1)
    assert out.spread.tolist() == pytest.approx([0.3, 0.3])
    assert out.repeat_times.tolist() == [[0.1], [0.1]] and out.memory.isna().all()
    assert ana.measured_runs(pd.DataFrame([_run(1, 100.0)]), HW).profiled.isna().all()  # no profiled column
    repeated = pd.DataFrame([_run(1, 100.0, config_hash="a", repeat=0, **{"memory_bytes.total": 5.0}),
                             _run(1, 90.0, median=0.11, config_hash="a", repeat=1),
                             _run(1, 1.0, median=9.0, config_hash="a", repeat=2, status="failed")])
    out = ana.measured_runs(repeated, HW)
    assert out.repeat_times.tolist() == [[0.1, 0.11]] and out.memory.tolist() == [5.0]


def test_model_order_and_descriptions():
    runs = pd.DataFrame({"model": ["gpt2", "tiny", "gpt2"]})
    assert ana.model_order(runs) == ["gpt2", "tiny"]  # the presets' order
    assert ana.models_text(["tiny"]) == "tiny (2 layers, h = 32)"
    hw = dataclasses.replace(HW, intra_latency=5e-6, intra_bandwidth=2.5e9, flops_fp32=1e11, flops_efficiency=0.5)
    assert ana.hardware_text(hw) == "α = 5 µs, β = 2.50 GB/s, 50 GFLOP/s"


def _winner_runs(noise=0.1):
    # (model, B): PP clearly faster; DP clearly faster; PP faster by less than the noise (a tie)
    return _ratio_frame([
        ("tiny", 8, ana.DP_LAYOUT, 100.0, 100.0, 100.0, noise), ("tiny", 8, ana.PP_LAYOUT, 200.0, 150.0, 80.0, 0.0),
        ("tiny", 16, ana.DP_LAYOUT, 100.0, 100.0, 100.0, 0.0), ("tiny", 16, ana.PP_LAYOUT, 50.0, 120.0, 50.0, 0.0),
        ("gpt2", 8, ana.DP_LAYOUT, 100.0, 100.0, np.nan, noise), ("gpt2", 8, ana.PP_LAYOUT, 105.0, 50.0, np.nan, 0.0),
    ])


def test_the_winner_of_each_configuration_with_ties_within_the_noise():
    ratio = ana.winner_table(_winner_runs())
    by = ratio.reset_index().set_index(["model", "B"])
    assert by.loc[("tiny", 8), "measured PP/DP"] == 2.0 and by.loc[("tiny", 8), "predicted PP/DP"] == 1.5
    assert by["measured winner"].to_dict() == {("gpt2", 8): "tie", ("tiny", 8): "PP", ("tiny", 16): "DP"}
    assert by["predicted winner"].to_dict() == {("gpt2", 8): "DP", ("tiny", 8): "PP", ("tiny", 16): "PP"}
    assert by["framework right"].to_dict() == {("gpt2", 8): "–", ("tiny", 8): "yes", ("tiny", 16): "no"}
    assert by.loc[("gpt2", 8), "low"] < 1 < by.loc[("gpt2", 8), "high"] and by.loc[("tiny", 8), "low"] > 1
    assert ana.winner_counts(ratio) == {"pp_wins": 1, "dp_wins": 1, "ties": 1, "decisive": 2, "agree": 1}


def test_a_difference_beyond_the_repeats_interval_is_no_tie_and_one_run_decides_nothing():
    # gpt2 at B = 8 has PP/DP = 1.05: a win for the pipeline when the repeats agree to 0.1 %, a tie at 10 %
    assert ana.winner_table(_winner_runs(noise=0.001)).loc[("gpt2", 8), "measured winner"] == "PP"
    assert ana.winner_table(_winner_runs(noise=0.001)).loc[("gpt2", 8), "framework right"] == "no"
    assert ana.winner_table(_winner_runs(noise=0.1)).loc[("gpt2", 8), "measured winner"] == "tie"
    single = ana.winner_table(_ratio_frame(_winner_runs().iloc[:, :7].values.tolist(), repeats=1))
    assert (single["measured winner"] == "tie").all() and single.low.isna().all()


def test_memory_per_device_beside_throughput():
    runs = _winner_runs().assign(memory=[100.0, 60.0, 100.0, 50.0, np.nan, np.nan])
    ratio = ana.winner_table(runs)
    assert ratio["PP/DP memory"].to_dict() == {("gpt2", 8): pytest.approx(np.nan, nan_ok=True), ("tiny", 8): 0.6,
                                               ("tiny", 16): 0.5}
    assert "PP/DP memory" not in ana.winner_table(_winner_runs())


def test_the_profiled_sentence_only_where_runs_have_profiled_predictions():
    runs = _winner_runs().assign(profiled_error=[0.5, 0.1, -0.2, 0.3, np.nan, np.nan])
    ratio = ana.winner_table(runs)
    # profiled PP/DP: tiny B=8 0.8 (DP, but PP won), tiny B=16 0.5 (DP, right); the tie does not count
    assert ana.profiled_text(ratio, runs, 2) == (
        "With profiled layer times instead of FLOPs at the peak rate (dotted), the framework names the winner in "
        "1 of 2 decisive cases, with a median throughput error of +20%.")
    assert ana.profiled_text(ratio.drop(columns="profiled PP/DP"), runs, 2) == ""
    no_profile = runs.assign(profiled=np.nan)
    assert ana.profiled_text(ana.winner_table(no_profile), no_profile, 2) == ""


def test_error_by_model_and_the_tables():
    runs = _winner_runs().assign(error=[0.1, 0.3, -0.5, 0.5, 0.02, 0.04])
    assert ana.error_by_model_text(runs, ["tiny", "gpt2"]) == "tiny +20%, gpt2 +3%"
    errors = ana.error_table(runs)
    assert errors.columns.tolist() == ["model", "B", "layout", "measured tokens/s", "predicted tokens/s",
                                       "signed error"]
    assert errors[["model", "B"]].values.tolist()[0] == ["gpt2", 8]  # sorted by model, B, layout
    table = ana.ratio_table(ana.winner_table(runs))
    tiny = table.loc[table.model == "tiny", "signed error of PP/DP"]
    assert tiny.tolist() == pytest.approx([1.5 / 2 - 1, 1.2 / 0.5 - 1])


def test_why_names_the_shares_at_the_largest_configuration():
    def time_s(iteration, exposed, bubble=0.0):
        return {"time_s": {"iteration": iteration, "communication_exposed": exposed, "bubble": bubble}}

    runs = pd.DataFrame({"model": ["tiny"] * 4, "B": [8, 8, 64, 64], "tokens": [128, 128, 1024, 1024],
                         "layout": [ana.DP_LAYOUT, ana.PP_LAYOUT] * 2,
                         "prediction": [time_s(1, 0.9), time_s(1, 0.9, 0.9), time_s(2, 1), time_s(4, 1, 2)]})
    assert ana.why_text(runs) == ("for tiny at B = 64 the framework puts DP's exposed all-reduce at 50% of its "
                                  "iteration, PP's bubble at 50% and its communication at 25%")


def test_the_throughput_figure_has_one_panel_per_model_and_a_profiled_line_where_measured():
    runs = _winner_runs()
    fig = ana.draw_throughput(runs, ["tiny", "gpt2"])
    tiny, gpt2 = fig.axes
    assert tiny.get_title() == "tiny" and len(tiny.lines) == 6 and len(gpt2.lines) == 4
    plt.close(fig)


def test_throughput_ratio_is_dp_time_over_pp_time_and_a_slow_link_favours_the_pipeline():
    ratio, dp_fits, pp_fits = ana.throughput_ratio("tiny", 16, TWO_NODES, 4)
    dp = predict(validate(Config(model=presets.model("tiny"), layout=Layout(dp=2, micro_batch=4, microbatches=2),
                                 training=Training("mixed", "adam"))), TWO_NODES)
    pp = predict(validate(Config(model=presets.model("tiny"),
                                 layout=Layout(pp=2, schedule="1f1b", micro_batch=4, microbatches=4),
                                 training=Training("mixed", "adam"))), TWO_NODES)
    assert ratio == dp["time_s"]["iteration"] / pp["time_s"]["iteration"] and dp_fits and pp_fits
    sweep = ana.bandwidth_sweep(["gpt2"], [1, 400], 64, TWO_NODES, 4)
    assert sweep.columns.tolist() == ["model", "gbit", "ratio"]
    slow, fast = sweep.ratio
    assert slow > fast  # the all-reduce of all gradients suffers more from a slow link than the pipeline's sends
    assert ana.with_bandwidth(TWO_NODES, 8).inter_bandwidth == 1e9


def test_cluster_grid_figure_and_sentences():
    grid = ana.cluster_grid(["tiny", "bert-tiny"], [8, 16], TWO_NODES, 4)
    assert grid.columns.tolist() == ["model", "B", "ratio", "dp_fits", "pp_fits"] and len(grid) == 4
    sweep = pd.DataFrame({"model": ["a", "a", "b", "b"], "gbit": [1, 10, 1, 10], "ratio": [2.0, 0.5, 0.9, 0.5]})
    fig = ana.draw_cluster(grid, sweep, ["tiny", "bert-tiny"], [8, 16], 16)
    assert len(fig.axes[0].texts) == 4 and len(fig.axes[1].lines) == 3  # two models and the line at 1
    plt.close(fig)
    assert ana.crossover_text(sweep) == "a: 1 Gbit/s; b: never"
    made = pd.DataFrame({"model": ["m1", "m1", "m2", "m2"], "B": [8, 64, 8, 64], "ratio": [1.2, 0.8, 1.5, 1.1],
                         "dp_fits": [True, True, False, False], "pp_fits": [True, True, True, False]})
    assert ana.no_fit_text(made) == "2 of 4 cells (m2), the pipeline in 1"
    assert ana.no_fit_text(made.assign(dp_fits=True, pp_fits=True)) == "0 of 4 cells (none), the pipeline in 0"
    assert ana.batch_wins_text(made, 8) == "2 of 2 models at B = 8"
    assert ana.batch_wins_text(made, 64) == "1 of 2 models at B = 64"


def test_the_verdict_and_its_sentences():
    pp = rule("pp_vs_dp")
    assert pp.verdict(ana.statistics({"pp_wins": 3}, 3, 28, 28)) == "reproduced"  # without the map: left out
    assert pp.verdict(ana.statistics({"pp_wins": 0}, 3, 0, 28)) == "not reproduced"
    assert pp.verdict(ana.statistics({"pp_wins": 2}, 3, 13, 28)) == "depends"  # measured half or more, cells not
    assert pp.verdict(ana.statistics({"pp_wins": 1}, 3, 14, 28)) == "depends"
    assert pp.verdict(ana.statistics({"pp_wins": 0}, 0, 0, 0)) == "not measured"
    # the map's cells count among the measured ones, and its boundary decides a criterion of its own
    placed = {"cells": 10, "pp_wins": 6, "dp_wins": 3, "ties": 1, "decisive": 9, "agree": 8}
    misplaced = {**placed, "agree": 4}
    assert ana.statistics({"pp_wins": 0}, 2, 14, 28, placed)["measured_share"] == 0.5
    assert pp.verdict(ana.statistics({"pp_wins": 1}, 2, 14, 28, placed)) == "reproduced"
    assert pp.verdict(ana.statistics({"pp_wins": 1}, 2, 14, 28, misplaced)) == "depends"
    assert pp.verdict(ana.statistics({"pp_wins": 0}, 2, 0, 28, {**misplaced, "pp_wins": 0})) == "not reproduced"
    ratio = ana.winner_table(_winner_runs())
    counts = ana.winner_counts(ratio)
    assert ana.finding(ratio, counts, 14, 28) == (
        "on loopback PP 2 beat DP 2 in 1 of 3 configurations, DP in 1, 1 ties (PP/DP 0.50–2.00); the framework "
        "predicts PP wins on 25 Gbit/s links in 14 of 28 cells")
    assert "on emulated links PP won 6 of 10 cells, DP 3, the framework naming the winner of 8 of 9" in ana.finding(
        ratio, counts, 14, 28, placed)
    numbers = ("on loopback the measurements have the pipeline win 1 of 3 configurations (data parallelism 1, 1 ties); "
               "the framework has the pipeline win 14 of 28 cells of a 25 Gbit/s cluster")
    texts = {v: ana.verdict_text(v, counts, 3, 14, 28) for v in ("reproduced", "depends", "not reproduced")}
    assert texts["reproduced"] == (
        f"the pipeline's advantage holds in most cases and the framework places its boundary: {numbers}.")
    assert texts["depends"].startswith("the pipeline's advantage holds in part of the map")
    assert texts["not reproduced"].startswith("the pipeline's advantage does not show")
    assert numbers in texts["depends"] and numbers in texts["not reproduced"]
    with_map = ana.verdict_text("depends", counts, 3, 14, 28, placed, "tiny, B = 8: PP wins at 30 Mbit/s")
    assert "on emulated links 6 of 10 cells (data parallelism 3, 1 ties)" in with_map
    assert with_map.endswith("Where it wins: tiny, B = 8: PP wins at 30 Mbit/s.")
