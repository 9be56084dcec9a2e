"""Where the time goes (``chapters/time_breakdown.md``): the measured split of each strategy's step
(:mod:`distperf.measure.breakdown`, one profiled step per run, the slowest rank) beside the cost model's terms.

- :func:`per_configuration`: one row per configuration of the timed experiments (:data:`EXPERIMENTS`, those of
  the noise floor and the two regimes) that measured a breakdown: its strategy, the measured classes as fractions of
  the profiled step, and the predicted terms (in the same classes with a profile's measured kernels, else compute,
  exposed communication and bubble) as fractions of the measured iteration;
- :func:`by_strategy`: the means of those per strategy; :func:`styled`: as the book shows it;
- :func:`draw`: measured and predicted bars per strategy;
- :func:`largest_share`, :func:`shortfalls`, :func:`compute_coverage`, :func:`framework_range`, :func:`fidelity`: the
  sentences;
- :func:`provenance_rows`: what the captions name.

Units: a class's fraction is its seconds in the breakdown step over that step's window (so that the classes of a
run sum to 1, whatever the profiler added), the predicted terms are seconds over the measured median iteration.
"""
from __future__ import annotations

import pandas as pd

from ..config import TIME_CLASSES as CLASSES
from . import rows
from . import noise
from .noise import strategy

EXPERIMENTS = noise.EXPERIMENTS + ("regimes",)  # the timed experiments on this machine's links, and the two regimes

PREFIX = "time_breakdown_s."
PREDICTED = ("compute", "communication_exposed", "bubble")
PREDICTED_CLASSES = ("matrix_products", "attention", "other_operators", "optimizer", "communication", "framework",
                     "bubble")
COMPUTING = ("matrix_products", "attention", "other_operators", "optimizer")
LABELS = {"matrix_products": "matrix products", "attention": "attention", "other_operators": "other operators",
          "optimizer": "optimizer", "communication": "communication", "framework": "framework and Python",
          "compute": "compute (predicted)", "communication_exposed": "exposed communication (predicted)",
          "bubble": "bubble (predicted)"}


def predicted_terms(frame) -> tuple:
    """The predicted terms a :func:`per_configuration` frame holds: the breakdown's classes, or the three terms."""
    return PREDICTED_CLASSES if "pred_matrix_products" in frame else PREDICTED


