"""The time model against measurements (distperf.analysis.time_model), on synthetic sweep rows, and the rule that
no validation row was used to fit anything."""
import json
import math
from dataclasses import asdict, fields, replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets  # noqa: E402
from distperf.analysis import time_model as tm  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.config import Config, Layout, validate  # noqa: E402
from distperf.cost import kernels as kn  # noqa: E402
from distperf.cost import predict  # noqa: E402
from distperf.hardware import PRESETS  # noqa: E402
from distperf.cost.kernels import STEP_FIT_MODEL  # noqa: E402
from test_kernels import synthetic_costs  # noqa: E402

HW = replace(PRESETS["A100-80GB"], name="synthetic", kernels=synthetic_costs(tp_layer_s=2e-4, fsdp_unit_s=1e-4))


def row(model: str, ratio: float, profiled_ratio: float | None = None, hw=HW, **layout) -> dict:
    """A sweep row of ``model`` whose measured median is the prediction on ``hw`` × ``ratio``."""
    cfg = validate(Config(model=presets.model(model), layout=Layout(**{"micro_batch": 1, **layout})))
    predicted = predict(cfg, hw)["time_s"]["iteration"]
    out = {"config_hash": f"{model}{sorted(layout.items())}", "repeat": 0, "status": "ok", "source": "fresh",
           "iteration_time_s.median": predicted * ratio}
    for section in ("model", "layout", "training"):
        for key, value in asdict(getattr(cfg, section)).items():
            out[f"config.{section}.{key}"] = json.dumps(list(value)) if isinstance(value, tuple) else value
    if profiled_ratio is not None:  # layer times k·T whose profiled prediction is the measured median × ratio
        shape = {"layer": (1e-3, 2e-3), "embedding": (1e-4, 1e-4), "head": (1e-4, 2e-4)}

        def profiled(k):
            times = {part: (k * f, k * b) for part, (f, b) in shape.items()}
            return predict(cfg, hw, layer_times=times)["time_s"]["iteration"]

        target = predicted * ratio * profiled_ratio
        k = (target - profiled(0.0)) / (profiled(1.0) - profiled(0.0))  # affine in k away from the schedule's kinks
        assert profiled(k) == pytest.approx(target, rel=1e-6)
        for part, (f, b) in shape.items():
            out[f"prediction.profiled.layer_times.{part}.forward_s"] = k * f
            out[f"prediction.profiled.layer_times.{part}.backward_s"] = k * b
    return out


def tables(ratio=1.25):
    return {"regimes": pd.DataFrame([row("small", ratio, 1.02), row("small", ratio, 0.97, dp=2),
                                     row(STEP_FIT_MODEL, 3.0, 1.5), row("small", ratio, 1.0, tp=2)]),
            "dp_zero": None}


def test_the_ablation_ladder_ends_at_the_full_model():
    abl = tm.ablation(tables(), HW)
    assert sorted(abl.order.unique()) == list(range(len(tm.LADDER)))
    assert len(abl) == 4 * len(tm.LADDER)
    last = abl[abl.order == len(tm.LADDER) - 1]
    assert last.error.to_numpy() == pytest.approx([1 / 1.25 - 1, 1 / 1.25 - 1, 1 / 3 - 1, 1 / 1.25 - 1])
    first = abl[abl.order == 0]
    assert (first.predicted_s.to_numpy() < last.predicted_s.to_numpy()).all()  # peak FLOPs is the fastest
    assert len(tm.ablation(tables(), replace(HW, kernels=None))) == 0  # no kernels: no ladder


def test_the_contention_rounds_reprice_the_analytical_mode_round_by_round():
    k = HW.kernels
    side = {"conditions": {"contention_rounds": [{"compute": k.contention_compute, "memory": k.contention_memory},
                                                 {"compute": 3.0, "memory": 3.0}]}}
    text = tm.contention_sensitivity(tables(), HW, side)
    same = tm.errors(tables(), HW).analytical.abs()
    slow = tm.errors(tables(), replace(HW, kernels=replace(k, contention_compute=3.0, contention_memory=3.0)))
    assert slow.analytical.abs().median() != pytest.approx(same.median())  # contended runs price differently
    first = f"{k.contention_compute:.2f}× and {k.contention_memory:.2f}×: {same.median():.1%}"
    assert text.startswith("priced with each of the calibration's 2 rounds") and text.count(first) == 2
    assert f"3.00× and 3.00×: {slow.analytical.abs().median():.1%}" in text
    assert tm.contention_sensitivity(tables(), HW, None) == "the calibration kept no rounds of its contention probe"
    assert tm.contention_sensitivity(tables(), HW, {"conditions": {}}).startswith("the calibration kept no rounds")


def _repeats(model: str, ratios, profiled_ratios, **layout) -> list[dict]:
    return [{**row(model, r, q, **layout), "repeat": i} for i, (r, q) in enumerate(zip(ratios, profiled_ratios))]


@pytest.mark.parametrize("spread, more", [(0.1, True), (0.01, False)])
def test_the_repeat_spread_of_the_profiled_error_is_measured_per_configuration(spread, more):
    table = pd.DataFrame(_repeats("small", (1.0, 1.2, 0.8), (1.0, 1 + spread, 1 - spread))
                         + _repeats(STEP_FIT_MODEL, (1.0, 2.0), (1.0, 2.0))  # the fit's preset: left out
                         + _repeats("small", (1.0,), (1.0,), dp=2))  # one repeat: no spread
    found = tm.repeat_spread({"regimes": table, "dp_zero": None}, HW)
    assert len(found) == 1 and found.repeats.iloc[0] == 3
    assert found.measured.iloc[0] == pytest.approx(0.2)
    assert found.profiled_error.iloc[0] == pytest.approx(spread, rel=1e-4)  # errors 0, +spread, −spread
    predicted = np.array([1.0, 1.2 * (1 + spread), 0.8 * (1 - spread)])
    assert found.profiled.iloc[0] == pytest.approx(predicted.std(ddof=1) / predicted.mean(), rel=1e-4)
    sentence = tm.repeat_spread_sentence(found)
    assert sentence.startswith("over 1 held-out configurations of 3 repeats each")
    assert ("moves by more than" if more else "moves by less than") in sentence
    assert tm.repeat_spread_sentence(tm.repeat_spread({"regimes": table.iloc[3:]}, HW)).startswith(
        "no held-out configuration ran twice")


@pytest.mark.parametrize("low, inside", [(0.91, True), (1.0, False)])
def test_a_miss_beyond_the_noise_lies_outside_its_medians_interval(low, inside):
    ratios = [low + 0.02 * i for i in range(10)]  # the analytical prediction is the run at ratio 1
    table = pd.DataFrame(_repeats("small", ratios, [1.0] * 10) + _repeats("small", (1.0, 1.5), (1.0, 1.0), dp=2))
    errs = tm.errors({"regimes": table}, HW)
    found = tm.beyond_noise({"regimes": table}, errs)
    assert len(found) == 1 and found.repeats.iloc[0] == 10  # two repeats bound no median
    assert (found.low_s.iloc[0], found.high_s.iloc[0]) == pytest.approx(
        tuple(found.measured_s.iloc[0] / (low + 0.09) * (low + 0.02 * k) for k in (1, 8)))  # the 2nd and 9th of 10
    assert bool(found["analytical inside"].iloc[0]) is inside
    sentence = tm.beyond_noise_sentence(found)
    assert f"the analytical prediction lies inside it in {int(inside)}" in sentence
    assert ("outside is" in sentence.split(";")[1]) is not inside
    assert tm.beyond_noise_sentence(tm.beyond_noise({"regimes": table.iloc[:5]}, errs)).startswith(
        "no held-out configuration ran the six repeats")


def test_errors_leave_out_the_fit_preset():
    errs = tm.errors(tables(), HW)
    assert STEP_FIT_MODEL not in set(errs.model) and len(errs) == 3
    assert errs.analytical.to_numpy() == pytest.approx([1 / 1.25 - 1] * 3)
    assert errs.profiled.to_numpy() == pytest.approx([0.02, -0.03, 0.0])


@pytest.mark.parametrize("ratio, met", [(1.05, True), (1.25, False)])
def test_the_goal_verdict_follows_the_data(ratio, met):
    goals = tm.goal_table(tm.errors(tables(ratio), HW))
    analytical = goals.set_index("mode").loc["analytical"]
    assert bool(analytical.met) is met and analytical.configurations == 3
    sentence = tm.goal_sentence(goals)
    assert ("the analytical mode meets" if met else "the analytical mode misses") in sentence
    assert "the profiled mode meets" in sentence  # |errors| 2 %, 3 %, 0 %
    empty = tm.goal_table(tm.errors({}, HW))
    assert empty.met.isna().all() and "was not measured" in tm.goal_sentence(empty)


