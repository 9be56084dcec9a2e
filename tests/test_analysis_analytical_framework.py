"""The framework chapter's tables and findings (distperf.analysis.analytical_framework), on small synthetic
tables: published rows stand in for ``data/published/values.csv``, small presets for the papers' models."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from distperf import presets  # noqa: E402
from distperf.analysis import analytical_framework as framework  # noqa: E402
from distperf.config import MEMORY_CATEGORIES, Config, Layout, ModelSpec, Training  # noqa: E402
from distperf.cost import activations, predict  # noqa: E402
from conftest import published_row  # noqa: E402

TINY_PARAMETERS = 2 * (12 * 32**2 + 13 * 32) + (256 + 16) * 32 + 2 * 32  # L(12h² + 13h) + (V + s)h + 2h




# Shared helpers ---------------------------------------------------------------------------------------

def test_preset_parameters_is_the_closed_form_plus_the_final_layernorm():
    assert framework.preset_parameters("tiny") == TINY_PARAMETERS == 34176


def test_rounded_as_published_prints_counts_exactly_and_billions_to_one_decimal():
    assert framework.rounded_as_published(124_439_808, "count") == "124,439,808"
    assert framework.rounded_as_published(124_439_808.0, "count") == "124,439,808"
    assert framework.rounded_as_published(1.7e9, "billion") == "1.7 B"
    assert framework.rounded_as_published(1_649_000_000, "billion") == "1.6 B"
    assert framework.rounded_as_published(1_651_000_000, "billion") == "1.7 B"
    with pytest.raises(ValueError, match="unit"):
        framework.rounded_as_published(1.0, "GB")


def test_count_of_counts_the_true_flags():
    assert framework.count_of([True, False, True]) == "2 of 3"
    assert framework.count_of(pd.Series([True, True])) == "2 of 2"
    assert framework.count_of([]) == "0 of 0"


def test_item_settings_reads_integers_and_floats():
    assert framework.item_settings("psi=7.5e9 N=64 zero=1") == {"psi": 7.5e9, "N": 64, "zero": 1}
    settings = framework.item_settings("psi=1.5e9")
    assert isinstance(settings["psi"], float) and settings["psi"] == 1.5e9
    assert isinstance(framework.item_settings("N=64")["N"], int)
    with pytest.raises(ValueError, match="key=value"):
        framework.item_settings("gpt2")


def test_styled_formats_the_columns_and_hides_the_index():
    html = framework.styled(pd.DataFrame({"x": [1.23456, None]}), {"x": "{:.2f}"}, na_rep="—").to_html()
    assert "1.23" in html and "1.2346" not in html and "—" in html
    assert "row0" in html and 'class="row_heading' not in html


# Parameters -------------------------------------------------------------------------------------------

PARAMETER_ROWS = [
    published_row("radford2019language", "released checkpoints (Hugging Face)", "tiny", "parameters", 34176, "count"),
    published_row("radford2019language", "released checkpoints (Hugging Face)", "small", "parameters", 1, "count"),
    published_row("narayanan2021efficient", "Table 1", "medium", "parameters", 7.0, "billion"),
    published_row("narayanan2021efficient", "Table 1", "medium", "something else", 1.0, "billion"),
    published_row("narayanan2021memory", "§5 (model names)", "2bw-gpt-1.3b", "parameters", 1.3, "billion"),
    published_row("narayanan2021memory", "§5 (model names)", "2bw-gpt-2.2b", "parameters", 2.2, "billion"),
    published_row("narayanan2021memory", "§5 (model names)", "2bw-gpt-3.8b", "parameters", 3.8, "billion"),
    published_row("narayanan2021memory", "§5 (model names)", "2bw-gpt-28.3b", "parameters", 28.3, "billion"),
]


def test_parameter_models_are_the_checkpoints_table_1_and_the_listed_2bw_models(fake_published):
    fake_published(PARAMETER_ROWS)
    assert framework.parameter_models() == ["tiny", "small", "medium", *framework.TWO_BW_MODELS]


def test_parameter_table_agrees_only_where_the_printed_values_are_equal(fake_published):
    fake_published(PARAMETER_ROWS)
    table = framework.parameter_table(["tiny", "small", "medium", "2bw-gpt-1.3b"])
    assert list(table.columns) == ["model", "published as", "published", "ours, same rounding", "agrees"]
    assert table["published as"].tolist() == [framework.PARAMETER_SOURCES["radford2019language"]] * 2 + [
        framework.PARAMETER_SOURCES["narayanan2021efficient"], framework.PARAMETER_SOURCES["narayanan2021memory"]]
    assert table.loc[0, "published"] == table.loc[0, "ours, same rounding"] == "34,176"
    assert table.loc[1, "published"] == "1"
    assert table.loc[2, "published"] == "7.0 B" and table.loc[2, "ours, same rounding"] == "0.0 B"
    assert table.loc[3, "ours, same rounding"] == "1.3 B"
    assert table.agrees.tolist() == [True, False, False, True]


# FLOPs, ZeRO, activations, bubble ---------------------------------------------------------------------

def test_flops_table_matches_the_closed_forms():
    table = framework.flops_table(["tiny", "small"], batch=8)
    assert table.model.tolist() == ["tiny", "small"] and (table.B == 8).all()
    m = presets.model("tiny")
    expected = 3 * (m.layers * (24 * 8 * m.seq * m.hidden**2 + 4 * 8 * m.seq**2 * m.hidden)
                    + 2 * 8 * m.seq * m.hidden * m.vocab)
    assert table.loc[0, "ours"] == expected
    assert table["ours / 72-form"].tolist() == pytest.approx([1, 1], rel=1e-12)
    assert table["ours / 96-form"].tolist() == pytest.approx([1, 1], rel=1e-12)
    assert (table["ours, full recompute"] > table["ours"]).all()


def test_zero_table_reads_psi_and_n_from_the_published_figure(fake_published):
    fake_published([published_row("rajbhandari2020zero", "Fig. 1", f"psi=1e9 N=4 zero={k}", "model states per device", gb,
                        "GB") for k, gb in enumerate([16.0, 7.0, 5.5, 4.0])]
                   + [published_row("rajbhandari2020zero", "§3.1", "psi=1.5e9", "16-bit weights", 3, "GB")])
    table = framework.zero_table()
    assert table.stage.tolist() == ["data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    # 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N bytes with Ψ = 10⁹, N = 4
    assert table["ours (GB)"].tolist() == pytest.approx([16, 7, 5.5, 4])
    assert table["ZeRO paper, Fig. 1 (GB)"].tolist() == [16.0, 7.0, 5.5, 4.0]


def test_activation_table_sets_the_cost_model_beside_the_published_form(fake_published):
    spec = ModelSpec(layers=1, hidden=64, heads=4, seq=32)
    coefficients = {"sbh": 1, "sbh/t": 0, "sbh·as/h": 0, "sbh·as/(ht)": 0}
    fake_published([published_row("korthikanti2022reducing", "Table 2", setting, f"activation bytes per layer, coefficient of {c}",
                        v, "bytes") for _, setting, _ in framework.ACTIVATION_CASES for c, v in coefficients.items()])
    table = framework.activation_table(spec, micro_batch=2)
    assert table.setting.tolist() == [label for label, _, _ in framework.ACTIVATION_CASES]
    assert table[framework.KORTHIKANTI].tolist() == [32 * 2 * 64 / 2**20] * len(table)
    assert table.loc[0, "ours (MiB)"] == activations.layer_activation_bytes(32, 2, 64, 4) / 2**20
    assert table.loc[5, "ours (MiB)"] == activations.layer_activation_bytes(32, 2, 64, 4, recompute="full") / 2**20


def test_activation_table_agrees_with_korthikanti_table_2():
    """With the committed coefficients every row is the paper's closed form (GPT-3's layer at b = 1)."""
    table = framework.activation_table(presets.model("gpt3-175b"), micro_batch=1)
    assert table["ours (MiB)"].tolist() == pytest.approx(table[framework.KORTHIKANTI].tolist(), rel=1e-12)
    assert table.loc[5, framework.KORTHIKANTI] == 2 * 2048 * 12288 / 2**20  # full recompute keeps 2sbh


def test_bubble_table_is_p_minus_one_over_vm_plus_p_minus_one():
    table = framework.bubble_table(depths=(1, 4), microbatches_per_stage=(1, 2))
    assert table[["p", "m"]].values.tolist() == [[1, 1], [1, 2], [4, 4], [4, 8]]
    assert (table.iloc[:2, 2:] == 0).all().all()  # one stage: no bubble
    assert table.iloc[2, 2:].tolist() == pytest.approx([3 / 7, 3 / 11, 3 / 19])
    assert list(framework.BUBBLE_FORMATS) == list(table.columns[2:])


# Memory of a GPT-3-class model ------------------------------------------------------------------------

def test_layout_sweeps_vary_one_parameter_around_the_base():
    base = Layout(dp=8, tp=8, pp=8, sequence_parallel=True, schedule="1f1b", microbatches=64, zero=1)
    sweeps = framework.layout_sweeps(base)
    assert list(sweeps) == [framework.PANEL_DP, framework.PANEL_TP, framework.PANEL_PP, framework.PANEL_ZERO]
    dp = sweeps[framework.PANEL_DP]
    assert [(v, layout.dp, layout.microbatches) for _, v, layout in dp][:2] == [(1, 1, 512), (2, 2, 256)]
    tp = {v: layout for _, v, layout in sweeps[framework.PANEL_TP]}
    assert not tp[1].sequence_parallel and tp[2].sequence_parallel
    pp = {v: layout for _, v, layout in sweeps[framework.PANEL_PP]}
    assert pp[1].schedule == "none" and pp[2].schedule == "1f1b" and pp[32].microbatches == 64
    assert [layout.zero for _, _, layout in sweeps[framework.PANEL_ZERO]] == [0, 1, 2, 3]
    assert all(layout.tp == 8 and layout.pp == 8 for _, _, layout in dp)


def test_predicted_memory_is_the_prediction_in_gib():
    tiny = presets.model("tiny")
    sweeps = {"zero": [("ZeRO", z, Layout(dp=2, zero=z)) for z in (0, 1)],
              "pp": [("p", 2, Layout(pp=2, schedule="1f1b", microbatches=2))]}
    memory = framework.predicted_memory(tiny, sweeps, Training(precision="mixed"))
    assert memory.panel.tolist() == ["zero", "zero", "pp"] and memory.value.tolist() == ["0", "1", "2"]
    out = predict(Config(model=tiny, layout=Layout(dp=2, zero=1), training=Training(precision="mixed")), None)
    assert memory.loc[1, "optimizer_states"] == out["memory_bytes"]["optimizer_states"] / 2**30
    assert memory.loc[1, "total"] == out["memory_bytes"]["total"] / 2**30
    assert list(memory.columns) == ["panel", "value", *MEMORY_CATEGORIES, "total"]


def synthetic_memory():
    """Two panels: the data-parallel one (optimizer states 6 then 5 GiB) and the ZeRO stages."""
    states = {"0": (2, 2, 12), "1": (2, 2, 3), "2": (2, 0.5, 3), "3": (0.5, 0.5, 3)}
    rows = [{"panel": framework.PANEL_DP, "value": str(d), "parameters": 1, "gradients": 1, "optimizer_states": o,
             "activations": 1, "total": 3 + o} for d, o in ((1, 6), (2, 5))]
    rows += [{"panel": framework.PANEL_ZERO, "value": z, "parameters": p, "gradients": g, "optimizer_states": o,
              "activations": 1, "total": p + g + o + 1} for z, (p, g, o) in states.items()]
    return pd.DataFrame(rows)


def test_base_total_floor_and_zero1_share():
    memory = synthetic_memory()
    assert framework.base_total(memory) == 2 + 2 + 3 + 1
    assert framework.zero1_floor(memory) == 5
    assert framework.zero1_share(memory) == pytest.approx((16 - 7) / (16 - 4))


def test_zero1_share_is_one_when_zero1_saves_all_that_zero3_saves():
    memory = synthetic_memory()
    stage_1 = (memory.panel == framework.PANEL_ZERO) & (memory.value == "1")
    memory.loc[stage_1, ["parameters", "gradients", "optimizer_states"]] = [0.5, 0.5, 3]
    assert framework.zero1_share(memory) == 1


def test_embedding_optimizer_states_are_twelve_bytes_a_parameter():
    spec = ModelSpec(hidden=64, vocab=1024)
    assert framework.embedding_optimizer_states(spec) == (65536, 65536 * 12 / 2**30)


def test_draw_memory_by_category_draws_one_panel_per_sweep():
    fig = framework.draw_memory_by_category(synthetic_memory(), capacity_gib=10)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [framework.PANEL_DP, framework.PANEL_ZERO]
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == [c.replace("_", " ") for c in MEMORY_CATEGORIES]
    assert any(list(line.get_ydata()) == [10, 10] for line in axes[1].get_lines())
    tops = sorted(p.get_y() + p.get_height() for p in axes[1].patches)
    assert tops[-1] == pytest.approx(17)  # stacked: stage 0 holds 2 + 2 + 12 + 1
    plt.close(fig)


def test_prediction_rates_time_both_orders_without_reordering_the_input():
    configs = [Config(model=presets.model("tiny"), layout=Layout(dp=d)) for d in (1, 2, 4)]
    before = list(configs)
    rates = framework.prediction_rates(configs, seed=0, repeats=3)
    assert set(rates) == {"sweep", "shuffled", "warm"}
    assert all(len(each) == 3 and all(r > 0 for r in each) for each in rates.values())
    assert configs == before
