"""The data-parallelism and ZeRO chapter's analysis (distperf.analysis.dp_zero), on small synthetic tables."""
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets  # noqa: E402
from distperf.analysis import dp_zero as dp  # noqa: E402
from distperf.config import Config, Layout, validate  # noqa: E402
from distperf.hardware import PRESETS  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402

MiB = 2**20


def trained(dp_ranks=2, zero=0, bucket_mb=25.0, status="ok", median=0.01):
    """A row of a sweep table as the runner writes it: the configuration trained, its bucket and time."""
    cfg = validate(Config(model=presets.model("tiny"), layout=Layout(dp=dp_ranks, zero=zero)))
    return {"status": status, "options.bucket_mb": bucket_mb, "iteration_time_s.median": median,
            **flatten({"config": cfg.to_dict()})}


def timed(bucket_mb, *medians, predicted=0.01, **values):
    """The repeats of one bucket size after the predictions: each run's median step, the predicted iteration and
    exposed time, and any measured columns (``values``)."""
    return [dict({"bucket_mb": bucket_mb, "repeat": r, "iteration_time_s.median": t, "predicted_s": predicted,
                  "predicted_exposed_s": predicted / 4, "profiled_s": float("nan"), "config.layout.dp": 2}, **values)
            for r, t in enumerate(medians)]


def sweep(*sizes):
    return pd.DataFrame([run for size in sizes for run in size])


def memory_table(errors=None, zero3=True):
    """A memory-by-category table of DDP and (optionally) ZeRO-2 and ZeRO-3, with chosen model-state errors."""
    labels = ["1 rank", "dp 2, ZeRO 0"] + (["dp 2, ZeRO 2", "dp 2, ZeRO 3"] if zero3 else [])
    states = {"1 rank": 400, "dp 2, ZeRO 0": 400, "dp 2, ZeRO 2": 300, "dp 2, ZeRO 3": 100}
    rows = []
    for label in labels:
        for category, share in (("parameters", 0.25), ("gradients", 0.25), ("optimizer states", 0.5)):
            measured = states[label] * share
            rows.append(dict(label=label, category=category, measured=measured, predicted=states[label] * share))
        rows.append(dict(label=label, category="activations", measured=50, predicted=80))
    memory = pd.DataFrame(rows)
    memory["error"] = (memory.predicted - memory.measured) / memory.measured
    if errors:
        for (label, category), error in errors.items():
            memory.loc[(memory.label == label) & (memory.category == category), "error"] = error
    return memory


def test_predictions_use_each_runs_bucket_and_count_the_bytes_sent():
    frame = dp.with_predictions(pd.DataFrame([trained(2, 0, 0.001), trained(2, 0, 25.0), trained(1)]),
                                PRESETS["V100-16GB"])
    small, default, single = frame.itertuples()
    assert small.predicted_exposed_s > default.predicted_exposed_s
    assert default.predicted_dp_bytes == default.prediction["communication_bytes"]["data_parallel"] > 0
    assert single.predicted_dp_bytes == 0


def test_labels_sorted_by_ranks_and_stage_and_the_model_line():
    zero = dp.labelled(pd.DataFrame([trained(2, 3), trained(1), trained(2, 0)]))
    assert zero.label.tolist() == ["1 rank", "dp 2, ZeRO 0", "dp 2, ZeRO 3"]
    run = pd.Series({"config.model.name": "tiny", "prediction": {"parameters": 1_000_000}})
    assert dp.model_line(run) == "tiny (1.00 M parameters, 3.8 MiB of fp32 gradients)"


def test_zero3_share_of_ddps_model_states():
    assert dp.zero3_share(memory_table()) == 0.25
    assert dp.share_text(dp.zero3_share(memory_table())) == "25%"
    assert dp.zero3_share(memory_table(zero3=False)) is None
    no_ddp = memory_table()
    assert dp.zero3_share(no_ddp[no_ddp.label != "dp 2, ZeRO 0"]) is None
    assert dp.share_text(None) == "n/a"


def test_the_worst_model_state_above_half_a_percent():
    assert dp.worst_state(memory_table()) == "none above 0.5 %"
    worst = memory_table(errors={("dp 2, ZeRO 3", "parameters"): -0.04, ("dp 2, ZeRO 2", "gradients"): 0.02})
    assert dp.worst_state(worst) == "-4% (parameters, dp 2, ZeRO 3)"
    assert dp.worst_state(memory_table(errors={("1 rank", "gradients"): 0.004})) == "none above 0.5 %"


