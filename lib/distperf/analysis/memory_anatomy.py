"""Memory anatomy of one device (``chapters/memory_anatomy.md``): each category the single-device trainer measured
(``notebooks/memory_anatomy.ipynb``, one row per model, micro-batch, sequence, precision, recomputation and
attention implementation) beside two predictions — the cost model's count of what the trainer runs
(``convention="trainer"``, at the row's attention) and Korthikanti et al.'s published count (``convention="paper"``
with unfused attention) — the allocator's peak beside the tensors', and the verdict.

- :func:`predicted_categories`, :func:`with_predictions`: both predictions of each category, the signed errors and
  the allocator's gap;
- :func:`base_of`, :func:`base_description`, :func:`axis`: the base configuration, and the rows of one axis;
- :func:`error_table`, :func:`styled_error_table`, :func:`allocator_table`, :func:`styled_allocator_table`: the
  tables;
- :func:`worst`, :func:`paper_count_errors`, :func:`selective_saving`, :func:`mixed_activation_ratio`,
  :func:`allocator_gap_range`: the numbers the prose quotes;
- :func:`statistics`, :func:`finding`: what the verdict's rule decides on, and the finding;
- :func:`draw_activations`, :func:`category_sizes`, :func:`draw_categories`: the two figures, one machine each.
"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from .. import presets
from ..config import MODEL_STATES, Config, Layout, Training
from ..cost import predict
from ..results import signed_error
from .verdicts import threshold

STATES = list(MODEL_STATES)
CATEGORIES = STATES + ["activations"]
KEYS = ["model", "batch", "seq", "precision", "recompute", "attention"]
# the verdict's rule, declared before the data: every model state within ±0.5 % and every row's activations
# within ±2 % of the trainer's count
STATES_TOLERANCE = threshold("memory_anatomy", "states_error")
ACTIVATIONS_TOLERANCE = threshold("memory_anatomy", "activations_error")
ACTIVATION_PANELS = [("batch", "micro-batch b"), ("seq", "sequence length s"), ("recompute", "recomputation"),
                     ("attention", "attention")]
ERROR_COLUMNS = {"batch": "b", "seq": "s", "parameter_count": "Ψ", "err_parameters": "parameters",
                 "err_gradients": "gradients", "err_optimizer_states": "optimizer states", "err_states": "all three",
                 "activations": "act. measured (MiB)", "pred_activations": "act. predicted (MiB)",
                 "err_activations": "activations", "err_paper_activations": "Korthikanti's count"}
ALLOCATOR_COLUMNS = {"batch": "b", "seq": "s", "tensor_peak_increase": "tensors (MiB)",
                     "allocator_peak_increase": "allocator (MiB)", "allocator_gap": "allocator − tensors (MiB)",
                     "allocator_ratio": "allocator / tensors"}


def _config(row, attention: str) -> Config:
    spec = replace(presets.model(row.model), seq=int(row.seq), attention=attention)
    return Config(model=spec, layout=Layout(micro_batch=int(row.batch), recompute=row.recompute),
                  training=Training(precision=row.precision))


def predicted_categories(row) -> pd.Series:
    """Both predictions for one measured row (its preset model at the row's sequence, micro-batch, recomputation,
    precision and attention, ``sdpa`` where the row has none): ``pred_<category>``, the cost model's count of what
    the trainer runs, its activations being the stash (the one-layer recomputation working set, which the
    measurement files under temporaries, is ``pred_working``); ``paper_<category>``, Korthikanti's count with
    unfused attention and ZeRO's mixed-precision bytes (``convention="paper"``), what the papers publish."""
    attention = getattr(row, "attention", "sdpa")
    attention = "sdpa" if pd.isna(attention) else attention
    trainer = predict(_config(row, attention))["memory_bytes"]
    paper = predict(_config(row, "math"), convention="paper")["memory_bytes"]
    return pd.Series({**{f"pred_{k}": trainer[k] for k in CATEGORIES}, "pred_working": trainer["recompute_working"],
                      **{f"paper_{k}": paper[k] for k in CATEGORIES}})


