"""What a pipeline's ranks wait for, action by action: the timeline of one breakdown step
(:mod:`distperf.measure.timeline`, ``python -m distperf run … --trace FILE``) read back and replayed; what a run with
``--trace`` keeps of it (:func:`summary`), and what :mod:`distperf.analysis.pipeline_timeline` reads over many runs.

Each action (the forward or backward of microbatch i on global stage s) depends on one action of a neighbour: F(s, i)
on F(s − 1, i), B(s, i) on B(s + 1, i) (the last stage's backward on its own forward). :func:`actions` lines the ranks
up on the machine's clock and gives each action its compute, the gap before it on its rank (from the rank's previous
action's end, or the window's start), the communication in that gap (the breakdown step's own spans) split at the
moment the dependency ended — waiting while the neighbour still computed, and waiting after it had finished — and
``hop``, how long after the dependency's end the action started. An action that waited more than :data:`STALL_US`
after its neighbour had finished is a *stall*: its input was ready, and did not come. (On this machine the cause is
measured by :mod:`distperf.measure.busy_sender`: gloo hands a message over only once the receiver has posted its receive, on
the sender's communication thread, which shares its core with the sender's compute; when that thread is not woken at
once it waits for the scheduler, a few milliseconds.)

:func:`replay` reruns each rank's actions in their recorded order on a model of the schedule's dependencies: an action
starts once its rank has finished the previous one plus the rank's usual gap, and its dependency has ended plus the
usual hop — no stalls. With every action's own compute it is the step without its stalls; with each rank's median
forward and backward it is also without the variation of the actions' times (a pipeline waits for the slower of two
neighbours at every step, so variation adds up where the mean does not): the schedule priced with constants, as a
cost model prices it. :func:`closed_form` is the cost model's formula (:func:`distperf.cost.schedules.pipeline_time`)
over the same medians: the gap between it and the replay at the medians is what the formula leaves out of the
schedule. So the measured span less the closed form splits into stalls (span − replay), variation (replay − replay at
the medians) and the schedule beyond the formula (replay at the medians − closed form).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from .intervals import intersect, length, union

# an action that waited longer than this (µs) after its neighbour's action ended is a stall: the receive of an
# activation or gradient whose sender had finished (on this machine 0.1-0.5 ms when the data is there, the `small`
# model's micro-batch of 2: 6 December 2026)
STALL_US = 1000.0
COLUMNS = ["rank", "stage", "kind", "microbatch", "order", "start", "end", "compute", "gap", "waited",
           "waited_neighbour", "waited_after", "dependency_rank", "dependency_end", "hop", "bound", "sender"]
SENDER_STATES = ("computing", "waiting", "other")  # what the sender did when an input became ready


def load(path: str | Path) -> tuple[list[dict], dict]:
    """(the ranks' timelines with every time in µs from the earliest window's start, ``distperf.about``) of a trace
    written by :func:`distperf.measure.timeline.write_trace`. Raises ValueError naming the file if it is not one."""
    try:
        trace = json.loads(Path(path).read_text())
        timelines = trace["distperf.timelines"]
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"{path}: not a trace of python -m distperf run --trace (no distperf.timelines)") from None
    if not isinstance(timelines, list) or not timelines:
        raise ValueError(f"{path}: the trace holds no rank's timeline")
    return align(timelines), trace.get("distperf.about", {})


def align(timelines: list[dict]) -> list[dict]:
    """The ranks' timelines (:func:`distperf.measure.timeline.rank_timeline`), in rank order, with every time in µs
    from the earliest rank's window start and each one's ``shift_us``, its window's start on that scale."""
    zero = min(t["origin_us"] for t in timelines)
    out = []
    for t in sorted(timelines, key=lambda t: t["rank"]):
        s = t["origin_us"] - zero
        out.append({**t, "actions": [[k, st, i, a + s, b + s] for k, st, i, a, b in t["actions"]],
                    "optimizer": [[a + s, b + s] for a, b in t["optimizer"]],
                    "communication": [[a + s, b + s] for a, b in t["communication"]], "shift_us": s})
    return out


