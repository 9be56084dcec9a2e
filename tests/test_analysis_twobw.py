"""The PipeDream-2BW chapter's analysis (distperf.analysis.twobw), on small synthetic tables."""
from __future__ import annotations

import dataclasses
import json
import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets, published  # noqa: E402
from distperf.analysis import pipeline_schedules as ps  # noqa: E402
from distperf.analysis import twobw  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.config import Config, Layout  # noqa: E402
from distperf.cost import schedules  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

MODEL = dataclasses.replace(presets.model("tiny"), layers=4)


def config(schedule="1f1b", m=4):
    return Config(model=MODEL, layout=Layout(pp=1 if schedule == "none" else 2, schedule=schedule, microbatches=m))


def run_row(schedule="1f1b", m=4, time=1.0, machine="cpu", source="fresh"):
    """A row of the pipeline_schedules sweep; 2BW keeps two versions of its 100 parameter bytes per stage."""
    versions = 2 if schedule == "2bw" else 1
    at_rest = [{"parameters": 100 * versions, "gradients": 100, "optimizer_states": 200}] * 2
    return {"status": "ok", "machine": machine, "source": source, "iteration_time_s.median": time,
            "model_state_bytes_at_rest": json.dumps(at_rest), **flatten({"config": config(schedule, m).to_dict()})}


def pipes(*specs):
    runs = ps.schedule_runs(pd.DataFrame([run_row("none", 4, 4.0)] + [run_row(**s) for s in specs]))
    return twobw.throughput_runs(runs)


def test_the_paper_speedups_come_from_the_published_table():
    quoted = twobw.paper_speedups()
    for other in ("PipeDream-Flush", "GPipe"):
        value = published.value(f"2BW against {other}", "speed-up, at most")
        assert quoted[other] == f"{value:g}×" and float(quoted[other][:-1]) == value


def test_rank_times_split_a_microbatch_by_flop_share():
    t_r = twobw.rank_times(config(), 2.0)
    flops = ps.rank_flops(config())
    assert t_r == [2.0 * x / sum(flops) for x in flops] and sum(t_r) == pytest.approx(2.0)


def test_throughput_runs_predict_tokens_per_second_from_the_calibration():
    p = pipes(dict(schedule="1f1b", time=2.0), dict(schedule="2bw", time=1.5), dict(schedule="interleaved"),
              dict(schedule="gpipe", machine="gpu"))
    assert p.schedule.tolist() == ["1f1b", "2bw"]  # interleaved is not compared; "gpu" has no reference
    flush = p.iloc[0]
    assert flush.predicted_s == schedules.pipeline_time("1f1b", twobw.rank_times(config(), 1.0), 4, 1)
    assert flush.measured_tps == 1 * 4 * 16 / 2.0 and flush.predicted_tps == 64 / flush.predicted_s
    assert flush.error == (flush.predicted_tps - flush.measured_tps) / flush.measured_tps
    assert p.name.tolist() == ["PipeDream-Flush (1F1B)", "PipeDream-2BW"]


def test_speedups_where_2bw_and_the_other_schedule_both_ran():
    p = pipes(dict(schedule="1f1b", m=4, time=2.0), dict(schedule="2bw", m=4, time=1.0),
              dict(schedule="gpipe", m=4, time=4.0), dict(schedule="gpipe", m=8, time=4.0),
              dict(schedule="2bw", m=4, time=0.1, source="reference"))
    speed = twobw.speedups(p)
    assert speed[["m", "against", "measured"]].values.tolist() == [[4, "PipeDream-Flush (1F1B)", 2.0],
                                                                    [4, "GPipe", 4.0]]
    t_r = twobw.rank_times(config(), 1.0)
    assert speed.predicted.iloc[0] == pytest.approx(1 + min(t_r) / (4 * max(t_r)))  # (m + p − 1)/m, unequal stages
    assert speed["signed error"].iloc[1] == (speed.predicted.iloc[1] - 4.0) / 4.0
    empty = twobw.speedups(pipes(dict(schedule="1f1b")))
    assert empty.empty and list(empty.columns) == ["m", "against", "measured", "predicted", "signed error"]
    assert list(twobw.speedup_table(speed).columns[2:4]) == ["measured speed-up", "predicted speed-up"]
    assert set(twobw.THROUGHPUT_TABLE_FORMAT) <= set(twobw.throughput_table(p).columns)