def test_bucket_runs_sorted_by_size():
    runs = dp.by_bucket(pd.DataFrame({"options.bucket_mb": ["100", "0.5", "25"]}))
    assert runs.bucket_mb.tolist() == [0.5, 25.0, 100.0]


def test_every_run_keeps_each_repeat_of_the_runs_that_succeeded():
    raw = pd.DataFrame([trained(2, 0, 1.0), trained(2, 0, 1.0, median=0.02), trained(2, 0, 4.0, status="failed")])
    assert dp.every_run(raw)["iteration_time_s.median"].tolist() == [0.01, 0.02]
    assert dp.by_bucket(dp.every_run(raw.iloc[:0])).bucket_mb.tolist() == []
    assert dp.by_bucket(dp.every_run(pd.DataFrame({"status": ["skipped"]}))).bucket_mb.tolist() == []


def test_every_run_drops_the_rows_of_an_earlier_model():
    old = dict(trained(2, 0, 1.0, median=5.0), date="2026-01-01T00:00:00Z", machine="m", source="fresh")
    new = [dict(trained(2, 0, mb), **{"config.model.layers": 32}, date=f"2026-02-0{i + 1}T00:00:00Z", machine="m",
                source="fresh") for i, mb in enumerate((1.0, 4.0))]
    other = dict(trained(2, 0, 1.0, median=7.0), date="2026-01-01T00:00:00Z", machine="gpu", source="reference")
    kept = dp.every_run(pd.DataFrame([old, *new, other]))
    assert kept["iteration_time_s.median"].tolist() == [0.01, 0.01, 7.0]  # another machine keeps its own model


def test_bucket_sizes_average_the_repeats_with_an_interval():
    sizes = dp.bucket_sizes(sweep(timed(4, 0.010, 0.012, 0.011, **{dp.EXPOSED: 0.002}), timed(1, 0.02)))
    assert sizes.bucket_mb.tolist() == [1, 4] and sizes.repeats.tolist() == [1, 3]
    assert sizes.measured_s.tolist() == pytest.approx([0.02, 0.011])
    assert math.isnan(sizes.ci_low_s[0]) and sizes.ci_low_s[1] < 0.011 < sizes.ci_high_s[1]
    assert sizes[dp.EXPOSED][1] == pytest.approx(0.002) and math.isnan(sizes[dp.EXPOSED][0])


def test_a_clear_u_shape_has_a_small_p_value():
    runs = sweep(timed(0.1, 0.030, 0.031, 0.029), timed(4, 0.020, 0.021, 0.019), timed(25, 0.010, 0.0101, 0.0099),
                 timed(100, 0.020, 0.0202, 0.0198, predicted=0.02))
    effect = dp.bucket_effect(runs)
    assert effect.spread == pytest.approx(2.0) and effect.best == 25 and effect.u_shape and effect.sizes == 4
    assert effect.p < 0.01
    assert dp.shape_sentence(effect).startswith("a U-shape") and dp.p_text(effect.p).startswith("p = ")
    assert dp.predicted_spread(dp.bucket_sizes(runs)) == pytest.approx(1.0)


def test_noise_alone_gives_a_large_p_value_and_no_u_shape():
    runs = sweep(timed(1, 0.010, 0.012, 0.011), timed(4, 0.011, 0.010, 0.012), timed(16, 0.012, 0.011, 0.010))
    effect = dp.bucket_effect(runs)
    assert effect.p > 0.5 and not effect.u_shape
    assert dp.shape_sentence(effect).startswith("no U-shape")
    at_end = dp.bucket_effect(sweep(timed(1, 0.03, 0.031), timed(25, 0.02, 0.021), timed(100, 0.01, 0.011)))
    assert not at_end.u_shape and at_end.best == 100
    single = dp.bucket_effect(sweep(timed(1, 0.03), timed(4, 0.01)))
    assert math.isnan(single.p) and dp.p_text(single.p) == "no p-value (one run per size)"
    assert dp.bucket_effect(sweep()).sizes == 0