def test_by_strategy_and_which_step_closes_the_error():
    abl, errs = tm.ablation(tables(), HW), tm.errors(tables(), HW)
    table = tm.by_strategy(abl, errs)
    assert table.strategy.tolist() == ["data parallel", "one device", "tensor parallel"]
    assert table.configurations.tolist() == [1, 1, 1]
    assert table["profiled"].to_numpy() == pytest.approx([-0.03, 0.02, 0.0])
    sentence = tm.closes(table)
    assert sentence.startswith("the median |error| over strategies goes") and "largest step is" in sentence
    fig, ax = plt.subplots()
    tm.draw_ablation(ax, table)
    assert len(ax.get_lines()) == 3 + 1
    plt.close(fig)
    flat = table.copy()
    for label, _ in tm.LADDER:
        flat[label] = -0.5
    assert "no step lowers it" in tm.closes(flat)


def test_by_regime_groups_by_model():
    errs = pd.DataFrame({"model": ["small", "small", "wide"], "analytical": [0.1, -0.3, 0.05],
                         "profiled": [0.0, 0.02, None]})
    table = tm.by_regime(errs).set_index("model")
    assert table.loc["small", "analytical largest |error|"] == pytest.approx(0.3)
    assert table.loc["wide", "configurations"] == 1


def test_predicted_classes_add_up_to_the_iteration():
    cfg = validate(Config(model=presets.model("small"), layout=Layout(micro_batch=1, microbatches=2)))
    classes = tm.predicted_classes(cfg, HW)
    assert sum(classes.values()) == pytest.approx(predict(cfg, HW)["time_s"]["iteration"])
    assert classes["framework"] >= HW.kernels.step_s
    ddp = validate(Config(model=presets.model("small"), layout=Layout(dp=2, micro_batch=1)))
    small = tm.predicted_classes(ddp, HW, 1024.0)  # one bucket per gradient tensor
    assert small["communication"] == pytest.approx(predict(ddp, HW, 1024.0)["time_s"]["communication_exposed"])
    assert small["communication"] != pytest.approx(tm.predicted_classes(ddp, HW)["communication"])


def test_every_constant_is_listed_with_its_unit_and_microbenchmark():
    table = tm.constants_table(HW)
    names = set(table.constant)
    for f in fields(kn.KernelCosts):
        if f.name not in ("elementwise", "skew", "fsdp_units", "p2p_stall_s", "contention_layer"):  # what-ifs after
            # the first: no profile's
            assert f.name in names
    assert table.unit.str.len().gt(0).all() and table.microbenchmark.str.len().gt(0).all()
    assert len(tm.constants_table(replace(HW, kernels=None))) == 0


def test_no_validation_row_was_used_to_fit_anything(monkeypatch):
    """The fitted constants (the step's Python, DTensor's cost per collective) come from the fit preset alone; no
    validation experiment trains that preset; the microbenchmarks' shapes are no preset's."""
    from distperf import cost
    from distperf.measure.kernels import PROBE, fit_step_overhead
    from distperf.measure.path_fits import TP_FIT_BATCHES, tensor_parallel_paths

    fit = fit_step_overhead(HW.kernels.to_dict(), micro_batches=(1,), steps=1)
    assert {r["model"] for r in fit["rows"]} == {STEP_FIT_MODEL}
    seen, priced = set(), cost.predict

    def predict(cfg, *args, **kwargs):
        seen.add(cfg.model.name)
        return priced(cfg, *args, **kwargs)

    monkeypatch.setattr(cost, "predict", predict)
    steps = {f"{p}_b{b}_step_s": 0.05 for p in ("tp", "tp_sp") for b in TP_FIT_BATCHES}
    assert set(tensor_parallel_paths(steps, HW, 2)) == {"tp_collective_s", "tp_sp_collective_s", "tp_collective_byte_s",
                                                        "tp_sp_collective_byte_s"}
    assert seen == {STEP_FIT_MODEL}
    validation = {name for name in presets.MODELS if name != STEP_FIT_MODEL}
    assert set(tm.held_out(pd.DataFrame({"model": list(presets.MODELS)})).model) == validation
    from distperf.measure.path_fits import PATH_PROBE

    for shape in (PROBE, PATH_PROBE):  # the kernel and parallel-path probes
        probe = (shape["hidden"], shape["heads"], shape["seq"])
        assert all((m.hidden, m.heads, m.seq) != probe for m in presets.MODELS.values())


def test_exposed_communication_per_kind_where_it_matters():
    from distperf.analysis import rows as rows_mod

    hw = HW
    dp_row = row("small", 1.0, dp=2)
    predicted = predict(rows_mod.config_of_row(pd.Series(dp_row)), hw)["time_s"]["communication_exposed"]
    iteration = dp_row["iteration_time_s.median"]
    big = {**dp_row, "communication.exposed_s.data_parallel": max(predicted, 0.2 * iteration) * 1.5}
    small = {**row("small", 1.0, tp=2), "communication.exposed_s.tensor_parallel": 0.01 * iteration}
    both = {**row("small", 1.0, dp=2, zero=3)}
    table = tm.exposed_errors({"regimes": pd.DataFrame([big, small, both])}, hw)
    assert table.kind.tolist() == ["data_parallel"]  # the tp run's exposed time is under 5 %; no column: left out
    assert table.error.iloc[0] == pytest.approx(predicted / big["communication.exposed_s.data_parallel"] - 1)
    goals = tm.goal_table(tm.errors({"regimes": pd.DataFrame([big])}, hw), table).set_index("mode")
    assert bool(goals.loc["exposed communication", "met"]) is bool(abs(table.error.iloc[0]) <= 0.10)
    assert "exposed communication per kind" in tm.goal_sentence(goals.reset_index())


def test_the_verdict_follows_the_goals():
    def table(profiled, analytical, exposed=None):
        errs = pd.DataFrame({"profiled": profiled, "analytical": analytical})
        return tm.goal_table(errs, None if exposed is None else pd.DataFrame({"error": exposed}))

    time = rule("time_breakdown")
    assert time.verdict(tm.statistics(table([0, 0.05, -0.15], [0, 0.1, -0.25], [0.1, -0.1, 0]))) == "reproduced"
    assert time.verdict(tm.statistics(table([0, 0.05, -0.16], [0, 0.1, -0.25], [0.1, -0.1, 0]))) == "depends"
    assert time.verdict(tm.statistics(table([0.3, -0.3], [0.3, -0.3], [0.3]))) == "not reproduced"
    unmeasured = tm.statistics(table([np.nan], [np.nan]))
    assert time.verdict(unmeasured) == "not measured" and math.isnan(unmeasured["exposed_largest"])


def test_the_largest_misses_are_named_from_the_data():
    last = tm.LADDER[-1][0]
    table = pd.DataFrame({"strategy": ["a", "b", "c", "d"], last: [-0.05, 0.4, -0.3, 0.1]})
    assert tm.largest_misses(table, 2) == "b (+40%), c (-30%)"
    assert tm.largest_misses(pd.DataFrame()) == "not measured"


def test_path_rounds_recompute_each_constant_from_every_round():
    from dataclasses import replace as swap

    hw = swap(PRESETS["A100-80GB"], kernels=synthetic_costs())
    fits = {kind: {"all": {"alpha": 1e-4, "beta": 1e9}} for kind in ("all-reduce", "all-gather", "reduce-scatter",
                                                                      "send")}
    base = {"plain_layer_s": 0.0, "tp_layer_s": 0.01, "tp_sp_layer_s": 0.01, "plain_stack_s": 0.01,
            "fsdp_stack_s": 0.05, "pp_microbatch_s": 0.004, "twobw_microbatch_s": 0.006,
            "pp_microbatch_wait_s": 0.002, "twobw_microbatch_wait_s": 0.003}
    rounds = [{**base, "tp_layer_s": x, "pp_microbatch_s": y, "pp_microbatch_wait_s": y / 2}
              for x, y in ((0.05, 0.004), (0.06, 0.008), (0.07, 0.006))]
    side = {"ranks": 2, "issued_fits": fits, "conditions": {"path_rounds": rounds, "contention_rounds": [
        {"memory": 1.1, "compute": 1.0}, {"memory": 2.3, "compute": 1.2}, {"memory": 1.5, "compute": 1.1}]}}
    table = tm.path_rounds(side, hw).set_index("constant")
    unprofiled = {"tp_collective_wait_s", "tp_sp_collective_wait_s"}  # a tensor-parallel layer's rounds, not steps
    assert set(table.index) == {name for name, _, _ in tm.CONTENTION + tm.PATH_CONSTANTS} - unprofiled
    assert (table["rounds"] == 3).all()
    assert tuple(table.loc["contention_memory", ["min", "median", "max"]]) == (1.1, 1.5, 2.3)
    tp = table.loc["tp_collective_s"]
    assert tp["min"] < tp["median"] < tp["max"] and tp["max"] - tp["min"] == pytest.approx(0.02 / 4 * 1e6)
    pp = table.loc["pp_action_s"]
    assert pp["max"] - pp["min"] == pytest.approx(0.004 / 2 * 1e6) and pp["profile"] == 0.0  # the profile's own
    inside = table.loc["pp_action_wait_s"]  # the profiled communication per microbatch, less the model's, / 2
    assert inside["max"] - inside["min"] == pytest.approx(0.002 / 2 * 1e6) and inside["max"] < pp["max"]
    assert table.loc["fsdp_overlap", "min"] == table.loc["fsdp_overlap", "max"]  # the same FSDP2 times each round
    assert tm.path_rounds({"conditions": {}}, hw).empty and tm.path_rounds(None, hw).empty