def _dependency(kind: str, stage: int, stages: int) -> tuple[str, int] | None:
    """The action (kind, global stage) that (kind, stage) waits for, None for a first stage's forward."""
    if kind == "F":
        return ("F", stage - 1) if stage > 0 else None
    return ("B", stage + 1) if stage < stages - 1 else ("F", stage)


def actions(timelines: list[dict]) -> pd.DataFrame:
    """One row per action of :func:`load`'s timelines (:data:`COLUMNS`, times in µs): ``order`` its place on its
    rank, ``compute`` its span, ``gap`` the time since its rank's previous action ended (or its window started),
    ``waited`` the communication inside that gap, split into ``waited_neighbour`` (before the dependency ended) and
    ``waited_after`` (after it), ``hop`` the start less the dependency's end (NaN for a dependency on the same rank
    or none), ``bound`` whether the dependency was what the action waited for: it ended on the other rank after this
    rank's previous action (the rank was free before its input was), ``sender`` what the dependency's rank was doing
    once the input was ready and this rank free to take it (:data:`SENDER_STATES`: inside an action, inside
    communication, anything else; "" for a dependency on the same rank or none)."""
    ends, where = {}, {}
    spans = {t["rank"]: ([(a[3], a[4]) for a in t["actions"]], union(tuple(c) for c in t["communication"]))
             for t in timelines}
    stages = 1 + max((a[1] for t in timelines for a in t["actions"]), default=-1)
    for t in timelines:
        for kind, stage, i, _, end in t["actions"]:
            ends[(kind, stage, i)], where[(kind, stage, i)] = end, t["rank"]
    rows = []
    for t in timelines:
        comm = union(tuple(s) for s in t["communication"])
        previous = 0.0 + t["shift_us"]
        for order, (kind, stage, i, start, end) in enumerate(t["actions"]):
            dep = _dependency(kind, stage, stages)
            key = None if dep is None else (dep[0], dep[1], i)
            dep_end = ends.get(key, float("nan")) if key else float("nan")
            dep_rank = where.get(key, -1) if key else -1
            other = dep_rank not in (-1, t["rank"])
            gap = [(previous, start)] if start > previous else []
            cut = min(max(dep_end, previous), start) if other else start
            rows.append({"rank": t["rank"], "stage": stage, "kind": kind, "microbatch": i, "order": order,
                         "start": start, "end": end, "compute": end - start, "gap": start - previous,
                         "waited": length(intersect(comm, gap)),
                         "waited_neighbour": length(intersect(comm, [(previous, cut)] if cut > previous else [])),
                         "waited_after": length(intersect(comm, [(cut, start)] if start > cut else [])),
                         "dependency_rank": dep_rank, "dependency_end": dep_end,
                         "hop": start - dep_end if other else float("nan"),
                         "bound": bool(other and dep_end > previous),
                         "sender": _state(spans[dep_rank], max(dep_end, previous)) if other else ""})
            previous = end
    return pd.DataFrame(rows, columns=COLUMNS)


def _state(spans: tuple, moment: float) -> str:
    """What a rank with (action spans, communication spans) ``spans`` was doing just after ``moment`` (µs)."""
    after = moment + 1.0
    actions, comm = spans
    if any(a <= after < b for a, b in actions):
        return "computing"
    return "waiting" if any(a <= after < b for a, b in comm) else "other"


def stalls_by_sender(table: pd.DataFrame) -> dict:
    """{state: [receives, stalls]} over the actions of :func:`actions` that took an input from another rank, by what
    the sender was doing when the input was ready (:data:`SENDER_STATES`)."""
    taken = table[table.sender != ""]
    return {state: [int((taken.sender == state).sum()), int(((taken.sender == state) & (taken.waited_after > STALL_US))
                                                           .sum())] for state in SENDER_STATES}


