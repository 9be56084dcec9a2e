"""Memory anatomy of one device (``chapters/memory_anatomy.md``): each category the single-device trainer measured
(``notebooks/memory_anatomy.ipynb``, one row per model, micro-batch, sequence, precision and recomputation) beside
the cost model's, the axes varied around the base configuration, and the verdict on the claim that the framework
predicts every category.

- :func:`predicted_categories`, :func:`with_predictions`: the prediction of each category and the signed errors;
- :func:`base_of`, :func:`base_description`, :func:`axis`: the base configuration, and the rows of one axis;
- :func:`error_table`, :func:`styled_error_table`: the table of errors per category;
- :func:`states_exact`, :func:`states_agreement`, :func:`mixed_precision_errors`, :func:`fp32_without_recomputation`,
  :func:`worst_on_sequence_axis`, :func:`selective_saving`, :func:`full_recomputation_errors`,
  :func:`mixed_activation_ratio`: the numbers the prose quotes;
- :func:`within_tolerance`, :func:`verdict`, :func:`finding`, :func:`reason`: the verdict and its sentences;
- :func:`draw_activations`, :func:`category_sizes`, :func:`draw_categories`: the two figures, one machine each.
"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from .. import presets
from ..config import MODEL_STATES, Config, Layout, Training
from ..cost import activations as act
from ..cost import predict
from ..cost.model_states import bytes_per_parameter
from ..results import signed_error
from .measured_vs_predicted import error_range

STATES = list(MODEL_STATES)
CATEGORIES = STATES + ["activations"]
KEYS = ["model", "batch", "seq", "precision", "recompute"]
TOLERANCE = 0.10  # the verdict's criterion: fp32 activations within ±10 % of the published count
EXACT = 1e-12  # a signed error below this is exact, to the byte
ACTIVATION_PANELS = [("batch", "micro-batch b"), ("seq", "sequence length s"), ("recompute", "recomputation")]
ERROR_COLUMNS = {"batch": "b", "seq": "s", "parameter_count": "Ψ", "err_parameters": "parameters",
                 "err_gradients": "gradients", "err_optimizer_states": "optimizer states", "err_states": "all three",
                 "activations": "act. measured (MiB)", "pred_activations": "act. predicted (MiB)",
                 "err_activations": "activations", "err_activations_no_scores": "activations without scores"}


def predicted_categories(row) -> pd.Series:
    """The cost model's bytes of each category for one measured row (its preset model at the row's sequence,
    micro-batch, recomputation and precision): ``pred_<state>``; ``pred_activations``, the stash without the
    one-layer recomputation working set (``pred_working``, which the measurement files under temporaries); and
    ``pred_scores``, the attention scores L·a·s²·b values of Korthikanti's count that fused attention does not
    keep (none with recomputation)."""
    spec = replace(presets.model(row.model), seq=int(row.seq))
    cfg = Config(model=spec, layout=Layout(micro_batch=int(row.batch), recompute=row.recompute),
                 training=Training(precision=row.precision))
    predicted = predict(cfg)["memory_bytes"]
    value_bytes = 2 if row.precision == "mixed" else 4
    s, b, h, a = spec.seq, int(row.batch), spec.hidden, spec.heads
    working = act.recompute_working_bytes(s, b, h, a, 1, False, spec.dropout > 0, value_bytes, row.recompute)
    scores = spec.layers * a * s * s * b * value_bytes if row.recompute == "none" else 0
    return pd.Series({**{f"pred_{k}": predicted[k] for k in STATES},
                      "pred_activations": predicted["activations"] - working, "pred_scores": scores,
                      "pred_working": working})


def with_predictions(mem):
    """``mem`` with :func:`predicted_categories` beside each row and the signed errors (predicted − measured)/measured
    ``err_<category>``; also the model states summed (``states``, ``pred_states``, ``err_states``) and the
    activations predicted without the scores (``pred_activations_no_scores``, ``err_activations_no_scores``)."""
    mem = pd.concat([mem, mem.apply(predicted_categories, axis=1)], axis=1)
    for k in CATEGORIES:
        mem[f"err_{k}"] = signed_error(mem[f"pred_{k}"], mem[k])
    mem["pred_activations_no_scores"] = mem.pred_activations - mem.pred_scores
    mem["err_activations_no_scores"] = signed_error(mem.pred_activations_no_scores, mem.activations)
    mem["states"] = mem[STATES].sum(axis=1)
    mem["pred_states"] = mem[[f"pred_{k}" for k in STATES]].sum(axis=1)
    mem["err_states"] = signed_error(mem.pred_states, mem.states)
    return mem


def base_of(rows) -> dict:
    """The base configuration, the one every axis shares: the most frequent value of each of :data:`KEYS`."""
    return {k: rows[k].mode().iloc[0] for k in KEYS}


def base_description(base: dict) -> str:
    """The base configuration in words."""
    return (f"model {base['model']}, micro-batch {base['batch']}, sequence {base['seq']}, {base['precision']}, "
            f"recomputation {base['recompute']}")


def axis(name: str, rows):
    """The rows of one axis: the other keys at the base of ``rows`` (a model keeps its own sequence length, the
    base model its base sequence), sorted along the axis where it is a number (batch, seq)."""
    selected, base = rows, base_of(rows)
    for k in KEYS:
        if k != name and not (name == "model" and k == "seq"):
            selected = selected[selected[k] == base[k]]
    if name == "model":
        selected = selected[(selected.model != base["model"]) | (selected.seq == base["seq"])]
    return selected.sort_values(name) if name in ("batch", "seq") else selected


def error_table(mem):
    """The table of signed errors per category and row, and the activations measured and predicted in MiB, its
    columns named as the book shows them."""
    table = mem[["machine"] + KEYS + ["parameter_count", "err_parameters", "err_gradients", "err_optimizer_states",
                                       "err_states", "activations", "pred_activations", "err_activations",
                                       "err_activations_no_scores"]].copy()
    table["activations"] /= 2**20
    table["pred_activations"] /= 2**20
    return table.rename(columns=ERROR_COLUMNS)


def styled_error_table(table):
    """:func:`error_table` with signed percentages, Ψ with thousands separators and MiB to two decimals."""
    percent = {c: "{:+.0%}" for c in ["parameters", "gradients", "optimizer states", "all three", "activations",
                                      "activations without scores"]}
    return table.style.format({**percent, "Ψ": "{:,}", "act. measured (MiB)": "{:.2f}",
                               "act. predicted (MiB)": "{:.2f}"}).hide(axis="index")


def states_exact(fresh) -> bool:
    """Whether every fp32 row's model states (each of the three) are predicted exactly (error below :data:`EXACT`)."""
    fp32 = fresh[fresh.precision == "fp32"]
    return bool((fp32[[f"err_{k}" for k in STATES]].abs() < EXACT).all().all())


