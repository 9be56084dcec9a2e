"""The memory anatomy chapter's analysis (distperf.analysis.memory_anatomy), on small synthetic tables."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf.analysis import memory_anatomy as anatomy  # noqa: E402
from distperf.cost import activations as act  # noqa: E402

MiB = 2**20


def measured(model="tiny", batch=2, seq=16, precision="fp32", recompute="none", **values):
    """One measured row as the experiment writes it (model states of a 1000-parameter model in fp32)."""
    row = dict(machine="cpu-2c", device_name="Some CPU", source="fresh", model=model, batch=batch, seq=seq,
               precision=precision, recompute=recompute, parameter_count=1000, parameters=4000, gradients=4000,
               optimizer_states=8000, activations=100.0)
    return {**row, **values}


def analysed(model="small", batch=2, seq=64, precision="fp32", recompute="none", err=0.0, act_err=0.1,
             noscores_err=0.0, activations=100.0, **values):
    """One row as :func:`anatomy.with_predictions` leaves it, with chosen errors."""
    row = measured(model, batch, seq, precision, recompute, activations=activations)
    row.update({f"err_{k}": err for k in anatomy.STATES}, err_states=err, err_activations=act_err,
               err_activations_no_scores=noscores_err, pred_activations=activations * (1 + act_err),
               pred_activations_no_scores=activations * (1 + noscores_err))
    row.update({f"pred_{k}": row[k] * (1 + err) for k in anatomy.STATES})
    return {**row, **values}


def grid():
    """The base (small, b = 2, s = 64, fp32, none) and each axis varied alone; the base is the most frequent."""
    return pd.DataFrame([
        analysed(act_err=0.08),
        analysed(batch=1, act_err=0.05), analysed(batch=4, act_err=0.07),
        analysed(seq=32, act_err=-0.12), analysed(seq=128, act_err=0.09),
        analysed(model="tiny", seq=16, act_err=0.03),
        analysed(precision="mixed", err=-0.5, activations=95.0),
        analysed(recompute="selective", act_err=-0.01, activations=80.0),
        analysed(recompute="full", act_err=-0.4, activations=30.0),
    ])


def test_predicted_categories_are_the_cost_models_without_the_working_set():
    plain = anatomy.predicted_categories(pd.Series(measured()))
    a, s, b, layers = 4, 16, 2, 2  # the tiny preset: 2 layers, 4 heads
    assert plain.pred_parameters == 4 * 34176 and plain.pred_optimizer_states == 8 * 34176
    assert plain.pred_scores == layers * a * s * s * b * 4 and plain.pred_working == 0
    selective = anatomy.predicted_categories(pd.Series(measured(recompute="selective")))
    assert selective.pred_scores == 0
    assert selective.pred_working == act.recompute_working_bytes(s, b, 32, a, 1, False, False, 4, "selective")
    mixed = anatomy.predicted_categories(pd.Series(measured(precision="mixed")))
    assert mixed.pred_scores == plain.pred_scores / 2 and mixed.pred_parameters == 2 * 34176


def test_with_predictions_adds_signed_errors_and_the_sums_of_the_states():
    frame = pd.DataFrame([measured(parameters=4 * 34176, gradients=4 * 34176, optimizer_states=4 * 34176)])
    out = anatomy.with_predictions(frame)
    row = out.iloc[0]
    assert row.err_parameters == 0 and row.err_optimizer_states == 1.0
    assert row.states == 12 * 34176 and row.pred_states == 16 * 34176
    assert row.err_states == pytest.approx(16 / 12 - 1)
    assert row.pred_activations_no_scores == row.pred_activations - row.pred_scores
    assert row.err_activations == pytest.approx(row.pred_activations / 100 - 1)
    assert row.err_activations_no_scores == pytest.approx(row.pred_activations_no_scores / 100 - 1)


def test_the_base_and_its_axes():
    rows = grid()
    base = anatomy.base_of(rows)
    assert base == dict(model="small", batch=2, seq=64, precision="fp32", recompute="none")
    assert anatomy.base_description(base) == "model small, micro-batch 2, sequence 64, fp32, recomputation none"
    assert anatomy.axis("batch", rows).batch.tolist() == [1, 2, 4]
    assert anatomy.axis("seq", rows).seq.tolist() == [32, 64, 128]
    assert sorted(anatomy.axis("model", rows).model) == ["small", "tiny"]  # tiny at its own sequence, 16
    assert anatomy.axis("recompute", rows).recompute.tolist() == ["none", "selective", "full"]
    assert anatomy.axis("precision", rows).precision.tolist() == ["fp32", "mixed"]


def test_the_error_table_in_mib_and_percent():
    table = anatomy.error_table(pd.DataFrame([analysed(activations=2 * MiB, act_err=0.5, parameter_count=12345)]))
    assert list(table.columns[:7]) == ["machine", "model", "b", "s", "precision", "recompute", "Ψ"]
    row = table.iloc[0]
    assert row["act. measured (MiB)"] == 2 and row["act. predicted (MiB)"] == 3 and row["activations"] == 0.5
    html = anatomy.styled_error_table(table).to_html()
    assert "12,345" in html and "+50%" in html and "3.00" in html


def test_model_states_exact_or_not():
    exact = pd.DataFrame([analysed(), analysed(precision="mixed", err=-0.5)])
    assert anatomy.states_exact(exact) and anatomy.states_agreement(exact) == "exactly, to the byte"
    off = pd.DataFrame([analysed(), analysed(err=-0.02)])
    assert not anatomy.states_exact(off) and anatomy.states_agreement(off) == "to within 2.0%"


def test_mixed_precision_errors_are_medians_or_not_measured():
    assert anatomy.mixed_precision_errors(pd.DataFrame([analysed()])) == "not measured at this scale"
    rows = pd.DataFrame([analysed(precision="mixed", err=-0.5), analysed(precision="mixed", err=-0.3),
                         analysed(precision="mixed", err=0.1)])
    assert anatomy.mixed_precision_errors(rows) == ("parameters -30%, gradients -30%, optimizer states -30%, "
                                                    "all three -30%")


def test_the_numbers_the_activation_paragraph_quotes():
    rows = grid()
    plain = anatomy.fp32_without_recomputation(rows)
    assert set(plain.recompute) == {"none"} and set(plain.precision) == {"fp32"} and len(plain) == 6
    assert anatomy.worst_on_sequence_axis(rows) == "-12% at s = 32"
    assert anatomy.selective_saving(rows) == "20.0%"
    assert anatomy.full_recomputation_errors(rows) == "-40% to -40%"
    assert anatomy.mixed_activation_ratio(rows) == "0.95"


def test_the_activation_numbers_without_the_rows_they_need():
    rows = pd.DataFrame([analysed(), analysed(batch=4)])
    assert anatomy.selective_saving(rows) == "—"
    assert anatomy.full_recomputation_errors(rows) == "—"
    assert anatomy.mixed_activation_ratio(rows) == "—"
    no_reference = pd.DataFrame([analysed(), analysed(), analysed(precision="mixed", seq=32)])
    assert anatomy.mixed_activation_ratio(no_reference) == "—"


def test_within_tolerance_on_both_sides():
    assert anatomy.within_tolerance(pd.Series([0.1, -0.1, 0.0]))
    assert not anatomy.within_tolerance(pd.Series([0.05, -0.1001]))
    assert anatomy.within_tolerance(pd.Series([0.2]), tolerance=0.25)


@pytest.mark.parametrize("exact, activations_ok, without_scores_ok, expected", [
    (True, True, False, "reproduced"),
    (True, False, False, "depends"),
    (False, False, True, "depends"),
    (False, True, False, "not reproduced"),
    (False, False, False, "not reproduced"),
])
def test_the_verdict(exact, activations_ok, without_scores_ok, expected):
    assert anatomy.verdict(exact, activations_ok, without_scores_ok) == expected


def test_the_finding_names_the_worst_row_and_how_the_states_match():
    plain = anatomy.fp32_without_recomputation(grid())
    text = anatomy.finding(plain, True)
    assert text.startswith("One device's fp32 model states match the 16 bytes per parameter exactly;")
    assert "misses by up to -12% (small, s = 32)" in text and "by at most 0% without them." in text
    assert "match the 16 bytes per parameter closely;" in anatomy.finding(plain, False)


def test_the_reason_follows_each_outcome():
    assert anatomy.reason(True, True, True) == ("fp32 model states are exact; fp32 activations lie within ±10% of "
                                                "Korthikanti's count")
    assert anatomy.reason(False, False, True).endswith("do not all lie within ±10% of Korthikanti's count, and do "
                                                       "once the s×s scores are left out")
    assert anatomy.reason(True, False, False).endswith(", and do not once the s×s scores are left out")
    assert anatomy.reason(False, False, False).startswith("fp32 model states are not exact; ")


def test_the_activation_figure_draws_three_axes():
    fig = plt.figure()
    anatomy.draw_activations(fig, grid())
    batch, seq, recompute = fig.axes
    assert [t.get_text() for t in recompute.get_xticklabels()] == ["none", "selective", "full"]
    assert [t.get_text() for t in batch.get_xticklabels()] == ["1", "2", "4"]
    assert len(seq.lines) == 2 and seq.get_xscale() == "log"
    plt.close(fig)


def test_the_category_bars_show_each_model_size_and_precision():
    long = anatomy.category_sizes(grid())
    assert list(dict.fromkeys(long.category)) == ["parameters", "gradients", "optimizer states", "activations"]
    assert list(dict.fromkeys(long.label)) == ["small, s = 64, fp32", "tiny, s = 16, fp32", "small, s = 64, mixed"]
    states = long[long.category == "parameters"]
    assert states.measured.tolist() == [4000, 4000, 4000] and states.predicted.tolist() == [4000, 4000, 2000]
    fig = plt.figure()
    anatomy.draw_categories(fig, grid())
    assert len(fig.axes) == 4 and all(ax.get_yscale() == "log" for ax in fig.axes)
    assert math.isclose(fig.axes[0].patches[0].get_height(), 4000 / MiB)
    plt.close(fig)