def test_weight_ratio_per_stage_and_its_sentence():
    ratio = twobw.weight_ratio(pipes(dict(schedule="1f1b"), dict(schedule="2bw")))
    assert ratio.tolist() == [2.0, 2.0]
    assert twobw.weight_ratio_sentence(ratio) == "2.000 on stage 0, 2.000 on stage 1"
    assert twobw.weight_ratio(pipes(dict(schedule="2bw"))).empty
    assert twobw.weight_ratio(pipes(dict(schedule="2bw", source="reference"))).empty
    assert twobw.weight_ratio_sentence(pd.Series(dtype=float)) == "not measured"


def conv_row(schedule, seed, losses, tied=True, lr=1e-3, steps=None, date="2026-01-02", status="ok", source="fresh"):
    return {"status": status, "machine": "cpu", "source": source, "date": date, "options.lr": lr,
            "options.steps": steps or len(losses), "config.model.tied": str(tied), "arg.seed": seed,
            "arg.schedule": schedule, "losses": json.dumps(losses), "config.model.layers": 2,
            "config.model.hidden": 32.0, "config.model.seq": 16, "config.layout.micro_batch": 2,
            "config.layout.microbatches": 2}


def test_latest_grid_keeps_the_latest_learning_rate_and_length():
    conv = pd.DataFrame([conv_row("1f1b", 0, [1.0] * 4, lr=1e-2, date="2026-01-01"),
                         conv_row("1f1b", 0, [1.0] * 4, tied=False), conv_row("2bw", 0, [1.0] * 4),
                         conv_row("2bw", 1, [1.0] * 4, status="failed")])
    grid = twobw.latest_grid(conv)
    assert grid.index.tolist() == [1, 2] and grid["head"].tolist() == ["untied head", "tied head"]


def test_loss_curves_smooth_over_a_twentieth_of_the_steps():
    conv = twobw.latest_grid(pd.DataFrame([conv_row("1f1b", 0, list(range(40, 0, -1)))]))
    curves, steps, window = twobw.loss_curves(conv)
    assert steps == 40 and window == 2 and len(curves) == 40
    assert curves.smoothed.tolist()[:3] == [40.0, 39.5, 38.5]
    short = twobw.latest_grid(pd.DataFrame([conv_row("1f1b", 0, [3.0, 1.0])]))
    assert twobw.loss_curves(short)[1:] == (2, 1)
    assert twobw.tail_start(40) == 32 and twobw.tail_start(3) == 2


def curves_of(final_by_run: dict, steps=10, first=5.0):
    """Curves that start at ``first`` and sit at a run's final loss from the second step on."""
    rows = [conv_row(s, seed, [first] + [loss] * (steps - 1), tied=head == "tied head")
            for (head, seed, s), loss in final_by_run.items()]
    curves, steps, _ = twobw.loss_curves(twobw.latest_grid(pd.DataFrame(rows)))
    return curves, steps


def test_final_losses_summary_and_whether_2bw_tracks_vanilla():
    curves, steps = curves_of({("tied head", 0, "1f1b"): 2.0, ("tied head", 0, "2bw"): 2.05,
                               ("tied head", 1, "1f1b"): 2.2, ("tied head", 1, "2bw"): 2.25,
                               ("untied head", 0, "1f1b"): 3.0, ("untied head", 0, "2bw"): 3.5,
                               ("untied head", 1, "1f1b"): 3.02, ("untied head", 1, "2bw"): 3.5})
    final = twobw.final_losses(curves, steps)
    assert final.loc[("tied head", 1), "difference"] == pytest.approx(0.05)
    summary = twobw.convergence_summary(final)
    assert summary.loc["tied head", "spread"] == pytest.approx(np.std([2.0, 2.2], ddof=1))
    assert summary.tracks.tolist() == [True, False]
    sentence = twobw.summary_sentence(summary)
    assert "with the tied head, 2BW's loss differs from vanilla by +0.050 nats per byte (+2.4%), within" in sentence
    assert "with the untied head" in sentence and "outside the seed-to-seed spread of vanilla (0.014)" in sentence
    assert twobw.loss_drop(curves, final) == pytest.approx(5.0 - np.mean([2.0, 2.2, 3.0, 3.02]))
    assert twobw.seed_count(final) == 2
    table = twobw.convergence_table(final)
    assert list(table.columns) == ["head", "seed", "vanilla 1F1B", "2BW", "2BW − vanilla"]


def test_one_seed_has_no_spread_and_does_not_track():
    curves, steps = curves_of({("tied head", 0, "1f1b"): 2.0, ("tied head", 0, "2bw"): 2.0})
    summary = twobw.convergence_summary(twobw.final_losses(curves, steps))
    assert math.isnan(summary.spread.iloc[0]) and not summary.tracks.iloc[0]


