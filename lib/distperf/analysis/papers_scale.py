"""What the chapter "At the papers' scale" computes: the cost model's parameter counts and model-state bytes
against the values the papers publish (GPT-3, Megatron-LM's Table 1, the PipeDream-2BW models, ZeRO's §3.1 and
Fig. 1) and against the real modules built on PyTorch's meta device (``data/fresh/<scale>/papers_scale.csv``
and ``papers_scale_stages.csv``, written by ``notebooks/papers_scale.ipynb``), and the chapter's verdict.

Published numbers are read from :mod:`distperf.published`; the parameter count of a preset is
:func:`.analytical_framework.preset_parameters`.
"""
from __future__ import annotations

import pandas as pd

from .. import presets, published, results
from ..config import MODEL_STATES, Config, Layout, Training
from ..cost import predict
from ..cost.model_states import bytes_per_parameter, zero_model_state_bytes
from .verdicts import share
from .analytical_framework import BILLION, GIB, TWO_BW_MODELS, count_of, item_settings, preset_parameters

UNIT_SCALE = {"GB": BILLION}  # published model-state sizes in units of one byte

# How the comparison names each published source: (source, where) → label.
SOURCES = {
    ("brown2020language", "Table 2.1"): "Brown et al. 2020, Table 2.1",
    ("narayanan2021efficient", "Table 1"): "Narayanan et al. 2021 (Megatron-LM), Table 1",
    ("narayanan2021memory", "§5 (model names)"): "Narayanan et al. 2021 (PipeDream-2BW), model name",
    ("rajbhandari2020zero", "§3.1"): "Rajbhandari et al. 2020 (ZeRO), §3.1",
    ("rajbhandari2020zero", "Fig. 1"): "Rajbhandari et al. 2020 (ZeRO), Fig. 1",
}
# ZeRO §3.1's quantities: the label the table shows, and the model states each counts.
SECTION_3_1 = {
    "16-bit weights": ("16-bit weights (GB)", ("parameters",)),
    "model states, mixed-precision Adam": ("model states, mixed Adam (GB)", MODEL_STATES),
}
# Sizes printed in billions to one decimal compare at 10⁸; §3.1's whole gigabytes at 10⁹.
TENTH_OF_A_BILLION = 1e8

PUBLISHED_FORMATS = {"published (10⁹)": "{:,.1f}", "ours (10⁹)": "{:,.3f}", "signed error": "{:+.2%}"}
META_COLUMNS = {"model": "model", "predicted": "predicted", "parameters": "meta (re-tied)", "error": "signed error",
                "parameters_as_built": "meta (as built)", "error_as_built": "signed error (as built)",
                "states_predicted": "states predicted (GiB)", "states_meta": "states meta (GiB)",
                "states_error": "states signed error"}
META_FORMATS = {"predicted": "{:,.0f}", "meta (re-tied)": "{:,.0f}", "meta (as built)": "{:,.0f}",
                "signed error": "{:+.2%}", "signed error (as built)": "{:+.2%}",
                "states predicted (GiB)": "{:,.2f}", "states meta (GiB)": "{:,.2f}", "states signed error": "{:+.2%}"}


# The real modules on the meta device ------------------------------------------------------------------

def predicted_states(name: str) -> int:
    """fp32 Adam model states of a preset model on one device, from the cost model's prediction:
    parameters + gradients + optimizer states, 16Ψ bytes."""
    mem = predict(Config(model=presets.model(name), layout=Layout(), training=Training("fp32", "adam")))["memory_bytes"]
    return mem["parameters"] + mem["gradients"] + mem["optimizer_states"]


def with_meta_predictions(meta: pd.DataFrame) -> pd.DataFrame:
    """The meta-device table with the cost model beside it: ``predicted`` (parameters) and its signed errors
    against the re-tied count (``error``) and the count as built (``error_as_built``); ``states_meta`` (the
    bytes torch allocated), ``states_predicted`` and ``states_error``."""
    meta = meta.copy()
    meta["predicted"] = meta.model.map(preset_parameters)
    meta["error"] = results.signed_error(meta.predicted, meta.parameters)
    meta["error_as_built"] = results.signed_error(meta.predicted, meta.parameters_as_built)
    meta["states_meta"] = meta.parameter_bytes + meta.gradient_bytes + meta.optimizer_state_bytes
    meta["states_predicted"] = meta.model.map(predicted_states)
    meta["states_error"] = results.signed_error(meta.states_predicted, meta.states_meta)
    return meta


def with_stage_predictions(stages: pd.DataFrame) -> pd.DataFrame:
    """The per-stage table with the cost model's parameters of each pipeline stage (1F1B over ``pp`` stages,
    m = pp) as ``predicted``, and its signed ``error``."""
    stages = stages.copy()
    stages["predicted"] = [predict(Config(model=presets.model(r.model),
                                          layout=Layout(pp=r.pp, schedule="1f1b", microbatches=r.pp)))
                           ["parameters_per_stage"][r.stage] for r in stages.itertuples()]
    stages["error"] = results.signed_error(stages.predicted, stages.parameters)
    return stages


