"""The tensor-parallelism chapter's analysis (distperf.analysis.tensor_parallel), on small synthetic tables."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets  # noqa: E402
from distperf.analysis import tensor_parallel as tpa  # noqa: E402
from distperf.config import Config, Layout, validate  # noqa: E402
from distperf.hardware import PRESETS  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

TP = rule("tensor_parallel")


def trained(tp=1, sp=False, b=2, status="ok"):
    """A row of the sweep table as the runner writes it (booleans come back from the CSV as text)."""
    cfg = validate(Config(model=presets.model("tiny"), layout=Layout(tp=tp, sequence_parallel=sp, micro_batch=b)))
    row = {"status": status, "iteration_time_s.median": 0.01, **flatten({"config": cfg.to_dict()})}
    row["config.layout.sequence_parallel"] = str(sp).lower()
    return row


def timed(layout, b, measured, predicted, profiled=float("nan"), sent=None, calls=None, layers=2):
    """A run after the predictions: its layout, microbatch, times and (over two ranks) tensor-parallel bytes."""
    t = 1 if layout == tpa.ONE_RANK else 2
    return {"layout": layout, "label": f"{layout}, b = {b}", "b": b, "t": t, "measured_s": measured,
            "predicted_s": predicted, "profiled_s": profiled, "config.model.layers": layers, tpa.SENT: sent,
            "predicted_tp_bytes_layer": 1000.0 if t > 1 else 0.0, "communication.calls.tensor_parallel": calls}


def runs(profiled=float("nan")):
    """One rank, tp 2 and tp 2 + SP at b = 1 and 2: tp 2 is faster at b = 2 only (measured), at both (predicted)."""
    return pd.DataFrame([
        timed(tpa.ONE_RANK, 1, 0.010, 0.010, profiled), timed(tpa.TP2, 1, 0.012, 0.008, profiled, 2400, 30),
        timed(tpa.TP2_SP, 1, 0.013, 0.008, profiled, 2600, 40),
        timed(tpa.ONE_RANK, 2, 0.020, 0.020, profiled), timed(tpa.TP2, 2, 0.016, 0.012, profiled, 4000, 30),
        timed(tpa.TP2_SP, 2, 0.020, 0.012, profiled, 4200, 40)])


def memory_table(state_error=0.0, activation_error=0.0):
    """Memory per category of the three layouts at b = 1 and 2 (tp 2 keeps 60 % of the states, SP less
    activations)."""
    rows = []
    for b in (1, 2):
        for layout, states, activations in ((tpa.ONE_RANK, 100, 40), (tpa.TP2, 60, 30), (tpa.TP2_SP, 60, 20)):
            for category in ("parameters", "gradients", "optimizer states"):
                rows.append(dict(label=f"{layout}, b = {b}", layout=layout, b=b, category=category, measured=states,
                                 predicted=states * (1 + state_error), error=state_error))
            rows.append(dict(label=f"{layout}, b = {b}", layout=layout, b=b, category="activations",
                             measured=activations * b, predicted=activations * b * (1 + activation_error),
                             error=activation_error))
    return pd.DataFrame(rows)


def test_layouts_name_and_sort_the_runs():
    tp = tpa.layouts(pd.DataFrame([trained(2, True, 2), trained(1, False, 2), trained(2, False, 1),
                                   trained(2, False, 2), trained(1, status="failed")]))
    assert tp.label.tolist() == ["tp 2, b = 1", "1 rank, b = 2", "tp 2, b = 2", "tp 2 + SP, b = 2"]
    assert tp.sp.tolist() == [False, False, False, True] and tp.t.tolist() == [2, 1, 2, 2]


def test_predictions_count_the_tensor_parallel_bytes_per_layer():
    tp = tpa.with_predictions(tpa.layouts(pd.DataFrame([trained(1), trained(2), trained(2, True)])),
                              PRESETS["V100-16GB"])
    one, plain, sequence = tp.itertuples()
    assert one.predicted_tp_bytes_layer == 0
    assert plain.predicted_tp_bytes_layer == plain.prediction["communication_bytes"]["tensor_parallel"] / 2 > 0
    assert sequence.predicted_tp_bytes_layer == pytest.approx(plain.predicted_tp_bytes_layer)  # the same volume
    run = pd.Series({"config.model.name": "tiny", "config.model.layers": 2, "config.model.hidden": 32,
                     "config.model.seq": 16})
    assert tpa.model_line(run) == "tiny (L = 2, h = 32, s = 16)"


def test_memory_shares_against_one_rank():
    assert tpa.state_share(memory_table()) == pytest.approx(0.6)
    assert tpa.activation_sentence(memory_table(), peak=True) == (
        "Measured activations per rank: tensor parallelism keeps 75% of one rank's, sequence parallelism 50%.")
    assert tpa.activation_sentence(memory_table(), peak=False).startswith("Activations were not measured")


def test_speed_ups_measured_and_predicted():
    tp = runs()
    speed, predicted = tpa.speeds(tp), tpa.speeds(tp, "predicted_s")
    assert tpa.speedups(speed) == "b = 1: 0.83×, b = 2: 1.25×"
    assert tpa.predicted_speedups(predicted) == "1.25×, 1.67×"
    assert tpa.sequence_parallel_time(speed).startswith("Sequence parallelism took 1.08×, 1.25× the time of plain "
                                                        "tensor parallelism (b = 1, 2);")
    assert tpa.sequence_parallel_time(tpa.speeds(tp[tp.layout != tpa.TP2_SP])) == ""


def test_the_communication_sentence():
    text = tpa.communication_sentence(runs(), comm=True)
    assert text.startswith("the measured tensor-parallel bytes per layer differ from the framework's by -52% to -17%.")
    assert "30 collective calls with tp 2, 40 collective calls with tp 2 + SP, against the framework's 8" in text
    assert tpa.communication_sentence(runs(), comm=False).startswith("communication bytes were not measured")


def legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_time_and_communication_figure():
    tp = runs()
    colours = tpa.layout_colours(tp)
    assert list(colours) == [tpa.ONE_RANK, tpa.TP2, tpa.TP2_SP] and len(set(colours.values())) == 3
    fig, (times, comm) = plt.subplots(1, 2)
    tpa.draw_times(times, tp, colours)
    tpa.draw_layer_bytes(comm, tp, True, colours)
    assert len(legend(times)) == 6 and legend(comm) == ["tp 2, measured", "tp 2, predicted", "tp 2 + SP, measured",
                                                        "tp 2 + SP, predicted"]
    fig2, (times2, comm2) = plt.subplots(1, 2)
    tpa.draw_times(times2, runs(profiled=0.011), colours)
    tpa.draw_layer_bytes(comm2, tp, False, colours)
    assert "1 rank, profiled" in legend(times2) and legend(comm2) == ["tp 2, predicted", "tp 2 + SP, predicted"]
    plt.close(fig)
    plt.close(fig2)


def test_the_error_rows_and_the_profiled_sentence():
    memory = memory_table().head(1)
    table = tpa.error_rows(memory, runs(profiled=0.009).head(2), comm=True)
    assert [r["quantity"] for r in table] == ["memory: parameters", "iteration time", "iteration time (profiled)",
                                              "iteration time", "iteration time (profiled)", "TP bytes sent per layer"]
    assert table[-1]["measured"] == 1.2 and table[-1]["predicted"] == 1.0 and table[-1]["unit"] == "kB"
    assert "TP bytes sent per layer" not in [r["quantity"] for r in tpa.error_rows(memory, runs(), comm=False)]
    errors = pd.DataFrame({"quantity": ["iteration time (profiled)"] * 2, "error": [-0.1, 0.3]})
    assert tpa.profiled_errors(errors).endswith("the error ranges from -10% to +30%.")
    assert tpa.profiled_errors(errors.assign(quantity="iteration time")) == ""


def statistics(state_error=0.0, activation_error=0.0, bytes_error=0.0, peak=True, comm=True, predicted_slow=True):
    """The rule's statistics on chosen errors; ``predicted_slow``: the framework, like the measurement, has tp 2 slower at b = 1."""
    tp = runs()
    speed = tpa.speeds(tp)
    predicted = speed.copy() if predicted_slow else tpa.speeds(tp, "predicted_s")
    table = pd.DataFrame({"quantity": ["TP bytes sent per layer"], "error": [bytes_error]})
    return tpa.statistics(memory_table(state_error, activation_error), table, speed, predicted, peak, comm)