def per_rank(timelines: list[dict], table: pd.DataFrame) -> pd.DataFrame:
    """Per rank, in ms: its window (to its last event), median forward and backward, compute in actions, all its
    communication, the part of it before actions while the neighbour still computed, the part after the neighbour
    had finished, and the rest (after the last action: sends, the tied embedding's all-reduce, the optimizer's
    neighbour), the actions that waited more than :data:`STALL_US` after their neighbour's had ended (``stalls``) and
    that waiting (``stalled_ms``), and the number of actions that waited on the neighbour (``bound``) with their median
    hop."""
    out = []
    for t in timelines:
        mine = table[table["rank"] == t["rank"]]
        comm = union(tuple(s) for s in t["communication"])
        last = max([b for _, b in t["optimizer"]] + [b for _, b in comm] + [mine.end.max() if len(mine) else 0.0])
        total = length(comm)
        bound = mine[mine.bound]
        stalled = mine[mine.waited_after > STALL_US]
        out.append({"rank": t["rank"], "stage": t["stage"], "window_ms": (last - t["shift_us"]) / 1e3,
                    "forward_ms": mine[mine.kind == "F"].compute.median() / 1e3,
                    "backward_ms": mine[mine.kind == "B"].compute.median() / 1e3,
                    "compute_ms": mine.compute.sum() / 1e3, "communication_ms": total / 1e3,
                    "neighbour_computing_ms": mine.waited_neighbour.sum() / 1e3,
                    "after_neighbour_ms": mine.waited_after.sum() / 1e3,
                    "elsewhere_ms": (total - mine.waited.sum()) / 1e3,
                    "stalls": len(stalled), "stalled_ms": stalled.waited_after.sum() / 1e3,
                    "bound_actions": len(bound),
                    "hop_ms": bound.hop.median() / 1e3 if len(bound) else float("nan")})
    return pd.DataFrame(out)


def _medians(by_rank: dict) -> tuple[dict, float]:
    """Per rank: {kind: (median compute, median gap of the actions neither bound to their neighbour nor stalled)};
    and the median hop of every rank's bound actions that did not stall, together (0 without any)."""
    own = {}
    for r, g in by_rank.items():
        own[r] = {}
        for k in "FB":
            mine = [a for a in g if a.kind == k]
            free = [a.gap for a in mine if a.order and not a.bound and a.waited_after <= STALL_US]
            own[r][k] = (statistics.median(a.compute for a in mine) if mine else 0.0,
                         statistics.median(free) if free else 0.0)
    hops = [a.hop for g in by_rank.values() for a in g if a.bound and a.waited_after <= STALL_US]
    return own, statistics.median(hops) if hops else 0.0


def replay(table: pd.DataFrame, own_compute: bool = True) -> float:
    """The pipeline's span (µs: the first action's start to the last one's end) when every rank runs its actions in
    their recorded order, each starting at max(its rank's previous end + gap, its dependency's end + hop), each rank's
    first action at its recorded start: gaps and hop are the usual ones (:func:`_medians`: a rank's median gap for the
    kind, the ranks' median hop), so that no transfer stalls; computes are each action's own (``own_compute``) or
    its rank's median for its kind."""
    rows = table.sort_values(["rank", "order"])
    by_rank = {r: list(g.itertuples()) for r, g in rows.groupby("rank")}
    own, hop = _medians(by_rank)
    done: dict[tuple[str, int, int], float] = {}
    pos = {r: 0 for r in by_rank}
    free = {r: None for r in by_rank}
    remaining = len(rows)
    while remaining:
        progressed = False
        for r, acts in by_rank.items():
            while pos[r] < len(acts):
                a = acts[pos[r]]
                key = None
                if a.dependency_rank not in (-1, r):
                    key = ("F", a.stage - 1, a.microbatch) if a.kind == "F" else ("B", a.stage + 1, a.microbatch)
                    if key not in done:
                        break
                compute, gap = own[r][a.kind]
                local = a.start if free[r] is None else free[r] + gap
                start = max(local, done[key] + hop) if key else local
                done[(a.kind, a.stage, a.microbatch)] = free[r] = start + (a.compute if own_compute else compute)
                pos[r], remaining, progressed = pos[r] + 1, remaining - 1, True
        if not progressed:
            raise RuntimeError(f"the recorded actions deadlock at positions {pos}")
    return max(done.values()) - rows.start.min()


