"""The planner chapter's analysis (distperf.analysis.planner), on small synthetic tables and the tiny model."""
import math
from dataclasses import replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np
import pandas as pd
import pytest

from distperf import presets, published
from distperf.analysis import planner as analysis
from distperf.analysis.verdicts import rule
from distperf.hardware import GIB, PRESETS
from distperf.planner import candidates, plan

V100 = PRESETS["V100-16GB"]
TINY = presets.model("tiny")


@pytest.fixture(autouse=True)
def close_figures():
    """Close the figures a test draws."""
    yield
    plt.close("all")


# --- the paper's setting -------------------------------------------------------------------------------------

def test_the_paper_depths_and_rate_come_from_the_published_table():
    depths = analysis.paper_depths()
    assert depths == {"2bw-gpt-2.2b": 8, "2bw-gpt-3.8b": 16}
    assert all(isinstance(d, int) for d in depths.values())
    assert depths["2bw-gpt-3.8b"] == published.value("2bw-gpt-3.8b on 64 V100", "planner's pipeline depth")
    assert analysis.achieved_tflops() == 45


def test_compute_rates_label_the_peak_and_scale_the_achieved_rate():
    hw = replace(V100, flops_16bit=100e12)
    rates = analysis.compute_rates(hw, 40)
    assert list(rates) == ["peak (100 TFLOP/s)", "achieved (40 TFLOP/s)"]
    assert rates["peak (100 TFLOP/s)"] is hw
    assert rates["achieved (40 TFLOP/s)"].flops_efficiency == pytest.approx(0.4)
    # the V100's efficiency is exactly what 45 / 125 gives
    assert analysis.compute_rates(V100, 45)["achieved (45 TFLOP/s)"].flops_efficiency == 45 / 125


def test_short_names_and_the_model_in_words():
    assert analysis.short_name("2bw-gpt-3.8b") == "3.8B"
    assert analysis.short_name("tiny") == "TINY"
    assert analysis.model_text(TINY) == f"tiny ({TINY.layers} layers, h = {TINY.hidden}, s = {TINY.seq})"


def test_time_plan_returns_the_best_time_and_the_plan():
    seconds, result = analysis.time_plan(TINY, 2, V100, 8, repeats=2)
    assert seconds > 0
    assert result == plan(TINY, 2, V100, 8)
    assert analysis.candidate_count(TINY, 4) == len(candidates(TINY, 4))


def test_choice_text_names_the_first_plan_or_that_nothing_fits():
    first = {"schedule": "2bw", "w": 4, "d": 256, "micro_batch": 2, "recompute": "full"}
    assert analysis.choice_text([first, {}]) == "2bw with w = 4, d = 256, b = 2, recomputation full"
    assert analysis.choice_text([]) == "nothing fits"


def _entry(strategy="pipeline", schedule="2bw", w=2, d=4, tp=1, b=2, recompute="none", throughput=100.0,
           memory_bytes=GIB, **more):
    return {"strategy": strategy, "schedule": schedule, "w": w, "d": d, "tp": tp, "micro_batch": b,
            "recompute": recompute, "accumulation": 8, "throughput": throughput, "memory_bytes": memory_bytes, **more}


def test_a_first_choice_row_shows_the_schedule_or_the_baseline():
    row = analysis.first_choice_row("2bw-gpt-2.2b", "peak", 64, 512, _entry(memory_bytes=3 * GIB), 8)
    assert row["model"] == "2.2B" and row["schedule"] == "2bw" and row["memory (GiB)"] == 3.0
    assert row["paper's d"] == 8 and row["m"] == 8 and row["t"] == 1
    baseline = analysis.first_choice_row("x", "peak", 8, 64, _entry("data-parallel", "none", d=1), None)
    assert baseline["schedule"] == "data-parallel" and baseline["paper's d"] is None


def test_paper_scale_plans_give_a_first_choice_per_case_and_every_plan():
    rates = {"fast": V100, "slow": replace(V100, flops_efficiency=0.5)}
    paper, every = analysis.paper_scale_plans({"tiny": 2}, rates, cases=((2, 8), (4, 8)), paper_gpus=2)
    assert len(paper) == 4 and list(paper["compute rate"]) == ["fast", "fast", "slow", "slow"]
    assert paper["paper's d"].iloc[0] == 2 and pd.isna(paper["paper's d"].iloc[1])  # the paper planned 2 devices
    assert paper.loc[0, "samples/s"] == plan(TINY, 2, V100, 8)["plans"][0]["throughput"]
    assert len(every) == sum(len(plan(TINY, g, hw, 8)["plans"]) for hw in rates.values() for g in (2, 4))
    assert set(every.model) == {"tiny"} and set(every.GPUs) == {2, 4}


