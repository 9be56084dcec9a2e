"""The memory anatomy chapter's analysis (distperf.analysis.memory_anatomy): on small synthetic tables, and the
cost model's count against measured steps of the tiny preset."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf.analysis import memory_anatomy as anatomy  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.runner.anatomy import measure_point  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

MEMORY = rule("memory_anatomy")

MiB = 2**20
PSI = 34176  # the tiny preset's parameters


def measured(model="tiny", batch=2, seq=16, precision="fp32", recompute="none", attention="sdpa", **values):
    """One measured row as the experiment writes it (model states of a 1000-parameter model in fp32)."""
    row = dict(machine="cpu-2c", device_name="Some CPU", source="fresh", model=model, batch=batch, seq=seq,
               precision=precision, recompute=recompute, attention=attention, parameter_count=1000,
               parameters=4000, gradients=4000, optimizer_states=8000, activations=100.0, total=20000,
               **{"at_start.parameters": 4000, "at_start.gradients": 4000, "at_start.optimizer_states": 8000},
               rss_peak_increase=8000)
    return {**row, **values}


def analysed(model="small", batch=2, seq=64, precision="fp32", recompute="none", attention="sdpa", err=0.0,
             act_err=0.0, paper_err=0.1, activations=100.0, **values):
    """One row as :func:`anatomy.with_predictions` leaves it, with chosen errors."""
    row = measured(model, batch, seq, precision, recompute, attention, activations=activations)
    row.update({f"err_{k}": err for k in anatomy.STATES}, err_states=err, err_activations=act_err,
               err_paper_activations=paper_err, pred_activations=activations * (1 + act_err),
               paper_activations=activations * (1 + paper_err), tensor_peak_increase=4000,
               allocator_peak_increase=8000, allocator_gap=4000, allocator_ratio=2.0)
    row.update({f"pred_{k}": row[k] * (1 + err) for k in anatomy.STATES})
    return {**row, **values}


def grid():
    """The base (small, b = 2, s = 64, fp32, none, sdpa) and each axis varied alone; the base is the most
    frequent."""
    return pd.DataFrame([
        analysed(paper_err=0.08),
        analysed(batch=1, paper_err=0.05), analysed(batch=4, paper_err=0.07),
        analysed(seq=32, act_err=-0.012, paper_err=0.03), analysed(seq=128, paper_err=0.2),
        analysed(model="tiny", seq=16, paper_err=0.02),
        analysed(precision="mixed", activations=95.0, paper_err=-0.3, pred_parameters=2000),
        analysed(recompute="selective", activations=80.0, paper_err=-0.01),
        analysed(recompute="full", activations=30.0, paper_err=-0.02),
        analysed(attention="math", activations=110.0, paper_err=-0.001, allocator_ratio=3.5),
    ])


def test_both_predictions_of_one_row():
    plain = anatomy.predicted_categories(pd.Series(measured()))
    assert plain.pred_parameters == 4 * PSI and plain.pred_optimizer_states == 8 * PSI and plain.pred_working == 0
    assert plain.paper_activations > plain.pred_activations  # the paper's count keeps the s×s scores
    mixed = anatomy.predicted_categories(pd.Series(measured(precision="mixed")))
    assert mixed.pred_parameters == 4 * PSI and mixed.paper_parameters == 2 * PSI  # autocast against ZeRO's 2 bytes
    assert mixed.paper_optimizer_states == 12 * PSI and mixed.pred_optimizer_states == 8 * PSI
    selective = anatomy.predicted_categories(pd.Series(measured(recompute="selective", attention="math")))
    assert selective.pred_working > 0
    no_attention = pd.Series({k: v for k, v in measured().items() if k != "attention"})
    assert anatomy.predicted_categories(no_attention).equals(plain)  # rows from before the axis ran sdpa


def test_with_predictions_adds_signed_errors_sums_and_the_allocators_gap():
    frame = pd.DataFrame([measured(parameters=4 * PSI, gradients=4 * PSI, optimizer_states=4 * PSI)])
    row = anatomy.with_predictions(frame).iloc[0]
    assert row.err_parameters == 0 and row.err_optimizer_states == 1.0
    assert row.states == 12 * PSI and row.pred_states == 16 * PSI and row.err_states == pytest.approx(16 / 12 - 1)
    assert row.err_activations == pytest.approx(row.pred_activations / 100 - 1)
    assert row.err_paper_activations == pytest.approx(row.paper_activations / 100 - 1)
    assert row.tensor_peak_increase == 20000 - 16000 and row.allocator_peak_increase == 8000
    assert row.allocator_gap == 4000 and row.allocator_ratio == 2.0
    cuda = anatomy.with_predictions(pd.DataFrame([measured(rss_peak_increase=None, cuda_max_allocated=26000)]))
    assert cuda.iloc[0].allocator_peak_increase == 10000
    old = anatomy.with_predictions(pd.DataFrame([{k: v for k, v in measured().items() if k != "attention"}]))
    assert old.iloc[0].attention == "sdpa"


@pytest.mark.parametrize("point", [
    dict(precision="fp32", recompute="none", attention="sdpa"),
    dict(precision="fp32", recompute="none", attention="math"),
    dict(precision="fp32", recompute="selective", attention="math"),
    dict(precision="fp32", recompute="full", attention="sdpa"),
    dict(precision="mixed", recompute="none", attention="sdpa"),
    dict(precision="mixed", recompute="selective", attention="math"),
])
def test_the_trainers_count_meets_a_measured_step(point):
    """The cost model against a measured step of the tiny preset, within the verdict's tolerances."""
    point = dict(model="tiny", batch=2, seq=16, **point)
    row = anatomy.with_predictions(pd.DataFrame([{**flatten(measure_point(point)), **point}]))
    assert MEMORY.verdict(anatomy.statistics(row)) == "reproduced"
    assert row.iloc[0].tensor_peak_increase > 0