def test_path_rounds_refit_each_collectives_alpha_on_every_round_of_the_issued_collectives():
    from dataclasses import replace as swap

    from distperf.cost.collectives import ring_terms

    hw = swap(PRESETS["A100-80GB"], kernels=synthetic_costs(), collectives=(("all-reduce", 5e-4, 1e9),))
    fits = {kind: {"all": {"alpha": 1e-4, "beta": 1e9}} for kind in ("all-reduce", "all-gather", "reduce-scatter",
                                                                      "send")}

    def issued(alpha):
        return [{"collective": "all-reduce", "ranks": 2, "bytes": n,
                 "seconds": ring_terms("all-reduce", 2, n)[0] * alpha + ring_terms("all-reduce", 2, n)[1] / 1e9}
                for n in (4, 1024, 65536, 1048576)]

    paths = {"plain_layer_s": 0.0, "tp_layer_s": 0.01, "tp_sp_layer_s": 0.01, "plain_stack_s": 0.01,
             "fsdp_stack_s": 0.05}
    side = {"ranks": 2, "issued_fits": fits, "conditions": {"path_rounds": [paths] * 3,
                                                            "issued_rounds": [issued(a) for a in (2e-4, 9e-4, 4e-4)]}}
    row = tm.path_rounds(side, hw).set_index("constant").loc["all-reduce α (issued)"]
    assert row["rounds"] == 3 and row["unit"] == "µs" and row["profile"] == pytest.approx(500)
    assert (row["min"], row["median"], row["max"]) == pytest.approx((200, 400, 900), rel=1e-6)


def test_a_drained_2bw_step_is_compared_with_a_flushed_pipelines_bubble():
    from distperf.analysis import rows as rows_mod

    twobw = row("small", 1.0, pp=2, schedule="2bw", microbatches=4)
    cfg = rows_mod.config_of_row(pd.Series(twobw))
    steady = predict(cfg, HW)["time_s"]
    flushed = predict(replace(cfg, layout=replace(cfg.layout, schedule="1f1b")), HW)["time_s"]
    assert steady["bubble"] < flushed["bubble"]
    measured = {**twobw, "communication.exposed_s.pipeline_parallel": twobw["iteration_time_s.median"]}
    table = tm.exposed_errors({"regimes": pd.DataFrame([measured])}, HW)
    assert table.predicted_s.iloc[0] == pytest.approx(steady["communication_exposed"] + flushed["bubble"])


def test_the_two_instruments_of_exposed_communication_are_compared_from_the_data():
    table = pd.DataFrame({"tracked_s": [1.0, 1.0], "breakdown_s": [0.5, 0.5], "predicted_s": [0.5, 0.5],
                          "tracked_stretch": [2.0, 3.0], "breakdown_stretch": [1.1, 1.3],
                          "instrument": ["breakdown step", "communication step"]})
    table["error_tracked"] = table.predicted_s / table.tracked_s - 1
    table["error"] = table["error_breakdown"] = table.predicted_s / table.breakdown_s - 1
    sentence = tm.instruments_sentence(table)
    assert "differ from the breakdown step's communication by a median of 100%" in sentence
    assert "a median 2.50 times the timed iteration (largest 3.00), the breakdown step's 1.20 (1.30)" in sentence
    assert "0% against the goal's instrument and 50% against the communication step" in sentence
    assert "breakdown step in 1 of them and the communication step in 1" in sentence
    agree = table.assign(breakdown_s=1.0, error_breakdown=-0.5)
    assert "by a median of 0%" in tm.instruments_sentence(agree)
    assert tm.instruments_sentence(table.assign(breakdown_s=float("nan"))).startswith("only one instrument")


def test_the_goals_instrument_is_the_breakdown_step_once_it_saw_the_waits():
    dp_row = row("small", 1.0, dp=2)
    iteration = dp_row["iteration_time_s.median"]
    # rank 1's step took longest (2.1 s) but 0.6 s of it was waiting for rank 0, whose own work (1.8 s) was longer
    measured = {**dp_row, "communication.exposed_s.data_parallel": 0.5 * iteration,
                "time_breakdown_s.window": 2.1, "time_breakdown_s.communication": 0.6,
                "time_breakdown_s.per_rank.communication": "[0.2, 0.6]",
                "time_breakdown_s.per_rank.window": "[2.0, 2.1]",
                "memory_bytes.per_rank.pipeline_rank": "[0, 0]",
                "communication.per_rank": '[{"window_s": 3.0}, {"window_s": 4.0}]'}
    older = tm.exposed_errors({"regimes": pd.DataFrame([measured])}, HW).iloc[0]
    assert older.instrument == "communication step" and older.measured_s == pytest.approx(0.5 * iteration)
    assert older.breakdown_s == pytest.approx(0.6 / 2.1 * iteration) and np.isnan(older.ending_s)
    assert older.tracked_stretch == pytest.approx(4.0 / iteration) and older.breakdown_stretch == pytest.approx(
        2.1 / iteration)
    seen = tm.exposed_errors({"regimes": pd.DataFrame([{**measured, "measured_steps.breakdown_waits": True}])},
                             HW).iloc[0]
    assert seen.instrument == "breakdown step" and seen.measured_s == pytest.approx(0.1 * iteration)
    assert seen.error == pytest.approx(seen.predicted_s / seen.measured_s - 1) == pytest.approx(seen.error_ending)
    assert seen.error_breakdown == pytest.approx(seen.predicted_s / (0.6 / 2.1 * iteration) - 1)
    assert seen.error_tracked == pytest.approx(seen.predicted_s / (0.5 * iteration) - 1)


def test_the_exposed_communication_is_measured_repeat_by_repeat_on_the_rank_that_ends_the_iteration():
    base = row("small", 1.0, pp=2, schedule="1f1b", microbatches=4)
    iteration = base["iteration_time_s.median"]
    layout = Layout(pp=2, microbatches=4, schedule="1f1b", micro_batch=1)
    last = predict(validate(Config(model=presets.model("small"), layout=layout)), HW)["slowest_stage"]
    repeats = []
    for i, comm in enumerate((0.2, 0.3, 0.4)):  # the rank at the ending stage communicates this share of its step
        shares = [comm, 0.9] if last == 0 else [0.9, comm]
        repeats.append({**base, "repeat": i, "measured_steps.breakdown_waits": True,
                        "iteration_time_s.median": iteration * (1 + i / 10),
                        "time_breakdown_s.window": 1.0, "time_breakdown_s.communication": max(shares),
                        "time_breakdown_s.per_rank.communication": json.dumps(shares),
                        "time_breakdown_s.per_rank.window": "[1.0, 1.0]",
                        # memory, and with it each rank's stage, only in the first repeat
                        "memory_bytes.per_rank.pipeline_rank": "[0, 1]" if i == 0 else None})
    tables_ = {"pipeline_schedules": pd.DataFrame(repeats)}
    exposed = tm.exposed_errors(tables_, HW)
    assert exposed.stage.tolist() == [last] and exposed.instrument.tolist() == ["breakdown step"]
    found = tm.exposed_repeats(tables_, exposed)
    assert found.config_hash.tolist() == [base["config_hash"]] * 3
    assert found.measured_s.to_numpy() == pytest.approx([0.2 * iteration, 0.3 * iteration * 1.1,
                                                         0.4 * iteration * 1.2])
    assert exposed.measured_s.iloc[0] == pytest.approx(0.3 * iteration * 1.1)  # the folded step: median per rank
    assert tm.exposed_repeats(tables_, exposed.assign(instrument="communication step")).empty


def test_the_drift_between_two_calibrations_is_told_from_the_data():
    first = pd.DataFrame({"analytical": [0.1, -0.2, 0.05], "profiled": [0.02, -0.04, 0.06]})
    again = pd.DataFrame({"analytical": [0.2, -0.3, 0.1], "profiled": [0.03, -0.05, 0.01]})
    sentence = tm.drift_sentence(first, again, ("2026-12-01T06:00:00Z", "2026-12-01T06:30:00Z"))
    assert "30 minutes after the first" in sentence
    assert "median |error| is 20.0% (largest 30%) against 10.0% (20%)" in sentence
    assert "profiled mode's 3.0% (5%) against 4.0% (6%)" in sentence
    assert "median |error| is 10.0% (largest 20%) against 20.0% (30%)" in tm.drift_sentence(again, first)
    assert tm.drift_sentence(first, first.iloc[:0]) == "no second calibration was made"


