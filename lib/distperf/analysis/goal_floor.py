"""What a perfect time model would score against a build's own measurements: the noise floor of the time goals.

A configuration's measured iteration is the median over its R repeats, each a run in fresh processes
(:func:`distperf.analysis.repeats.fold`). A model that knew every configuration's true iteration would still miss
that median by the median's own noise, so the goals of the chapter "Where the time goes" (a median and a largest
|signed error| over the held-out configurations) cannot be met more tightly than the runs repeat. How tightly that
is, this module estimates by simulation, under a noise model declared before any build was read:

- a repeat's noise, relative to its configuration's mean, is drawn from the build's own repeats, pooled over the
  held-out configurations (or over one strategy's): each repeat's deviation d = (x − x̄)/x̄ from the mean x̄ of its
  configuration's R repeats, times √(R/(R − 1)), so that the variance lost to x̄ is put back;
- one simulated build draws R deviations per configuration with replacement, folds them as the protocol does,
  M = median(1 + d), and scores the perfect prediction 1 against it: signed error (1 − M)/M;
- over the configurations it takes the goals' statistics, the median and the largest |error|;
- ``draws`` simulated builds give each statistic's distribution, and the share of them in which the perfect model
  meets a goal.

The same simulation gives the exposed communication's floor from its measurements one repeat at a time
(:func:`distperf.analysis.time_model.exposed_repeats`; a configuration's folded measurement takes each rank's median
over the repeats, which the simulation stands in for by the median of the repeats' own measurements).

It assumes that the repeats of a configuration are independent and that every configuration's relative noise has
the same distribution (pooling): a configuration that is noisier than the others lends its spread to them all. The
floor is that of a prediction that does not move with the run; the profiled mode's does, since each repeat times its
own parts (:func:`distperf.analysis.time_model.repeat_spread` shows by how much).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..cost.kernels import STEP_FIT_MODEL
from .noise import strategy

TIME = "iteration_time_s.median"
DRAWS = 2000
MORE_REPEATS = 10  # the floor is also simulated with this many repeats per configuration, to show what more buy


def held_out_repeats(tables: dict):
    """(experiment, row) of every repeat this build ran successfully (``source`` fresh where the table has it, status
    ``ok``, an iteration time) of a held-out configuration (every model but :data:`STEP_FIT_MODEL`), in tables that
    keep their repeats apart."""
    for name, table in tables.items():
        if table is None or not len(table) or "repeat" not in table or "config_hash" not in table:
            continue
        part = table[(table["status"] == "ok") & table[TIME].notna()]
        if "source" in part:
            part = part[part["source"] == "fresh"]
        for _, r in part[part["config.model.name"] != STEP_FIT_MODEL].iterrows():
            yield name, r


def repeat_times(tables: dict) -> pd.DataFrame:
    """Per repeat of every held-out configuration (:func:`held_out_repeats`): ``experiment``, ``config_hash``,
    ``strategy`` and ``measured_s``, the run's median step."""
    runs = [{"experiment": name, "config_hash": r["config_hash"], "strategy": strategy(r), "measured_s": float(r[TIME])}
            for name, r in held_out_repeats(tables)]
    return pd.DataFrame(runs, columns=["experiment", "config_hash", "strategy", "measured_s"])


