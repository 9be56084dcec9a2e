"""Where a pipeline's step goes beyond the cost model's formula, over many runs: the experiment
``scripts/pipeline_timeline.py`` (the `small` model on two stages, GPipe and 1F1B, each run with ``--trace``), read from
what each run kept of its timeline (:func:`distperf.measure.pipeline_replay.summary`: the measured span, its replay
without stalls and at the ranks' median action times, and the cost model's closed form over those medians).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..measure.pipeline_replay import SENDER_STATES, STALL_US


NAME = "pipeline_timeline"
TRACE = "pipeline_timeline.trace.json"  # the experiment's last run's trace, archived beside its table
RUN_COLUMNS = ["schedule", "microbatches", "repeat", "iteration_ms", "span_ms", "replay_ms", "replay_medians_ms",
               "closed_form_ms", "stalls_ms", "variation_ms", "schedule_ms", "excess_ms", "first_communication_ms",
               "first_stalls", "stalls", "stalled_ms",
               *(f"{state}_{what}" for state in SENDER_STATES for what in ("receives", "stalls"))]
TERMS = ("stalls_ms", "variation_ms", "schedule_ms")


def runs(table: pd.DataFrame | None) -> pd.DataFrame:
    """A row per ``ok`` run of the experiment's ``table`` (``scripts/pipeline_timeline.py``) that kept its timeline
    (:data:`RUN_COLUMNS`, ms): the span's excess over the closed form (``excess_ms``) split into stalls (span −
    replay), variation (replay − replay at the medians) and the schedule beyond the formula (replay at the medians −
    closed form); the first stage's communication (the rank that ends a flushed pipeline) and its stalls; every rank's
    stalls and their waiting together."""
    from .rows import json_cell

    if table is None or not len(table) or "timeline.span_ms" not in table:
        return pd.DataFrame(columns=RUN_COLUMNS)
    out = []
    for _, r in table[(table["status"] == "ok") & table["timeline.span_ms"].notna()].iterrows():
        ranks = json_cell(r.get("timeline.per_rank")) or []
        by_sender = {state: json_cell(r.get(f"timeline.stalls_by_sender.{state}")) for state in SENDER_STATES}
        first = next((x for x in ranks if x.get("stage") == 0), {})
        span, replayed, medians, closed = (float(r[f"timeline.{k}"]) for k in (
            "span_ms", "replay_ms", "replay_medians_ms", "closed_form_ms"))
        out.append({"schedule": r["config.layout.schedule"], "microbatches": int(r["config.layout.microbatches"]),
                    "repeat": int(r.get("repeat", 0)), "iteration_ms": float(r["iteration_time_s.median"]) * 1e3,
                    "span_ms": span, "replay_ms": replayed, "replay_medians_ms": medians, "closed_form_ms": closed,
                    "stalls_ms": span - replayed, "variation_ms": replayed - medians, "schedule_ms": medians - closed,
                    "excess_ms": span - closed, "first_communication_ms": first.get("communication_ms", float("nan")),
                    "first_stalls": first.get("stalls", 0), "stalls": sum(x.get("stalls", 0) for x in ranks),
                    "stalled_ms": sum(x.get("stalled_ms", 0.0) for x in ranks),
                    **{f"{state}_{what}": (by_sender[state] if isinstance(by_sender[state], list) else
                                           [np.nan, np.nan])[k] for state in SENDER_STATES
                       for k, what in enumerate(("receives", "stalls"))}})
    return pd.DataFrame(out, columns=RUN_COLUMNS)


def compare(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per schedule and m, the medians over the runs of :func:`runs`' numbers (the receives and stalls by what their
    sender was doing: the sums), with ``runs``, the share of the span the excess over the closed form is
    (``excess_share``) and the share of the first stage's communication it is (``excess_of_first``)."""
    if not len(per_run):
        return pd.DataFrame()
    counted = [f"{state}_{what}" for state in SENDER_STATES for what in ("receives", "stalls")]
    numbers = [c for c in RUN_COLUMNS if c not in ("schedule", "microbatches", "repeat", *counted)]
    groups = per_run.groupby(["schedule", "microbatches"])
    out = groups[numbers].median().join(groups[counted].sum(min_count=1))
    out.insert(0, "runs", groups.size())
    out["excess_share"] = out.excess_ms / out.span_ms
    out["excess_of_first"] = out.excess_ms / out.first_communication_ms
    return out.reset_index()


def sentence(compared: pd.DataFrame) -> str:
    """:func:`compare` in words: per schedule at its largest m, the span's median excess over the closed form and its
    three parts, and what that excess is of the first stage's communication."""
    if not len(compared):
        return "No run kept its timeline."
    parts = []
    for schedule, g in compared.groupby("schedule", sort=False):
        r = g.loc[g.microbatches.idxmax()]
        largest = max(TERMS, key=lambda t: r[t])
        parts.append(
            f"{schedule} at m = {int(r.microbatches)} ({int(r.runs)} runs): the profiled step's pipeline ran "
            f"{r.excess_ms:+.1f} ms ({r.excess_share:+.1%}) beyond the cost model's formula over the step's own "
            f"median action times — stalls {r.stalls_ms:+.1f} ms (a median {r.stalls:g} actions a step waited more "
            f"than {STALL_US / 1e3:.0f} ms for an input that was ready), variation {r.variation_ms:+.1f} ms, the "
            f"schedule beyond the formula {r.schedule_ms:+.1f} ms; the largest part is "
            f"{largest.removesuffix('_ms')}; that excess is {r.excess_of_first:+.0%} of the first stage's "
            f"{r.first_communication_ms:.1f} ms of communication{_by_sender(r)}")
    return "; ".join(parts) + "."


