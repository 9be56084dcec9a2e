"""How noisy one breakdown step's communication is, within a run and between runs.

A run's breakdown steps (:mod:`distperf.measure.steps`) are each profiled alone from a barrier of the ranks, and keep
every step's communication and window per rank (``time_breakdown_s.per_step``, a list per rank of a value per step).
A rank's communication share in a step is s = communication / window; over a run's n steps, the run's share is
Σ communication / Σ window (what the mean breakdown the run reports gives). Per configuration and rank,
:func:`noise` reports

- ``within``: the relative standard deviation of s from step to step inside a run, the mean over the runs;
- ``first_step``: the relative standard deviation, from run to run, of each run's first step's s (the instrument
  until 6 December 2026, when a run took one breakdown step);
- ``all_steps``: the same of each run's share over all its steps (the instrument from then).

Where a step's noise is its own, the mean over n steps divides its variance by up to n; where it is the run's (the
machine's speed that minute, the ranks' placement), more steps buy nothing. ``scripts/breakdown_steps.py`` measures it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .rows import json_cell

STEPS = "time_breakdown_s.per_step."
COLUMNS = ["configuration", "repeat", "rank", "step", "communication_s", "window_s", "share"]


def step_shares(table: pd.DataFrame | None) -> pd.DataFrame:
    """A row per step of every rank of every ``ok`` run in ``table`` (None: none) that kept its steps:
    ``configuration`` (the schedule, then m), ``repeat``, ``rank``, ``step``, ``communication_s``, ``window_s`` and
    ``share``."""
    out = []
    if table is None or not len(table) or STEPS + "window" not in table:
        return pd.DataFrame(columns=COLUMNS)
    runs = table[(table["status"] == "ok") & table[STEPS + "window"].notna()]
    for _, run in runs.iterrows():
        name = f"{run.get('config.layout.schedule', '?')}, m = {run.get('config.layout.microbatches', '?')}"
        comm, window = json_cell(run[STEPS + "communication"]), json_cell(run[STEPS + "window"])
        for rank, (cs, ws) in enumerate(zip(comm, window)):
            for step, (c, w) in enumerate(zip(cs, ws)):
                if w and w > 0:
                    out.append({"configuration": name, "repeat": int(run.get("repeat", 0)), "rank": rank,
                                "step": step, "communication_s": float(c), "window_s": float(w),
                                "share": float(c) / float(w)})
    return pd.DataFrame(out, columns=COLUMNS)


def _rsd(values) -> float:
    values = np.asarray(values, dtype=float)
    return float(values.std(ddof=1) / values.mean()) if len(values) > 1 and values.mean() else np.nan


def noise(shares: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and rank of :func:`step_shares`: ``runs``, ``steps`` (per run, the fewest), ``share`` (the
    mean over runs of the runs' share over all steps), and the relative standard deviations ``within``,
    ``first_step`` and ``all_steps`` of the module docstring."""
    columns = ["configuration", "rank", "runs", "steps", "share", "within", "first_step", "all_steps"]
    out = []
    for (name, rank), part in shares.groupby(["configuration", "rank"], sort=True):
        runs = part.sort_values("step").groupby("repeat")
        first = runs.share.first()
        total = runs.communication_s.sum() / runs.window_s.sum()
        out.append({"configuration": name, "rank": rank, "runs": len(first), "steps": int(runs.size().min()),
                    "share": float(total.mean()), "within": float(np.nanmean([_rsd(g.share) for _, g in runs])),
                    "first_step": _rsd(first), "all_steps": _rsd(total)})
    return pd.DataFrame(out, columns=columns)


def noise_sentence(table: pd.DataFrame) -> str:
    """:func:`noise` in words: the ranges over configurations and ranks of each relative standard deviation."""
    if not len(table):
        return "no run kept its breakdown steps"
    span = lambda c: f"{table[c].min():.0%} to {table[c].max():.0%}"  # noqa: E731
    steps, runs = int(table.steps.min()), int(table.runs.min())
    lower = table.all_steps < table.first_step * (1 - 1e-9)  # equal up to rounding is not lower
    fewer = "lower" if lower.all() else "not lower in every case" if lower.any() else "no lower"
    return (f"over {len(table)} ranks of {table.configuration.nunique()} configurations, {runs} runs of {steps} "
            f"breakdown steps each, a step's communication share moved by a relative standard deviation of "
            f"{span('within')} from step to step within a run; a run's first step's, from run to run, by "
            f"{span('first_step')}; and the share over a run's {steps} steps by {span('all_steps')}, {fewer} than "
            f"the first step's")