def repeat_deviations(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (a row per repeat: ``experiment``, ``config_hash``, ``strategy``, ``measured_s``) of the
    configurations that ran at least twice, with ``repeats`` (R) and ``deviation``, (x − x̄)/x̄ · √(R/(R − 1))."""
    columns = ["experiment", "config_hash", "strategy", "repeats", "measured_s", "deviation"]
    if not len(runs):
        return pd.DataFrame(columns=columns)
    frame = runs.copy()
    frame["repeats"] = frame.groupby(["experiment", "config_hash"], sort=False).measured_s.transform("size")
    frame = frame[frame.repeats >= 2].copy()
    mean = frame.groupby(["experiment", "config_hash"], sort=False).measured_s.transform("mean")
    frame["deviation"] = (frame.measured_s - mean) / mean * np.sqrt(frame.repeats / (frame.repeats - 1))
    return frame[columns].reset_index(drop=True)


def simulate(deviations, configurations: int, repeats: int, draws: int = DRAWS, seed: int = 0) -> np.ndarray:
    """The goals' statistics of a perfect prediction in ``draws`` simulated builds of ``configurations``
    configurations with ``repeats`` repeats each, the repeats' relative noise drawn from ``deviations`` (see the
    module docstring): an array of shape (draws, 2), the median and the largest |signed error| of each build."""
    pool = np.asarray(deviations, dtype=float)
    rng = np.random.default_rng(seed)
    folded = np.median(1.0 + rng.choice(pool, size=(draws, configurations, repeats)), axis=2)
    error = np.abs((1.0 - folded) / folded)
    return np.stack([np.median(error, axis=1), error.max(axis=1)], axis=1)


def floor_table(runs: pd.DataFrame, goals: dict, draws: int = DRAWS, seed: int = 0) -> pd.DataFrame:
    """The noise floor of the goals ``goals`` ({mode: (median goal, largest goal)}) for the measurements ``runs`` (a
    row per repeat, as :func:`repeat_times` gives the iteration's), one row per pool and number of repeats: ``pool``
    ("all" held-out configurations, then each strategy with two or more of them), ``configurations``, ``repeats``
    (the build's, the most common among the pool's configurations, then :data:`MORE_REPEATS`, for "all" only, unless
    the build ran that many), the median |error| of a perfect prediction (``median``: its median over the simulated
    builds; ``median_low``, ``median_high``: their 5th and 95th percentiles), the same of the largest |error|
    (``largest``, …), and per mode ``meets <mode>``: the share of simulated builds in which the perfect prediction
    met both of that mode's goals."""
    found = repeat_deviations(runs)
    rows_ = []
    if not len(found):
        return pd.DataFrame(rows_)
    pools = [("all", found)] + [(name, part) for name, part in found.groupby("strategy", sort=True)
                                if part.config_hash.nunique() >= 2]
    for name, part in pools:
        configurations = part.groupby(["experiment", "config_hash"]).ngroups
        measured = int(part.groupby(["experiment", "config_hash"]).repeats.first().mode().iloc[0])
        for repeats in dict.fromkeys((measured, MORE_REPEATS) if name == "all" else (measured,)):
            stats = simulate(part.deviation, configurations, repeats, draws, seed)
            row = {"pool": name, "configurations": configurations, "repeats": repeats}
            for i, statistic in enumerate(("median", "largest")):
                low, mid, high = np.percentile(stats[:, i], [5, 50, 95])
                row.update({statistic: mid, f"{statistic}_low": low, f"{statistic}_high": high})
            for mode, (median_goal, largest_goal) in goals.items():
                row[f"meets {mode}"] = float(np.mean((stats[:, 0] <= median_goal) & (stats[:, 1] <= largest_goal)))
            rows_.append(row)
    return pd.DataFrame(rows_)


def floor_sentence(table: pd.DataFrame, goals: dict) -> str:
    """The pooled rows of :func:`floor_table` in words: what a perfect prediction scores and how often it meets each
    goal, at the build's repeats and at :data:`MORE_REPEATS`."""
    pooled = table[table.pool == "all"] if len(table) else table
    if not len(pooled):
        return ("no held-out configuration was measured in two repeats or more, so the spread between runs is "
                "unknown (a smoke build runs each once; tables from before 3 December 2026 broke a step down in one "
                "repeat)")
    parts = []
    for _, r in pooled.iterrows():
        meets = ", ".join(f"the {_named(mode)} ({goals[mode][0]:.0%} / {goals[mode][1]:.0%}) in "
                          f"{r[f'meets {mode}']:.0%}" for mode in goals)
        parts.append(f"with {r.repeats} repeats per configuration a perfect prediction of the {r.configurations} "
                     f"held-out configurations scores a median |error| of {r['median']:.1%} (90 % of simulated builds "
                     f"{r.median_low:.1%} to {r.median_high:.1%}) and a largest of {r.largest:.0%} "
                     f"({r.largest_low:.0%} to {r.largest_high:.0%}), and meets {meets} of them")
    return "; ".join(parts)


def _named(mode: str) -> str:
    """A goal's name in a sentence: a mode's, or the exposed communication's."""
    return "exposed communication's goal" if mode == "exposed communication" else f"{mode} mode's"
