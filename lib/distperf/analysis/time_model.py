"""The time model against measured iterations (``chapters/time_breakdown.md``, sections from "The kernel time
model" on): which term of the analytical prediction closes which part of the error, and how far each mode is from
the measurement on the configurations held out of every fit.

- :data:`LADDER`: the cumulative ablation, each step the hardware profile with one more term of
  :mod:`distperf.cost.kernels` switched on; :func:`ablation`: every configuration's signed error at every step;
- :func:`held_out`: the rows a validation may use (the fit's preset, :data:`distperf.measure.kernels.STEP_FIT_MODEL`,
  left out); :func:`errors`: per configuration the analytical (every term) and profiled signed errors;
- :func:`goal_table`, :data:`GOALS`: median and largest |error| per mode against the goals declared before the data;
- :func:`by_strategy`, :func:`draw_ablation`, :func:`by_regime`: the tables and the figure;
- :func:`predicted_classes`: the predicted iteration in the classes of the measured breakdown.

Errors are signed, (predicted − measured) / measured median iteration: negative means too fast.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ..cost import kernels as kn
from ..measure.kernels import STEP_FIT_MODEL
from ..results import signed_error
from . import rows
from .noise import strategy

# label, the hardware variant: each step adds one term to the one before
LADDER = (
    ("FLOPs at the best GEMM rate", lambda hw: replace(hw, kernels=None)),
    ("+ kernels by shape", lambda hw: replace(hw, kernels=hw.kernels.without("optimizer", "framework"))),
    ("+ optimizer per tensor", lambda hw: replace(hw, kernels=hw.kernels.without("framework"))),
    ("+ framework costs", lambda hw: hw),
)
# declared before the data (the acceptance): median and largest |signed error| of the iteration time
GOALS = {"analytical": (0.10, 0.25), "profiled": (0.05, 0.15)}


def _frame(tables: dict) -> pd.DataFrame:
    parts = []
    for name, table in tables.items():
        if table is None or not len(table):
            continue
        runs = rows.ok(table[table["source"] == "fresh"] if "source" in table else table)
        runs = runs[runs["iteration_time_s.median"].notna()]
        if len(runs):
            runs = runs.assign(experiment=name)
            parts.append(runs)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def ablation(tables: dict, hw) -> pd.DataFrame:
    """One row per configuration and step of :data:`LADDER`: ``experiment``, ``strategy``, ``model``, ``step`` (its
    label), ``order``, ``measured_s``, ``predicted_s`` and the signed ``error``. Empty without measured kernels."""
    frame = _frame(tables)
    if hw is None or hw.kernels is None or not len(frame):
        return pd.DataFrame(columns=["experiment", "strategy", "model", "step", "order", "measured_s", "predicted_s",
                                     "error"])
    out = []
    for order, (label, variant) in enumerate(LADDER):
        predicted = rows.with_predictions(frame, variant(hw), check=False)
        out.append(pd.DataFrame({"experiment": frame.experiment, "strategy": frame.apply(strategy, axis=1),
                                 "model": frame["config.model.name"], "step": label, "order": order,
                                 "measured_s": predicted.measured_s, "predicted_s": predicted.predicted_s}))
    table = pd.concat(out, ignore_index=True)
    table["error"] = signed_error(table.predicted_s, table.measured_s)
    return table


def held_out(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of configurations no constant was fitted on: every model but :data:`STEP_FIT_MODEL`."""
    return frame[frame["model"] != STEP_FIT_MODEL]


def errors(tables: dict, hw) -> pd.DataFrame:
    """Per held-out configuration: ``experiment``, ``strategy``, ``model``, ``measured_s``, and the signed errors of
    the ``analytical`` mode (every term of the kernel time model on ``hw``) and the ``profiled`` one (the run's own
    prediction from profiled layer times; NaN where it had none)."""
    frame = _frame(tables)
    if hw is None or not len(frame):
        return pd.DataFrame(columns=["experiment", "strategy", "model", "measured_s", "analytical", "profiled"])
    predicted = rows.with_predictions(frame, hw, check=False)
    out = pd.DataFrame({"experiment": frame.experiment, "strategy": frame.apply(strategy, axis=1),
                        "model": frame["config.model.name"], "measured_s": predicted.measured_s,
                        "analytical": signed_error(predicted.predicted_s, predicted.measured_s),
                        "profiled": signed_error(predicted.profiled_s.astype(float), predicted.measured_s)})
    return held_out(out).reset_index(drop=True)


def goal_table(errs: pd.DataFrame) -> pd.DataFrame:
    """Per mode: configurations, median and largest |signed error|, the goals (:data:`GOALS`) and whether each is
    met (None where nothing was measured)."""
    out = []
    for mode, (median_goal, max_goal) in GOALS.items():
        values = errs[mode].dropna().abs() if mode in errs else pd.Series(dtype=float)
        n = len(values)
        out.append({"mode": mode, "configurations": n, "median |error|": values.median() if n else np.nan,
                    "largest |error|": values.max() if n else np.nan, "goal (median, largest)":
                    f"≤ {median_goal:.0%}, ≤ {max_goal:.0%}",
                    "met": (bool(values.median() <= median_goal and values.max() <= max_goal) if n else None)})
    return pd.DataFrame(out)