def states_agreement(fresh) -> str:
    """How closely the fp32 model states are predicted: 'exactly, to the byte', else the largest error."""
    if states_exact(fresh):
        return "exactly, to the byte"
    fp32 = fresh[fresh.precision == "fp32"]
    return f"to within {fp32[[f'err_{k}' for k in STATES]].abs().max().max():.1%}"


def mixed_precision_errors(fresh) -> str:
    """The median signed error of each model state (and of their sum) over the mixed-precision rows."""
    mixed = fresh[fresh.precision == "mixed"]
    if not len(mixed):
        return "not measured at this scale"
    return (f"parameters {mixed.err_parameters.median():+.0%}, gradients {mixed.err_gradients.median():+.0%}, "
            f"optimizer states {mixed.err_optimizer_states.median():+.0%}, all three {mixed.err_states.median():+.0%}")


def fp32_without_recomputation(fresh):
    """The fp32 rows without recomputation: where Korthikanti's count is checked."""
    fp32 = fresh[fresh.precision == "fp32"]
    return fp32[fp32.recompute == "none"]


def worst_on_sequence_axis(fresh) -> str:
    """The activations' largest error along the sequence axis, and where: '+e% at s = …'."""
    seq_axis = axis("seq", fresh)
    worst = seq_axis.loc[seq_axis.err_activations.abs().idxmax()]
    return f"{worst.err_activations:+.0%} at s = {worst.seq}"


def selective_saving(fresh) -> str:
    """The activations selective recomputation saves, 1 − selective/none, at the base configuration (the first
    selective row of the base precision against the base row); '—' without them."""
    base = base_of(fresh)
    selective = fresh[(fresh.recompute == "selective") & (fresh.precision == base["precision"])]
    plain = fresh[(fresh.recompute == "none") & (fresh.precision == base["precision"]) & (fresh.model == base["model"])
                  & (fresh.batch == base["batch"]) & (fresh.seq == base["seq"])]
    if not (len(selective) and len(plain)):
        return "—"
    return f"{1 - selective.activations.iloc[0] / plain.activations.iloc[0]:.1%}"


def full_recomputation_errors(fresh) -> str:
    """The range of the activations' errors with full recomputation (all precisions); '—' without such rows."""
    full = fresh[fresh.recompute == "full"]
    return error_range(full.err_activations) if len(full) else "—"


