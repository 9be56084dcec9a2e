"""The noise floor (``chapters/calibration.md``, section "Noise floor"): how far apart independent runs of one
configuration land on this machine, per strategy, so that every later error can be read against it.

It adds no run of its own: every timed experiment runs each configuration R times in fresh processes
(:mod:`distperf.runner.batch`), and :func:`distperf.analysis.repeats.by_configuration` gives each configuration's
95 % t-interval over its repeats. Here those intervals are gathered from the experiments that time on this
machine's own links (:data:`EXPERIMENTS`; the emulated-network runs add the emulator's own noise and are left
out) and grouped by strategy (:func:`strategy`).

- :func:`strategy`: a configuration's strategy in words, from its ``config.layout.*`` columns;
- :func:`intervals`: one row per configuration with its strategy and interval;
- :func:`floor`: per strategy, how many configurations, the median and the largest relative half-width, and the
  share within :data:`GOAL`;
- :func:`styled_floor`, :func:`within_goal`, :func:`summary`: the table and the sentence the chapter prints;
- :func:`background`: how busy other processes kept the machine while the runs and the calibrations were measured
  (:mod:`distperf.measure.background`), in words.
"""
from __future__ import annotations

import math

import pandas as pd

from .repeats import by_configuration, t_quantile

EXPERIMENTS = ("dp_zero", "dp_bucket", "tensor_parallel", "pipeline_schedules", "pp_vs_dp", "partitioning",
               "planner")
GOAL = 0.02  # the goal, declared before the data: a 95 % half-width ≤ 2 % of the median, for every strategy
LAYOUT = "config.layout."


def strategy(row) -> str:
    """'one device', or the parallelisms of the row joined by ' × ' in the order they are applied (pipeline and
    its schedule, tensor parallel with or without sequence parallelism, data parallel or its ZeRO stage)."""
    def get(name, default):
        value = row.get(LAYOUT + name, default)
        return default if pd.isna(value) else value

    parts = []
    if int(get("pp", 1)) > 1:
        parts.append(f"pipeline ({get('schedule', '?')})")
    if int(get("tp", 1)) > 1:
        parts.append("tensor + sequence parallel" if str(get("sequence_parallel", False)) == "True"
                     else "tensor parallel")
    if int(get("dp", 1)) > 1:
        zero = int(get("zero", 0))
        parts.append(f"ZeRO-{zero}" if zero else "data parallel")
    return " × ".join(parts) or "one device"


def intervals(tables: dict) -> pd.DataFrame:
    """One row per configuration of every table of ``tables`` (experiment name → sweep table; rows of other
    sources than ``fresh`` are left out): ``experiment``, ``strategy`` and the columns of
    :func:`~distperf.analysis.repeats.by_configuration`."""
    parts = []
    for name, table in tables.items():
        if table is None or not len(table):
            continue
        fresh = table[table["source"] == "fresh"] if "source" in table else table
        per = by_configuration(fresh)
        if len(per):
            parts.append(per.assign(experiment=name, strategy=per.apply(strategy, axis=1)))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["experiment", "strategy", "repeats", "median_s", "ci_half_rel"])


def run_to_run_sd(half_rel: float, repeats: int) -> float:
    """The relative standard deviation of a run's median that a relative 95 % half-width over ``repeats`` runs
    implies: half · √R / t₀.₉₇₅,R−1."""
    return half_rel * math.sqrt(repeats) / t_quantile(repeats - 1)


def repeats_needed(sd_rel: float, goal: float = GOAL, most: int = 1000) -> int | None:
    """The fewest repeats R ≥ 2 whose 95 % half-width, t₀.₉₇₅,R−1 · sd / √R, is at most ``goal`` for runs that
    scatter by ``sd_rel``; None beyond ``most``."""
    for r in range(2, most + 1):
        if t_quantile(r - 1) * sd_rel / math.sqrt(r) <= goal:
            return r
    return None


