"""Where a pipeline's step goes beyond the cost model's formula, over many runs: the experiment
``scripts/pipeline_timeline.py`` (the `small` model on two stages, GPipe and 1F1B, each run with ``--trace``), read from
what each run kept of its timeline (:func:`distperf.measure.pipeline_replay.summary`: the measured span, its replay
without stalls and at the ranks' median action times, and the cost model's closed form over those medians).
"""
from __future__ import annotations

import pandas as pd

from ..measure.pipeline_replay import STALL_US


NAME = "pipeline_timeline"
RUN_COLUMNS = ["schedule", "microbatches", "repeat", "iteration_ms", "span_ms", "replay_ms", "replay_medians_ms",
               "closed_form_ms", "stalls_ms", "variation_ms", "schedule_ms", "excess_ms", "first_communication_ms",
               "first_stalls", "stalls", "stalled_ms"]
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
        first = next((x for x in ranks if x.get("stage") == 0), {})
        span, replayed, medians, closed = (float(r[f"timeline.{k}"]) for k in (
            "span_ms", "replay_ms", "replay_medians_ms", "closed_form_ms"))
        out.append({"schedule": r["config.layout.schedule"], "microbatches": int(r["config.layout.microbatches"]),
                    "repeat": int(r.get("repeat", 0)), "iteration_ms": float(r["iteration_time_s.median"]) * 1e3,
                    "span_ms": span, "replay_ms": replayed, "replay_medians_ms": medians, "closed_form_ms": closed,
                    "stalls_ms": span - replayed, "variation_ms": replayed - medians, "schedule_ms": medians - closed,
                    "excess_ms": span - closed, "first_communication_ms": first.get("communication_ms", float("nan")),
                    "first_stalls": first.get("stalls", 0), "stalls": sum(x.get("stalls", 0) for x in ranks),
                    "stalled_ms": sum(x.get("stalled_ms", 0.0) for x in ranks)})
    return pd.DataFrame(out, columns=RUN_COLUMNS)


def compare(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per schedule and m, the medians over the runs of :func:`runs`' numbers, with ``runs``, the share of the span
    the excess over the closed form is (``excess_share``) and the share of the first stage's communication it is
    (``excess_of_first``)."""
    if not len(per_run):
        return pd.DataFrame()
    numbers = [c for c in RUN_COLUMNS if c not in ("schedule", "microbatches", "repeat")]
    out = per_run.groupby(["schedule", "microbatches"])[numbers].median()
    out.insert(0, "runs", per_run.groupby(["schedule", "microbatches"]).size())
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
            f"{r.first_communication_ms:.1f} ms of communication")
    return "; ".join(parts) + "."
