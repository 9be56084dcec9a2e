"""The data-parallelism and ZeRO chapter's analysis (distperf.analysis.dp_zero), on small synthetic tables."""
from types import SimpleNamespace

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


def timed(bucket_mb, measured, p10=None, p90=None, predicted=0.01, **values):
    """A bucket run after the predictions: median, p10 and p90 of its steps, predicted time and exposed time."""
    return dict({"bucket_mb": bucket_mb, "measured_s": measured, "iteration_time_s.p10": p10 or measured * 0.99,
                 "iteration_time_s.p90": p90 or measured * 1.01, "predicted_s": predicted,
                 "predicted_exposed_s": predicted / 4, "profiled_s": float("nan"), "config.layout.dp": 2}, **values)


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


def test_sweep_runs_take_the_default_bucket_from_the_zero_experiment():
    zero = pd.DataFrame([trained(1), trained(2, 0, median=0.02), trained(2, 3), trained(2, 1, status="failed")])
    bucket = pd.DataFrame([trained(2, 0, 1.0), trained(2, 0, 25.0, median=0.5), trained(2, 0, 100.0, status="failed")])
    zero, sweep = dp.sweep_runs(zero, bucket)
    assert len(zero) == 3
    assert sweep["options.bucket_mb"].tolist() == [1.0, 25.0]
    assert sweep["iteration_time_s.median"].tolist() == [0.01, 0.02]  # the ZeRO experiment's DDP run, not 0.5


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


def test_a_u_shape_stands_out_of_the_noise():
    sweep = pd.DataFrame([timed(1, 0.03, predicted=0.02), timed(25, 0.01), timed(100, 0.02)])
    effect = dp.bucket_effect(sweep)
    assert effect.spread == pytest.approx(2.0) and effect.noise == pytest.approx(0.02)
    assert effect.best.bucket_mb == 25 and effect.u_shape and effect.predicted_spread == pytest.approx(1.0)
    assert dp.shape_sentence(effect.u_shape).startswith("a U-shape")


def test_no_u_shape_at_an_end_or_within_the_noise():
    at_end = dp.bucket_effect(pd.DataFrame([timed(1, 0.03), timed(25, 0.02), timed(100, 0.01)]))
    assert not at_end.u_shape and at_end.best.bucket_mb == 100
    noisy = pd.DataFrame([timed(1, 0.0105, 0.009, 0.012), timed(25, 0.01, 0.009, 0.011),
                          timed(100, 0.0102, 0.009, 0.011)])
    assert not dp.bucket_effect(noisy).u_shape
    assert dp.shape_sentence(False).startswith("no U-shape")


def test_the_exposed_share_at_the_default_bucket():
    sweep = pd.DataFrame([timed(1, 0.02), timed(25, 0.01, **{dp.EXPOSED: 0.005})])
    assert dp.exposed_sentence(sweep, True).startswith("exposed data-parallel communication was 50% of the iteration")
    assert dp.exposed_sentence(sweep, False).startswith("the framework predicts exposed communication of 25%")
    assert "nan%" in dp.exposed_sentence(sweep[sweep.bucket_mb != 25], True)


def legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_bucket_figure_draws_what_was_measured():
    sweep = pd.DataFrame([timed(1, 0.02, **{dp.EXPOSED: 0.004, "communication.time_s.data_parallel": 0.006}),
                          timed(25, 0.01, **{dp.EXPOSED: 0.001, "communication.time_s.data_parallel": 0.005})])
    fig, (times, comm) = plt.subplots(1, 2)
    dp.draw_bucket_times(times, sweep)
    dp.draw_bucket_communication(comm, sweep, exposed=True)
    assert sorted(legend(times)) == ["measured (median, p10–p90)", "predicted (FLOPs at peak rate)"]
    assert legend(comm) == ["measured exposed", "measured all-reduce time", "predicted exposed"]
    assert comm.get_xscale() == "log"
    fig2, (times2, comm2) = plt.subplots(1, 2)
    dp.draw_bucket_times(times2, sweep.assign(profiled_s=[0.015, 0.012]))
    dp.draw_bucket_communication(comm2, sweep, exposed=False)
    assert "predicted (profiled layer times)" in legend(times2) and legend(comm2) == ["predicted exposed"]
    plt.close(fig)
    plt.close(fig2)


def zero_runs(measured_comm=True):
    """Two ZeRO runs and a bucket sweep after the predictions, with or without measured communication."""
    comm = {"communication.sent_bytes.data_parallel": 2 * MiB, dp.EXPOSED: 0.002} if measured_comm else {}
    base = dict(measured_s=0.01, predicted_s=0.008, profiled_s=float("nan"), predicted_dp_bytes=3 * MiB,
                predicted_exposed_s=0.001)
    zero = pd.DataFrame([dict(base, label="1 rank", **{"config.layout.dp": 1}),
                         dict(base, label="dp 2, ZeRO 0", **{"config.layout.dp": 2}, **comm)])
    bucket = pd.DataFrame([dict(base, label="dp 2, ZeRO 0", bucket_mb=25.0, **{"config.layout.dp": 2}, **comm),
                           dict(base, label="dp 2, ZeRO 0", bucket_mb=0.5, **{"config.layout.dp": 2}, **comm)])
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


@pytest.mark.parametrize("spread, noise, verdict", [(0.2, 0.1, "reproduced"), (0.08, 0.1, "depends"),
                                                    (0.04, 0.01, "depends"), (0.06, 0.01, "reproduced"),
                                                    (0.04, 0.1, "not reproduced")])
def test_the_bucket_matters_above_the_noise_and_five_percent(spread, noise, verdict):
    effect = dp.BucketEffect(spread=spread, noise=noise, best=pd.Series({"bucket_mb": 25.0}), u_shape=False,
                             predicted_spread=0.0)
    assert rule("dp_zero").verdict(dp.statistics(effect)) == verdict


def test_the_finding_and_the_verdicts_words():
    effect = dp.BucketEffect(spread=0.3, noise=0.05, best=pd.Series({"bucket_mb": 4.0}), u_shape=True,
                             predicted_spread=0.1)
    assert dp.finding(effect, 0.3) == ("Bucket size changed two-rank DDP's iteration time by 30% (fastest at 4 MiB, "
                                       "step-to-step spread 5%); ZeRO-3 kept 30% of DDP's model states per rank")
    assert dp.finding(effect, None) == "Bucket size changed two-rank DDP's iteration time by 30%"
    hw = SimpleNamespace(intra_latency=150e-6)
    assert dp.verdict_text("reproduced", hw).endswith("the communication block size matters here too")
    assert "only at the margin" in dp.verdict_text("depends", hw)
    assert "α ≈ 150 µs" in dp.verdict_text("not reproduced", hw)
