"""The calibration chapter's analysis (distperf.analysis.calibration), on small synthetic tables."""
from dataclasses import replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np
import pandas as pd
import pytest

from distperf.analysis import calibration as analysis
from distperf.analysis.verdicts import rule
from distperf.cost import flops
from distperf.hardware import PRESETS

HW = replace(PRESETS["V100-16GB"], flops_fp32=100e9, flops_16bit=400e9)
PROVENANCE = dict(device_name="CPU", commit="abc1234", date="2026-01-02T03:04:05Z", scale="smoke")


@pytest.fixture(autouse=True)
def close_figures():
    """Close the figures a test draws."""
    yield
    plt.close("all")


def _gemm(quick=False):
    return pd.DataFrame({"machine": ["cpu", "cpu", "cpu", "gpu", "gpu"], "source": ["fresh"] * 3 + ["reference"] * 2,
                         "dtype": ["float32", "float32", "bfloat16", "float32", "float32"],
                         "n": [64, 128, 128, 64, 128],
                         "flops_per_s": [50e9, 90e9, 300e9, 5e12, 9e12], "quick": [quick] * 5, **PROVENANCE})


def test_each_machine_is_predicted_with_its_own_rate():
    peak32 = analysis.fp32_rates(_gemm(), HW)
    assert peak32.to_dict() == {"cpu": 100e9, "gpu": 9e12}  # this build's profile, the reference's fastest fp32
    assert analysis.fresh_machine(_gemm()) == "cpu"


def test_the_provenance_says_when_the_calibration_was_quick():
    assert analysis.provenance(_gemm(quick=True)).endswith(" (quick calibration)")
    assert not analysis.provenance(_gemm()).endswith(" (quick calibration)")
    assert analysis.provenance(_gemm()).startswith("CPU (cpu, this build), 2026-01-02")


def test_the_gemm_figure_marks_the_profile_rates():
    (ax,) = analysis.draw_gemm(_gemm(), HW).axes
    assert [t.get_text() for t in ax.texts] == ["profile R (fp32)", "profile R (bf16)"]
    assert {line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == "--"} >= {100.0, 400.0}


def _coll():
    """All-reduce on 2 ranks (α = 10 µs, β = 1 GB/s) at two sizes, and a send, on this build's machine."""
    return pd.DataFrame({"collective": ["all-reduce", "all-reduce", "send"], "ranks": [2, 2, 2],
                         "bytes": [1000, 1_000_000, 1000], "seconds": [25e-6, 1.5e-3, 11e-6],
                         "alpha": [10e-6, 10e-6, 1e-6], "beta": [1e9, 1e9, 1e8], "machine": "cpu", "source": "fresh"})


def test_the_ring_fit_beside_each_collective():
    coll = analysis.with_ring_fit(_coll())
    # all-reduce on n = 2: k = 2(n-1) = 2 steps, c·M = 2(n-1)/n·M = M; a send: 1 step, M
    assert coll.steps.tolist() == [2, 2, 1] and coll.volume.tolist() == [1000, 1_000_000, 1000]
    assert coll.predicted_s[0] == pytest.approx(2 * 10e-6 + 1000 / 1e9)
    assert coll.error[1] == pytest.approx((2 * 10e-6 + 1e-3 - 1.5e-3) / 1.5e-3)
    assert "steps" not in _coll()


def test_the_fit_table_and_what_the_prose_quotes():
    coll = analysis.with_ring_fit(_coll())
    fits = analysis.fit_table(coll)
    assert list(fits.columns) == ["machine", "collective", "ranks", "α (µs)", "β (GB/s)", "points", "rms rel. error",
                                  "most negative error", "most positive error"]
    ar = analysis.all_reduce_fit(analysis.fresh_fits(fits, coll))
    errors = coll.error[:2].to_numpy()
    assert ar["α (µs)"] == pytest.approx(10) and ar["β (GB/s)"] == 1 and ar.points == 2
    assert ar["rms rel. error"] == pytest.approx(np.sqrt(np.mean(errors**2)))
    assert ar["most negative error"] == errors.min() and ar["most positive error"] == errors.max()
    assert analysis.rms(pd.Series([0.3, -0.4])) == pytest.approx(np.sqrt(0.125))
    worst = fits["rms rel. error"].idxmax()
    assert analysis.worst_fit(fits) == fits.collective[worst]
    assert analysis.rms_range(pd.DataFrame({"rms rel. error": [0.05, 0.3]})) == "5% to 30%"
    assert set(analysis.FIT_FORMAT) <= set(fits.columns)


def test_fresh_fits_leave_out_reference_machines():
    coll = analysis.with_ring_fit(pd.concat([_coll(), _coll().assign(machine="gpu", source="reference")]))
    fits = analysis.fit_table(coll)
    assert len(fits) == 4 and set(analysis.fresh_fits(fits, coll).machine) == {"cpu"}


def test_the_collectives_figure_has_a_panel_per_collective():
    fig = analysis.draw_collectives(analysis.with_ring_fit(_coll()))
    assert [ax.get_title() for ax in fig.axes] == ["all-reduce", "send"]
    assert fig.axes[0].get_ylabel() == "time (µs)"
    single = analysis.draw_collectives(analysis.with_ring_fit(_coll()[:2]))  # one panel: axes is not a list
    assert len(single.axes) == 1


