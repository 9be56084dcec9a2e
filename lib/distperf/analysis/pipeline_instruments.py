"""A pipeline's communication on two instruments, run by run: the wait clock and the breakdown steps.

The experiment (``scripts/pipeline_instruments.py``) runs the `small` model on two pipeline stages (micro-batch 2,
GPipe and 1F1B, m = 4 and 8), each run in fresh processes through ``distperf run``, several runs of each. Per run and
rank, :func:`per_run` reads

- the wait clock (:mod:`distperf.measure.wait_clock`) on the timed steps, no profiler: the seconds the rank's thread
  spent in its transfers' calls (``clock_s``) and the same by call, posting sends (``send_s``), posting receives
  (``recv_s``) and waiting (``wait_s``), each the median over the timed steps;
- the breakdown steps' communication (:mod:`distperf.measure.breakdown`, the profiler) as a share of their window,
  times the run's iteration (``breakdown_s``), as the book's goal reads the exposed communication; and in the
  profiled step's own seconds, unscaled, that communication (``steps_comm_s``) and the rank's own work, everything
  else (``own_s``).

:func:`compare` gives, per schedule, m and rank, the medians over the runs and in how many runs the breakdown steps
read more than the clock, with the model's exposed communication and bubble (PipeDream's engine split included, as
:func:`distperf.analysis.time_model.exposed_errors` prices a pipeline for the clock) beside the rank that ends the
iteration.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .repeats import CLOCK
from .rows import json_cell

NAME = "pipeline_instruments"
CALLS = ("send", "recv", "wait")
RUN_COLUMNS = ["schedule", "microbatches", "repeat", "rank", "iteration_s", "clock_s", "send_s", "recv_s", "wait_s",
               "breakdown_s", "steps_comm_s", "own_s"]
OWN_SAME = 0.02  # two stages' own work differ by no more than this share: the same work


def per_run(table: pd.DataFrame | None) -> pd.DataFrame:
    """A row per rank of every ``ok`` run of ``table`` (None: none) that kept both instruments (:data:`RUN_COLUMNS`)."""
    out = []
    if table is None or not len(table) or CLOCK not in table or "time_breakdown_s.per_rank.window" not in table:
        return pd.DataFrame(columns=RUN_COLUMNS)
    runs = table[(table["status"] == "ok") & table[CLOCK].notna()]
    for _, run in runs.iterrows():
        clock, calls = json_cell(run[CLOCK]), json_cell(run.get("wait_clock_s.by_call")) or []
        comm = json_cell(run["time_breakdown_s.per_rank.communication"]) or []
        window = json_cell(run["time_breakdown_s.per_rank.window"]) or []
        iteration = float(run["iteration_time_s.median"])
        for rank, seconds in enumerate(clock):
            by = calls[rank] if rank < len(calls) and isinstance(calls[rank], dict) else {}
            measured = rank < len(window) and rank < len(comm) and window[rank]
            share = comm[rank] / window[rank] if measured else np.nan
            out.append({"schedule": run["config.layout.schedule"], "microbatches": int(run["config.layout.microbatches"]),
                        "repeat": int(run.get("repeat", 0)), "rank": rank, "iteration_s": iteration,
                        "clock_s": seconds, **{f"{c}_s": by.get(c, np.nan) for c in CALLS},
                        "breakdown_s": share * iteration, "steps_comm_s": comm[rank] if measured else np.nan,
                        "own_s": window[rank] - comm[rank] if measured else np.nan})
    return pd.DataFrame(out, columns=RUN_COLUMNS)


def predictions(table: pd.DataFrame | None, hw) -> pd.DataFrame:
    """Per schedule and m of ``table``: the rank that ends the iteration (``rank``) and the model's exposed
    communication and bubble of it on the timed steps (``predicted_s``), priced on ``hw`` at each run's speed;
    empty without a profile or runs."""
    from . import time_model as tm

    if table is not None and "source" in table:  # as distperf.results.load reads an archive: its runs are read as
        table = table[table["source"] == table["source"].iloc[0]].drop(columns=["source"])  # a build's own
    found = tm.exposed_errors({NAME: table}, hw, held_out_only=False) if table is not None and hw is not None \
        else pd.DataFrame()
    if not len(found):
        return pd.DataFrame(columns=["schedule", "microbatches", "rank", "predicted_s"])
    return pd.DataFrame({"schedule": found.schedule, "microbatches": found.microbatches.astype(int),
                         "rank": found.clock_stage.astype(int), "predicted_s": found.clock_predicted_s})


def compare(runs: pd.DataFrame, predicted: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per schedule, m and rank of :func:`per_run`'s ``runs``: ``runs`` (how many), the medians over them of the
    iteration, the clock, its calls and the breakdown steps, ``breakdown_above`` (in how many runs the breakdown steps
    read more than the clock) and, from ``predicted`` (:func:`predictions`) on the rank that ends the iteration,
    ``predicted_s`` and its signed errors against the clock's and the breakdown's medians (NaN elsewhere)."""
    keys = ["schedule", "microbatches", "rank"]
    values = ["iteration_s", "clock_s", "send_s", "recv_s", "wait_s", "breakdown_s", "steps_comm_s", "own_s"]
    if not len(runs):
        return pd.DataFrame(columns=keys + ["runs"] + values + ["breakdown_above", "predicted_s", "error_clock",
                                                                 "error_breakdown"])
    grouped = runs.groupby(keys)
    out = grouped[values].median()
    out.insert(0, "runs", grouped.size())
    out["breakdown_above"] = grouped.apply(lambda g: int((g.breakdown_s > g.clock_s).sum()), include_groups=False)
    out = out.reset_index()
    predicted = predicted if predicted is not None and len(predicted) else pd.DataFrame(columns=keys + ["predicted_s"])
    out = out.merge(predicted[keys + ["predicted_s"]].drop_duplicates(keys), on=keys, how="left")
    out["error_clock"] = out.predicted_s / out.clock_s - 1
    out["error_breakdown"] = out.predicted_s / out.breakdown_s - 1
    return out