def fresh_models(meta: pd.DataFrame) -> pd.DataFrame:
    """This build's rows of :func:`with_meta_predictions`, smallest predicted count first."""
    return meta[meta.source == "fresh"].sort_values("predicted")


def with_states(fresh: pd.DataFrame) -> pd.DataFrame:
    """The rows whose Adam step was taken (model states measured)."""
    return fresh.dropna(subset=["states_meta"])


def fresh_stages(stages: pd.DataFrame) -> pd.DataFrame:
    """This build's rows of :func:`with_stage_predictions`."""
    return stages[stages.source == "fresh"]


def exact_count(predicted, counted) -> int:
    """How many predictions equal the count exactly."""
    return int((predicted == counted).sum())


def untied_range(fresh: pd.DataFrame) -> str:
    """The range of signed errors against the count as built (head untied), e.g. '-23.7% to -0.4%'."""
    return f"{fresh.error_as_built.min():+.1%} to {fresh.error_as_built.max():+.1%}"


def stage_layouts(stages: pd.DataFrame) -> str:
    """The pipeline layouts checked stage by stage, e.g. 'gpt3-175b over 8 stages'."""
    layouts = stages[["model", "pp"]].drop_duplicates().itertuples(index=False)
    return ", ".join(f"{m} over {p} stages" for m, p in layouts)


def meta_table(fresh: pd.DataFrame) -> pd.DataFrame:
    """The meta-device comparison as shown (:data:`META_COLUMNS`, model states in GiB); format with
    :data:`META_FORMATS`."""
    table = fresh[list(META_COLUMNS)].copy()
    table[["states_predicted", "states_meta"]] /= GIB
    return table.rename(columns=META_COLUMNS)


def draw_meta(fresh: pd.DataFrame):
    """Parameters (left) and fp32 Adam model states (right) of each model: the meta device's counts as points
    (re-tied and as built), the cost model as a dashed line, models in the order of ``fresh``. Returns the
    figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    x = np.arange(len(fresh))
    ax = axes[0]
    ax.scatter(x, fresh.parameters, s=50, zorder=3, label="meta device, head re-tied")
    ax.scatter(x, fresh.parameters_as_built, s=30, marker="x", zorder=3, label="meta device, as built")
    ax.plot(x, fresh.predicted, ls="--", color="grey", label="predicted")
    ax.set_yscale("log")
    ax.set_ylabel("parameters")
    ax.set_xticks(x, fresh.model, rotation=90, fontsize="x-small")
    ax.legend(fontsize="small")
    ax.set_title("parameters")
    steps = with_states(fresh)
    xs = x[fresh.states_meta.notna().to_numpy()]
    ax = axes[1]
    ax.scatter(xs, steps.states_meta / GIB, s=50, zorder=3, label="meta device, fp32 Adam step")
    ax.plot(xs, steps.states_predicted / GIB, ls="--", color="grey", label="predicted")
    ax.set_yscale("log")
    ax.set_ylabel("GiB")
    ax.set_xticks(xs, steps.model, rotation=90, fontsize="x-small")
    ax.legend(fontsize="small")
    ax.set_title("model states (parameters + gradients + Adam)")
    fig.tight_layout()
    return fig


# Published values -------------------------------------------------------------------------------------

def published_models() -> list[str]:
    """The models whose published parameter counts the chapter checks: GPT-3, Megatron-LM's Table 1 and
    :data:`~.analytical_framework.TWO_BW_MODELS`, in the published table's order."""
    gpt3 = [r["item"] for r in published.select(source="brown2020language", quantity="parameters")]
    table_1 = [r["item"] for r in published.select(source="narayanan2021efficient", where="Table 1",
                                                   quantity="parameters")]
    return gpt3 + table_1 + list(TWO_BW_MODELS)


def parameter_rows(models) -> list[tuple]:
    """(model, quantity, source, published, ours, unit) of each model's published parameter count, compared
    at :data:`TENTH_OF_A_BILLION`."""
    rows = []
    for name in models:
        value, row = published.parameter_count(name)
        rows.append((name, "parameters", SOURCES[row["source"], row["where"]], value, preset_parameters(name),
                     TENTH_OF_A_BILLION))
    return rows


def zero_section_rows() -> list[tuple]:
    """ZeRO §3.1's sizes of Ψ parameters: 2Ψ bytes of 16-bit weights and 16Ψ of mixed-precision Adam model
    states (:func:`bytes_per_parameter`), compared in whole GB."""
    per_parameter = dict(zip(MODEL_STATES, bytes_per_parameter("mixed", "adam")))
    rows = []
    for r in published.select(source="rajbhandari2020zero", where="§3.1"):
        psi = item_settings(r["item"])["psi"]
        label, states = SECTION_3_1[r["quantity"]]
        rows.append((f"Ψ = {psi / BILLION:g}B", label, SOURCES[r["source"], r["where"]],
                     r["value"] * UNIT_SCALE[r["unit"]], psi * sum(per_parameter[k] for k in states), BILLION))
    return rows