def test_the_exposed_share_at_the_default_bucket():
    # measured: each rank's exposed time over the step it was measured in (the waiting summary), as for waiting
    sizes = dp.bucket_sizes(sweep(timed(1, 0.02), timed(25, 0.01, **{dp.EXPOSED: 0.005})))
    summary = pd.DataFrame({"label": ["dp 2, bucket 25 MiB"] * 2 + ["dp 2, bucket 1 MiB"], "rank": [1, 0, 0],
                            "share": [0.1, 0.4, 0.9]})
    assert dp.exposed_sentence(sizes, summary).startswith(
        "exposed data-parallel communication at DDP's default 25 MiB bucket took 40% on rank 0, 10% on rank 1 of")
    no_runs = summary.iloc[:0]
    assert dp.exposed_sentence(sizes, no_runs).startswith("the framework predicts exposed communication of 25%")
    assert dp.exposed_sentence(sizes, summary[summary.label != "dp 2, bucket 25 MiB"]).startswith("the framework")
    assert "nan%" in dp.exposed_sentence(sizes[sizes.bucket_mb != 25], no_runs)


def legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_bucket_figure_draws_what_was_measured():
    measured = {dp.EXPOSED: 0.004, dp.ALLREDUCE: 0.006}
    sizes = dp.bucket_sizes(sweep(timed(1, 0.02, 0.021, **measured), timed(25, 0.01, 0.012, **measured)))
    fig, (times, comm) = plt.subplots(1, 2)
    dp.draw_bucket_times(times, sizes)
    dp.draw_bucket_communication(comm, sizes, exposed=True)
    assert sorted(legend(times)) == ["measured (mean of repeats, 95 % CI)", "predicted (FLOPs at peak rate)"]
    assert legend(comm) == ["measured exposed", "measured all-reduce time", "predicted exposed"]
    assert comm.get_xscale() == "log"
    fig2, (times2, comm2) = plt.subplots(1, 2)
    dp.draw_bucket_times(times2, sizes.assign(profiled_s=[0.015, 0.012]))
    dp.draw_bucket_communication(comm2, sizes, exposed=False)
    assert "predicted (profiled layer times)" in legend(times2) and legend(comm2) == ["predicted exposed"]
    plt.close(fig)
    plt.close(fig2)


def per_rank(*ranks):
    """communication.per_rank as the runner writes it: (waiting by kind, window) per rank."""
    return json.dumps([{"exposed_s": {**kinds, "total": sum(kinds.values())}, "window_s": window}
                       for kinds, window in ranks])


def test_every_ranks_waiting_with_its_interval():
    ddp = pd.DataFrame({"repeat": [0, 1], dp.PER_RANK: [per_rank(({"data_parallel": 0.1}, 1.0),
                                                                 ({"data_parallel": 0.3}, 1.0)),
                                                        per_rank(({"data_parallel": 0.2}, 1.0),
                                                                 ({"data_parallel": 0.3}, 1.0))]})
    pipe = pd.DataFrame({"repeat": [0, 1, 2], dp.PER_RANK: [per_rank(({"pipeline_parallel": 0.5}, 1.0),
                                                                     ({"pipeline_parallel": 0.1}, 2.0))] * 2 + [None]})
    wait = pd.concat([dp.waiting(ddp, ["ddp"] * 2), dp.waiting(pipe, ["pp"] * 3)], ignore_index=True)
    assert len(wait) == 8 and wait.share.tolist()[:4] == [0.1, 0.3, 0.2, 0.3]
    summary = dp.waiting_summary(wait)
    assert summary[["label", "rank"]].values.tolist() == [["ddp", 0], ["ddp", 1], ["pp", 0], ["pp", 1]]
    assert summary.share.tolist() == pytest.approx([0.15, 0.3, 0.5, 0.05])
    assert summary.low[0] < 0.15 < summary.high[0] and summary.low[1] == summary.high[1] == pytest.approx(0.3)
    assert summary["waiting_s.pipeline_parallel"][2] == pytest.approx(0.5)
    assert dp.largest_waiting(summary, ["ddp", "pp"]) == (pytest.approx(0.5), "pp, rank 0")
    assert dp.largest_waiting(summary, ["ddp"]) == (pytest.approx(0.3), "ddp, rank 1")
    assert math.isnan(dp.largest_waiting(summary, ["other"])[0])
    assert dp.waiting(pipe.iloc[2:], ["pp"]).empty
    fig, ax = plt.subplots()
    dp.draw_waiting(ax, summary)
    assert legend(ax) == ["rank 0", "rank 1"] and len(ax.patches) == 4
    plt.close(fig)


