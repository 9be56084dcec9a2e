"""Where the time goes (distperf.analysis.time_breakdown), on small synthetic sweep tables."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf.analysis import time_breakdown as tb  # noqa: E402
from distperf.measure.breakdown import CLASSES  # noqa: E402

SPLIT = dict(matrix_products=0.5, attention=0.1, other_operators=0.1, optimizer=0.1, communication=0.1,
             framework=0.1)


def run(hash_, median=0.1, window=0.1, dp=1, pp=1, split=SPLIT, predicted=(0.05, 0.01, 0.0), repeat=0, **extra):
    row = {"experiment": "x", "config_hash": hash_, "repeat": repeat, "status": "ok", "source": "fresh",
           "config.model.name": "small", "config.layout.dp": dp, "config.layout.pp": pp, "config.layout.tp": 1,
           "config.layout.zero": 0, "config.layout.schedule": "1f1b" if pp > 1 else "none",
           "iteration_time_s.median": median, "iteration_time_s.p10": median, "iteration_time_s.p90": median,
           PREFIX_WINDOW: window if repeat == 0 else None,
           **{tb.PREFIX + c: (split[c] * window if repeat == 0 else None) for c in CLASSES},
           "prediction.time_s.compute": predicted[0], "prediction.time_s.communication_exposed": predicted[1],
           "prediction.time_s.bubble": predicted[2], "prediction.time_s.iteration": sum(predicted)}
    return {**row, **extra}


PREFIX_WINDOW = tb.PREFIX + "window"


def tables():
    dp = pd.DataFrame([run("a", dp=2), run("a", dp=2, repeat=1, median=0.3), run("a", dp=2, repeat=2, median=0.1),
                       run("b", dp=2, window=0.2, median=0.2, predicted=(0.1, 0.02, 0.0)),
                       run("c", dp=2, status="failed")])
    pipe = pd.DataFrame([run("p", pp=2, split={**SPLIT, "matrix_products": 0.2, "framework": 0.4},
                             predicted=(0.04, 0.0, 0.02))])
    old = pd.DataFrame([{k: v for k, v in run("z").items() if not k.startswith(tb.PREFIX)}])  # before breakdowns
    return {"dp_zero": dp, "pipeline_schedules": pipe, "planner": old, "tensor_parallel": None}


def test_one_row_per_configuration_with_fractions():
    per = tb.per_configuration(tables())
    assert sorted(per.strategy) == ["data parallel", "data parallel", "pipeline (1f1b)"]
    a = per[(per.strategy == "data parallel") & (per.window_s == 0.1)].iloc[0]
    assert a.median_s == pytest.approx(0.1)  # the median over the three repeats
    assert a.matrix_products == pytest.approx(0.5) and sum(a[c] for c in CLASSES) == pytest.approx(1.0)
    assert a.pred_compute == pytest.approx(0.5) and a.pred_total == pytest.approx(0.6)
    assert len(tb.per_configuration({"planner": tables()["planner"]})) == 0


def test_by_strategy_and_the_sentences():
    per = tb.per_configuration(tables())
    table = tb.by_strategy(per)
    assert table.strategy.tolist() == ["data parallel", "pipeline (1f1b)"]  # by the share of matrix products
    assert table.configurations.tolist() == [2, 1] and table["iteration (ms)"].tolist() == pytest.approx([150, 100])
    assert tb.largest_share(table) == ("matrix products in 1 of 2 strategies; framework and Python in 1 of 2 "
                                       "strategies")
    assert tb.compute_coverage(per) == "a median 62% (from 62% to 80%)"  # 0.5 / 0.8 twice, 0.4 / 0.5 once
    assert tb.framework_range(per) == "10% to 40%"
    assert tb.fidelity(per) == "1.00× (from 1.00× to 1.00×)"
    html = tb.styled(table).to_html()
    assert "framework and Python" in html and "50%" in html
    empty = tb.per_configuration({})
    assert tb.largest_share(tb.by_strategy(empty)) == "no strategy was measured"
    assert tb.compute_coverage(empty) == tb.framework_range(empty) == tb.fidelity(empty) == "not measured"


def test_provenance_rows_of_every_table():
    frames = {"a": pd.DataFrame([{"machine": "m", "date": "d", "commit": "c", "source": "fresh", "x": 1}]),
              "b": None, "c": pd.DataFrame([{"machine": "n", "date": "e", "commit": "c", "source": "reference"}])}
    prov = tb.provenance_rows(frames)
    assert prov.machine.tolist() == ["m", "n"] and "x" not in prov


def test_the_figure_draws_both_bars_per_strategy():
    table = tb.by_strategy(tb.per_configuration(tables()))
    fig, ax = plt.subplots()
    tb.draw(ax, table)
    assert len(ax.patches) == 2 * (len(CLASSES) + len(tb.PREDICTED))
    assert [t.get_text() for t in ax.get_yticklabels()] == table.strategy.tolist()
    plt.close(fig)


def test_shortfalls_name_the_class_the_prediction_misses_most_and_follow_the_data():
    def table(measured: dict, predicted: dict):
        row = {"strategy": "ZeRO-3", **{c: measured.get(c, 0.0) for c in CLASSES},
               **{f"pred_{c}": predicted.get(c, 0.0) for c in tb.PREDICTED_CLASSES}}
        return pd.DataFrame([row])

    comm = table({"communication": 0.5, "matrix_products": 0.5}, {"communication": 0.2, "matrix_products": 0.5})
    assert tb.shortfalls(comm, ["ZeRO-3"]) == ("ZeRO-3: communication (measured 50% of the step, predicted 20%)")
    mm = table({"communication": 0.5, "matrix_products": 0.5}, {"communication": 0.5, "matrix_products": 0.1})
    assert tb.shortfalls(mm, ["ZeRO-3"]).startswith("ZeRO-3: matrix products (measured 50%")
    bubble = table({"communication": 0.5, "matrix_products": 0.5},
                   {"communication": 0.1, "bubble": 0.4, "matrix_products": 0.3})  # a pipeline's waits
    assert tb.shortfalls(bubble, ["ZeRO-3"]).startswith("ZeRO-3: matrix products")
    assert tb.shortfalls(comm, ["DDP"]) == "no such strategy was measured"
    assert tb.shortfalls(comm.drop(columns=[f"pred_{c}" for c in tb.PREDICTED_CLASSES]), ["ZeRO-3"]) == \
        "not measured in classes"