def test_the_paper_table_leaves_a_missing_depth_empty():
    depth = analysis.paper_table_format()["paper's d"]
    assert depth(float("nan")) == "" and depth(16.0) == "16"


def _paper():
    """Four first choices at 64 GPUs (and one at 8): 2.2B picks 8 and 16, 3.8B picks 8 twice (paper: 8, 16)."""
    rows = [("2.2B", "peak (125 TFLOP/s)", 64, 512, 16, "full", 8),
            ("2.2B", "achieved (45 TFLOP/s)", 64, 512, 8, "none", 8),
            ("3.8B", "peak (125 TFLOP/s)", 64, 512, 8, "none", 16),
            ("3.8B", "achieved (45 TFLOP/s)", 64, 2048, 8, "none", 16),
            ("3.8B", "achieved (45 TFLOP/s)", 8, 64, 4, "full", None)]
    return pd.DataFrame(rows, columns=["model", "compute rate", "GPUs", "global batch", "d", "recompute", "paper's d"])


def test_depths_hits_and_rate_choices_at_the_paper_scale():
    paper = _paper()
    at64 = analysis.at_paper_gpus(paper)
    assert len(at64) == 4
    assert analysis.chosen_depths(at64, "2bw-gpt-2.2b") == [8, 16]
    assert analysis.chosen_depths(at64, "2bw-gpt-3.8b") == [8]
    assert analysis.paper_hits(at64) == [("2.2B", "achieved (45 TFLOP/s)", 512)]
    assert analysis.rate_choices(at64, "2bw-gpt-2.2b", 512) == "d = 16 at the peak rate, d = 8 at the achieved rate"
    assert analysis.recompute_first(paper) == "2 of the 5"
    decided = analysis.decisions(at64.assign(schedule="2bw", w=4))
    assert decided["same depth"].tolist() == ["no", "yes", "no", "no"]
    assert decided["paper's d"].tolist() == [8, 8, 16, 16] and decided.d.tolist() == [16, 8, 8, 8]


def test_gpipe_fit_counts_pipelines_with_and_without_recomputation():
    every = pd.DataFrame([_entry(schedule="gpipe"), _entry(schedule="gpipe", recompute="full"),
                          _entry(schedule="gpipe", recompute="full"), _entry(schedule="2bw"),
                          _entry("data-parallel", "none")])
    assert analysis.gpipe_fit(every) == "1 GPipe configurations without recomputation and 2 with it"
    assert analysis.gpipe_fit(every[every.schedule != "gpipe"]).startswith("0 GPipe configurations")


def test_depth_gap_compares_the_best_pipeline_of_each_depth():
    plans = [_entry(d=8, throughput=110.0, memory_bytes=14 * GIB), _entry(d=8, throughput=90.0),
             _entry(d=16, throughput=100.0), _entry("data-parallel", "none", d=16, throughput=500.0)]
    assert analysis.best_at_depth(plans, 8)["throughput"] == 110.0
    assert analysis.best_at_depth(plans, 16)["throughput"] == 100.0  # the baseline is no pipeline
    assert analysis.best_at_depth(plans, 4) is None
    assert analysis.depth_gap(plans, shallow=8, deep=16) == ("+10%", "14.0 GiB")
    assert analysis.depth_gap(plans, shallow=16, deep=8) == ("-9%", "1.0 GiB")
    assert analysis.depth_gap(plans, shallow=8, deep=4) == ("n/a (one depth does not fit)", "n/a")