def test_the_base_and_its_axes():
    rows = grid()
    base = anatomy.base_of(rows)
    assert base == dict(model="small", batch=2, seq=64, precision="fp32", recompute="none", attention="sdpa")
    assert anatomy.base_description(base) == ("model small, micro-batch 2, sequence 64, fp32, recomputation none, "
                                              "sdpa attention")
    assert anatomy.axis("batch", rows).batch.tolist() == [1, 2, 4]
    assert anatomy.axis("seq", rows).seq.tolist() == [32, 64, 128]
    assert sorted(anatomy.axis("model", rows).model) == ["small", "tiny"]  # tiny at its own sequence, 16
    assert anatomy.axis("recompute", rows).recompute.tolist() == ["none", "selective", "full"]
    assert anatomy.axis("precision", rows).precision.tolist() == ["fp32", "mixed"]


def test_the_error_table_in_mib_and_percent():
    table = anatomy.error_table(pd.DataFrame([analysed(activations=2 * MiB, act_err=0.5, parameter_count=12345)]))
    assert list(table.columns[:8]) == ["machine", "model", "b", "s", "precision", "recompute", "attention", "Ψ"]
    row = table.iloc[0]
    assert row["act. measured (MiB)"] == 2 and row["act. predicted (MiB)"] == 3 and row["activations"] == 0.5
    html = anatomy.styled_error_table(table).to_html()
    assert "12,345" in html and "+50.0%" in html and "3.00" in html and "+10.0%" in html


def test_the_allocator_table_in_mib():
    table = anatomy.allocator_table(pd.DataFrame([analysed(tensor_peak_increase=MiB, allocator_peak_increase=3 * MiB,
                                                           allocator_gap=2 * MiB, allocator_ratio=3.0)]))
    row = table.iloc[0]
    assert row["tensors (MiB)"] == 1 and row["allocator (MiB)"] == 3 and row["allocator − tensors (MiB)"] == 2
    assert "3.00" in anatomy.styled_allocator_table(table).to_html()
    assert anatomy.allocator_gap_range(grid()) == "2.00× to 3.50×"
    assert anatomy.allocator_gap_range(pd.DataFrame([analysed(allocator_ratio=None)])) == "not measured"


def test_tolerances_on_both_sides_and_the_worst_row():
    rows = grid()
    assert MEMORY.verdict(anatomy.statistics(rows)) == "reproduced"
    assert MEMORY.verdict(anatomy.statistics(rows), {"activations_error": 0.01}) == "depends"
    assert MEMORY.outcome(anatomy.statistics(pd.DataFrame([analysed(err=-0.006)])))["states_error"] is False
    assert MEMORY.outcome(anatomy.statistics(pd.DataFrame([analysed(err=0.005)])))["states_error"] is True
    assert anatomy.worst(rows, "err_activations") == "-1.20% (small, b = 2, s = 32, fp32, none, sdpa)"


def test_the_numbers_the_activation_paragraph_quotes():
    rows = grid()
    assert anatomy.paper_count_errors(rows, "sdpa") == "+2.0% to +20.0%"
    assert anatomy.paper_count_errors(rows, "math") == "-0.1% to -0.1%"
    assert anatomy.selective_saving(rows) == "20.0%"
    assert anatomy.mixed_activation_ratio(rows) == "0.95"


def test_the_activation_numbers_without_the_rows_they_need():
    rows = pd.DataFrame([analysed(), analysed(batch=4)])
    assert anatomy.selective_saving(rows) == "—" and anatomy.selective_saving(rows, "math") == "—"
    assert anatomy.paper_count_errors(rows, "math") == "—"
    assert anatomy.mixed_activation_ratio(rows) == "—"
    no_reference = pd.DataFrame([analysed(), analysed(), analysed(precision="mixed", seq=32)])
    assert anatomy.mixed_activation_ratio(no_reference) == "—"


def test_the_rules_statistics_are_the_largest_errors():
    rows = grid()
    stats = anatomy.statistics(rows)
    assert stats["activations_error"] == pytest.approx(0.012)
    assert stats["states_error"] == 0.0


def test_the_finding_quotes_the_data():
    rows = grid()
    assert anatomy.finding(rows) == ("Korthikanti's published count, on the fp32 rows without recomputation, misses "
                                     "the unfused (`math`) attention by -0.1% to -0.1% and the fused (`sdpa`) "
                                     "attention the trainers use by default by +2.0% to +20.0%.")


def test_the_activation_figure_draws_four_axes():
    fig = plt.figure()
    anatomy.draw_activations(fig, grid())
    batch, seq, recompute, attention = fig.axes
    assert [t.get_text() for t in recompute.get_xticklabels()] == ["none", "selective", "full"]
    assert [t.get_text() for t in attention.get_xticklabels()] == ["sdpa", "math"]
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