def _layers():
    """Parts of one model at micro-batches 1 and 2: embedding, layer and head (forward and backward seconds)."""
    rows = []
    for b in (1, 2):
        rows += [("m", "embedding", b, 1e-4 * b, 1e-4 * b, 0), ("m", "layer", b, 1e-3 * b, 3e-3 * b, 1e6 * b),
                 ("m", "head", b, 2e-3 * b, 4e-3 * b, 2e6 * b)]
    frame = pd.DataFrame(rows, columns=["model", "part", "micro_batch", "forward_s", "backward_s", "forward_flops"])
    return frame.assign(machine="cpu", source="fresh")


def test_layer_predictions_divide_flops_by_the_rate():
    long = analysis.layer_predictions(_layers(), pd.Series({"cpu": 1e9}))
    assert len(long) == 8 and "embedding" not in set(long.part)
    forward, backward = long[long.pass_ == "forward"].iloc[0], long[long.pass_ == "backward"].iloc[0]
    assert forward.predicted_s == 1e-3 and backward.flops == 2e6 and backward.predicted_s == 2e-3
    assert backward.error == pytest.approx(-1 / 3) and forward.series == "m layer, forward"
    assert analysis.median_error(long, "forward") == pytest.approx(0.0)
    assert analysis.median_error(long, "backward") == pytest.approx(np.median([-1 / 3, 0.0, -1 / 3, 0.0]))
    assert analysis.backward_ratio(_layers()) == pytest.approx(2.5)  # 3 for the layer, 2 for the head


def _whole(times=(0.02, 0.04)):
    return pd.DataFrame({"machine": "cpu", "source": "fresh", "model": "m", "micro_batch": [1, 2], "layers": 4,
                         "seq": 16, "hidden": 32, "vocab": 64, "time_s": list(times)})


def test_model_predictions_profiled_and_analytical():
    w = analysis.model_predictions(_layers(), _whole(), pd.Series({"cpu": 1e9}))
    profiled = 4 * (1e-3 + 3e-3) + 2e-4 + 6e-3
    assert w.profiled_s[0] == pytest.approx(profiled)
    assert w.analytical_s[0] == flops.model_flops(1, 4, 16, 32, 128, 64) / 1e9
    assert w.error_profiled[0] == pytest.approx((profiled - 0.02) / 0.02)
    assert w.series.tolist() == ["cpu, m", "cpu, m"]
    table = analysis.model_table(w)
    assert list(table.columns) == ["machine", "model", "b", "measured (ms)", "profiled (ms)", "profiled error",
                                   "analytical (ms)", "analytical error"]
    assert table["measured (ms)"].tolist() == [20.0, 40.0] and set(analysis.MODEL_FORMAT) <= set(table.columns)
    (ax,) = analysis.draw_model(w).axes
    assert ax.get_ylabel() == "forward + backward (ms)" and len(ax.lines) == 4


def test_error_ranges_and_the_smallest_model():
    wf = pd.DataFrame({"model": ["big", "big", "small", "small"], "layers": [8, 8, 2, 2], "hidden": [64, 64, 32, 32],
                       "error_profiled": [-0.1, 0.05, 0.4, 0.9], "source": "fresh"})
    assert analysis.error_range(wf.error_profiled) == "-10% to +90%"
    assert analysis.smallest_model_error(wf) == "+40% to +90% (small)"
    assert len(analysis.fresh_models(pd.concat([wf, wf.assign(source="reference")]))) == 4


@pytest.mark.parametrize("fit_rms, profiled, expected", [
    (0.25, 0.25, "reproduced"),  # the criterion includes its bound
    (0.26, 0.10, "depends"),
    (0.10, -0.26, "depends"),
    (0.30, 0.30, "not reproduced"),
])
def test_the_verdict_rule(fit_rms, profiled, expected):
    fits = pd.DataFrame({"rms rel. error": [0.01, fit_rms]})
    wf = pd.DataFrame({"error_profiled": [0.0, profiled], "error_analytical": [-0.5, 0.0]})
    met = analysis.criteria(fits, wf)
    assert rule("calibration").verdict(analysis.statistics(fits, wf)) == expected
    assert met[analysis.ANALYTICAL_CRITERION] is False


def test_the_criteria_in_words():
    met = analysis.criteria(pd.DataFrame({"rms rel. error": [0.1]}),
                            pd.DataFrame({"error_profiled": [0.3], "error_analytical": [0.2]}))
    assert analysis.criteria_text(met, meets=True) == "the α-β fits (rms), the analytical model times"
    assert analysis.criteria_text(met, meets=False) == "the profiled model times"
    assert analysis.criteria_text(dict.fromkeys(met, True), meets=False) == "none"
    assert analysis.criteria_text(dict.fromkeys(met, False), meets=True) == "none"
    loose = analysis.criteria(pd.DataFrame({"rms rel. error": [0.4]}),
                              pd.DataFrame({"error_profiled": [0.3], "error_analytical": [0.2]}), tolerance=0.5)
    assert all(loose.values())


def test_the_finding():
    ar = pd.Series({"α (µs)": 141.7, "β (GB/s)": 1.337})
    wf = pd.DataFrame({"error_profiled": [-0.05, 0.4], "error_analytical": [-0.7, -0.2]})
    assert analysis.finding(HW, ar, wf) == (
        "On this machine the fastest fp32 product runs at 100 GFLOP/s and an all-reduce costs α = 142 µs plus 1/β "
        "with β = 1.34 GB/s; summing profiled layer times misses a whole model's step by -5% to +40%, FLOPs / R by "
        "-70% to -20%.")