def zero_runs(measured_comm=True):
    """Two ZeRO runs and a bucket sweep after the predictions, with or without measured communication."""
    comm = {"communication.sent_bytes.data_parallel": 2 * MiB, dp.EXPOSED: 0.002} if measured_comm else {}
    base = dict(measured_s=0.01, predicted_s=0.008, profiled_s=float("nan"), predicted_dp_bytes=3 * MiB,
                predicted_exposed_s=0.001)
    zero = pd.DataFrame([dict(base, label="1 rank", **{"config.layout.dp": 1}),
                         dict(base, label="dp 2, ZeRO 0", **{"config.layout.dp": 2}, **comm)])
    bucket = pd.DataFrame([dict(base, label="dp 2, ZeRO 0", bucket_mb=0.5, **{"config.layout.dp": 2}, **comm)])
    return zero, bucket


def test_the_error_rows_of_each_run():
    zero, bucket = zero_runs()
    memory = pd.DataFrame([dict(label="1 rank", category="parameters", measured=MiB, predicted=MiB)])
    table = dp.error_rows(memory, zero, bucket)
    assert [(r["quantity"], r["configuration"]) for r in table] == [
        ("memory: parameters", "1 rank"), ("iteration time", "1 rank"), ("iteration time", "dp 2, ZeRO 0"),
        ("data-parallel bytes sent", "dp 2, ZeRO 0"), ("exposed communication", "dp 2, ZeRO 0"),
        ("iteration time", "dp 2, bucket 0.5 MiB"), ("data-parallel bytes sent", "dp 2, bucket 0.5 MiB"),
        ("exposed communication", "dp 2, bucket 0.5 MiB")]
    assert table[3]["measured"] == 2.0 and table[3]["predicted"] == 3.0 and table[4]["measured"] == 2.0
    unmeasured = dp.error_rows(memory, *zero_runs(measured_comm=False))
    assert {r["quantity"] for r in unmeasured} == {"memory: parameters", "iteration time"}


def error_table(quantities):
    return pd.DataFrame([dict(quantity=q, configuration=c, error=e) for q, c, e in quantities])


def test_the_sentences_on_the_errors_with_and_without_measurements():
    table = error_table([("iteration time (profiled)", "a", 0.1), ("iteration time (profiled)", "b", -0.2),
                         ("exposed communication", "a", 0.5), ("data-parallel bytes sent", "dp 2, ZeRO 0", 0.0),
                         ("data-parallel bytes sent", "dp 2, ZeRO 1", 0.5),
                         ("data-parallel bytes sent", "dp 2, ZeRO 3", float("nan"))])
    assert dp.profiled_errors(table).endswith("it ranges from -20% to +10%")
    assert dp.exposed_errors(table) == "its signed error ranges from +50% to +50%"
    assert dp.volume_errors(table) == "dp 2, ZeRO 0: +0%; dp 2, ZeRO 1: +50%"
    empty = error_table([("iteration time", "a", 0.1)])
    assert dp.profiled_errors(empty) == ""
    assert dp.exposed_errors(empty) == "it was not measured in this build"
    assert dp.volume_errors(empty) == "not measured in this build"


def effect(spread, p, sizes=12, best=25.0):
    return dp.BucketEffect(spread=spread, p=p, best=best, u_shape=False, sizes=sizes)


@pytest.mark.parametrize("loopback, slow, waiting, verdict", [
    ((0.2, 0.001), (0.5, 0.001), 0.3, "reproduced"),
    ((0.2, 0.3), (0.5, 0.001), 0.3, "depends"),  # a large change on loopback that the repeats do not separate
    ((0.01, 0.5), (0.02, 0.4), 0.02, "not reproduced"),
    ((0.01, 0.5), (0.02, 0.4), float("nan"), "not reproduced"),  # no waiting measured: the rest decide
])
def test_the_verdict_follows_the_spreads_their_p_values_and_the_waiting(loopback, slow, waiting, verdict):
    assert rule("dp_zero").verdict(dp.statistics(effect(*loopback), effect(*slow), waiting)) == verdict


def test_the_finding_says_what_was_measured():
    text = dp.finding(effect(0.3, 0.002, best=4.0), effect(0.5, 0.01, sizes=5, best=25.0), 0.25, "pp 2, 1F1B, rank 0")
    assert text == ("Across 12 bucket sizes DDP's step changed by 30% (p = 0.002; fastest at 4 MiB), on the emulated "
                    "slow link by 50% (p = 0.01; fastest at 25 MiB); the rank that waits most (pp 2, 1F1B, rank 0) "
                    "waits 25% of its step")
    assert dp.finding(effect(0.3, math.nan), effect(math.nan, math.nan, sizes=0), math.nan, "") == (
        "Across 12 bucket sizes DDP's step changed by 30% (no p-value (one run per size); fastest at 25 MiB)")
