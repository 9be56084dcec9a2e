"""The papers' chapter's comparisons and verdict (distperf.analysis.papers_scale), on small synthetic tables:
meta-device rows of small presets, published rows standing in for ``data/published/values.csv``."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets  # noqa: E402
from distperf.analysis import papers_scale as papers  # noqa: E402
from distperf.analysis.analytical_framework import TWO_BW_MODELS, preset_parameters  # noqa: E402
from distperf.analysis.verdicts import rule  # noqa: E402
from distperf.config import Config, Layout  # noqa: E402
from distperf.cost import predict  # noqa: E402
from conftest import published_row  # noqa: E402

TINY, SMALL = preset_parameters("tiny"), preset_parameters("small")
TINY_UNTIED = TINY + 256 * 32  # init_empty_weights unties the head: V·h more




def meta_rows():
    """What notebooks/papers_scale.ipynb writes, for two small presets and a reference row: 'small' took no
    Adam step."""
    return pd.DataFrame({
        "model": ["small", "tiny", "tiny"], "source": ["fresh", "fresh", "reference"],
        "parameters": [SMALL, TINY, TINY], "parameters_as_built": [SMALL + 256 * 128, TINY_UNTIED, TINY_UNTIED],
        "parameter_bytes": [math.nan, 4 * TINY, 4 * TINY], "gradient_bytes": [math.nan, 4 * TINY, 4 * TINY],
        "optimizer_state_bytes": [math.nan, 8 * TINY, 8 * TINY]})


def stage_rows():
    """Per-stage counts of 'tiny' over two stages, as the notebook writes them, and a reference row."""
    per_stage = predict(Config(model=presets.model("tiny"), layout=Layout(pp=2, schedule="1f1b", microbatches=2)))
    return pd.DataFrame({"model": ["tiny", "tiny", "tiny"], "source": ["fresh", "fresh", "reference"],
                         "pp": [2, 2, 2], "stage": [0, 1, 0],
                         "parameters": [*per_stage["parameters_per_stage"], 0]})


# The real modules on the meta device ------------------------------------------------------------------

def test_predicted_states_are_sixteen_bytes_a_parameter_in_fp32_adam():
    assert papers.predicted_states("tiny") == 16 * TINY


def test_with_meta_predictions_sets_the_cost_model_beside_the_meta_counts():
    meta = meta_rows()
    out = papers.with_meta_predictions(meta)
    assert "predicted" not in meta  # the input is left alone
    assert out.predicted.tolist() == [SMALL, TINY, TINY]
    assert out.error.tolist() == [0, 0, 0]
    assert out.loc[1, "error_as_built"] == pytest.approx((TINY - TINY_UNTIED) / TINY_UNTIED)
    assert out.loc[1, "states_meta"] == out.loc[1, "states_predicted"] == 16 * TINY
    assert math.isnan(out.loc[0, "states_meta"]) and math.isnan(out.loc[0, "states_error"])
    assert out.loc[1, "states_error"] == 0


def test_with_stage_predictions_counts_each_pipeline_stage():
    out = papers.with_stage_predictions(stage_rows())
    assert out.error.tolist()[:2] == [0, 0]
    assert out.predicted.sum() - out.predicted[2] == TINY + 256 * 32  # the last stage's copy of the tied embedding


def test_fresh_models_are_this_builds_rows_smallest_first_and_with_states_those_that_stepped():
    fresh = papers.fresh_models(papers.with_meta_predictions(meta_rows()))
    assert fresh.model.tolist() == ["tiny", "small"] and (fresh.source == "fresh").all()
    assert papers.with_states(fresh).model.tolist() == ["tiny"]
    assert papers.fresh_stages(stage_rows()).stage.tolist() == [0, 1]


def test_exact_count_untied_range_and_stage_layouts():
    fresh = papers.fresh_models(papers.with_meta_predictions(meta_rows()))
    assert papers.exact_count(fresh.predicted, fresh.parameters) == 2
    assert papers.exact_count(fresh.predicted, fresh.parameters + 1) == 0
    low, high = sorted(fresh.error_as_built)
    assert papers.untied_range(fresh) == f"{low:+.1%} to {high:+.1%}"
    stages = pd.DataFrame({"model": ["a", "a", "b"], "pp": [2, 2, 4]})
    assert papers.stage_layouts(stages) == "a over 2 stages, b over 4 stages"


def test_meta_table_renames_and_shows_states_in_gib():
    fresh = papers.fresh_models(papers.with_meta_predictions(meta_rows()))
    table = papers.meta_table(fresh)
    assert list(table.columns) == list(papers.META_COLUMNS.values())
    assert table["states meta (GiB)"].iloc[0] == 16 * TINY / 2**30
    assert set(papers.META_FORMATS) <= set(table.columns)
    assert "states_meta" in fresh  # the input keeps its columns


def test_draw_meta_draws_parameters_and_the_states_of_models_that_stepped():
    fresh = papers.fresh_models(papers.with_meta_predictions(meta_rows()))
    fig = papers.draw_meta(fresh)
    left, right = fig.axes
    assert [t.get_text() for t in left.get_xticklabels()] == ["tiny", "small"]
    assert [t.get_text() for t in right.get_xticklabels()] == ["tiny"]
    assert len(right.collections[0].get_offsets()) == 1
    plt.close(fig)


# Published values -------------------------------------------------------------------------------------

PUBLISHED = [
    published_row("brown2020language", "Table 2.1", "tiny", "parameters", 34176, "count"),
    published_row("narayanan2021efficient", "Table 1", "small", "parameters", 0.8, "billion"),
    published_row("narayanan2021memory", "§5 (model names)", "2bw-gpt-1.3b", "parameters", 1.3, "billion"),
    published_row("rajbhandari2020zero", "§3.1", "psi=1.5e9", "16-bit weights", 3, "GB"),
    published_row("rajbhandari2020zero", "§3.1", "psi=1.5e9", "model states, mixed-precision Adam", 25, "GB"),
    *[published_row("rajbhandari2020zero", "Fig. 1", f"psi=1e9 N=4 zero={k}", "model states per device", gb, "GB")
      for k, gb in enumerate([16.0, 7.0, 5.5, 4.0])],
]


def test_published_models_are_gpt3_table_1_and_the_listed_2bw_models(fake_published):
    fake_published(PUBLISHED)
    assert papers.published_models() == ["tiny", "small", *TWO_BW_MODELS]


def test_parameter_rows_read_the_published_counts(fake_published):
    fake_published(PUBLISHED)
    rows = papers.parameter_rows(["tiny", "small"])
    assert rows[0] == ("tiny", "parameters", "Brown et al. 2020, Table 2.1", 34176.0, TINY, 1e8)
    assert rows[1][2:4] == ("Narayanan et al. 2021 (Megatron-LM), Table 1", 0.8 * 1e9)


def test_zero_rows_read_psi_and_n_from_the_published_items(fake_published):
    fake_published(PUBLISHED)
    section = papers.zero_section_rows()
    assert section == [("Ψ = 1.5B", "16-bit weights (GB)", "Rajbhandari et al. 2020 (ZeRO), §3.1", 3e9, 3e9, 1e9),
                       ("Ψ = 1.5B", "model states, mixed Adam (GB)", "Rajbhandari et al. 2020 (ZeRO), §3.1", 25e9,
                        24e9, 1e9)]
    figure = papers.zero_figure_rows()
    assert [r[0] for r in figure] == [f"Ψ = 1B, N_d = 4, ZeRO-{k}" for k in range(4)]
    assert [r[4] for r in figure] == pytest.approx([16e9, 7e9, 5.5e9, 4e9])


def comparison():
    return papers.published_comparison([
        ("a", "parameters", "s", 1.7e9, 1.73e9, 1e8),  # rounds to 17 both: agrees, +1.76 %
        ("b", "parameters", "s", 1.7e9, 1.76e9, 1e8),  # rounds to 18: misses, +3.53 %
        ("c", "bytes", "s", 24e9, 24.4e9, 1e9),  # whole GB: agrees
    ])


def test_published_comparison_agrees_on_either_side_of_the_rounding():
    frame = comparison()
    assert frame.agrees.tolist() == [True, False, True]
    assert frame.error.tolist() == pytest.approx([0.03 / 1.7, 0.06 / 1.7, 0.4 / 24])


def test_published_table_shows_units_of_a_billion():
    table = papers.published_table(comparison())
    assert list(table.columns) == ["model", "quantity", "source", "published (10⁹)", "ours (10⁹)", "signed error",
                                   "agrees"]
    assert table["ours (10⁹)"].tolist() == pytest.approx([1.73, 1.76, 24.4])


def test_worst_and_missed():
    frame = comparison()
    assert papers.worst(frame).model == "b"
    assert papers.worst_text(frame) == "+3.53% (b, parameters)"
    assert papers.missed_text(frame) == "b (+3.53%)"
    assert papers.missed_text(frame[frame.agrees]) == "none"


# Verdict ----------------------------------------------------------------------------------------------

def exact_inputs():
    fresh = papers.fresh_models(papers.with_meta_predictions(meta_rows()))
    stages = papers.fresh_stages(papers.with_stage_predictions(stage_rows()))
    return fresh, stages


def test_meta_exact_needs_every_count_states_and_stage_to_match():
    fresh, stages = exact_inputs()

    def exact(fresh, stages):
        return papers.statistics(fresh, stages, comparison())["counts_exact"]

    assert exact(fresh, stages) == 1
    assert exact(fresh.assign(parameters=fresh.parameters + 1), stages) < 1
    assert exact(fresh.assign(states_meta=fresh.states_meta + 8), stages) < 1
    assert exact(fresh, stages.assign(parameters=stages.parameters + 1)) < 1


@pytest.mark.parametrize("exact, agree, outcome", [(1.0, 1.0, "reproduced"), (1.0, 0.9, "depends"),
                                                   (0.9, 1.0, "depends"), (0.9, 0.9, "not reproduced")])
def test_verdict(exact, agree, outcome):
    assert rule("papers_scale").verdict({"counts_exact": exact, "published_agree": agree}) == outcome


def test_reason_follows_the_statistics_and_names_the_misses():
    frame = comparison()
    assert papers.reason({"counts_exact": 1.0}, frame) == ("every count equals the real module's, but not every "
                                                          "published value agrees after rounding: b parameters +3.53%")
    assert papers.reason({"counts_exact": 0.5}, frame[frame.agrees]) == (
        "50% of the counts equal the real module's, and every published value agrees after rounding")


def test_finding_reports_gpt3_the_exact_models_and_the_published_agreement():
    fresh = pd.DataFrame({"model": ["gpt3-175b", "x", "y"], "parameters": [174.6e9, 10, 20],
                          "predicted": [174.6e9, 10, 21]})
    text = papers.finding(fresh, comparison())
    assert text == ("The cost model counts GPT-3's 174.60 billion parameters; 2 of 3 paper models are counted exactly "
                    "as the real modules hold them on the meta device; 2 of 3 published values agree after rounding, "
                    "the largest difference +3.53%.")
