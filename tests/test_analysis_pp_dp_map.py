"""Claim 1 as a map (distperf.analysis.pp_dp_map), on small synthetic tables."""
from __future__ import annotations

import dataclasses
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from distperf import presets, results  # noqa: E402
from distperf.analysis import pp_dp_map as pm  # noqa: E402
from distperf.analysis.pp_vs_dp import DP_LAYOUT, PP_LAYOUT  # noqa: E402
from distperf.config import Config, Layout, validate  # noqa: E402
from distperf.hardware import PRESETS  # noqa: E402
from distperf.runner.sweep import flatten  # noqa: E402

HW = dataclasses.replace(PRESETS["V100-16GB"], intra_latency=1e-5, intra_bandwidth=1e9)
FITS = {1e8: {"send": {"alpha": 2e-4, "beta": 0.9 * 1e8 / 8}}}
RATES = (1e7, 1e8, 1e9)


def _runs(ratios: dict, noise: float = 0.01, predicted: dict | None = None):
    """A runs frame as measured_runs leaves it: for each (model, B, rate) DP at 100 samples/s and PP at
    100·ratio, three repeats spread by ``noise``; predicted PP/DP from ``predicted`` (default: the measured)."""
    predicted = predicted or ratios
    rows = []
    for (model, batch, rate), ratio in ratios.items():
        for layout, measured, pred in ((DP_LAYOUT, 100.0, 100.0), (PP_LAYOUT, 100.0 * ratio,
                                                                    100.0 * predicted[(model, batch, rate)])):
            times = [1 / measured * (1 + k * noise) for k in (-1, 0, 1)]
            rows.append({"model": model, "B": batch, "rate": rate, "layout": layout, "measured": measured,
                         "predicted": pred, "profiled": np.nan, "repeat_times": times})
    return pd.DataFrame(rows)


# the pipeline wins on slow links and loses on fast ones; at 100 Mbit/s the two are within the noise
FALLING = {("small", 8, 1e7): 2.0, ("small", 8, 1e8): 1.0, ("small", 8, 1e9): 0.5}


def test_cells_winners_and_the_region_along_the_rate():
    cells = pm.map_cells(_runs(FALLING))
    assert cells["measured winner"].tolist() == ["PP", "tie", "DP"]
    assert pm.boundary_counts(cells) == {"cells": 3, "pp_wins": 1, "dp_wins": 1, "ties": 1, "decisive": 2, "agree": 2}
    assert pm.region_text(cells) == "small, B = 8: PP wins at 10 Mbit/s; DP wins at 1 Gbit/s; tie at 100 Mbit/s"
    # the opposite data gives the opposite region
    rising = {key: 1 / value for key, value in FALLING.items()}
    assert pm.region_text(pm.map_cells(_runs(rising))) == (
        "small, B = 8: PP wins at 1 Gbit/s; DP wins at 10 Mbit/s; tie at 100 Mbit/s")
    # a framework that has the pipeline win everywhere misses the boundary
    wrong = pm.map_cells(_runs(FALLING, predicted={key: 3.0 for key in FALLING}))
    assert pm.boundary_counts(wrong)["agree"] == 1


def test_crossovers_measured_against_predicted_per_slice():
    cells = pm.map_cells(_runs({**FALLING, ("tiny", 32, 1e7): 0.5, ("tiny", 32, 1e9): 0.4}))
    curves = {("small", 8): np.array([2.0, 0.5]), ("tiny", 32): np.array([0.5, 0.4])}
    cross = pm.crossovers(cells, curves, rates=np.array([1e7, 1e9])).set_index("model")
    assert math.isclose(cross.loc["small", "measured"], 1e8) and math.isclose(cross.loc["small", "predicted"], 1e8)
    assert math.isclose(cross.loc["small", "factor"], 1.0)
    assert pd.isna(cross.loc["tiny", "measured"]) and math.isnan(cross.loc["tiny", "factor"])
    late = pm.crossovers(cells, {("small", 8): np.array([2.0, 1.5]), ("tiny", 32): np.array([0.5, 0.4])},
                         rates=np.array([1e7, 1e9])).set_index("model")
    assert late.loc["small", "factor"] == math.inf  # measured but not predicted
    said = pm.crossover_text(late.reset_index())
    assert "small, B = 8: measured 100 Mbit/s, predicted none in the swept range" in said
    assert "(factor 1)" in pm.crossover_text(cross.reset_index())


def test_the_table_and_figure():
    runs = _runs(FALLING).assign(memory=[100.0, 60.0] * 3)
    cells = pm.map_cells(runs)
    table = pm.table(cells)
    assert table.link.tolist() == ["10 Mbit/s", "100 Mbit/s", "1 Gbit/s"] and (table["PP/DP memory"] == 0.6).all()
    fig = pm.draw_map(cells, {("small", 8): np.linspace(2, 0.5, 5)}, ["small"], rates=np.logspace(7, 9, 5))
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) >= 2
    plt.close(fig)


def _row(pp: int, rate: float, median: float, repeat: int) -> dict:
    layout = (Layout(pp=2, schedule="1f1b", micro_batch=2, microbatches=4) if pp > 1 else
              Layout(dp=2, micro_batch=2, microbatches=2))
    config = validate(Config(model=presets.model("tiny"), layout=layout))
    return {"status": "ok", "config_hash": f"{pp}-{rate}", "repeat": repeat, "network.inter_bit_per_s": rate,
            "iteration_time_s.median": median, "iteration_time_s.p10": median, "iteration_time_s.p90": median,
            "tokens_per_s": 8 * 16 / median, "memory_bytes.total": 100.0 * pp, "machine": "test", "date": "2026-12-01",
            "commit": "abc", "device_name": "a CPU", **flatten({"config": config.to_dict()})}


def test_the_section_from_every_repeat_and_without_runs():
    rows = pd.DataFrame([_row(pp, rate, median * (1 + 0.01 * k), k) for rate, dp_t, pp_t in
                         ((1e7, 0.4, 0.2), (1e9, 0.1, 0.2)) for pp, median in ((1, dp_t), (2, pp_t)) for k in range(3)])
    cells, counts, region, fig, table, texts, prov = pm.section(rows, "", HW, FITS)
    assert cells["measured winner"].tolist() == ["PP", "DP"] and not cells.low.isna().any()
    assert counts["cells"] == 2 and region == "tiny, B = 8: PP wins at 10 Mbit/s; DP wins at 1 Gbit/s"
    assert texts["ppdp-map-memory"] == "2.00× to 2.00×" and len(table) == 2
    assert prov == f"a CPU (test, this build), 2026-12-01, commit abc, scale {results.book_scale()}"
    plt.close(fig)
    cells, counts, region, fig, table, texts, prov = pm.section(None, "needs root", HW, FITS)
    assert cells is None and counts is None and region == "" and table is None
    assert set(texts.values()) == {"not measured (needs root)"} and set(texts) == set(pm.TEXT_KEYS)
    plt.close(fig)