def per_configuration(tables: dict, hw=None) -> pd.DataFrame:
    """One row per configuration that has a breakdown (``ok`` runs of this build, repeats folded): ``experiment``,
    ``strategy``, ``model``, ``median_s`` (the measured iteration), ``window_s`` (the breakdown step), the
    fraction of each class of :data:`CLASSES` in that step, and ``pred_<term>`` (:data:`PREDICTED`) over
    ``median_s``; also ``pred_total`` (the predicted iteration over the measured one). With ``hw`` (a profile with
    measured kernels) the predicted terms are those of ``hw`` in the classes of the breakdown
    (:func:`distperf.analysis.time_model.predicted_classes`, :data:`PREDICTED_CLASSES`), else the run's own."""
    parts = []
    for name, table in tables.items():
        if table is None or not len(table) or not rows.has(table, PREFIX + "window"):
            continue
        runs = rows.ok(table[table["source"] == "fresh"] if "source" in table else table)
        runs = runs[runs[PREFIX + "window"].notna()]
        if not len(runs):
            continue
        window = runs[PREFIX + "window"].astype(float)
        median = runs["iteration_time_s.median"].astype(float)
        part = pd.DataFrame({"experiment": name, "strategy": runs.apply(strategy, axis=1),
                             "model": runs["config.model.name"], "median_s": median, "window_s": window})
        for c in CLASSES:
            part[c] = runs[PREFIX + c].astype(float) / window
        if hw is not None and hw.kernels is not None:
            from .time_model import predicted_classes

            predicted = pd.DataFrame([predicted_classes(rows.config_of_row(r), rows.run_hardware(hw, r),
                                                        rows.bucket_bytes(r))
                                      for _, r in runs.iterrows()],
                                     index=runs.index)
            for term in PREDICTED_CLASSES:
                part[f"pred_{term}"] = predicted[term] / median
            part["pred_total"] = predicted.sum(axis=1) / median
        else:
            for term in PREDICTED:
                part[f"pred_{term}"] = runs[f"prediction.time_s.{term}"].astype(float) / median
            part["pred_total"] = runs["prediction.time_s.iteration"].astype(float) / median
        parts.append(part)
    columns = ["experiment", "strategy", "model", "median_s", "window_s", *CLASSES,
               *[f"pred_{t}" for t in PREDICTED], "pred_total"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def by_strategy(per: pd.DataFrame) -> pd.DataFrame:
    """The mean of each fraction over a strategy's configurations (means, so that the classes still sum to 1),
    with ``configurations`` and the median ``median_s`` (ms, as ``iteration (ms)``), sorted by the share of matrix
    products."""
    terms = predicted_terms(per)
    if not len(per):
        return pd.DataFrame(columns=["strategy", "configurations", "iteration (ms)", *CLASSES,
                                     *[f"pred_{t}" for t in terms], "pred_total"])
    grouped = per.groupby("strategy")
    table = grouped[[*CLASSES, *[f"pred_{t}" for t in terms], "pred_total"]].mean()
    table.insert(0, "iteration (ms)", grouped.median_s.median() * 1e3)
    table.insert(0, "configurations", grouped.size())
    return table.reset_index().sort_values("matrix_products", ascending=False, ignore_index=True)


def styled(table):
    """:func:`by_strategy` with percentages and the classes named as the book names them."""
    shown = table.rename(columns={**LABELS, **{f"pred_{t}": f"{LABELS[t].removesuffix(' (predicted)')} (predicted)"
                                               for t in predicted_terms(table)},
                                  "pred_total": "predicted iteration"})
    percent = [c for c in shown.columns if c not in ("strategy", "configurations", "iteration (ms)")]
    return shown.style.format({**{c: "{:.0%}" for c in percent}, "iteration (ms)": "{:.1f}"}).hide(axis="index")


def draw(ax, table) -> None:
    """Per strategy two stacked bars: the measured classes (fractions of the step, summing to 1) and the
    predicted terms (fractions of the measured iteration: their sum is the predicted iteration over the
    measured one)."""
    import numpy as np
    import seaborn as sns

    from ..plots import PALETTE

    colours = dict(zip(CLASSES, sns.color_palette(PALETTE, len(CLASSES))))
    predicted_colours = {**colours, "compute": colours["matrix_products"],
                         "communication_exposed": colours["communication"], "bubble": "lightgrey"}
    y = np.arange(len(table))
    left = np.zeros(len(table))
    for c in CLASSES:
        ax.barh(y - 0.2, table[c], 0.38, left=left, color=colours[c], label=LABELS[c])
        left += table[c].to_numpy()
    left = np.zeros(len(table))
    for term in predicted_terms(table):
        values = table[f"pred_{term}"].to_numpy()
        ax.barh(y + 0.2, values, 0.38, left=left, color=predicted_colours[term], hatch="//", edgecolor="white",
                label=LABELS[term] if term in PREDICTED else None)
        left += values
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(y, table.strategy)
    ax.invert_yaxis()
    ax.set_xlabel("fraction of the measured step (upper bar) and of the measured iteration (lower bar, predicted)")
    ax.legend(fontsize="x-small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18))


def largest_share(table) -> str:
    """Which measured class is the largest in how many strategies, in words."""
    if not len(table):
        return "no strategy was measured"
    largest = table[list(CLASSES)].astype(float).idxmax(axis=1)
    counts = largest.value_counts()
    return "; ".join(f"{LABELS[c]} in {n} of {len(table)} strategies" for c, n in counts.items())


def shortfalls(table, strategies) -> str:
    """For each of ``strategies`` (in that order), the class of :func:`by_strategy`'s ``table`` whose predicted share of
    the measured iteration falls furthest below its measured share of the breakdown step (the predicted bubble
    counted with communication, which is where the profiler puts a pipeline's waits), in words; needs the predicted
    classes of a profile with measured kernels."""
    if not len(table) or "pred_matrix_products" not in table:
        return "not measured in classes"
    out = []
    for name in strategies:
        found = table[table.strategy == name]
        if not len(found):
            continue
        row = found.iloc[0]
        predicted = {c: float(row[f"pred_{c}"]) for c in CLASSES}
        predicted["communication"] += float(row["pred_bubble"])
        gap = {c: float(row[c]) - predicted[c] for c in CLASSES}
        c = max(gap, key=gap.get)
        out.append(f"{name}: {LABELS[c]} (measured {float(row[c]):.0%} of the step, predicted {predicted[c]:.0%})")
    return "; ".join(out) if out else "no such strategy was measured"


def compute_coverage(per) -> str:
    """The cost model's compute term (a fraction of the measured iteration) over the measured computing share of
    the step (matrix products, attention, other operators and optimizer), as the median and range over
    configurations."""
    if not len(per):
        return "not measured"
    computed = per.pred_compute if "pred_compute" in per else per[[f"pred_{c}" for c in COMPUTING]].sum(axis=1)
    ratio = (computed / per[list(COMPUTING)].sum(axis=1)).dropna()
    return f"a median {ratio.median():.0%} (from {ratio.min():.0%} to {ratio.max():.0%})"


def framework_range(per) -> str:
    """The range over configurations of the framework-and-Python share of a step."""
    return f"{per.framework.min():.0%} to {per.framework.max():.0%}" if len(per) else "not measured"


def fidelity(per) -> str:
    """How long the profiled breakdown step took against the timed iteration: the median and range of the
    ratio window / median."""
    if not len(per):
        return "not measured"
    ratio = per.window_s / per.median_s
    return f"{ratio.median():.2f}× (from {ratio.min():.2f}× to {ratio.max():.2f}×)"


def provenance_rows(tables: dict) -> pd.DataFrame:
    """The provenance columns (and ``source``) of every row of ``tables``, one frame: what the chapter's captions
    name."""
    from ..results import PROVENANCE_COLUMNS

    keep = [*PROVENANCE_COLUMNS, "source"]
    return pd.concat([t[[c for c in keep if c in t]] for t in tables.values() if t is not None and len(t)],
                     ignore_index=True)