def with_predictions(mem):
    """``mem`` (``attention`` filled with ``sdpa`` where a row lacks it) with :func:`predicted_categories` beside
    each row and the signed errors (predicted − measured)/measured: ``err_<category>`` for the trainer's count,
    ``err_paper_<category>`` for the paper's; the model states summed (``states``, ``pred_states``,
    ``err_states``); and the allocator beside the tensors: ``tensor_peak_increase`` (the step's tensor peak over
    the tensors held when it began), ``allocator_peak_increase`` (CPU: the resident set's peak over its start;
    CUDA: ``max_memory_allocated`` over the tensors at the start), their difference ``allocator_gap`` and ratio
    ``allocator_ratio``."""
    mem = mem.copy()
    mem["attention"] = mem["attention"].fillna("sdpa") if "attention" in mem else "sdpa"
    mem = pd.concat([mem, mem.apply(predicted_categories, axis=1)], axis=1)
    for k in CATEGORIES:
        mem[f"err_{k}"] = signed_error(mem[f"pred_{k}"], mem[k])
        mem[f"err_paper_{k}"] = signed_error(mem[f"paper_{k}"], mem[k])
    mem["states"] = mem[STATES].sum(axis=1)
    mem["pred_states"] = mem[[f"pred_{k}" for k in STATES]].sum(axis=1)
    mem["err_states"] = signed_error(mem.pred_states, mem.states)
    start_columns = [c for c in mem if str(c).startswith("at_start.")]
    start = mem[start_columns].sum(axis=1, min_count=1) if start_columns else float("nan")
    mem["tensor_peak_increase"] = mem["total"] - start
    if "cuda_max_allocated" in mem and mem["cuda_max_allocated"].notna().any():
        mem["allocator_peak_increase"] = mem["cuda_max_allocated"] - start
    else:
        mem["allocator_peak_increase"] = mem["rss_peak_increase"] if "rss_peak_increase" in mem else float("nan")
    mem["allocator_gap"] = mem.allocator_peak_increase - mem.tensor_peak_increase
    mem["allocator_ratio"] = mem.allocator_peak_increase / mem.tensor_peak_increase
    return mem


def base_of(rows) -> dict:
    """The base configuration, the one every axis shares: the most frequent value of each of :data:`KEYS`."""
    return {k: rows[k].mode().iloc[0] for k in KEYS}


def base_description(base: dict) -> str:
    """The base configuration in words."""
    return (f"model {base['model']}, micro-batch {base['batch']}, sequence {base['seq']}, {base['precision']}, "
            f"recomputation {base['recompute']}, {base['attention']} attention")


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
    """The table of signed errors per category and row (the trainer's count; the last column Korthikanti's count of
    the activations), and the activations measured and predicted in MiB, its columns named as the book shows
    them."""
    table = mem[["machine"] + KEYS + ["parameter_count", "err_parameters", "err_gradients", "err_optimizer_states",
                                       "err_states", "activations", "pred_activations", "err_activations",
                                       "err_paper_activations"]].copy()
    table["activations"] /= 2**20
    table["pred_activations"] /= 2**20
    return table.rename(columns=ERROR_COLUMNS)


def styled_error_table(table):
    """:func:`error_table` with signed percentages (one decimal), Ψ with thousands separators, MiB to two
    decimals."""
    percent = {c: "{:+.1%}" for c in ["parameters", "gradients", "optimizer states", "all three", "activations",
                                      "Korthikanti's count"]}
    return table.style.format({**percent, "Ψ": "{:,}", "act. measured (MiB)": "{:.2f}",
                               "act. predicted (MiB)": "{:.2f}"}).hide(axis="index")


def allocator_table(mem):
    """The allocator's peak increase over the step beside the tensors' (MiB), their gap and ratio, per row."""
    table = mem[["machine"] + KEYS + list(ALLOCATOR_COLUMNS)[2:]].copy()
    for c in ("tensor_peak_increase", "allocator_peak_increase", "allocator_gap"):
        table[c] /= 2**20
    return table.rename(columns=ALLOCATOR_COLUMNS)


def styled_allocator_table(table):
    """:func:`allocator_table` with MiB to two decimals and the ratio to two."""
    return table.style.format({c: "{:.2f}" for c in list(ALLOCATOR_COLUMNS.values())[2:]}).hide(axis="index")


