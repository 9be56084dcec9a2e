"""The cost model against published step times (distperf.analysis.published_time): the published rows and their
layouts, the FLOP count behind Megatron-LM's rates, Megatron-LM's conventions in the cost model, and the split
between the rows the constants are fitted on and those they are judged on."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from distperf import published
from distperf.analysis import published_time as pt
from distperf.cost import predict


def test_every_published_time_and_rate_has_a_layout_and_a_configuration():
    rows = [r for q in pt.QUANTITIES for key in (pt.FIT, pt.VALIDATE)
            for r in published.select(source=key[0], where=key[1], quantity=q)]
    cases = pt.cases()
    assert len(cases) == len(rows) == 18
    assert {c.role for c in cases} == {"fit", "validation"}
    for c in cases:
        lay = c.config.layout
        assert lay.tp * lay.pp * lay.dp == c.gpus
        assert lay.micro_batch * lay.microbatches * lay.dp == int(pt.layouts()[c.item]["global_batch"])
        assert c.measured_s > 0


def test_a_rate_becomes_a_time_with_the_papers_own_flop_count():
    case = next(c for c in pt.cases() if c.role == "fit")
    rate = published.value(case.item, "achieved teraFLOP/s per GPU", source=pt.FIT[0]) * 1e12
    assert case.measured_s == pytest.approx(pt.paper_flops(case.config) / (case.gpus * rate))
    # the framework's FLOPs with full recomputation are the paper's second form (Eq. (3) of the framework chapter)
    for c in pt.cases():
        if c.config.layout.recompute == "full":
            hardware = predict(c.config, convention="paper")["flops"]["hardware"]
            assert hardware == pytest.approx(pt.paper_flops(c.config), rel=1e-3), c.item


def test_the_papers_convention_splits_the_head_and_the_pipeline_sends_over_the_tensor_parallel_ranks():
    case = next(c for c in pt.cases() if c.item.startswith("1T, full"))
    paper = predict(case.config, convention="paper")
    one = dataclasses.replace(case.config, layout=dataclasses.replace(case.config.layout, tp=1))
    assert paper["communication_bytes"]["pipeline_parallel"] == pytest.approx(
        predict(one, convention="paper")["communication_bytes"]["pipeline_parallel"] / 8, rel=0.01)
    from distperf.cost import flops, stage
    from distperf.hardware import PRESETS

    spec, lay, tr, hw = case.config.model, case.config.layout, case.config.training, PRESETS["A100-80GB"]
    last = stage.Span(layers=2, first=False, last=True)
    replicated = stage.compute(spec, lay, tr, hw, last).forward
    split = stage.compute(spec, lay, tr, hw, last, vocab_parallel=True).forward
    head = flops.head_forward_flops(lay.micro_batch, spec.seq, spec.hidden, spec.vocab) / hw.flops("mixed")
    assert replicated - split == pytest.approx(head * (1 - 1 / lay.tp))


def test_the_fit_sees_only_its_own_rows_and_a_validation_row_moves_no_constant(monkeypatch):
    monkeypatch.setattr(pt, "FLOPS_GRID", (0.5, 0.6, 0.7, 0.8))
    monkeypatch.setattr(pt, "LINK_GRID", (0.3, 0.5, 1.0))
    monkeypatch.setattr(pt, "PASSES_GRID", (0.0, 2.0))
    fit_rows = [c for c in pt.cases() if c.role == "fit"]
    assert pt.fit_subset_check(fit_rows) == []
    assert pt.fit_subset_check(pt.cases()) == [c.item for c in pt.cases() if c.role == "validation"]
    constants = pt.fit(fit_rows)
    assert len(constants) == 3
    doubled = tuple(dataclasses.replace(c, measured_s=2 * c.measured_s) if c.role == "validation" else c
                    for c in pt.cases())
    monkeypatch.setattr(pt, "cases", lambda: doubled)
    assert pt.fit([c for c in pt.cases() if c.role == "fit"]) == constants
    frame = pt.table(constants)
    assert set(frame.role) == {"fit", "validation"}
    # the fitted constants bring the fit rows closer than the datasheet does
    fit_part = frame[frame.role == "fit"]
    assert fit_part.fitted_error.abs().mean() < fit_part.datasheet_error.abs().mean()


def test_the_statistics_and_the_misses_follow_the_errors_either_way():
    def frame(errors):
        return pd.DataFrame({"item": [f"r{i}" for i in range(len(errors))], "role": "validation",
                             "fitted_error": errors, "fitted_s": 1.0, "bubble_s": 0.1, "communication_s": 0.2})

    good = pt.statistics(frame([0.01, -0.02, 0.03]))
    assert good == pytest.approx({"validation_mean": 0.02, "validation_max": 0.03})
    bad = pt.statistics(frame([0.2, -0.3]))
    assert bad["validation_max"] == pytest.approx(0.3)
    assert pt.statistics(frame([]).assign(role="fit")) == {}
    over = pt.misses_text(frame([0.01, 0.2, 0.3]))
    assert over.startswith("2 of 3 validation rows") and "all over-predicted" in over and "r2 (+30.0%" in over
    under = pt.misses_text(frame([-0.01, -0.2, -0.3]))
    assert "all under-predicted" in under
    assert pt.misses_text(frame([0.1, 0.1])).startswith("no validation row misses")


def _throughputs(flush_ratio, gpipe_ratio):
    rows = []
    for batch in (512, 2048):
        rows.append({"model": "m", "rate": "r", "GPUs": 64, "batch": batch, "2bw": 100.0, "1f1b": 100.0 / flush_ratio,
                     "gpipe": 100.0 / gpipe_ratio, "2BW/Flush": flush_ratio, "2BW/GPipe": gpipe_ratio,
                     "Flush bubble": 0.2})
    return pd.DataFrame(rows)


def test_the_published_2bw_speedups_are_compared_within_the_tolerance_either_way():
    paper = {item: published.value(item, quantity, source=pt.TWOBW_SOURCE) for item, quantity, _, _ in pt.TWOBW_RATIOS}
    close = pt.twobw_comparison(_throughputs(paper["2BW against PipeDream-Flush"],
                                             paper["2BW against GPipe"]), "r")
    assert close.paper.tolist() == list(paper.values())
    assert close["within 15 %"].tolist() == [True, True, abs(close.framework[2] / close.paper[2] - 1) <= 0.15]
    far = pt.twobw_comparison(_throughputs(1.0, 1.0), "r")
    assert far["within 15 %"].tolist()[:2] == [False, False] and pt.ratio_share(far) < pt.ratio_share(close)
    assert pt.statistics(pd.DataFrame({"role": []}), far) == {"twobw_ratios": pt.ratio_share(far)}
    text = pt.ratio_misses_text(_throughputs(1.1, 2.0), far, "r")
    assert "loses 20% of its iteration" in text and "GPipe fits in memory in 2 of 2 cases" in text
    none_fit = _throughputs(1.1, 2.0).assign(gpipe=float("nan"), **{"2BW/GPipe": float("nan")})
    assert pt.twobw_comparison(none_fit, "r").framework.isna().tolist() == [False, True, False]


def test_the_planner_gives_each_schedule_its_own_best_plan_at_the_papers_cases():
    from distperf.analysis import planner as ap
    from distperf.hardware import PRESETS

    rates = {"peak": PRESETS["V100-16GB"]}
    th = pt.schedule_throughputs(rates, ((64, 512),), ("2bw-gpt-2.2b",), 8, ap.PAPER_NODE_BANDWIDTH)
    row = th.iloc[0]
    assert row["2bw"] > 0 and row["1f1b"] > 0 and row["2BW/Flush"] == pytest.approx(row["2bw"] / row["1f1b"])
    assert 0 <= row["Flush bubble"] < 1


def test_the_papers_model_and_data_parallelism_are_megatron_lms(monkeypatch):
    """Dropout and the unfused attention of both papers' GPT; the gradient all-reduced in one bucket after the
    backward, so that a data-parallel row's prediction exposes the whole all-reduce."""
    from distperf.cost.collectives import collective_time
    from distperf.hardware import PRESETS

    case = next(c for c in pt.cases() if c.item == "megatron-1.7b")
    assert case.config.model.dropout > 0 and case.config.model.attention == "math"
    hw = PRESETS[case.hardware]
    serial = pt.predicted(case, hw)
    grads = predict(case.config, hw, convention="paper")["parameters"] * 2  # 16-bit gradients
    lay = case.config.layout
    assert serial["communication_exposed"] == pytest.approx(collective_time("all-reduce", grads, lay.dp,
                                                                            *hw.link(lay.dp)), rel=1e-6)