def _by_sender(r) -> str:
    """The stall rate of the receives by what their sender was doing when the input was ready, in words."""
    told = [f"{state} {int(r[f'{state}_stalls'])} of {int(r[f'{state}_receives'])}" for state in SENDER_STATES
            if f"{state}_receives" in r and r[f"{state}_receives"] > 0]
    return (" (stalled receives by what the sender was doing once the input was ready: " + ", ".join(told) + ")"
            if told else "")


def draw(ax, timelines: list[dict], about: dict | None = None) -> None:
    """One step of a trace (:func:`distperf.measure.pipeline_replay.load`) on ``ax``: per rank a lane of its forwards
    and backwards (each labelled with its microbatch) above a thin lane of its communication, the stalls
    (:data:`distperf.measure.pipeline_replay.STALL_US`: waiting after the input had been ready) in red; ms on the
    x-axis from the earliest rank's window start."""
    from ..measure.pipeline_replay import actions

    table = actions(timelines)
    colours = {"F": "#4c72b0", "B": "#dd8452"}
    for t in timelines:
        y = -t["rank"]
        for kind, _, i, a, b in t["actions"]:
            ax.barh(y, (b - a) / 1e3, left=a / 1e3, height=0.5, color=colours[kind], edgecolor="white", lw=0.5)
            ax.text((a + b) / 2e3, y, f"{kind}{i}", ha="center", va="center", fontsize=6, color="white")
        for a, b in t["communication"]:
            ax.barh(y - 0.4, (b - a) / 1e3, left=a / 1e3, height=0.18, color="#8c8c8c")
        for r in table[(table["rank"] == t["rank"]) & (table.waited_after > STALL_US)].itertuples():
            ax.barh(y - 0.4, r.waited_after / 1e3, left=(r.start - r.waited_after) / 1e3, height=0.18, color="#c44e52")
    ax.set_yticks([-t["rank"] for t in timelines],
                  [f"rank {t['rank']}\n(stage {t['stage']})" for t in timelines], fontsize="small")
    ax.set_xlabel("ms from the step's start")
    lay = (about or {}).get("config", {}).get("layout", {})
    if lay:
        ax.set_title(f"{lay.get('schedule')}, m = {lay.get('microbatches')}: forwards (blue), backwards (orange), "
                     f"waiting (grey), stalls (red)", fontsize="small")


def archived_trace():
    """The archived :data:`TRACE` (``data/reference/<machine>/``; the canonical machine's first), None without one."""
    from ..results import CANONICAL, DATA

    found = sorted((DATA / "reference").glob(f"*/{TRACE}"), key=lambda p: (p.parent.name != CANONICAL, p))
    return found[0] if found else None


def trace_provenance(about: dict) -> str:
    """Where a trace came from (its ``distperf.about``), for a caption."""
    p = about.get("provenance") or {}
    if not p:
        return "a trace without provenance"
    return (f"{p.get('device_name')} ({p.get('machine')}), {p.get('date')}, commit {str(p.get('commit'))[:7]}, "
            f"torch {p.get('torch')}")


SENDER_RATIO = 1.5  # a stall rate this many times another's is "more often"


def sender_sentence(per_run: pd.DataFrame) -> str:
    """Over every run of :func:`runs`, the stall rate of the receives whose sender was computing when the input was
    ready against that of those whose sender was waiting in its own communication (its core free for the transfer),
    in words, with the rule declared with it (6 December 2026): if the waiting senders' receives stalled less often
    (their rate at most the computing ones' over :data:`SENDER_RATIO`), the stalls fit a computing sender as their
    cause; else a computing sender is not their only cause."""
    counted = [f"{state}_{what}" for state in SENDER_STATES for what in ("receives", "stalls")]
    if not len(per_run) or per_run[counted].isna().all().all():
        return "no run kept what the senders were doing"
    total = per_run[counted].sum()
    by = ", ".join(f"{state} {int(total[f'{state}_stalls'])} of {int(total[f'{state}_receives'])}"
                   for state in SENDER_STATES)
    busy_n, idle_n = total["computing_receives"], total["waiting_receives"]
    if not busy_n or not idle_n:
        return f"over the {len(per_run)} runs, stalled receives by what the sender was doing: {by}; no comparison"
    busy, idle = total["computing_stalls"] / busy_n, total["waiting_stalls"] / idle_n
    verdict = ("the stalls fit a computing sender as their cause" if idle * SENDER_RATIO <= busy else
               "a computing sender is not their only cause")
    return (f"over the {len(per_run)} runs, stalled receives by what the sender was doing when the input was ready: "
            f"{by} ({busy:.0%} of those whose sender computed, {idle:.0%} of those whose sender waited on its own "
            f"communication): {verdict}")