def zero_figure_rows() -> list[tuple]:
    """ZeRO's Fig. 1: model states per device at each stage (:func:`zero_model_state_bytes`), compared at
    :data:`TENTH_OF_A_BILLION` bytes (the figure prints GB to one decimal)."""
    rows = []
    for r in published.select(source="rajbhandari2020zero", where="Fig. 1"):
        setting = item_settings(r["item"])
        psi, n, stage = setting["psi"], setting["N"], setting["zero"]
        rows.append((f"Ψ = {psi / BILLION:g}B, N_d = {n}, ZeRO-{stage}", "model states per device (GB)",
                     SOURCES[r["source"], r["where"]], r["value"] * UNIT_SCALE[r["unit"]],
                     sum(zero_model_state_bytes(psi, n, stage)), TENTH_OF_A_BILLION))
    return rows


def published_comparison(rows) -> pd.DataFrame:
    """The rows of :func:`parameter_rows`, :func:`zero_section_rows`, :func:`zero_figure_rows` as a frame
    with the signed ``error`` (ours − published)/published and ``agrees``: both equal once rounded to
    ``unit``."""
    frame = pd.DataFrame(rows, columns=["model", "quantity", "source", "published", "ours", "unit"])
    frame["error"] = results.signed_error(frame.ours, frame.published)
    frame["agrees"] = (frame.ours / frame.unit).round() == (frame.published / frame.unit).round()
    return frame


def published_table(comparison: pd.DataFrame) -> pd.DataFrame:
    """The comparison as shown: published and ours in units of 10⁹, no rounding unit; format with
    :data:`PUBLISHED_FORMATS`."""
    show = comparison.assign(published=lambda d: d.published / BILLION, ours=lambda d: d.ours / BILLION)
    show = show.rename(columns={"published": "published (10⁹)", "ours": "ours (10⁹)", "error": "signed error"})
    return show.drop(columns="unit")


def worst(comparison: pd.DataFrame) -> pd.Series:
    """The row with the largest absolute signed error."""
    return comparison.loc[comparison.error.abs().idxmax()]


def worst_text(comparison: pd.DataFrame) -> str:
    """The largest difference from a published value, e.g. '-2.81% (megatron-1.7b, parameters)'."""
    row = worst(comparison)
    return f"{row.error:+.2%} ({row.model}, {row.quantity})"


def missed_text(comparison: pd.DataFrame) -> str:
    """The rows that do not agree, 'model (error)' joined by commas, or 'none'."""
    missed = comparison[~comparison.agrees]
    return ", ".join(f"{r.model} ({r.error:+.2%})" for r in missed.itertuples()) or "none"


# Verdict ----------------------------------------------------------------------------------------------

def statistics(fresh: pd.DataFrame, stages: pd.DataFrame, comparison: pd.DataFrame) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the share of counts equal to the real module's
    (parameters of every model, model states of every model that took a step, parameters of every pipeline stage)
    and the share of published values that agree after rounding."""
    steps = with_states(fresh)
    exact = (exact_count(fresh.predicted, fresh.parameters) + exact_count(steps.states_predicted, steps.states_meta)
             + int((stages.predicted == stages.parameters).sum()))
    return {"counts_exact": share(exact, len(fresh) + len(steps) + len(stages)),
            "published_agree": share(int(comparison.agrees.sum()), len(comparison))}


def reason(stats: dict, comparison: pd.DataFrame) -> str:
    """The two statistics in words, naming the published values that do not agree."""
    counts = ("every count equals the real module's" if stats["counts_exact"] == 1
              else f"{stats['counts_exact']:.0%} of the counts equal the real module's")
    missed = comparison[~comparison.agrees]
    if missed.empty:
        return f"{counts}, and every published value agrees after rounding"
    return (f"{counts}, but not every published value agrees after rounding: "
            + ", ".join(f"{r.model} {r.quantity} {r.error:+.2%}" for r in missed.itertuples()))

def finding(fresh: pd.DataFrame, comparison: pd.DataFrame) -> str:
    """The chapter's finding in one sentence: GPT-3's count in billions, how many models are exact on the
    meta device, how many published values agree, and the largest difference."""
    row = fresh[fresh.model == "gpt3-175b"].iloc[0]
    exact = exact_count(fresh.predicted, fresh.parameters)
    return (f"The cost model counts GPT-3's {row.parameters / BILLION:.2f} billion parameters; {exact} of "
            f"{len(fresh)} paper models are counted exactly as the real modules hold them on the meta device; "
            f"{count_of(comparison.agrees)} published values agree after rounding, the largest "
            f"difference {worst(comparison).error:+.2%}.")