def mixed_activation_ratio(fresh) -> str:
    """Mixed-precision activations over fp32 ones, first mixed row without recomputation against the fp32 row of
    the same model, micro-batch and sequence; '—' where either is missing."""
    mixed = fresh[fresh.precision == "mixed"]
    if not len(mixed):
        return "—"
    first = mixed[mixed.recompute == "none"].iloc[0]
    fp32 = fresh[fresh.precision == "fp32"]
    ref = fp32[(fp32.recompute == "none") & (fp32.model == first.model) & (fp32.batch == first.batch)
               & (fp32.seq == first.seq)]
    return f"{first.activations / ref.activations.iloc[0]:.2f}" if len(ref) else "—"


def within_tolerance(errors, tolerance: float = TOLERANCE) -> bool:
    """Whether every signed error lies within ±``tolerance``."""
    return bool((errors.abs() <= tolerance).all())


def verdict(exact: bool, activations_ok: bool, without_scores_ok: bool) -> str:
    """'reproduced' when the fp32 model states are exact and the activations within tolerance; else 'depends'
    when the states are exact or the activations are within tolerance once the scores are left out; else
    'not reproduced'."""
    if exact and activations_ok:
        return "reproduced"
    return "depends" if exact or without_scores_ok else "not reproduced"


def finding(fp32_act, exact: bool) -> str:
    """The verdict's finding: how the fp32 model states match, and the activation count's largest miss (with and
    without the attention scores)."""
    worst = fp32_act.loc[fp32_act.err_activations.abs().idxmax()]
    per_parameter = sum(bytes_per_parameter("fp32", "adam"))
    return (f"One device's fp32 model states match the {per_parameter} bytes per parameter "
            f"{'exactly' if exact else 'closely'}; Korthikanti's activation count misses by up to "
            f"{worst.err_activations:+.0%} ({worst.model}, s = {worst.seq}) because fused attention stores no s×s "
            f"scores, and by at most {fp32_act.err_activations_no_scores.abs().max():.0%} without them.")


def reason(exact: bool, activations_ok: bool, without_scores_ok: bool) -> str:
    """The criterion's result in words: the model states, then the activations (and without the scores)."""
    states = "fp32 model states are exact" if exact else "fp32 model states are not exact"
    activations = (f"fp32 activations {'lie' if activations_ok else 'do not all lie'} within ±{TOLERANCE:.0%} of "
                   "Korthikanti's count")
    if not activations_ok:
        activations += f", and {'do' if without_scores_ok else 'do not'} once the s×s scores are left out"
    return f"{states}; {activations}"


def draw_activations(sub, rows) -> None:
    """Activations against micro-batch, sequence and recomputation (:data:`ACTIVATION_PANELS`) for one machine's
    rows: measured points, Korthikanti's count dashed, the count without the scores dotted."""
    import numpy as np
    import seaborn as sns

    from ..plots import PALETTE

    colours = sns.color_palette(PALETTE, 3)
    axes = sub.subplots(1, len(ACTIVATION_PANELS), sharey=False)
    for ax, (name, label) in zip(axes, ACTIVATION_PANELS):
        part = axis(name, rows)
        xs = np.arange(len(part)) if name == "recompute" else part[name].to_numpy()
        ax.scatter(xs, part.activations / 2**20, color=colours[0], s=50, zorder=3, label="measured (saved tensors)")
        ax.plot(xs, part.pred_activations / 2**20, ls="--", color=colours[1], marker="+",
                label="predicted (Korthikanti)")
        ax.plot(xs, part.pred_activations_no_scores / 2**20, ls=":", color=colours[2], marker="x",
                label="predicted, without the s×s scores")
        if name == "recompute":
            ax.set_xticks(xs, part.recompute)
        else:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(v) for v in xs])
        ax.set_xlabel(label)
    axes[0].set_ylabel("activations (MiB)")
    axes[0].legend(fontsize="x-small")


def category_sizes(rows):
    """The bars of the categories figure, long: for each model size (at the base precision) and the base model
    in each precision, one row per category with ``label``, ``category``, ``measured`` and ``predicted`` bytes."""
    sizes = pd.concat([axis("model", rows), axis("precision", rows)]).drop_duplicates(subset=KEYS)
    sizes = sizes.assign(label=sizes.model + ", s = " + sizes.seq.astype(str) + ", " + sizes.precision)
    return pd.concat([sizes.assign(category=k.replace("_", " "), measured=sizes[k], predicted=sizes[f"pred_{k}"])
                      for k in CATEGORIES], ignore_index=True)


def draw_categories(sub, rows) -> None:
    """:func:`category_sizes` of one machine's rows as bars (measured) and marks (predicted), MiB on a log scale."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from ..plots import category_bars

    category_bars(category_sizes(rows), label="label", category="category", measured="measured",
                  predicted="predicted", ylabel="MiB (log scale)", scale=2**20, fig=sub)
    for ax in sub.axes:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