def floor(per: pd.DataFrame, goal: float = GOAL) -> pd.DataFrame:
    """Per strategy (configurations with an interval only, two repeats or more): ``configurations``,
    ``repeats`` (the fewest), ``median half-width`` and ``largest half-width`` (relative to the median),
    ``within goal`` (the share at most ``goal``); for comparison, ``within a run``: the median over the
    configurations of half the p10–p90 spread of a run's own steps, relative to its median; ``run-to-run sd``, the
    median relative standard deviation of a run's median that the half-widths imply (:func:`run_to_run_sd`), and
    ``repeats for the goal`` at that spread (:func:`repeats_needed`); sorted by the largest half-width."""
    with_interval = per.dropna(subset=["ci_half_rel"])
    rows = []
    for name, part in with_interval.groupby("strategy", sort=True):
        sd = pd.Series([run_to_run_sd(h, int(r)) for h, r in zip(part.ci_half_rel, part.repeats)]).median()
        rows.append({"strategy": name, "configurations": len(part), "repeats": int(part.repeats.min()),
                     "median half-width": part.ci_half_rel.median(), "largest half-width": part.ci_half_rel.max(),
                     "within goal": (part.ci_half_rel <= goal).mean(),
                     "within a run": ((part.p90_s - part.p10_s) / 2 / part.median_s).median(),
                     "run-to-run sd": sd, "repeats for the goal": repeats_needed(sd, goal)})
    table = pd.DataFrame(rows, columns=["strategy", "configurations", "repeats", "median half-width",
                                        "largest half-width", "within goal", "within a run", "run-to-run sd",
                                        "repeats for the goal"])
    return table.sort_values("largest half-width", ascending=False, ignore_index=True)


def styled_floor(table):
    """:func:`floor` with percentages."""
    return table.style.format({"median half-width": "{:.1%}", "largest half-width": "{:.1%}",
                               "within goal": "{:.0%}", "within a run": "{:.1%}", "run-to-run sd": "{:.1%}",
                               "repeats for the goal": "{:.0f}"}, na_rep="more than 1000").hide(axis="index")


def within_goal(table, goal: float = GOAL) -> bool | None:
    """Whether every strategy's median half-width is at most ``goal`` (None without any interval)."""
    if not len(table):
        return None
    return bool((table["median half-width"] <= goal).all())


def summary(table, goal: float = GOAL) -> str:
    """The result in words: no interval at this scale; or every strategy within the goal; or which are not, with
    their median half-widths."""
    ok = within_goal(table, goal)
    if ok is None:
        return "no configuration ran twice at this scale, so there is no interval to read"
    if ok:
        return (f"every strategy's median half-width is within {goal:.0%} (the widest, "
                f"{table.iloc[0]['strategy']}, reaches {table.iloc[0]['largest half-width']:.1%} at its worst "
                f"configuration)")
    over = table[table["median half-width"] > goal]
    listed = ", ".join(f"{r['strategy']} ({r['median half-width']:.1%})" for _, r in over.iterrows())
    needed = pd.to_numeric(over["repeats for the goal"], errors="coerce")
    most = f"{needed.max():.0f}" if needed.notna().all() else "more than 1000"
    return (f"{len(over)} of {len(table)} strategies have a median half-width above {goal:.0%}: {listed}. Runs of "
            f"one configuration scatter by a median {over['run-to-run sd'].median():.1%} (relative standard "
            f"deviation); at each strategy's spread a {goal:.0%} half-width takes {needed.min():.0f} to {most} "
            f"repeats per configuration instead of {int(over.repeats.min())}")


def background(tables: dict, calibrations: dict[str, dict | None]) -> str:
    """How much of the machine other processes used while it was measured, in words: over the ``tables``' runs
    (their ``background_cpu_share``: median, largest, and how many exceed
    :data:`distperf.measure.background.QUIET`) and for each of ``calibrations`` ({label: its sidecar, or None}).
    Tables and sidecars measured before this was recorded say so."""
    from ..measure.background import QUIET

    columns = [t["background_cpu_share"] for t in tables.values() if t is not None and "background_cpu_share" in t]
    shares = pd.to_numeric(pd.concat(columns, ignore_index=True), errors="coerce").dropna() if columns else \
        pd.Series(dtype=float)
    if len(shares):
        busy = int((shares > QUIET).sum())
        runs = (f"other processes used a median {shares.median():.1%} of the machine's CPU time while its runs were "
                f"measured (largest {shares.max():.0%}; {busy} of {len(shares)} runs above {QUIET:.0%})")
    else:
        runs = "the runs predate the record of other processes' use of the machine"
    parts = []
    for label, side in calibrations.items():
        share = (side or {}).get("background_cpu_share")
        parts.append(f"{share:.1%} during {label}" if share is not None else f"not recorded for {label}")
    return runs + ("; " + ", ".join(parts) if parts else "")