def test_the_machines_drift_between_calibrations_is_read_from_their_matrix_products():
    from types import SimpleNamespace

    def profile(rows):  # what gemm_drift reads of a hardware profile
        return SimpleNamespace(kernels=None if rows is None else SimpleNamespace(linear_fp32=rows))

    first = profile(((64, 1.0, 2.0), (128, 2.0, 4.0), (256, 4.0, 8.0), (512, 8.0, 16.0)))
    again = profile(((64, 9.0, 2.0), (128, 3.0, 4.0), (256, 6.0, 8.0), (512, 8.0, 16.0)))
    sentence = tm.gemm_drift(first, again)
    assert "(n from 128 to 512) took 1.00 to 1.50 times the first calibration's time (median 1.50)" in sentence
    assert tm.gemm_drift(profile(None), again) == "the calibrations measured no matrix products to compare"
    assert tm.gemm_drift(first, again, smallest=1024) == "the calibrations share no matrix-product size to compare"


def test_a_pipelines_exposed_time_is_read_on_the_stage_the_model_says_ends_the_iteration():
    from distperf.analysis import rows as rows_mod

    pipe = row("small", 1.0, pp=2, schedule="1f1b", microbatches=4)
    last = predict(rows_mod.config_of_row(pd.Series(pipe)), HW)["slowest_stage"]
    iteration = pipe["iteration_time_s.median"]
    # the other stage has the longer own work (0.9 s against 0.5 s) and the longer step: neither makes it the one
    shares, windows = ([0.5, 0.2], [1.0, 1.1]) if last == 0 else ([0.2, 0.5], [1.1, 1.0])
    measured = {**pipe, "measured_steps.breakdown_waits": True, "time_breakdown_s.window": 1.1,
                "time_breakdown_s.communication": 0.2,  # the rank whose step took longest
                "time_breakdown_s.per_rank.communication": json.dumps(shares),
                "time_breakdown_s.per_rank.window": json.dumps(windows),
                "memory_bytes.per_rank.pipeline_rank": "[0, 1]"}
    found = tm.exposed_errors({"regimes": pd.DataFrame([measured])}, HW).iloc[0]
    assert found.measured_s == pytest.approx(0.5 * iteration) == pytest.approx(found.ending_s)
    assert found.breakdown_s == pytest.approx(0.2 / 1.1 * iteration)
    assert found.error_breakdown == pytest.approx(found.predicted_s / (0.2 / 1.1 * iteration) - 1)
    assert "it changes 1 of them" in tm.instruments_sentence(found.to_frame().T.assign(
        tracked_s=1.0, error_tracked=0.0).astype({"breakdown_s": float, "ending_s": float, "error_ending": float,
                                                  "error": float, "error_breakdown": float,
                                                  "tracked_stretch": float, "breakdown_stretch": float}))


def test_the_slowest_stage_is_the_one_that_ends_the_iteration():
    cfg = validate(Config(model=presets.model("small"), layout=Layout(pp=2, schedule="1f1b", microbatches=4,
                                                                        micro_batch=1, partition=(1, 3))))
    out = predict(cfg, HW)
    assert out["slowest_stage"] in (0, 1)
    balanced = predict(validate(Config(model=presets.model("small"), layout=Layout(
        pp=2, schedule="1f1b", microbatches=4, micro_batch=1))), HW)
    assert balanced["slowest_stage"] == 0  # 1F1B: the first stage runs the last backward