def test_simulation_remark_on_each_outcome():
    curves, steps = curves_of({("tied head", 0, "1f1b"): 2.0, ("tied head", 0, "2bw"): 3.0,
                               ("tied head", 1, "1f1b"): 2.0, ("tied head", 1, "2bw"): 3.0})
    final = twobw.final_losses(curves, steps)
    summary = twobw.convergence_summary(final)
    sim = pd.DataFrame({"losses": [json.dumps([5.0] * 8 + [3.05] * 2)]})
    agrees = twobw.simulation_remark(sim, final, steps, summary)
    assert "ends at 3.050 nats per byte against the 2BW trainer's 3.000 and vanilla's 2.000" in agrees
    assert agrees.endswith("not to the pipeline that implements it.")
    sim = pd.DataFrame({"losses": [json.dumps([5.0] * 8 + [3.2] * 2)]})
    assert twobw.simulation_remark(sim, final, steps, summary).endswith("a question for the trainer.")
    assert twobw.simulation_remark(sim.iloc[:0], final, steps, summary).startswith("At this scale the one-step delay")
    tracking = summary.assign(tracks=True)
    assert twobw.simulation_remark(sim.iloc[:0], final, steps, tracking) == "The delay costs nothing measurable here."


def test_simulation_runs_of_this_build_and_the_same_length():
    sim = pd.DataFrame({"source": ["fresh", "fresh", "reference"], "steps": [10, 20, 10]})
    assert twobw.simulation_runs(sim, 10).index.tolist() == [0]


def test_conv_model_line():
    assert twobw.conv_model_line(pd.Series(conv_row("1f1b", 0, [1.0]))) == (
        "2 layers, h = 32, s = 16, b = 2, m = 2, Adam, lr 0.001")


def _speed(measured, predicted=None):
    return pd.DataFrame({"m": range(2, 2 + len(measured)), "against": twobw.NAMES["1f1b"], "measured": measured,
                         "predicted": predicted or [1.5] * len(measured)})


def test_flush_speedups_and_their_sentences():
    speed = pd.concat([_speed([1.2, 0.9]), _speed([3.0]).assign(against="GPipe")])
    flush = twobw.flush_speedups(speed)
    assert flush.measured.tolist() == [1.2, 0.9]
    assert not twobw.always_faster(flush) and twobw.always_faster(flush[flush.measured > 1])
    assert not twobw.always_faster(flush.iloc[:0])
    assert twobw.faster_sentence(True) == "faster than" and twobw.faster_sentence(False) == "not always faster than"
    assert twobw.speed_sentence(flush) == "1.20× (predicted 1.50×) at m = 2, 0.90× (predicted 1.50×) at m = 3"
    assert twobw.speed_sentence(flush.iloc[:0]) == "not measured"


def test_the_version_sentence_follows_the_ratio():
    assert twobw.version_sentence(pd.Series({0: 2.001, 1: 1.995})).startswith("the second weight version")
    assert twobw.version_sentence(pd.Series({0: 2.2})) == "up to 10% away from the second weight version alone (2×)"
    assert twobw.version_sentence(pd.Series(dtype=float)) == "the weight versions were not measured"


def engine_speed(lows):
    """:func:`twobw.engine_speedups` rows against Flush on the same engine with the given lower bounds."""
    return pd.DataFrame({"m": range(2, 2 + len(lows)), "against": twobw.ENGINE_NAMES["2bw-flush"],
                         "speed-up": [x + 0.05 for x in lows], "low": lows, "high": [x + 0.1 for x in lows]})


def long_row(method, seed, lr, held_out, losses=(3.0, 2.0, 1.5, 1.4, 1.3), status="ok", machine="cpu-2c"):
    """A row of the long study's table as the runner writes it."""
    return {"status": status, "machine": machine, "options.lr": lr, "options.seed": seed,
            "config.layout.schedule": method, "held_out_loss": held_out, "losses": json.dumps(list(losses)),
            "date": "2026-12-01T10:00:00Z", "commit": "abc1234"}


def long_study(gaps_by_lr, base=2.0):
    """Runs whose held-out loss differs by the given per-seed gaps (2BW − no pipeline) at each learning rate."""
    return pd.DataFrame([row for lr, gaps in gaps_by_lr.items() for seed, gap in enumerate(gaps)
                         for row in (long_row("none", seed, lr, base + 0.1 * seed),
                                     long_row("2bw", seed, lr, base + 0.1 * seed + gap))]
                        + [long_row("2bw", 9, 1e-3, 5.0, status="failed")])


