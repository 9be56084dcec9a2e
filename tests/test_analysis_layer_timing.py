"""The layer-timing chapter's analysis (distperf.analysis.layer_timing), on small synthetic tables."""
import pandas as pd
import pytest

from distperf.analysis import layer_timing as analysis
from distperf.cost import flops


def _gemm():
    return pd.DataFrame({"machine": ["cpu", "cpu", "gpu"], "rate_flops": [1e9, 4e9, 1e12]})


def _layers(times=(0.012, 0.2, 2e-5)):
    """Three layers, two measured on this build's cpu, one from a reference gpu."""
    return pd.DataFrame({"machine": ["cpu", "cpu", "gpu"], "source": ["fresh", "fresh", "reference"],
                         "device_name": ["CPU", "CPU", "GPU"], "hidden": [32, 64, 64], "seq": [16, 32, 32],
                         "batch": [1, 2, 2], "ffn": [128, 256, 256], "time_s": list(times)})


def test_peak_rates_are_each_machines_fastest_product():
    assert analysis.peak_rates(_gemm()).to_dict() == {"cpu": 4e9, "gpu": 1e12}
    assert analysis.peak_rates(_gemm()).name == "peak_flops"


def test_the_prediction_is_three_forward_passes_over_the_rate():
    layers = analysis.with_prediction(_layers(), _gemm())
    first = 3 * flops.layer_forward_flops(1, 16, 32, 128)
    assert layers.flops[0] == first and layers.peak_flops.tolist() == [4e9, 4e9, 1e12]
    assert layers.predicted_s[0] == first / 4e9
    assert layers.error[0] == pytest.approx((first / 4e9 - 0.012) / 0.012)
    assert layers.achieved_flops[0] == first / 0.012
    assert layers.fraction_of_peak[0] == pytest.approx(first / 0.012 / 4e9)
    assert layers.series.tolist() == ["cpu, s = 16", "cpu, s = 32", "gpu, s = 32"]
    assert analysis.fresh_row(layers).peak_flops == 4e9


def test_the_error_table_shows_milliseconds_and_gigaflops():
    layers = analysis.with_prediction(_layers(), _gemm())
    table = analysis.error_table(layers)
    assert list(table.columns) == ["machine", "hidden", "seq", "batch", "GFLOP", "measured (ms)", "predicted (ms)",
                                   "signed error", "achieved GFLOP/s"]
    assert table["measured (ms)"][0] == 12.0 and table["GFLOP"][0] == layers.flops[0] / 1e9
    assert table["achieved GFLOP/s"][1] == layers.achieved_flops[1] / 1e9
    assert set(analysis.TABLE_FORMAT) <= set(table.columns)
    assert layers.time_s[0] == 0.012  # the layers themselves are left in seconds


def test_extremes_under_prediction_and_their_words():
    layers = pd.DataFrame({"machine": "cpu", "error": [-0.5, 0.1, -0.05, 0.3], "hidden": [32, 64, 128, 256],
                           "seq": [16, 16, 32, 32]})
    worst, best = analysis.extremes(layers)
    assert (worst.hidden, best.hidden) == (32, 128)
    assert analysis.error_text(worst) == "-50% (h = 32, s = 16)"
    assert analysis.under_predicted(layers) == 2
    assert analysis.under_predicted(layers.assign(error=[0.0, 0.1, 0.2, 0.3])) == 0
    assert analysis.finding(best, worst, 2, 4) == ("FLOPs over the peak matrix rate predict a layer's time with "
                                                   "signed errors from -5% to -50%, under-predicting in 2 of 4 sizes.")


def test_the_trend_of_the_achieved_fraction_on_both_sides_of_the_threshold():
    growing = pd.DataFrame({"flops": [1, 2, 3, 4], "fraction_of_peak": [0.1, 0.2, 0.3, 0.4]})
    assert analysis.peak_fraction_trend(growing) == pytest.approx(1.0)
    assert analysis.trend_sentence(analysis.peak_fraction_trend(growing)) == "grows with the layer's size"
    mixed = growing.assign(fraction_of_peak=[0.2, 0.1, 0.4, 0.3])
    assert analysis.peak_fraction_trend(mixed) == pytest.approx(0.6)
    shuffled = growing.assign(fraction_of_peak=[0.3, 0.1, 0.4, 0.2])
    assert analysis.trend_sentence(analysis.peak_fraction_trend(shuffled)) == ("does not grow steadily with the "
                                                                               "layer's size")
    assert analysis.trend_sentence(analysis.TREND_RHO) == "does not grow steadily with the layer's size"
    assert analysis.trend_sentence(0.51) == "grows with the layer's size"
