"""The pipeline-schedules chapter's analysis (distperf.analysis.pipeline_schedules), on small synthetic tables."""
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
from distperf.analysis import pipeline_schedules as ps  # noqa: E402
from distperf.analysis import rows  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.config import Config, Layout  # noqa: E402
from distperf.cost import flops as fl  # noqa: E402
from distperf.cost import schedules  # noqa: E402
from distperf.cost.predict import predict  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

MODEL = dataclasses.replace(presets.model("tiny"), layers=4)


def config(schedule="1f1b", m=4, pp=2, chunks=1):
    return Config(model=MODEL, layout=Layout(pp=pp, schedule=schedule, microbatches=m, chunks=chunks))


def run_row(schedule="1f1b", m=4, time=1.0, machine="cpu", source="fresh", status="ok", memory=None, pp=None,
            chunks=1):
    """One sweep row as the table gives it; ``memory``: per-rank bytes by category (measured in a step), else
    only the model states at rest (parameters doubled under 2BW)."""
    pp = pp or (1 if schedule == "none" else 2)
    cfg = config(schedule, m, pp, chunks)
    versions = 2 if schedule == "2bw" else 1
    at_rest = [{"parameters": 100 * versions, "gradients": 100, "optimizer_states": 200}] * pp
    row = {"status": status, "machine": machine, "source": source, "iteration_time_s.median": time,
           "tokens_per_s": 64 * m / time, "model_state_bytes_at_rest": json.dumps(at_rest),
           **flatten({"config": cfg.to_dict()})}
    if memory is not None:
        per = {c: [rank[c] for rank in memory] for c in memory[0]}
        row.update({f"memory_bytes.per_rank.{c}": json.dumps(v) for c, v in per.items()})
    return row


def table(*specs):
    return pd.DataFrame([run_row(**spec) for spec in specs])


def test_span_formats_the_smallest_and_largest_value():
    assert ps.span(pd.Series([0.1, -0.25, 0.5]), "+.0%") == "-25% to +50%"
    assert ps.span(pd.Series([1.0]), ".1f") == "1.0 to 1.0"


def test_flops_per_chunk_and_rank_carry_the_head_on_the_last_chunk():
    layer, head = fl.layer_forward_flops(1, 16, 32, 128), fl.head_forward_flops(1, 16, 32, 256)
    assert ps.chunk_flops(config()) == [2 * layer, 2 * layer + head]
    assert ps.rank_flops(config()) == [2 * layer, 2 * layer + head]
    # interleaved: rank r holds chunks r and r + p
    assert ps.chunk_flops(config("interleaved", chunks=2)) == [layer, layer, layer, layer + head]
    assert ps.rank_flops(config("interleaved", chunks=2)) == [2 * layer, 2 * layer + head]
    shares = ps.rank_shares(config())
    assert sum(shares) == pytest.approx(1) and shares[1] > shares[0]
    assert shares[0] == 2 * layer / (4 * layer + head)


def test_schedule_runs_keep_the_rows_that_ran_with_m_schedule_and_time():
    runs = ps.schedule_runs(table(dict(m=4, time=2.0), dict(status="failed"), dict(schedule="none", m=2)))
    assert runs.index.tolist() == [0, 2]
    assert runs.m.tolist() == [4, 2] and runs.m.dtype.kind == "i"
    assert runs.schedule.tolist() == ["1f1b", "none"] and runs.measured_s.tolist() == [2.0, 1.0]


def test_the_reference_microbatch_is_the_median_of_one_process_time_over_m_per_machine():
    runs = ps.schedule_runs(table(dict(schedule="none", m=2, time=2.0), dict(schedule="none", m=4, time=2.0),
                                  dict(schedule="none", m=4, time=8.0), dict(schedule="none", m=1, time=5.0,
                                                                             machine="gpu"), dict(m=4, time=9.0)))
    reference = ps.microbatch_reference(runs)
    assert reference[("cpu", "fresh")] == 1.0 and reference[("gpu", "fresh")] == 5.0
    assert len(reference) == 2