def worst(fresh, column: str) -> str:
    """The largest |signed error| of ``column`` over the rows, and where: '+e% (model, b, s, precision,
    recomputation, attention)'."""
    row = fresh.loc[fresh[column].abs().idxmax()]
    return (f"{row[column]:+.2%} ({row.model}, b = {row.batch}, s = {row.seq}, {row.precision}, "
            f"{row.recompute}, {row.attention})")


def paper_count_errors(fresh, attention: str) -> str:
    """The range of Korthikanti's count's errors on the fp32 rows without recomputation that ran ``attention``;
    '—' where there are none."""
    part = fresh[(fresh.precision == "fp32") & (fresh.recompute == "none") & (fresh.attention == attention)]
    errors = part.err_paper_activations
    return f"{errors.min():+.1%} to {errors.max():+.1%}" if len(part) else "—"


def selective_saving(fresh, attention: str = "sdpa") -> str:
    """The activations selective recomputation saves, 1 − selective/none, at the base configuration with
    ``attention``; '—' without both rows."""
    base = {**base_of(fresh), "attention": attention}
    at = fresh
    for k in ("model", "batch", "seq", "precision", "attention"):
        at = at[at[k] == base[k]]
    selective, plain = at[at.recompute == "selective"], at[at.recompute == "none"]
    if not (len(selective) and len(plain)):
        return "—"
    return f"{1 - selective.activations.iloc[0] / plain.activations.iloc[0]:.1%}"


def mixed_activation_ratio(fresh) -> str:
    """Mixed-precision activations over fp32 ones, first mixed row without recomputation against the fp32 row of
    the same model, micro-batch, sequence and attention; '—' where either is missing."""
    mixed = fresh[(fresh.precision == "mixed") & (fresh.recompute == "none")]
    if not len(mixed):
        return "—"
    first = mixed.iloc[0]
    ref = fresh[(fresh.precision == "fp32") & (fresh.recompute == "none") & (fresh.model == first.model)
                & (fresh.batch == first.batch) & (fresh.seq == first.seq) & (fresh.attention == first.attention)]
    return f"{first.activations / ref.activations.iloc[0]:.2f}" if len(ref) else "—"


def allocator_gap_range(fresh) -> str:
    """The range of the allocator's peak increase over the tensors', as a ratio, over the rows that have it."""
    ratio = fresh.allocator_ratio.dropna()
    return f"{ratio.min():.2f}× to {ratio.max():.2f}×" if len(ratio) else "not measured"


def statistics(fresh) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the largest |error| of a model state and of a
    row's activations against the trainer's count."""
    return {"states_error": float(fresh[[f"err_{k}" for k in STATES]].abs().max().max()),
            "activations_error": float(fresh.err_activations.abs().max())}


def finding(fresh) -> str:
    """The verdict's finding: where Korthikanti's count lands against the measurement, fused and unfused."""
    return (f"Korthikanti's published count, on the fp32 rows without recomputation, misses the unfused "
            f"(`math`) attention by {paper_count_errors(fresh, 'math')} and the fused (`sdpa`) attention the "
            f"trainers use by default by {paper_count_errors(fresh, 'sdpa')}.")


def draw_activations(sub, rows) -> None:
    """Activations against micro-batch, sequence, recomputation and attention (:data:`ACTIVATION_PANELS`) for one
    machine's rows: measured points, the trainer's count dashed, Korthikanti's count dotted."""
    import numpy as np
    import seaborn as sns

    from ..plots import PALETTE

    colours = sns.color_palette(PALETTE, 3)
    axes = sub.subplots(1, len(ACTIVATION_PANELS), sharey=False)
    for ax, (name, label) in zip(axes, ACTIVATION_PANELS):
        part = axis(name, rows)
        categorical = name in ("recompute", "attention")
        xs = np.arange(len(part)) if categorical else part[name].to_numpy()
        ax.scatter(xs, part.activations / 2**20, color=colours[0], s=50, zorder=3, label="measured (saved tensors)")
        ax.plot(xs, part.pred_activations / 2**20, ls="--", color=colours[1], marker="+",
                label="predicted (what the trainer runs)")
        ax.plot(xs, part.paper_activations / 2**20, ls=":", color=colours[2], marker="x",
                label="Korthikanti's count (unfused)")
        if categorical:
            ax.set_xticks(xs, part[name])
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