def closed_form(table: pd.DataFrame, schedule: str, microbatches: int, chunks: int = 1) -> float:
    """:func:`distperf.cost.schedules.pipeline_time` (µs) with each rank's t_r the sum over forward and backward of its
    median compute and gap (:func:`_medians`) for each of its chunks: the form the cost model prices a pipeline
    with."""
    from ..cost.schedules import pipeline_time

    rows = table.sort_values(["rank", "order"])
    own, _ = _medians({r: list(g.itertuples()) for r, g in rows.groupby("rank")})
    per = [chunks * sum(c + g for c, g in own[r].values()) for r in sorted(own)]
    return pipeline_time(schedule, per, microbatches, chunks)


def measured_span(table: pd.DataFrame) -> float:
    """The pipeline's span in the step (µs): its first action's start to its last one's end."""
    return float(table.end.max() - table.start.min())


def summary(timelines: list[dict], schedule: str, microbatches: int, chunks: int = 1) -> dict:
    """A step's timeline in numbers (ms): the pipeline's measured span, its :func:`replay` with every action's own
    compute and at the ranks' medians, the :func:`closed_form`, and each rank's waits (:func:`per_rank`, ``per_rank``);
    what ``python -m distperf run --trace`` keeps under ``timeline``, with :func:`stalls_by_sender`. Empty without
    actions (no pipeline)."""
    table = actions(timelines)
    if not len(table):
        return {}
    ranks = per_rank(timelines, table).round(4)
    return {"span_ms": measured_span(table) / 1e3, "replay_ms": replay(table) / 1e3,
            "replay_medians_ms": replay(table, own_compute=False) / 1e3,
            "closed_form_ms": closed_form(table, schedule, microbatches, chunks) / 1e3,
            "per_rank": ranks.to_dict(orient="records"), "stalls_by_sender": stalls_by_sender(table)}



def main(argv: list[str] | None = None) -> int:
    """``python -m distperf.measure.pipeline_replay TRACE``: one trace's ranks, its span against the replay and the
    closed form, and its stalls. Exit status 0, or 2 when the file is not a trace."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="what a pipeline's ranks waited for, in a trace of "
                                                 "python -m distperf run --trace")
    parser.add_argument("trace", help="the trace file")
    args = parser.parse_args(argv)
    try:
        timelines, about = load(args.trace)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lay = about.get("config", {}).get("layout", {})
    table = actions(timelines)
    if not len(table):
        print(f"error: {args.trace}: no pipeline action in the trace", file=sys.stderr)
        return 2
    numbers = summary(timelines, lay.get("schedule", "1f1b"), lay.get("microbatches", 1), lay.get("chunks", 1))
    print(pd.DataFrame(numbers["per_rank"]).to_string(index=False, float_format="{:.2f}".format))
    print(f"pipeline span {numbers['span_ms']:.1f} ms; replayed without stalls {numbers['replay_ms']:.1f} ms, and at "
          f"the ranks' median action times {numbers['replay_medians_ms']:.1f} ms; the cost model's closed form over "
          f"those medians {numbers['closed_form_ms']:.1f} ms")
    stalled = table[table.waited_after > STALL_US]
    for a in stalled.itertuples():
        print(f"stall: rank {a.rank}'s {'forward' if a.kind == 'F' else 'backward'} {a.microbatch} waited "
              f"{a.waited_after / 1e3:.1f} ms after rank {a.dependency_rank}'s action it needed had ended")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