def test_calibrated_pipelines_predict_the_schedule_from_flop_shares():
    runs = ps.schedule_runs(table(dict(schedule="none", m=4, time=4.0), dict(schedule="1f1b", m=4, time=6.0),
                                  dict(schedule="2bw", m=4, time=5.0), dict(schedule="gpipe", m=4, machine="gpu")))
    pipes = ps.calibrated_pipelines(runs)
    assert pipes.schedule.tolist() == ["1f1b", "2bw"]  # no one-process reference on "gpu": dropped
    t_r = [1.0 * s for s in ps.rank_shares(config())]
    flush, twobw = pipes.iloc[0], pipes.iloc[1]
    assert flush.predicted_s == schedules.pipeline_time("1f1b", t_r, 4, 1) == 4 * max(t_r) + min(t_r)
    assert flush.ideal_s == 4 * max(t_r)
    assert flush.measured_bubble == 1 - flush.ideal_s / 6.0
    assert flush.predicted_bubble == pytest.approx(min(t_r) / flush.predicted_s)
    assert flush.error == (flush.predicted_s - 6.0) / 6.0
    assert twobw.predicted_bubble == 0 and twobw.predicted_s == 4 * max(t_r)
    assert pipes.name.tolist() == ["1F1B (Flush)", "PipeDream-2BW"]


def test_model_line():
    assert ps.model_line(config()) == "4 layers, h = 32, s = 16, b = 1"


def test_flush_actions_run_every_microbatch_forward_then_backward():
    gpipe = ps.flush_actions("gpipe", 2, 3)
    assert [a.kind for a in gpipe[0]] == ["F"] * 3 + ["B"] * 3
    one = ps.flush_actions("1f1b", 3, 4)
    assert [a.kind for a in one[0]][:3] == ["F", "F", "F"]  # warm-up of d − r − 1 = 2, then F, B
    assert [a.kind for a in one[2]] == ["F", "B"] * 4  # the last stage: no warm-up
    for lane in one:
        assert sorted(a.index for a in lane if a.kind == "F") == list(range(4))
        assert sorted(a.index for a in lane if a.kind == "B") == list(range(4))
    assert [a.kind for a in ps.flush_actions("1f1b", 4, 1)[0]] == ["F", "B"]  # warm-up capped at m


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("d, m", [(2, 1), (2, 4), (4, 8), (8, 3)])
def test_the_simulated_bubble_is_the_closed_form(kind, d, m):
    assert ps.simulated_bubble(kind, d, m) == pytest.approx(schedules.bubble_fraction(d, m), abs=1e-12)


def test_bubble_check_tabulates_both_schedules_at_every_depth_and_m():
    sim = ps.bubble_check(depths=(2, 4), microbatches=(1, 8))
    assert len(sim) == 8 and set(sim.kind) == {"gpipe", "1f1b"}
    assert ps.simulation_max_difference(sim) < 1e-12
    assert ps.simulation_max_difference(sim.assign(simulated=sim.closed_form + ([0.0] * 7 + [-0.25]))) == 0.25


def test_gantt_timelines_draw_gpipe_1f1b_and_two_batches_of_2bw():
    lanes = ps.gantt_timelines(2, 2)
    assert list(lanes) == ["GPipe", "1F1B (Flush)", "PipeDream-2BW (2 batches, no flush)"]
    assert all(len(t) == 2 for t in lanes.values())
    assert any(action.kind == "U" for lane in lanes["PipeDream-2BW (2 batches, no flush)"] for action, _, _ in lane)


def _pipes(*specs):
    return ps.calibrated_pipelines(ps.schedule_runs(table(dict(schedule="none", m=4, time=4.0), *specs)))


def test_time_table_in_milliseconds_sorted_by_machine_schedule_and_m():
    t = ps.time_table(_pipes(dict(schedule="gpipe", m=8, time=0.5), dict(schedule="1f1b", m=4, time=0.25),
                             dict(schedule="1f1b", m=2, time=0.125)))
    assert t.schedule.tolist() == ["1F1B (Flush)", "1F1B (Flush)", "GPipe"] and t.m.tolist() == [2, 4, 8]
    assert t["measured (ms)"].tolist() == [125.0, 250.0, 500.0]
    assert set(ps.TIME_TABLE_FORMAT) <= set(t.columns)


def _measured(stages=2, activations=(40, 20), states=(100, 100, 200)):
    return [{"parameters": states[0], "gradients": states[1], "optimizer_states": states[2],
             "activations": activations[r], "total": sum(states) + activations[r]} for r in range(stages)]