def sentence(compared: pd.DataFrame) -> str:
    """:func:`compare` in words: per schedule at its largest m, the rank that ends the iteration (where predicted;
    else rank 0); the medians of the calls need not add up to the clock's."""
    if not len(compared):
        return "no run kept both instruments"
    parts = []
    for schedule, part in compared.groupby("schedule", sort=False):
        top = part[part.microbatches == part.microbatches.max()]
        ending = top[top.predicted_s.notna()]
        r = (ending if len(ending) else top).iloc[0]
        model = (f"; the model prices {r.predicted_s * 1e3:.1f} ms ({r.error_clock:+.0%} against the clock, "
                 f"{r.error_breakdown:+.0%} against the breakdown steps)") if not np.isnan(r.predicted_s) else ""
        parts.append(f"{schedule} at m = {int(r.microbatches)}, rank {int(r['rank'])}: {r.clock_s * 1e3:.1f} ms on "
                     f"the clock (posting sends {r.send_s * 1e3:.1f} ms, posting receives {r.recv_s * 1e3:.1f} ms, "
                     f"waiting {r.wait_s * 1e3:.1f} ms) of an iteration of {r.iteration_s * 1e3:.1f} ms, and "
                     f"{r.breakdown_s * 1e3:.1f} ms on the breakdown steps, more in {int(r.breakdown_above)} of "
                     f"{int(r.runs)} runs{model}")
    return "; ".join(parts)


def contrast(compared: pd.DataFrame, first: str = "gpipe", second: str = "1f1b") -> str:
    """Which instrument reads more, over every schedule, m and rank of :func:`compare`, and how far apart the
    ``first`` and ``second`` schedules' rank that ends the iteration waits on the clock at their largest common m,
    against their iterations and the model's predictions, in words."""
    if not len(compared):
        return "no run kept both instruments"
    above, runs = int(compared.breakdown_above.sum()), int(compared.runs.sum())
    text = f"the breakdown steps read more than the clock in {above} of {runs} runs' ranks"
    ending = compared[compared.predicted_s.notna()]
    common = set(ending[ending.schedule == first].microbatches) & set(ending[ending.schedule == second].microbatches)
    if common:
        m = max(common)
        a, b = (ending[(ending.schedule == s) & (ending.microbatches == m)].iloc[0] for s in (first, second))
        text += (f"; at m = {m} the clock of the rank that ends the iteration reads {(a.clock_s - b.clock_s) * 1e3:+.1f}"
                 f" ms under {first} against {second} (iterations {a.iteration_s * 1e3:.1f} and "
                 f"{b.iteration_s * 1e3:.1f} ms), where the model prices {(a.predicted_s - b.predicted_s) * 1e3:+.1f} "
                 "ms") + _own_work(compared, m, first, second)
    return text


def _own_work(compared: pd.DataFrame, m: int, first: str, second: str) -> str:
    """How each rank's own work and communication in the breakdown steps, in their own seconds, differ between the
    ``first`` and ``second`` schedules at ``m`` (medians over the runs), and whether the rank with the most own work
    under ``second`` (the one that bounds the iteration) did more of it under ``first`` (by more than
    :data:`OWN_SAME`), in words; empty where a rank lacks either schedule."""
    at_m = compared[compared.microbatches == m]
    rows = {s: at_m[at_m.schedule == s].set_index("rank") for s in (first, second)}
    ranks = sorted(set(rows[first].index) & set(rows[second].index))
    if not ranks or rows[first].own_s.isna().any() or rows[second].own_s.isna().any():
        return ""
    own = {r: rows[first].own_s[r] - rows[second].own_s[r] for r in ranks}
    comm = {r: rows[first].steps_comm_s[r] - rows[second].steps_comm_s[r] for r in ranks}
    each = ", ".join(f"rank {r} {own[r] * 1e3:+.1f} ms of own work and {comm[r] * 1e3:+.1f} ms of communication"
                     for r in ranks)
    bound = rows[second].own_s.idxmax()
    more = own[bound] / rows[second].own_s[bound]
    verdict = (f"the rank whose own work bounds the iteration (rank {bound}) did "
               f"{'no more' if more <= OWN_SAME else f'{more:.0%} more'} work under {first}")
    if more <= OWN_SAME and comm[bound] > 0:
        verdict += " and waited longer: the extra waiting lies in the schedule's dependencies, not in slower work"
    return f"; in the breakdown steps' own seconds, {first} against {second}: {each}; {verdict}"