def test_the_long_studys_paired_gaps_and_their_bound():
    long = twobw.long_runs(long_study({1e-3: [0.001, 0.003, 0.002], 3e-3: [0.05, 0.07, 0.06]}))
    assert len(long) == 12 and set(long.method) == {"2bw", "none"}
    assert long.train_tail.iloc[0] == pytest.approx(1.3) and long.steps.iloc[0] == 5
    gaps = twobw.held_out_gaps(long)
    assert gaps.lr.tolist() == [1e-3, 3e-3] and gaps.seeds.tolist() == [3, 3]
    assert gaps.gap.tolist() == pytest.approx([0.002, 0.06]) and gaps.baseline[0] == pytest.approx(2.1)
    assert gaps.low[0] < 0.002 < gaps.high[0]
    assert twobw.gap_bound(gaps) == pytest.approx(gaps.high[1])
    sentence = twobw.gap_sentence(gaps, 0.02)
    assert "at lr 0.001, 2BW's final held-out loss differs by +0.002" in sentence
    assert sentence.count("not inside ±0.02") == 1 and sentence.count("inside ±0.02") == 2
    one_seed = twobw.held_out_gaps(twobw.long_runs(long_study({1e-3: [0.01]})))
    assert math.isnan(one_seed.low[0]) and math.isnan(twobw.gap_bound(one_seed))
    empty = twobw.held_out_gaps(twobw.long_runs(long_study({})))
    assert empty.empty and math.isnan(twobw.gap_bound(empty))
    assert twobw.gap_sentence(empty, 0.02) == "the long study has not been run on any machine"


@pytest.mark.parametrize("lows, gaps, expected", [
    ([1.2, 1.01], [0.001, 0.002, 0.0015], "reproduced"),
    ([1.2, 1.1], [0.05, 0.06, 0.055], "depends"),  # faster, but the held-out loss gap leaves the margin
    ([1.2, 0.98], [0.001, 0.002, 0.0015], "depends"),
    ([0.9], [0.05, 0.06, 0.055], "not reproduced"),
    ([], [], "not measured")])
def test_verdict_needs_both_speed_and_equivalence(lows, gaps, expected):
    held = twobw.held_out_gaps(twobw.long_runs(long_study({1e-3: gaps} if gaps else {})))
    assert rule("twobw").verdict(twobw.statistics(engine_speed(lows), held)) == expected


def engine_table(times: dict, parts=None, peaks=None) -> pd.DataFrame:
    """Rows of the engines experiment: {(schedule, m): [median step of each repeat]} (schedule "gpipe+recompute"
    for GPipe with full recomputation)."""
    parts = parts or {"layer.forward_s": 1.0, "layer.backward_s": 2.0, "embedding.forward_s": 0.0,
                      "embedding.backward_s": 0.0, "head.forward_s": 0.0, "head.backward_s": 0.0,
                      "optimizer.layer_s": 0.0, "optimizer.first_s": 0.0, "optimizer.last_s": 0.0}
    out = []
    for (schedule, m), values in times.items():
        for r, t in enumerate(values):
            out.append({"status": "ok", "source": "fresh", "repeat": r, "config_hash": f"{schedule}-{m}",
                        "arg.schedule": schedule.split("+")[0],
                        "config.layout.recompute": "full" if "+" in schedule else "none", "arg.microbatches": m,
                        "arg.pp": 2, "config.model.layers": 4, "iteration_time_s.median": t,
                        "memory_bytes.total": (peaks or {}).get(schedule, 100.0) * m,
                        "prediction.memory_bytes_per_stage": json.dumps([90.0 * m, 80.0 * m]),
                        **{f"part_times.{k}": v for k, v in parts.items()}})
    return pd.DataFrame(out)


def test_engine_speedups_carry_an_interval_from_the_repeats():
    runs = twobw.engine_runs(engine_table({("2bw", 4): [1.0, 1.02, 0.98], ("2bw-flush", 4): [1.2, 1.22, 1.18],
                                           ("gpipe", 4): [1.5]}))
    speed = twobw.engine_speedups(runs)
    flush = twobw.same_engine(speed).iloc[0]
    assert flush["speed-up"] == pytest.approx(1.2, rel=1e-3) and flush["low"] < 1.2 < flush["high"]
    assert flush["repeats"] == 3 and twobw.interval_text(flush).startswith("1.20× [")
    gpipe = speed[speed.against == twobw.ENGINE_NAMES["gpipe"]].iloc[0]
    assert math.isnan(gpipe["low"]) and twobw.interval_text(gpipe) == "1.50× (one repeat, no interval)"