def test_memory_by_stage_from_the_step_peaks_beside_the_prediction():
    pipes = _pipes(dict(schedule="gpipe", m=4, memory=_measured(activations=(0, 20))),
                   dict(schedule="1f1b", m=4, memory=_measured()))
    mem, kind = ps.memory_by_stage(pipes)
    assert kind == rows.PEAK and len(mem) == 2 * 2 * 4
    assert set(mem.category) == {"parameters", "gradients", "optimizer states", "activations"}
    one = mem[(mem.schedule == "1f1b") & (mem.stage == 1)].set_index("category")
    assert one.loc["activations", "measured"] == 20 and one.loc["activations", "in_flight"] == 1
    assert mem[(mem.schedule == "1f1b") & (mem.stage == 0)].in_flight.iloc[0] == 2  # p − r
    assert set(mem[mem.schedule == "gpipe"].in_flight) == {4}  # all m on every stage
    predicted = predict(config("1f1b"), check=False)["memory_bytes_by_stage"][1]["activations"]
    assert one.loc["activations", "predicted"] == predicted
    assert one.loc["activations", "error"] == (predicted - 20) / 20
    zero = mem[(mem.schedule == "gpipe") & (mem.stage == 0) & (mem.category == "activations")]
    assert math.isnan(zero.error.iloc[0])  # nothing measured: no error


def test_memory_by_stage_at_rest_has_no_activations_and_two_versions_for_2bw():
    mem, kind = ps.memory_by_stage(_pipes(dict(schedule="2bw", m=4), dict(schedule="1f1b", m=4)))
    assert kind == rows.AT_REST
    act = mem[mem.category == "activations"]
    assert act.measured.isna().all() and act.error.isna().all()
    params = mem[mem.category == "parameters"].groupby("schedule").measured.sum()
    assert params["2bw"] == 2 * params["1f1b"]
    assert set(mem[mem.schedule == "2bw"].versions) == {2} and set(mem[mem.schedule == "1f1b"].versions) == {1}


def test_largest_m_weight_ratio_and_inflight_table():
    mem, _ = ps.memory_by_stage(_pipes(dict(schedule="2bw", m=4), dict(schedule="1f1b", m=4),
                                       dict(schedule="1f1b", m=2),
                                       dict(schedule="none", m=8, time=8.0, source="reference"),
                                       dict(schedule="1f1b", m=8, source="reference")))
    m_show, shown = ps.largest_m_fresh(mem)
    assert m_show == 8 and shown.empty  # the largest m was only in reference data
    mem = mem[mem.source == "fresh"]
    m_show, shown = ps.largest_m_fresh(mem)
    assert m_show == 4 and set(shown.m) == {4} and set(shown.source) == {"fresh"}
    assert ps.weight_ratio(shown) == 2.0
    assert math.isnan(ps.weight_ratio(shown[shown.schedule == "2bw"]))
    mem_peak, _ = ps.memory_by_stage(_pipes(dict(schedule="1f1b", m=4, memory=_measured(activations=(2**21, 2**20)))))
    inflight = ps.inflight_table(mem_peak)
    assert inflight["measured activations (MiB)"].tolist() == [2.0, 1.0]
    assert inflight["microbatches in flight"].tolist() == [2, 1] and inflight["weight versions"].tolist() == [1, 1]
    assert set(ps.INFLIGHT_TABLE_FORMAT) <= set(inflight.columns)


def test_inflight_correlation_is_a_rank_correlation_and_needs_three_points():
    mem = pd.DataFrame({"source": "fresh", "category": "activations", "in_flight": [1, 2, 4, 8],
                        "measured": [10.0, 30.0, 31.0, 90.0]})
    assert ps.inflight_correlation(mem) == pytest.approx(1.0)
    assert ps.inflight_correlation(mem.assign(measured=[90.0, 31.0, 30.0, 10.0])) == pytest.approx(-1.0)
    assert math.isnan(ps.inflight_correlation(mem.iloc[:2]))
    assert math.isnan(ps.inflight_correlation(mem.assign(measured=np.nan)))


def test_memory_error_table_sums_over_stages_and_m_in_mib():
    mem = pd.DataFrame({"source": ["fresh"] * 4 + ["reference"], "name": "1F1B (Flush)",
                        "category": ["parameters", "parameters", "activations", "activations", "parameters"],
                        "measured": [2**20, 2**20, 0.0, np.nan, 5.0], "predicted": [2**20, 2**21, 2**20, 2**20, 1.0]})
    etab = ps.memory_error_table(mem)
    params = etab.set_index("category").loc["parameters"]
    assert params.measured == 2.0 and params.predicted == 3.0 and params["signed error"] == 0.5
    assert math.isnan(etab.set_index("category").loc["activations", "signed error"])  # nothing measured
    assert list(ps.memory_table_shown(etab).columns[:4]) == ["schedule", "category", "measured (MiB)",
                                                             "predicted (MiB)"]
    states, acts = ps.memory_errors(etab)
    assert states.tolist() == [0.5] and acts.empty
    assert ps.states_error_text(states) == "50.0%" and ps.activations_error_text(acts) == "not measured"
    assert ps.states_error_text(states.iloc[:0]) == "not measured"
    assert ps.activations_error_text(pd.Series([-0.1, 0.2])) == "-10% to +20%"