def _time_goals_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "time_goals.py"
    spec = importlib.util.spec_from_file_location("time_goals", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_time_goals_script_prints_the_goal_table_from_the_data():
    def goal_rows(text):
        return {line.split()[0]: line.split()[1:] for line in text.splitlines() if "≤" in line}

    text = _time_goals_script().report(tables(1.25), HW)  # every run measured 1.25 × the analytical prediction
    found = goal_rows(text)
    assert found["analytical"][:3] == ["3", "20.0%", "20.0%"] and found["analytical"][-1] == "False"
    assert found["profiled"][:3] == ["3", "2.0%", "3.0%"] and found["profiled"][-1] == "True"
    assert found["exposed"][-1] == "None" and "-" in found["exposed"]  # no run measured it
    assert any(line.split() == ["one", "device", "-20.0%", "+2.0%"] for line in text.splitlines())
    assert goal_rows(_time_goals_script().report(tables(1.02), HW))["analytical"][-1] == "True"


def test_the_time_goals_script_says_what_is_missing(monkeypatch, tmp_path, capsys):
    from distperf import results

    monkeypatch.setattr(results, "book_dir", lambda scale=None: tmp_path)
    assert _time_goals_script().main(["--scale", "cpu"]) == 2
    assert "hardware.json is missing: run `make data SCALE=cpu` first" in capsys.readouterr().err


def test_the_rounds_sentence_says_whether_the_calibrations_constants_settled():
    rule = {"least": 3, "most": 8, "settled": 0.1, "budget_s": 150.0}
    loud = {"rounds": 7, "settled": False, "seconds": 155.5, "rule": rule,
            "last_moves": {"send alpha": 0.19, "tp_layer_s": 0.02}}
    said = tm.rounds_sentence({"conditions": {"rounds": loud}})
    assert said.startswith("7 rounds in 156 s") and "did not settle within 10%" in said and "send alpha" in said
    quiet = {**loud, "rounds": 3, "settled": True, "last_moves": {"send alpha": 0.05}}
    assert "the constants settled" in tm.rounds_sentence({"conditions": {"rounds": quiet}})
    assert "predates the rule" in tm.rounds_sentence({"conditions": {}})


def test_the_rounds_rule_sentence_prices_both_rules_on_the_same_calibration():
    from distperf.cost.collectives import ring_terms

    def issued(alpha):
        return [{"collective": kind, "ranks": 2, "bytes": n,
                 "seconds": ring_terms(kind, 2, n)[0] * alpha + ring_terms(kind, 2, n)[1] / 1e9}
                for kind in ("all-gather", "all-reduce", "reduce-scatter", "send") for n in (4, 1024, 65536, 1048576)]

    paths = {"plain_layer_s": 0.01, "tp_layer_s": 0.03, "tp_sp_layer_s": 0.03, "plain_stack_s": 0.02,
             "fsdp_stack_s": 0.05}
    side = {"ranks": 2, "conditions": {"issued_rounds": [issued(a) for a in (4e-3, 1e-4, 2e-4, 3e-4)],
                                       "path_rounds": [paths] * 4, "contention_rounds": [{"memory": 1.0,
                                                                                          "compute": 1.0}] * 4}}
    text = tm.rounds_rule_sentence(tables(), HW, side)
    now, earlier = text.split("; with the profile the earlier rule")
    assert now.startswith("priced with the profile from all 4 rounds")
    from distperf.measure.rounds import profile_from_rounds

    first = profile_from_rounds(HW, side, **tm.EARLIER_RULE)  # the first round's 4 ms α
    assert dict((k, a) for k, a, _ in first.collectives)["all-reduce"] == pytest.approx(4e-3, rel=1e-6)
    e = tm.errors(tables(), first)
    assert f"analytical {e.analytical.abs().median():.1%} (largest {e.analytical.abs().max():.0%})" in earlier
    assert "no rounds" in tm.rounds_rule_sentence(tables(), HW, {"conditions": {}})


@pytest.mark.parametrize("truth", ["with", "alone"])
def test_the_per_byte_rule_compares_both_fits_of_the_same_steps(truth):
    """Steps of the tiny preset priced with a cost per collective and per byte; a tensor-parallel run of small measured
    as either fit prices it: the rule stands where the per-byte fit is the truth, not where the per-call one is."""
    from distperf.measure.path_fits import TP_FIT_BATCHES, tensor_parallel_paths

    true = replace(HW, kernels=replace(HW.kernels, tp_collective_s=3e-4, tp_collective_byte_s=2e-9))

    def step(b):
        cfg = Config(model=presets.model(STEP_FIT_MODEL), layout=Layout(tp=2, micro_batch=b))
        return predict(cfg, true, backend="gloo")["time_s"]["iteration"]

    side = {"ranks": 2, "conditions": {"paths": {f"tp_b{b}_step_s": step(b) for b in TP_FIT_BATCHES}}}
    fitted = replace(true, kernels=replace(true.kernels, **tensor_parallel_paths(side["conditions"]["paths"], true, 2,
                                                                                  per_byte=truth == "with")))
    runs = {"regimes": pd.DataFrame([row("small", 1.0, 1.0, hw=fitted, tp=2, micro_batch=b) for b in (1, 8)]
                                    + [row("small", 1.1, 1.0, dp=2)])}
    rule = tm.tp_bytes_rule(runs, true, side)
    assert rule["runs"] == 2 and rule["stands"] == (truth == "with")
    assert rule[truth]["analytical"][1] == pytest.approx(0.0, abs=1e-9)  # the fit that made the runs prices them
    other = "alone" if truth == "with" else "with"
    assert rule[other]["analytical"][0] > 0.01 and rule[other]["profiled"][1] > 0.01
    text = tm.tp_bytes_rule_sentence(runs, true, side)
    assert "the 2 tensor-parallel runs' median |error|" in text and "3 µs" not in text
    assert ("the per-byte term stands" in text) == (truth == "with")
    early = {"conditions": {"paths": {f"tp_b{b}_step_s": step(b) for b in (1, 2, 4)}}}
    assert tm.tp_bytes_rule(runs, true, early) is None and "too few" in tm.tp_bytes_rule_sentence(runs, true, early)


@pytest.mark.parametrize("truth", ["split", "whole"])
def test_the_wait_rule_compares_dtensors_cost_split_and_whole_as_communication(truth):
    """Tensor-parallel runs whose measured exposed communication is what the split (or the whole cost) predicts: the
    rule stands where the split is the truth, not where the whole cost is; a profile without waits has no rule."""
    split = replace(HW, kernels=replace(HW.kernels, tp_collective_s=1e-3, tp_collective_wait_s=4e-4))
    whole = replace(split, kernels=replace(split.kernels, tp_collective_wait_s=1e-3))
    runs = [row("small", 1.0, hw=split, tp=2, micro_batch=b) for b in (1, 2)]
    probe = {"regimes": pd.DataFrame([{**r, "communication.exposed_s.tensor_parallel": 1.0} for r in runs])}
    truths = {name: tm.exposed_errors(probe, hw).predicted_s.tolist() for name, hw in (("split", split),
                                                                                        ("whole", whole))}
    assert all(a < b for a, b in zip(truths["split"], truths["whole"]))  # DTensor's Python is not communication
    measured = pd.DataFrame([{**r, "communication.exposed_s.tensor_parallel": t} for r, t in zip(runs, truths[truth])])
    rule = tm.wait_rule({"regimes": measured}, split)
    assert rule["runs"] == 2 and rule["stands"] == (truth == "split")
    assert rule[truth][1] == pytest.approx(0.0, abs=1e-9)
    text = tm.wait_rule_sentence({"regimes": measured}, split)
    assert "400 of 1000 µs (tp_collective_s)" in text and "over the 2 tensor-parallel runs" in text
    assert ("the split stands" in text) == (truth == "split")
    assert tm.wait_rule({"regimes": measured}, HW) is None and "did not profile" in tm.wait_rule_sentence(
        {"regimes": measured}, HW)


@pytest.mark.parametrize("truth", ["split", "whole"])
def test_the_wait_rule_compares_the_pipeline_engines_cost_split_and_whole_as_framework(truth):
    split = replace(HW, kernels=replace(HW.kernels, pp_action_s=2e-3, pp_action_wait_s=1.5e-3))
    whole = replace(split, kernels=replace(split.kernels, pp_action_wait_s=0.0))
    runs = [row("small", 1.0, hw=split, pp=2, schedule="1f1b", microbatches=m) for m in (2, 4)]
    probe = {"regimes": pd.DataFrame([{**r, "communication.exposed_s.pipeline_parallel": 1.0} for r in runs])}
    truths = {name: tm.exposed_errors(probe, hw, pipeline_split=True).predicted_s.tolist()
              for name, hw in (("split", split), ("whole", whole))}
    assert all(a > b for a, b in zip(truths["split"], truths["whole"]))  # the engine's sends and waits
    assert tm.exposed_errors(probe, split).predicted_s.tolist() == truths["split" if tm.PIPELINE_SPLIT else "whole"]
    measured = pd.DataFrame([{**r, "communication.exposed_s.pipeline_parallel": t}
                             for r, t in zip(runs, truths[truth])])
    rule = tm.wait_rule({"regimes": measured}, split, "pipeline_parallel")
    assert rule["runs"] == 2 and rule["stands"] == (truth == "split")
    text = tm.wait_rule_sentence({"regimes": measured}, split, "pipeline_parallel")
    assert "1500 of 2000 µs (pp_action_s)" in text and "the 2 pipeline-parallel runs" in text
    assert ("the split stands" in text) == (truth == "split") and "as framework" in text


def test_the_overlap_rule_sentence_prices_both_probes_of_the_same_calibration():
    from dataclasses import replace as changed

    hw = changed(HW, kernels=changed(HW.kernels, overlap=0.0))
    side = {"conditions": {"overlap_rounds": [{"overlap": 0.0, "overlap_1mib": x} for x in (0.9, 1.0, 0.6)]}}
    text = tm.overlap_rule_sentence(tables(), hw, side)
    assert "(0.00, the median of 3 rounds)" in text and "1 MiB probe's (0.90)" in text
    now, then = text.split("; with the 1 MiB probe's")
    assert "the 1 data-parallel runs' median signed error" in now
    e = tm.errors(tables(), changed(hw, kernels=changed(hw.kernels, overlap=0.9)))
    assert f"profiled {e.profiled.abs().median():.1%} (largest {e.profiled.abs().max():.0%})" in then
    assert "predates" in tm.overlap_rule_sentence(tables(), hw, {"conditions": {}})


def test_the_tensor_parallel_path_rounds_reprice_the_runs_they_touch():
    spread = pd.DataFrame([("tp_collective_s", "µs", 3, 100.0, 500.0, 5000.0, 500.0)],
                          columns=["constant", "unit", "rounds", "min", "median", "max", "profile"])
    text = tm.path_sensitivity(tables(), HW, spread)
    low = tm.errors(tables(), replace(HW, kernels=replace(HW.kernels, tp_collective_s=1e-4))).profiled
    high = tm.errors(tables(), replace(HW, kernels=replace(HW.kernels, tp_collective_s=5e-3))).profiled
    moved = (high - low).abs() > 1e-9
    assert moved.sum() == 1 and high[moved].iloc[0] > low[moved].iloc[0]  # only the tp=2 run pays the constant
    assert "tp_collective_s 100 to 5000 µs" in text and "the 1 tensor-parallel run's profiled" in text
    assert f"from {low[moved].iloc[0]:+.1%} to {high[moved].iloc[0]:+.1%}" in text
    assert tm.path_sensitivity(tables(), HW, spread.iloc[:0]).startswith("the calibration kept no rounds")
    dp_only = {"regimes": tables()["regimes"].iloc[:2]}
    assert tm.path_sensitivity(dp_only, HW, spread) == "no held-out run used tensor parallelism"


def test_the_pipeline_action_rounds_reprice_the_pipeline_runs_alone():
    spread = pd.DataFrame([("pp_action_s", "µs", 6, 400.0, 1300.0, 2100.0, 1300.0),
                           ("tp_collective_s", "µs", 6, 100.0, 500.0, 5000.0, 500.0)],
                          columns=["constant", "unit", "rounds", "min", "median", "max", "profile"])
    piped = {"regimes": pd.concat([tables()["regimes"], pd.DataFrame([
        row("small", 1.25, 1.0, pp=2, schedule="1f1b", microbatches=4),
        row("small", 1.25, 1.1, pp=2, schedule="gpipe", microbatches=2)])], ignore_index=True)}
    text = tm.path_sensitivity(piped, HW, spread, "pipeline")
    low = tm.errors(piped, replace(HW, kernels=replace(HW.kernels, pp_action_s=4e-4))).profiled
    high = tm.errors(piped, replace(HW, kernels=replace(HW.kernels, pp_action_s=2.1e-3))).profiled
    moved = (high - low).abs() > 1e-9
    assert moved.sum() == 2 and (high[moved] > low[moved]).all()  # a dearer action makes both pipelines longer
    assert "pp_action_s 400 to 2100 µs" in text and "tp_collective_s" not in text and "the 2 pipeline runs'" in text
    assert f"median {low[moved].median():+.1%} and {high[moved].median():+.1%}" in text
    assert tm.path_sensitivity(piped, HW, spread.iloc[1:], "pipeline").startswith("the calibration kept no rounds")
    assert tm.path_sensitivity(tables(), HW, spread, "pipeline") == "no held-out run used a pipeline"


def test_recomputation_is_paired_with_its_twin_and_its_constants_judged_by_the_declared_rule():
    from dataclasses import replace as changed

    # measured as the model with the checkpoint at 3 ms per layer would price it: the constants bring the runs that
    # recompute nearer zero in both modes; a twin without recomputation pairs with each
    costly = changed(HW, kernels=changed(HW.kernels, recompute_layer_s=3e-3))
    plain, full = row("small", 1.0, 1.0), row("small", 1.0, 1.0, recompute="full")
    measured_with = predict(validate(Config(model=presets.model("small"), layout=Layout(micro_batch=1,
                                                                                       recompute="full"))), costly)
    full["iteration_time_s.median"] = measured_with["time_s"]["iteration"]
    found = {"planner": pd.DataFrame([plain, full])}
    pairs = tm.recompute_pairs(found, costly)
    assert list(pairs.recompute) == ["full"] and len(pairs) == 1
    assert pairs.measured[0] == pytest.approx(pairs.analytical[0], rel=1e-6)  # priced as measured
    text = tm.recompute_rule_sentence(found, costly)
    assert "over the 1 held-out configurations with recomputation" in text and "The constants stand" in text
    # measured as the model without the constants prices it: they move the runs away from zero
    full["iteration_time_s.median"] = predict(validate(Config(model=presets.model("small"), layout=Layout(
        micro_batch=1, recompute="full"))), HW)["time_s"]["iteration"]
    assert "do not stand" in tm.recompute_rule_sentence({"planner": pd.DataFrame([plain, full])}, costly)
    assert "predates the recomputation probe" in tm.recompute_rule_sentence(found, HW)
    assert tm.recompute_rule_sentence({"planner": pd.DataFrame([plain])}, costly) == "no held-out run recomputed"


def test_layer_contention_compares_the_parts_measured_at_once_with_the_kernel_model_alone():
    from dataclasses import replace as changed

    from distperf.cost import kernels as kn

    hw = changed(HW, kernels=changed(HW.kernels, contention_compute=1.1, contention_memory=1.3))

    def timed(ratio, **layout):
        out = row("small", 1.0, **layout)
        spec, lay = presets.model("small"), Layout(**{"micro_batch": 1, **layout})
        layer = kn.layer(hw.kernels, 1, spec.seq, spec.hidden, spec.heads, spec.ffn, lay.tp, False, True, True, False,
                         "none", False)
        f, b = sum(p[0] for p in layer.values()), sum(p[1] for p in layer.values())
        out.update({f"{tm.LAYER_TIMES}layer.forward_s": ratio * f, f"{tm.LAYER_TIMES}layer.backward_s": ratio * b,
                    f"{tm.LAYER_TIMES}ranks_at_once": lay.world_size})
        return out

    found = tm.layer_contention({"regimes": pd.DataFrame([timed(1.0), timed(1.5, dp=2), timed(1.4, tp=2)])}, hw)
    assert list(found.ranks) == [1, 2, 2]
    assert list(found.measured) == pytest.approx([1.0, 1.5, 1.4])
    assert found.profile[0] == 1.0 and 1.1 < found.profile[1] < 1.3  # the profile's ratios, weighted by class
    text = tm.layer_contention_sentence(found)
    assert "on one device its layer took a median 1.00 times" in text and "1.45 times" in text
    assert "within 10%" in text and "leaves out" in text
    close = tm.layer_contention_sentence(found.assign(measured=found.profile))
    assert "prices the layer within 10%" in close
    assert tm.layer_contention_sentence(found.iloc[:0]) == "no held-out run timed its parts"


def _stepped_repeats(means, firsts, clocks=None, schedule="1f1b"):
    """Repeats of a `small` pipeline (1F1B by default) whose ending rank communicates the share ``means[i]`` of repeat
    i's steps on the whole and ``firsts[i]`` of its first step (every rank alike, windows of 1 s), and with
    ``clocks`` waits ``clocks[i]`` seconds on repeat i's wait clock (the other rank twice as long)."""
    base = row("small", 1.0, pp=2, schedule=schedule, microbatches=4)
    out = []
    for i, (mean, first) in enumerate(zip(means, firsts)):
        if clocks is not None:
            base = {**base, "wait_clock_s.per_rank": json.dumps([clocks[i], 2 * clocks[i]])}
        rest = (5 * mean - first) / 4  # the other four steps, so that the five's share is ``mean``
        steps = [first] + [rest] * 4
        out.append({**base, "repeat": i, "measured_steps.breakdown_waits": True,
                    "time_breakdown_s.window": 1.0, "time_breakdown_s.communication": mean,
                    "time_breakdown_s.per_rank.communication": json.dumps([mean, mean]),
                    "time_breakdown_s.per_rank.window": "[1.0, 1.0]",
                    "time_breakdown_s.per_step.communication": json.dumps([steps, steps]),
                    "time_breakdown_s.per_step.window": json.dumps([[1.0] * 5, [1.0] * 5]),
                    "memory_bytes.per_rank.pipeline_rank": "[0, 1]" if i == 0 else None})
    return {"pipeline_schedules": pd.DataFrame(out)}, base["iteration_time_s.median"]


def test_the_exposed_communication_is_read_over_all_breakdown_steps_or_on_the_first_alone():
    tables_, iteration = _stepped_repeats([0.30, 0.31, 0.32], [0.2, 0.3, 0.5])
    every = tm.exposed_errors(tables_, HW)
    assert every.measured_s.iloc[0] == pytest.approx(0.31 * iteration)
    first = tm.exposed_errors(tables_, HW, all_steps=False)
    assert first.measured_s.iloc[0] == pytest.approx(0.3 * iteration) == pytest.approx(first.ending_s.iloc[0])
    assert first.error.iloc[0] == pytest.approx(first.predicted_s.iloc[0] / (0.3 * iteration) - 1)
    found = tm.exposed_repeats(tables_, every, first_step=True)
    assert found.measured_s.to_numpy() == pytest.approx([0.2 * iteration, 0.3 * iteration, 0.5 * iteration])
    older = {name: t.drop(columns=[c for c in t if ".per_step." in c]) for name, t in tables_.items()}
    assert tm.exposed_errors(older, HW, all_steps=False).measured_s.iloc[0] == pytest.approx(0.31 * iteration)


@pytest.mark.parametrize("steady", ["all", "first"])
def test_the_breakdown_steps_rule_keeps_the_instrument_whose_repeats_spread_less(steady):
    calm, loud = [0.30, 0.31, 0.32, 0.31], [0.2, 0.4, 0.3, 0.5]
    tables_, _ = _stepped_repeats(calm, loud) if steady == "all" else _stepped_repeats(loud, calm)
    rule = tm.breakdown_steps_rule(tables_, tm.exposed_errors(tables_, HW))
    spread = {v: np.std(x, ddof=1) / np.mean(x) for v, x in (("all", calm), ("first", loud))} if steady == "all" \
        else {v: np.std(x, ddof=1) / np.mean(x) for v, x in (("all", loud), ("first", calm))}
    assert rule["configurations"] == 1 and rule["stands"] == (steady == "all")
    assert rule["all"]["rsd"] == pytest.approx(spread["all"]) and rule["first"]["rsd"] == pytest.approx(spread["first"])
    sentence = tm.breakdown_steps_rule_sentence(tables_, tm.exposed_errors(tables_, HW))
    assert ("all the steps stand" if steady == "all" else "all the steps do not stand") in sentence
    older = {name: t.drop(columns=[c for c in t if ".per_step." in c]) for name, t in tables_.items()}
    without = tm.exposed_errors(older, HW)
    assert tm.breakdown_steps_rule(older, without) is None
    assert tm.breakdown_steps_rule_sentence(older, without).startswith("no run kept its breakdown steps")


def test_the_wait_clock_reads_the_rank_that_ends_the_iteration_on_its_timed_steps():
    tables_, iteration = _stepped_repeats([0.30, 0.31, 0.32], [0.3] * 3, clocks=[0.02, 0.04, 0.03])
    steps = tm.exposed_errors(tables_, HW)  # the goal's instrument until the rule judges: the breakdown steps
    assert steps.instrument.iloc[0] == "breakdown step" and steps.measured_s.iloc[0] == pytest.approx(0.31 * iteration)
    assert steps.clock_s.iloc[0] == pytest.approx(0.03)  # the repeats' median, on the stage that ends the iteration
    assert steps.error_clock.iloc[0] == pytest.approx(steps.clock_predicted_s.iloc[0] / 0.03 - 1)
    clock = tm.exposed_errors(tables_, HW, wait_clock=True)
    assert clock.instrument.iloc[0] == "wait clock" and clock.measured_s.iloc[0] == pytest.approx(0.03)
    assert clock.predicted_s.iloc[0] == pytest.approx(steps.predicted_s.iloc[0])  # 1F1B: the same prediction
    assert tm.exposed_repeats(tables_, clock).empty  # the breakdown's repeats judge no clock row
    assert sorted(tm.goal_repeats(tables_, clock).measured_s) == pytest.approx([0.02, 0.03, 0.04])
    assert len(tm.goal_repeats(tables_, steps)) == 3  # on the breakdown steps: their three repeats
    # 2BW's timed steps do not flush: the clock is priced with its own bubble, the drained breakdown step with 1F1B's
    twobw, _ = _stepped_repeats([0.30] * 3, [0.3] * 3, clocks=[0.03] * 3, schedule="2bw")
    found = tm.exposed_errors(twobw, HW)
    assert found.clock_predicted_s.iloc[0] < found.predicted_s.iloc[0]
    older = {name: t.drop(columns=["wait_clock_s.per_rank"]) for name, t in tables_.items()}
    assert tm.exposed_errors(older, HW, wait_clock=True).instrument.iloc[0] == "breakdown step"


@pytest.mark.parametrize("stage, stages, expected", [(1, "[0, 1]", 0.02), (0, "[0, 1]", 0.05), (0, None, 0.02),
                                                     (1, "[0, 0]", np.nan)])
def test_the_clock_of_the_ending_rank_is_the_least_waiting_one_at_its_stage(stage, stages, expected):
    found = tm._clock_s({"wait_clock_s.per_rank": "[0.05, 0.02]", "memory_bytes.per_rank.pipeline_rank": stages},
                        stage)
    assert found == pytest.approx(expected, nan_ok=True)
    assert np.isnan(tm._clock_s({}, 0))


@pytest.mark.parametrize("steady", ["clock", "breakdown"])
def test_the_wait_clock_rule_keeps_the_instrument_whose_repeats_spread_less(steady):
    calm, loud = [0.30, 0.31, 0.32, 0.31], [0.2, 0.4, 0.3, 0.5]
    shares, clocks = (loud, [c / 10 for c in calm]) if steady == "clock" else (calm, [c / 10 for c in loud])
    tables_, iteration = _stepped_repeats(shares, shares, clocks=clocks)
    exposed = tm.exposed_errors(tables_, HW)
    rule = tm.wait_clock_rule(tables_, exposed)
    assert rule["configurations"] == 1 and rule["stands"] == (steady == "clock")
    assert rule["clock"]["rsd"] == pytest.approx(np.std(clocks, ddof=1) / np.mean(clocks))
    assert rule["breakdown"]["rsd"] == pytest.approx(np.std(shares, ddof=1) / np.mean(shares))
    assert rule["shift"] == pytest.approx(np.median(clocks) / (np.median(shares) * iteration) - 1)
    sentence = tm.wait_clock_rule_sentence(tables_, exposed)
    assert ("the wait clock stands" if steady == "clock" else "the wait clock does not stand") in sentence
    older = {name: t.drop(columns=["wait_clock_s.per_rank"]) for name, t in tables_.items()}
    assert tm.wait_clock_rule(older, tm.exposed_errors(older, HW)) is None
    assert tm.wait_clock_rule_sentence(older, tm.exposed_errors(older, HW)).startswith("no pipeline run kept")


@pytest.mark.parametrize("truth", [True, False])
def test_the_bucket_point_stands_where_the_all_reduce_at_ddps_bucket_prices_the_runs(truth):
    """Issued all-reduces to 4 MiB at 100 MB/s and one at DDP's bucket at 20 MB/s; a data-parallel run of the medium
    preset measured as the fit with the point prices it, or as the fit without: the point stands only in the first."""
    from distperf.analysis import rows as rows_mod
    from distperf.cost.collectives import ring_terms
    from distperf.measure.rounds import ISSUED_LARGEST, profile_from_rounds

    def timed(n, beta):
        steps, volume = ring_terms("all-reduce", 2, n)
        return {"collective": "all-reduce", "ranks": 2, "bytes": n, "seconds": steps * 1e-4 + volume / beta}

    bucket = ISSUED_LARGEST["all-reduce"]
    paths = {"plain_layer_s": 0.01, "tp_layer_s": 0.03, "tp_sp_layer_s": 0.03, "plain_stack_s": 0.02,
             "fsdp_stack_s": 0.05}
    side = {"ranks": 2, "conditions": {
        "issued_rounds": [[timed(n, 1e8) for n in (4, 1024, 65536, 1 << 22)] + [timed(bucket, 2e7)]] * 3,
        "path_rounds": [paths] * 3, "contention_rounds": [{"memory": 1.0, "compute": 1.0}] * 3}}
    hw = replace(HW, kernels=replace(HW.kernels, overlap=0.0),  # nothing hides the all-reduce
                 collectives=tuple((kind, 1e-4, 1e9) for kind in ("all-gather", "all-reduce", "reduce-scatter",
                                                                   "send")),
                 collectives_on=(HW.intra_latency, HW.intra_bandwidth))
    true = profile_from_rounds(hw, side, bucket=truth)
    dp = row("medium", 1.0, 1.0, hw=true, dp=2)
    exposed = predict(rows_mod.config_of_row(pd.Series(dp)), true)["time_s"]["communication_exposed"]
    runs = {"regimes": pd.DataFrame([{**dp, "communication.exposed_s.data_parallel": exposed}])}
    found = tm.bucket_point_rule(runs, hw, side)
    assert found["stands"] is truth and found["with"]["runs"] == found["without"]["runs"] == 1
    assert found["with"]["beta"] < found["without"]["beta"] and found["point_bytes"] == bucket
    assert found["with" if truth else "without"]["exposed"] == pytest.approx(0.0, abs=1e-9)
    sentence = tm.bucket_point_rule_sentence(runs, hw, side)
    assert sentence.startswith("the issued all-reduce of 25 MiB took") and "(the sizes to 4 MiB)" in sentence
    assert sentence.endswith("stands: a lower exposed median and neither mode's median higher") is truth
    older = {**side, "conditions": {**side["conditions"], "issued_rounds": [r[:-1] for r in
                                                                            side["conditions"]["issued_rounds"]]}}
    assert tm.bucket_point_rule(runs, hw, older) is None
    assert tm.bucket_point_rule_sentence(runs, hw, older) == ("this calibration did not time the all-reduce at DDP's "
                                                              "default bucket")


@pytest.mark.parametrize("truth", [True, False])
def test_the_receive_stall_stands_where_it_prices_a_pipelines_waiting(truth):
    """A pipeline run whose exposed communication is what the model gives with the calibration's stall on every
    receive, or without it: the stall stands only in the first."""
    from distperf.analysis import rows as rows_mod

    stall = 2e-3
    side = {"conditions": {"busy_sender": {"stall_s": stall, "busy": {"stalled": 0.1}}}}
    true = replace(HW, kernels=replace(HW.kernels, p2p_stall_s=stall if truth else 0.0))
    run = row("small", 1.0, None, hw=true, pp=2, schedule="1f1b", microbatches=4)
    p = predict(rows_mod.config_of_row(pd.Series(run)), true)["time_s"]
    runs = {"regimes": pd.DataFrame([{**run, "communication.exposed_s.pipeline_parallel":
                                      p["communication_exposed"] + p["bubble"]}])}
    found = tm.stall_rule(runs, HW, side)
    assert found["stands"] is truth and found["with"]["runs"] == found["without"]["runs"] == 1
    assert found["with" if truth else "without"]["exposed"] == pytest.approx(0.0, abs=1e-9)
    assert found["with"]["exposed_max"] >= found["with"]["exposed"]
    sentence = tm.stall_rule_sentence(runs, HW, side)
    assert sentence.startswith("a receive from a computing sender waited 2.00 ms longer") and "(10% of them" in sentence
    assert sentence.endswith("stands: a lower exposed median and neither mode's median higher") is truth
    assert tm.stall_rule(runs, HW, {"conditions": {}}) is None
    assert tm.stall_rule_sentence(runs, HW, None) == "this calibration did not time a receive from a computing sender"


@pytest.mark.parametrize("truth", [True, False])
def test_ddps_slopes_stand_where_they_price_a_ddp_runs_iteration(truth):
    """A DDP run whose iteration (both modes) is what the model gives with DDP's cost per tensor and per byte, or
    without it: the slopes stand only in the first; a profile without them has no rule to judge."""
    sloped = replace(HW, kernels=replace(HW.kernels, ddp_tensor_s=5e-6, ddp_byte_s=1e-9))
    runs = {"regimes": pd.DataFrame([row("small", 1.0, 1.0, hw=sloped if truth else HW, dp=2)])}
    found = tm.ddp_slopes_rule(runs, sloped)
    assert found["stands"] is truth and found["with"]["runs"] == found["without"]["runs"] == 1
    for mode in tm.MODES:
        assert found["with" if truth else "without"]["ddp"][mode] == pytest.approx(0.0, abs=1e-9)
        assert found["without" if truth else "with"]["ddp"][mode] > 0.01
    sentence = tm.ddp_slopes_rule_sentence(runs, sloped)
    assert sentence.startswith("DDP's 5.00 µs per parameter tensor and 1000 ps per byte of gradient: with them, the "
                               "1 ")
    assert (": the slopes stand: " in sentence) is truth
    assert tm.ddp_slopes_rule(runs, HW) is None
    assert tm.ddp_slopes_rule_sentence(runs, HW) == ("this calibration did not measure DDP's cost per tensor and per "
                                                     "byte")


@pytest.mark.parametrize("truth", [True, False])
def test_a_layers_contention_stands_where_it_prices_the_runs_of_several_ranks(truth):
    """Runs whose iterations (both modes) are what the model gives with a layer's contention ratio (the calibration's
    sidecar holds it), or with the two other ratios instead: the layer's stands only in the first; one rank's run is
    the same in both; a calibration without the ratio has no rule to judge."""
    side = {"conditions": {"contention": {"memory": 1.0, "compute": 1.0, "layer": 1.3}}}
    truth_hw = replace(HW, kernels=replace(HW.kernels, contention_layer=1.3)) if truth else HW
    runs = {"regimes": pd.DataFrame([row("small", 1.0, 1.0, hw=truth_hw, pp=2, schedule="1f1b", microbatches=2),
                                     row("small", 1.0, 1.0, hw=truth_hw, microbatches=2)])}
    found = tm.layer_contention_rule(runs, HW, side)
    assert found["stands"] is truth and found["ratio"] == 1.3
    assert found["with"]["runs"] == found["without"]["runs"] == 1
    assert found["with" if truth else "without"]["analytical_max"] == pytest.approx(0.0, abs=1e-9)
    assert found["without" if truth else "with"]["analytical_max"] > 0.05
    sentence = tm.layer_contention_rule_sentence(runs, HW, side)
    assert sentence.startswith("a layer took 1.300 times as long with every rank running it at once")
    assert sentence.endswith("it stands: a lower analytical median, no higher analytical largest and no higher "
                             "profiled median") is truth
    assert tm.layer_contention_rule(runs, HW, {"conditions": {"contention": {"memory": 1.0}}}) is None
    assert tm.layer_contention_rule_sentence(runs, HW, None) == ("this calibration did not time a layer with every "
                                                                 "rank at once")


@pytest.mark.parametrize("truth", [True, False])
def test_a_runs_own_all_reduce_probe_stands_where_it_prices_the_runs_exposed_communication(truth):
    """A DDP run whose exposed communication and iteration are what the model gives with the all-reduce's fit through
    the run's own probe (ten times the calibration's time of its message), or through the calibration's alone: the
    probe stands only in the first; without a run that took it there is no rule to judge."""
    from distperf.analysis import rows as rows_mod
    from distperf.measure import speed

    hw = replace(HW, kernels=replace(HW.kernels, overlap=0.0),  # nothing hides the all-reduce
                 collectives=(("all-reduce", 1e-4, 1e8),), collectives_on=(HW.intra_latency, HW.intra_bandwidth))
    probe = {"speed_probe.gemm_s": 1e-4, "speed_probe.elementwise_s": 1e-5, "speed_probe.python_s": 1e-6,
             "speed_probe.allreduce_s": 10 * (2e-4 + 2**20 / 1e8), "speed_probe.allreduce_bytes": 2**20,
             "speed_probe.allreduce_ranks": 2}
    true = speed.at_allreduce(hw, speed.of_row(pd.Series(probe))) if truth else hw
    assert (true is not hw) is truth
    dp = {**row("medium", 1.0, 1.0, hw=true, dp=2), **probe}
    exposed = predict(rows_mod.config_of_row(pd.Series(dp)), true)["time_s"]["communication_exposed"]
    runs = {"regimes": pd.DataFrame([{**dp, "communication.exposed_s.data_parallel": exposed}])}
    found = tm.allreduce_probe_rule(runs, hw)
    assert found["stands"] is truth and found["probed"] == 1 and found["with"]["runs"] == 1
    assert found["with" if truth else "without"]["exposed"] == pytest.approx(0.0, abs=1e-9)
    assert found["without" if truth else "with"]["exposed"] > 0.5
    sentence = tm.allreduce_probe_rule_sentence(runs, hw)
    assert sentence.startswith("each data-parallel run's all-reduce priced through its own probe (1 runs took it)")
    assert sentence.endswith("stands: a lower exposed median and neither mode's median higher") is truth
    assert not rows_mod.RUN_ALLREDUCE  # the rule leaves the model as it found it
    bare = {"regimes": pd.DataFrame([row("medium", 1.0, 1.0, hw=hw, dp=2)])}
    assert tm.allreduce_probe_rule_sentence(bare, hw) == "no run of this build took the all-reduce probe"


def test_the_all_reduce_fit_through_a_probe_times_the_probed_message_as_the_probe_did():
    from distperf.cost.collectives import collective_time
    from distperf.measure import speed

    hw = replace(HW, collectives=(("all-gather", 3e-4, 2e9), ("all-reduce", 1e-4, 1e9)))
    run = {"allreduce_s": 5e-3, "allreduce_bytes": 2**22, "allreduce_ranks": 2}
    priced = speed.at_allreduce(hw, run)
    (kind, alpha, beta), = [c for c in priced.collectives if c[0] == "all-reduce"]
    assert alpha == 1e-4 and collective_time("all-reduce", 2**22, 2, alpha, beta) == pytest.approx(5e-3)
    assert ("all-gather", 3e-4, 2e9) in priced.collectives  # the other kinds keep the calibration's fit
    for useless in (None, {}, {**run, "allreduce_s": 1e-4}, {**run, "allreduce_ranks": 1}):
        assert speed.at_allreduce(hw, useless) is hw  # no probe, or one not above the fit's latency
    assert speed.at_allreduce(HW, run) is HW  # no fit to move


def test_the_receive_stall_adds_to_each_received_message_of_a_pipeline_only():
    stall = 1e-3
    stalled = replace(HW, kernels=replace(HW.kernels, p2p_stall_s=stall))
    for layout, grows in ((Layout(pp=2, schedule="gpipe", microbatches=4), True), (Layout(dp=2), False)):
        cfg = validate(Config(model=presets.model("small"), layout=layout))
        before, after = (predict(cfg, hw)["time_s"] for hw in (HW, stalled))
        if grows:  # the bottleneck rank's one receive per microbatch, and the drain's
            assert after["iteration"] - before["iteration"] == pytest.approx(5 * stall, rel=1e-6)
        else:
            assert after == before
    assert "p2p_stall_s" not in stalled.kernels.to_dict()
    assert stalled.kernels.without("contention").p2p_stall_s == 0.0


def _alternating(microbatches: int, late: float, early: float) -> list[dict]:
    """Three repeats of a two-rank data-parallel `small` run (``microbatches`` per rank) whose two breakdown steps,
    each as long as its timed iteration, end on different ranks: the late rank communicates ``late`` times the m = 1
    run's iteration, the early one ``early`` times it; on the whole, both ranks communicate their mean."""
    base = row("small", 1.0, dp=2, microbatches=microbatches)
    unit, window = row("small", 1.0, dp=2, microbatches=1)["iteration_time_s.median"], base["iteration_time_s.median"]
    late, early = late * unit, early * unit
    mean = (late + early) / 2
    return [{**base, "repeat": i, "measured_steps.breakdown_waits": True, "time_breakdown_s.window": window,
             "time_breakdown_s.communication": mean, "time_breakdown_s.per_rank.communication": json.dumps([mean] * 2),
             "time_breakdown_s.per_rank.window": json.dumps([window] * 2),
             "time_breakdown_s.per_step.communication": json.dumps([[late, early], [early, late]]),
             "time_breakdown_s.per_step.window": json.dumps([[window] * 2] * 2),
             "memory_bytes.per_rank.pipeline_rank": "[0, 0]"} for i in range(3)]


@pytest.mark.parametrize("nearer", [True, False])
def test_the_rank_that_ends_the_iteration_is_found_step_by_step_and_judged_by_its_rule(nearer):
    # m = 1: the late rank communicates 0.2 of the iteration, the early one 0.6; m = 4: the late one the same seconds
    # (the same collective: the step-by-step reading lies nearer) or both 0.4 (it does not: 2 times the m = 1 run's
    # step-by-step reading, against 1 time read once per run)
    more = _alternating(4, 0.2, 0.9) if nearer else _alternating(4, 0.4, 0.4)
    tables_ = {"pp_vs_dp": pd.DataFrame(_alternating(1, 0.2, 0.6) + more)}
    unit = tables_["pp_vs_dp"].groupby("config.layout.microbatches")["iteration_time_s.median"].first()[1]
    found = tm.exposed_errors(tables_, HW).set_index("microbatches")
    assert found.measured_s[1] == pytest.approx(0.2 * unit) == pytest.approx(found.ending_s[1])
    assert found.ending_run_s[1] == pytest.approx(0.4 * unit)  # found once: both ranks' mean
    assert found.error_ending_run[1] == pytest.approx(found.predicted_s[1] / (0.4 * unit) - 1)
    once = tm.exposed_errors(tables_, HW, step_ending=False).set_index("microbatches")
    assert once.measured_s[1] == pytest.approx(0.4 * unit)
    rule = tm.step_ending_rule(tables_, tm.exposed_errors(tables_, HW))
    assert rule["configurations"] == 2 and rule["pairs"] == 1 and rule["stands"] == nearer
    assert rule["changed"] == pytest.approx(0.5 if nearer else 0.25)  # a tie goes to the later rank, every step
    assert rule["step"]["ratio"] == pytest.approx(1.0 if nearer else 2.0)
    assert rule["run"]["ratio"] == pytest.approx(0.55 / 0.4 if nearer else 1.0)
    sentence = tm.step_ending_rule_sentence(tables_, tm.exposed_errors(tables_, HW))
    assert ("step by step stands" if nearer else "step by step does not stand") in sentence
    older = {name: t.drop(columns=[c for c in t if ".per_step." in c]) for name, t in tables_.items()}
    assert tm.step_ending_rule(older, tm.exposed_errors(older, HW)) is None
    assert tm.exposed_errors(older, HW).set_index("microbatches").measured_s[1] == pytest.approx(0.4 * unit)


def test_the_step_ending_rule_pairs_configurations_the_goal_does_not_judge():
    # at m = 4 the late rank communicates 0.1 of the m = 1 run's iteration, under 5 % of its own: the goal leaves
    # that configuration out, the rule still pairs it (and finds it farther: 0.5 times, against 1.6 once per run)
    tables_ = {"pp_vs_dp": pd.DataFrame(_alternating(1, 0.2, 0.6) + _alternating(4, 0.1, 1.2))}
    exposed = tm.exposed_errors(tables_, HW)
    assert exposed.microbatches.tolist() == [1]
    assert 4 in tm.exposed_errors(tables_, HW, step_ending=False).microbatches.tolist()
    rule = tm.step_ending_rule(tables_, exposed)
    assert rule["pairs"] == 1 and rule["configurations"] == 1 and not rule["stands"]
    assert rule["step"]["ratio"] == pytest.approx(0.5) and rule["run"]["ratio"] == pytest.approx(0.65 / 0.4)