def goal_sentence(table: pd.DataFrame) -> str:
    """The goal table in one sentence, each mode's numbers and whether it met its goal."""
    parts = []
    for _, r in table.iterrows():
        if not r.configurations:
            parts.append(f"the {r['mode']} mode was not measured")
            continue
        verdict = "meets" if r.met else "misses"
        parts.append(f"the {r['mode']} mode {verdict} its goal ({r['goal (median, largest)']}) with a median "
                     f"|error| of {r['median |error|']:.1%} and a largest of {r['largest |error|']:.0%} over "
                     f"{r.configurations} configurations")
    return "; ".join(parts)


def by_strategy(abl: pd.DataFrame, errs: pd.DataFrame) -> pd.DataFrame:
    """Per strategy (held-out configurations): the median signed error at each step of :data:`LADDER`, then the
    profiled mode's."""
    if not len(abl):
        return pd.DataFrame(columns=["strategy", "configurations"])
    held = held_out(abl)
    table = held.pivot_table(index="strategy", columns="step", values="error", aggfunc="median")
    table = table[[label for label, _ in LADDER if label in table.columns]]
    table.insert(0, "configurations", held[held.order == 0].groupby("strategy").size())
    table["profiled"] = errs.groupby("strategy").profiled.median() if len(errs) else np.nan
    return table.reset_index()


def styled_by_strategy(table):
    """:func:`by_strategy` with signed percentages."""
    signed = [c for c in table.columns if c not in ("strategy", "configurations")]
    return table.style.format({c: "{:+.0%}" for c in signed}, na_rep="–").hide(axis="index")


def closes(table: pd.DataFrame) -> str:
    """Which step of the ladder moves the median |error| (over strategies) the most, in words, with the median |error|
    before and after each step."""
    steps = [label for label, _ in LADDER if label in table.columns]
    if not len(table) or not steps:
        return "not measured"
    medians = [table[s].abs().median() for s in steps]
    moves = [(medians[i - 1] - medians[i], steps[i]) for i in range(1, len(steps))]
    best = max(moves)
    ladder = " → ".join(f"{m:.0%}" for m in medians)
    return (f"the median |error| over strategies goes {ladder} along the ladder; the largest step is "
            f"“{best[1]}” ({best[0]:+.0%} of the measured iteration)" if best[0] > 0 else
            f"the median |error| over strategies goes {ladder}: no step lowers it")


def draw_ablation(ax, table: pd.DataFrame) -> None:
    """Per strategy, the median signed error after each step of :data:`LADDER` (lines from left to right)."""
    steps = [label for label, _ in LADDER if label in table.columns]
    x = np.arange(len(steps))
    for _, r in table.iterrows():
        ax.plot(x, [r[s] for s in steps], marker="o", label=r.strategy)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhspan(-GOALS["analytical"][0], GOALS["analytical"][0], color="lightgrey", alpha=0.5, lw=0)
    ax.set_xticks(x, steps, rotation=15, ha="right")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:+.0%}")
    ax.set_ylabel("median signed error of the iteration")
    ax.legend(fontsize="x-small", ncol=2)


def by_regime(errs: pd.DataFrame) -> pd.DataFrame:
    """Per model (the regime: which kernels fill a step): configurations, median and largest |error| per mode."""
    if not len(errs):
        return pd.DataFrame(columns=["model", "configurations"])
    grouped = errs.groupby("model")
    out = pd.DataFrame({"configurations": grouped.size(),
                        "analytical median |error|": grouped.analytical.apply(lambda v: v.abs().median()),
                        "analytical largest |error|": grouped.analytical.apply(lambda v: v.abs().max()),
                        "profiled median |error|": grouped.profiled.apply(lambda v: v.abs().median()),
                        "profiled largest |error|": grouped.profiled.apply(lambda v: v.abs().max())})
    return out.reset_index()


def predicted_classes(cfg, hw) -> dict:
    """The predicted iteration of ``cfg`` on ``hw`` (with kernels) in the classes of the measured breakdown, for the
    pipeline rank with the most compute: matrix products, attention, other operators, framework (×m microbatches;
    the step's fixed Python in framework), optimizer, and the exposed communication and bubble of the prediction."""
    from ..cost import predict
    from ..cost.predict import rank_spans
    from ..cost.stage import kernel_classes

    out = predict(cfg, hw, check=False)
    lay, m = cfg.layout, cfg.layout.microbatches
    per_rank = [kernel_classes(cfg.model, lay, cfg.training, hw.kernels, span) for span in rank_spans(cfg)]
    busiest = max(per_rank, key=lambda c: sum(f + b for f, b in c.values()))
    classes = {c: m * sum(busiest[c]) for c in kn.CLASSES}
    t = out["time_s"]
    per_step = hw.kernels.step_s + (hw.kernels.ddp_step_s if lay.dp > 1 and lay.zero < 2 else 0.0)
    classes["framework"] += per_step
    classes["optimizer"] = max(t["compute"] - m * sum(sum(v) for v in busiest.values()) - per_step, 0.0)
    classes["communication"] = t["communication_exposed"]
    classes["bubble"] = t["bubble"]
    return classes