def _fresh(times: dict) -> pd.DataFrame:
    return pd.DataFrame([dict(schedule=s, m=m, measured_s=t) for (s, m), t in times.items()])


def test_the_trend_of_time_per_microbatch_with_m_and_its_sentence():
    falling = ps.per_microbatch_trend(_fresh({("1f1b", 2): 4.0, ("1f1b", 4): 6.0, ("gpipe", 8): 10.0}))
    rising = ps.per_microbatch_trend(_fresh({("1f1b", 2): 2.0, ("1f1b", 4): 6.0, ("gpipe", 8): 20.0}))
    one_m = ps.per_microbatch_trend(_fresh({("1f1b", 4): 2.0, ("2bw", 8): 1.0}))
    assert falling == pytest.approx(-1.0) and rising == pytest.approx(1.0) and math.isnan(one_m)
    assert ps.trend_sentence(falling) == "falls as m grows, as the shrinking bubble predicts"
    assert ps.trend_sentence(-0.5) == ps.trend_sentence(falling)
    assert ps.trend_sentence(-0.49) == ps.trend_sentence(rising) == "does not fall steadily with m"
    assert ps.trend_sentence(one_m) == "was measured at one m only"


def test_2bw_speedup_over_1f1b_where_both_ran():
    speedup = ps.speedup_over_1f1b(_fresh({("1f1b", 2): 3.0, ("2bw", 2): 2.0, ("1f1b", 4): 5.0, ("2bw", 8): 1.0}))
    assert speedup.to_dict() == {2: 1.5}
    assert ps.speedup_sentence(speedup) == "1.50× at m = 2"
    assert ps.speedup_sentence(speedup.iloc[:0]) == "not measured"


def test_median_abs_error():
    assert ps.median_abs_error(pd.DataFrame({"error": [-0.3, 0.1, 0.2]})) == 0.2


def test_bubble_gap_is_the_median_of_measured_minus_predicted():
    fresh = pd.DataFrame({"measured_bubble": [0.5, 0.3, 0.1], "predicted_bubble": [0.3, 0.3, 0.3]})
    assert ps.bubble_gap(fresh) == pytest.approx(0.0)


@pytest.mark.parametrize("median_abs, speedup, trend, expected", [
    (0.10, [1.2], -0.9, "reproduced"),  # every criterion includes its bound
    (0.11, [1.2], -0.9, "depends"),
    (0.51, [0.9], -0.4, "not reproduced"),
    (0.51, [1.2, 1.1], -0.9, "depends"),  # trend and 2BW advantage hold, the level does not
    (0.51, [1.2, 0.9], -0.9, "depends"),
    (0.51, [], np.nan, "not reproduced"),  # what was not measured is left out
    (0.05, [], np.nan, "reproduced"),
])
def test_verdict_on_each_side_of_its_thresholds(median_abs, speedup, trend, expected):
    stats = ps.statistics(median_abs, pd.Series(speedup, dtype=float), trend)
    assert rule("pipeline_schedules").verdict(stats) == expected


def test_finding_quotes_the_numbers():
    text = ps.finding(0.123, -0.456, 0.0012, 1.999)
    assert "error of 12%" in text and "Spearman -0.46" in text and "to 0.1%" in text and "2.00×" in text


def test_the_figures_draw():
    import matplotlib.pyplot as plt

    fig = ps.draw_gantt(ps.gantt_timelines(2, 2), 2)
    assert len(fig.axes) == 3
    pipes = _pipes(dict(schedule="1f1b", m=4, time=6.0), dict(schedule="2bw", m=4, time=5.0))
    fig_b = ps.draw_bubble(ps.bubble_check(depths=(2, 4, 8), microbatches=(1, 2)), pipes)
    labels = fig_b.axes[0].get_legend_handles_labels()[1]
    assert "measured, PipeDream-2BW, p = 2" in labels and "measured, GPipe, p = 2" not in labels
    mem, _ = ps.memory_by_stage(pipes)
    fig_m = ps.draw_memory(ps.largest_m_fresh(mem)[1])
    assert [ax.get_title() for ax in fig_m.axes] == ["parameters (all weight versions)", "activations"]
    plt.close("all")