def test_the_simulator_is_fed_the_measured_stage_and_checked_at_depth_two():
    runs = twobw.engine_runs(engine_table({("2bw", 2): [2 * 6.0], ("2bw-flush", 2): [3 * 6.0]}))
    forward, backward, update = twobw.stage_times(runs, 4)
    assert forward == [2.0] * 4 and backward == [4.0] * 4 and update == 0.0  # two layers a stage
    sim = twobw.simulated_speedups(runs, depths=(2, 4), ms=(2, 4))
    assert sim.set_index(["depth", "m"]).simulated.to_dict() == pytest.approx(
        {(2, 2): 1.5, (2, 4): 5 / 4, (4, 4): 7 / 4})  # (m + d − 1)/m with equal stages
    check = twobw.simulation_check(twobw.engine_speedups(runs), sim)
    assert check.iloc[0]["signed error"] == pytest.approx(0.0)


def test_the_memory_cap_makes_gpipe_recompute_or_not_fit():
    runs = twobw.engine_runs(engine_table(
        {("2bw", 4): [1.0, 1.0], ("gpipe", 4): [1.1, 1.1], ("gpipe+recompute", 4): [1.4, 1.4],
         ("2bw", 8): [2.0, 2.0], ("gpipe", 8): [2.2, 2.2]},
        peaks={"2bw": 100.0, "gpipe": 150.0, "gpipe+recompute": 90.0}))
    table = twobw.capped(runs).set_index("m")
    assert table.loc[4, "GPipe under the cap"] == twobw.ENGINE_NAMES["gpipe+recompute"]
    assert table.loc[4, "speed-up"] == pytest.approx(1.4)
    assert table.loc[8, "GPipe under the cap"] == "does not fit" and math.isnan(table.loc[8, "speed-up"])
    memory = twobw.engine_memory(runs)
    row = memory[(memory.schedule == twobw.ENGINE_NAMES["2bw"]) & (memory.m == 4)].iloc[0]
    assert row["measured (bytes)"] == 400.0 and row["predicted (bytes)"] == 360.0
    assert row["signed error"] == pytest.approx(-0.1)


def test_finding_quotes_speed_and_the_held_out_gaps():
    gaps = pd.DataFrame({"lr": [1e-3], "gap": [0.004], "low": [-0.001], "high": [0.009]})
    assert twobw.finding(_speed([1.2, 1.4]), gaps) == (
        "2BW ran 1.30× as fast as PipeDream-Flush on average; its final held-out loss differed from training "
        "without a pipeline by +0.004 [-0.001, +0.009] (lr 0.001) nats/byte.")
    assert twobw.finding(_speed([1.2]), gaps.iloc[:0]).endswith("; the long convergence study has not been run.")


def test_the_figures_draw():
    import matplotlib.pyplot as plt

    fig = twobw.draw_memory_model(depth=4)
    two, gpipe = fig.axes[0].get_lines()
    assert two.get_xdata().tolist() == [4, 8, 12, 16, 20, 24, 28, 32]
    assert len(set(two.get_ydata())) == 1 and gpipe.get_ydata()[-1] > gpipe.get_ydata()[0]
    curves, _ = curves_of({("tied head", 0, "1f1b"): 2.0, ("tied head", 0, "2bw"): 2.1,
                           ("untied head", 0, "1f1b"): 2.0, ("untied head", 0, "2bw"): 2.1})
    fig = twobw.draw_convergence(curves, 1)
    assert len(fig.axes) == 4 and fig.axes[2].get_title() == "untied head"
    long = twobw.long_runs(long_study({1e-3: [0.001, 0.003], 3e-3: [0.05, 0.07]}))
    fig = twobw.draw_long_study(long, twobw.held_out_gaps(long), 0.02)
    curves_ax, gap_ax = fig.axes
    assert len(curves_ax.get_lines()) == 4 and [t.get_text() for t in gap_ax.get_xticklabels()] == [
        "lr 0.001", "lr 0.003"]
    empty = twobw.long_runs(long_study({}))
    twobw.draw_long_study(empty, twobw.held_out_gaps(empty), 0.02)  # nothing archived yet: empty axes
    plt.close("all")