def test_a_constant_on_the_edge_of_its_grid_is_named_with_the_error_one_step_beyond(monkeypatch):
    rows = [c for c in pt.cases() if c.role == "fit"][:3]
    inside = (pt.FLOPS_GRID[10], pt.LINK_GRID[5], pt.PASSES_GRID[4])
    assert pt.edge_text(inside, rows) == "no constant lies on an edge of its grid"
    text = pt.edge_text((pt.FLOPS_GRID[10], pt.LINK_GRID[-1], pt.PASSES_GRID[0]), rows)
    assert "links' fraction of the datasheet lies at the grid's upper end (1); one step beyond (1.05)" in text
    assert "memory-bound passes lies at the grid's lower end (0); one step beyond (-0.25)" in text


def test_the_fitted_preset_is_a_profile_that_predict_reads_back(tmp_path):
    from distperf.hardware import PRESETS, load_profile, save_profile

    fitted = pt.scaled(PRESETS["A100-80GB"], 0.7, 0.5, 2.0)
    save_profile(fitted, tmp_path / "hw.json")
    assert load_profile(tmp_path / "hw.json") == fitted
    plain = pt.scaled(PRESETS["A100-80GB"], 0.7, 0.5)  # no memory-bound passes: 0 reads back as 0
    save_profile(plain, tmp_path / "plain.json")
    assert load_profile(tmp_path / "plain.json") == plain
    case = next(c for c in pt.cases() if c.role == "validation")
    assert pt.predicted(case, fitted)["iteration"] > pt.predicted(case, plain)["iteration"]