def test_memory_flip_finds_the_largest_limit_that_makes_a_depth_first():
    # tiny on 2 devices: data parallelism first with ample memory, a 2-stage pipeline once it no longer fits
    options = dict(precision="fp32", max_micro_batch=2, recompute=("none",), gpus_per_node=2)
    dp_memory = plan(TINY, 2, V100, 8, **options)["plans"][0]["memory_bytes"]
    step = 2**10 / GIB  # limits on a grid of whole KiB: exact binary fractions of a GiB, no rounding
    high = (dp_memory // 2**10 + 4) * 2**10 / GIB
    flip = analysis.memory_flip(TINY, 2, V100, 8, 2, high_gib=high, low_gib=0.0, step_gib=step, **options)
    assert flip * GIB == math.ceil(dp_memory / 2**10 - 1) * 2**10  # the first limit below dp_memory: d = 2 first
    assert analysis.memory_flip(TINY, 2, V100, 8, 4, high_gib=1.0, low_gib=0.5, step_gib=0.25, **options) is None
    assert analysis.flip_text(flip, 16.0, 4.0) == f"{flip:.2f} GiB"
    assert analysis.flip_text(None, high_gib=16.0, low_gib=4.0) == "no limit between 4 and 16 GiB"


def test_plans_of_case_and_the_depth_figure():
    every = pd.DataFrame([{"model": m, "rate": "r", "GPUs": 4, "batch": 8, **_entry(d=d, schedule=s, throughput=t)}
                          for m in ("a", "b") for d, s, t in ((2, "2bw", 10.0), (4, "2bw", 12.0), (2, "gpipe", 8.0))]
                         + [{"model": "a", "rate": "r", "GPUs": 4, "batch": 8,
                             **_entry("data-parallel", "none", d=1, throughput=9.0)},
                            {"model": "a", "rate": "other", "GPUs": 4, "batch": 8, **_entry(d=2)}])
    case = analysis.plans_of_case(every, 4, 8, "r")
    assert len(case) == 7 and set(case.rate) == {"r"}
    fig = analysis.draw_depth_throughput(case, {"a": 2, "b": 4}, 4)
    left, right = fig.axes
    assert left.get_xlabel() == "pipeline depth d (w = 4/d)" and right.get_title() == "b"
    assert list(left.lines[0].get_ydata()) == [10.0, 12.0]  # the best 2bw per depth
    assert any(line.get_label() == "best data-parallel" for line in left.lines)
    assert not any(line.get_label() == "best data-parallel" for line in right.lines)


# --- the ranking on this machine -----------------------------------------------------------------------------

def _runs(profiled=True):
    """Five two-rank runs of a fixed global batch 8, as the sweep writes them."""
    layouts = [(2, 1, 1, "none", 1, "none", 4, 0.010), (2, 1, 1, "none", 2, "none", 2, 0.008),
               (1, 1, 2, "2bw", 2, "none", 4, 0.016), (1, 1, 2, "gpipe", 1, "full", 8, 0.020),
               (1, 2, 1, "none", 2, "none", 4, 0.012)]
    frame = pd.DataFrame(layouts, columns=["config.layout.dp", "config.layout.tp", "config.layout.pp",
                                           "config.layout.schedule", "config.layout.micro_batch",
                                           "config.layout.recompute", "config.layout.microbatches",
                                           "iteration_time_s.median"])
    frame["memory_bytes.total"] = [1e6, 2e6, 1e6, 1e6, 1e6]
    if profiled:
        for p in analysis.LAYER_PARTS:
            for k, scale in (("forward", 1e-3), ("backward", 2e-3)):
                frame[f"{analysis.PROFILED_TIMES}.{p}.{k}_s"] = scale * frame["config.layout.micro_batch"]
    return frame


def test_global_batch_and_the_configuration_fields():
    runs = _runs()
    assert analysis.global_batch(runs) == 8
    runs = analysis.with_layout(runs, 8)
    assert runs.strategy.tolist() == ["data-parallel", "data-parallel", "pipeline", "pipeline", "tensor-parallel"]
    assert runs.w.tolist() == [2, 2, 1, 1, 1] and runs.d.tolist() == [1, 1, 2, 2, 1] and runs.tp.tolist()[-1] == 2
    assert runs.measured.tolist() == [800.0, 1000.0, 500.0, 400.0, 8 / 0.012]
    assert runs.measured_memory.tolist()[1] == 2e6
    assert analysis.with_layout(_runs().drop(columns="memory_bytes.total"), 8).measured_memory.isna().all()


def test_planner_options_and_profiled_layer_times():
    runs = analysis.with_layout(_runs(), 8)
    assert analysis.planner_options(runs) == dict(precision="fp32", max_micro_batch=2, recompute=("full", "none"),
                                                  gpus_per_node=2)
    times = analysis.profiled_layer_times(runs)
    assert sorted(times) == [1, 2] and times[2]["head"] == (2e-3, 4e-3)
    runs.loc[runs.micro_batch == 1, f"{analysis.PROFILED_TIMES}.head.backward_s"] = np.nan
    assert sorted(analysis.profiled_layer_times(runs)) == [2]
    assert analysis.profiled_layer_times(analysis.with_layout(_runs(profiled=False), 8)) == {}


def test_rankings_use_profiled_times_only_where_every_size_has_them():
    runs = analysis.with_layout(_runs(), 8)
    assert list(analysis.rankings(TINY, V100, runs, 8)) == ["FLOPs", "profiled"]
    assert list(analysis.rankings(TINY, V100, analysis.with_layout(_runs(profiled=False), 8), 8)) == ["FLOPs"]
    flops = analysis.rankings(TINY, V100, runs, 8)["FLOPs"]
    assert flops == plan(TINY, 2, V100, 8, **analysis.planner_options(runs))


def _ranked(runs, predicted: dict[str, list]):
    """The runs with plans whose throughput is ``predicted[how]`` per run (None: no such plan)."""
    plans = {how: {"plans": [{**{k: r[k] for k in analysis.KEY}, "throughput": v, "memory_bytes": 1.5e6}
                             for (_, r), v in zip(runs.iterrows(), values) if v is not None]}
             for how, values in predicted.items()}
    return analysis.with_labels(analysis.with_predictions(runs, plans)), plans


def test_predictions_merge_beside_the_runs_with_their_errors():
    runs, _ = _ranked(analysis.with_layout(_runs(), 8), {"FLOPs": [900, 900, 1000, None, 500]})
    assert runs.predicted_FLOPs.tolist()[:3] == [900, 900, 1000] and math.isnan(runs.predicted_FLOPs[3])
    assert runs.error_FLOPs.tolist()[:3] == [0.125, -0.1, 1.0]
    assert runs.memory_FLOPs.tolist()[0] == 1.5e6


def test_spearman_is_pearson_on_ranks_over_pairs_with_values():
    a = pd.Series([1.0, 2.0, 3.0, 4.0])
    assert analysis.spearman(a, a ** 3) == pytest.approx(1.0)
    assert analysis.spearman(a, -a) == pytest.approx(-1.0)
    tied = np.corrcoef([1, 2, 3, 4], [1.5, 1.5, 3.5, 3.5])[0, 1]  # ties take their mean rank
    assert analysis.spearman(a, pd.Series([1.0, 1.0, 2.0, 2.0])) == pytest.approx(tied)
    assert analysis.spearman(pd.Series([1.0, np.nan, 2.0, 3.0]), pd.Series([3.0, 9.0, 2.0, 1.0])) == pytest.approx(-1)
    assert math.isnan(analysis.spearman(pd.Series([1.0, 2.0, np.nan]), pd.Series([1.0, 2.0, 3.0])))


def test_configuration_labels():
    runs = analysis.with_labels(analysis.with_layout(_runs(), 8))
    assert runs.configuration.tolist() == ["DP w=2, b=1", "DP w=2, b=2", "2bw d=2, b=2", "gpipe d=2, b=1, recompute",
                                           "TP t=2, b=2"]


def test_the_summary_of_each_ranking():
    runs, plans = _ranked(analysis.with_layout(_runs(), 8), {"FLOPs": [1, 2, 3, 4, 5], "profiled": [5, 9, 3, 2, 4]})
    summary = analysis.ranking_summary(runs, plans)
    best = analysis.best_measured(runs)
    assert best.configuration == "DP w=2, b=2"
    assert analysis.best_text(best) == "DP w=2, b=2 (1,000.0 samples/s)"
    assert summary["profiled"]["first"].configuration == "DP w=2, b=2" and summary["profiled"]["share"] == 1.0
    assert summary["FLOPs"]["first"].configuration == "TP t=2, b=2" and summary["FLOPs"]["n"] == 5
    assert summary["FLOPs"]["share"] == pytest.approx(2 / 3)
    assert summary["profiled"]["rho"] == pytest.approx(1.0)
    assert analysis.first_choice_text(summary["FLOPs"]) == ("TP t=2, b=2, measured 666.7 samples/s, "
                                                            "67% of the measured best")


def test_the_modes_sentence_names_the_closer_ranking():
    flops, profiled = {"share": 0.5}, {"share": 0.9}
    closer = analysis.modes_sentence({"FLOPs": flops, "profiled": profiled})
    assert closer.startswith("Here the first choice from profiled layer times runs closer to the measured best "
                             "(90% against 50%). FLOPs over a fixed rate")
    assert analysis.modes_sentence({"FLOPs": profiled, "profiled": flops}).startswith(
        "Here the first choice from FLOPs runs closer to the measured best (90% against 50%).")
    assert analysis.modes_sentence({"FLOPs": flops, "profiled": flops}).startswith(
        "Both modes' first choices run equally close to the measured best. FLOPs")
    assert analysis.modes_sentence({"FLOPs": flops}) == ""


def test_the_memory_error_or_that_it_was_not_measured():
    runs = pd.DataFrame({"memory_FLOPs": [90.0, 120.0, 100.0], "measured_memory": [100.0, 100.0, 100.0]})
    assert analysis.memory_error_text(runs) == "+0% (from -10% to +20%)"
    assert analysis.memory_error_text(runs.assign(measured_memory=np.nan)) == "not measured"


def test_the_ranking_table_orders_by_measured_throughput():
    predicted = {"FLOPs": [1, 2, 3, None, 5], "profiled": [5, 4, 3, 2, 1]}
    runs, plans = _ranked(analysis.with_layout(_runs(), 8), predicted)
    table, fmt = analysis.ranking_table(runs, plans)
    assert list(table.columns) == ["configuration", "measured rank", "rank (profiled)", "rank (FLOPs)",
                                   "measured samples/s", "predicted (FLOPs)", "predicted (profiled)",
                                   "signed error (FLOPs)", "signed error (profiled)"]
    assert table.configuration.tolist()[0] == "DP w=2, b=2" and table["measured rank"].tolist() == [1, 2, 3, 4, 5]
    assert table["rank (FLOPs)"].tolist()[:2] == [3, 4] and pd.isna(table["rank (FLOPs)"].tolist()[-1])
    assert set(fmt) == {"measured samples/s", "predicted (FLOPs)", "predicted (profiled)", "signed error (FLOPs)",
                        "signed error (profiled)"}


def test_the_ranking_figure_draws_both_rankings():
    runs, _ = _ranked(analysis.with_layout(_runs(), 8), {"FLOPs": [1, 2, 3, 4, 5], "profiled": [5, 4, 3, 2, 1]})
    (ax,) = analysis.draw_ranking(runs).axes
    labels = [c.get_label() for c in ax.collections]
    assert "2bw, FLOPs" in labels and "data-parallel, profiled" in labels and len(labels) == 8
    only_flops, _ = _ranked(analysis.with_layout(_runs(profiled=False), 8), {"FLOPs": [1, 2, 3, 4, 5]})
    assert len(analysis.draw_ranking(only_flops).axes[0].collections) == 4


# --- the verdict ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rho, share, hits, expected", [
    (0.7, 0.9, 4, "reproduced"),
    (0.7, 0.9, 3, "depends"),  # a good ranking, not every depth
    (0.69, 0.9, 1, "depends"),  # a first choice near the best, a weak ranking
    (0.69, 0.89, 0, "not reproduced"),
])
def test_the_verdict_rule(rho, share, hits, expected):
    summary = {"FLOPs": {"rho": -1.0, "share": 0.0}, "profiled": {"rho": rho, "share": share}}
    stats, use = analysis.statistics(summary, hits, 4)
    assert use == "profiled" and rule("planner").verdict(stats) == expected


def test_the_verdict_uses_flops_without_profiled_times():
    stats, use = analysis.statistics({"FLOPs": {"rho": 0.8, "share": 1.0}}, 2, 2)
    assert use == "FLOPs" and rule("planner").verdict(stats) == "reproduced"
    stats, _ = analysis.statistics({"FLOPs": {"rho": 0.1, "share": 0.5}}, 0, 2)
    assert rule("planner").verdict(stats) == "not reproduced"


def test_the_finding():
    s = {"share": 0.95, "rho": 0.8234, "n": 5}
    chosen = {"2bw-gpt-2.2b": [8, 16], "2bw-gpt-3.8b": [8]}
    assert analysis.finding("profiled", s, chosen, {"2bw-gpt-2.2b": 8, "2bw-gpt-3.8b": 16}) == (
        "first choice (profiled) ran at 95% of the measured best, Spearman ρ = +0.82 over 5 configurations; on 64 "
        "V100s it picks d = 8, 16 for GPT 2.2B and d = 8 for 3.8B (paper: 8 and 16)")