def test_every_statistic_on_both_sides_of_its_threshold():
    assert TP.verdict(statistics()) == "reproduced"
    assert not TP.outcome(statistics(state_error=0.11))["states_error"]
    assert TP.outcome(statistics(state_error=-0.1))["states_error"]
    assert not TP.outcome(statistics(bytes_error=-0.2))["comm_error"]
    assert TP.outcome(statistics(activation_error=0.25))["activations_error"]
    assert not TP.outcome(statistics(activation_error=0.26))["activations_error"]
    assert not TP.outcome(statistics(predicted_slow=False))["faster_agree"]
    unmeasured = TP.outcome(statistics(peak=False, comm=False))
    assert unmeasured["comm_error"] is None and unmeasured["activations_error"] is None
    assert TP.verdict(statistics(activation_error=0.5, predicted_slow=False)) == "depends"
    assert TP.verdict(statistics(state_error=0.5, bytes_error=0.5, activation_error=0.5,
                                 predicted_slow=False)) == "not reproduced"


def test_the_finding():
    tp = runs()
    assert tpa.finding(0.6, tpa.speeds(tp), tpa.speeds(tp, "predicted_s")) == (
        "At tp = 2 a rank keeps 60% of the model states; tp 2 ran 1.25× one rank's speed at b = 2 (framework: 1.67×)")
