"""The part of a pipeline action spent inside communication, per schedule, fitted on the tiny preset's runs.

A measured breakdown files what a pipeline engine spends in its sends, its receives and its waits on them as
communication. The cost model prices the engine's whole action (``pp_action_s``, ``twobw_action_s``: one
microbatch's forward or backward on a stage) and files it as framework; :func:`distperf.cost.stage.action_inside`
moves the part inside communication there, 2·v·w per microbatch. Until 6 December 2026 that part w came only from
the calibration's probe (:func:`distperf.measure.calibrate.pipeline_microbatch_time`): a stage pair without a head,
1F1B and 2BW only, GPipe and the interleaved schedule taking 1F1B's. On the three ten-repeat builds of 5 and
6 December 2026 (696dc47, de85c17, 8c89bfd) it read 1277, 819 and 669 µs per 1F1B action and 821, 1348 and 834 µs per
2BW action, and the split stood on one of the three.

This fit measures the part as the goal measures it: the calibration runs the tiny preset
(:data:`~distperf.cost.kernels.STEP_FIT_MODEL`, four layers) through ``distperf run`` as the book runs its
experiments (:data:`EXPERIMENT`: two stages, micro-batch 2, m = 2 and 8 microbatches, each schedule, three repeats),
and reads each run's exposed communication as :func:`distperf.analysis.time_model.exposed_errors` reads a held-out
run's. Per schedule s,

    w_s = max(median over its runs of (measured − predicted) / (2 · v · m), 0)

with ``predicted`` the model's exposed communication and bubble with the whole action as framework, v the chunks per
rank and m the microbatches (a microbatch crosses two actions per chunk of the rank). It is a fit, and so on the tiny
preset only, whose runs no validation uses (:func:`distperf.analysis.time_model.held_out`).

How it was chosen (a diagnostic, not the verdict): on the development machine on 6 December 2026, this fit (one sweep,
53 s, on the profile of the build at 8c89bfd) found 312 µs (1F1B), 395 µs (2BW), 286 µs (GPipe) and 497 µs
(interleaved) per action; priced with them, the 28 pipeline runs of the three builds above scored a median |error| of
5.7 %, 7.1 % and 7.9 % (largest 17 %, 35 % and 26 %), against 10.2 %, 17.5 % and 19.0 % (47 %, 48 % and 57 %) with the
whole action as framework. Whether the split now stands is judged by the rule declared before it
(:func:`distperf.analysis.time_model.wait_rule`) on the next ten-repeat build, whose calibration fits its own parts.
That build ran at 21e68cf: its calibration fitted 289 µs (1F1B), 483 µs (2BW), 224 µs (GPipe) and 566 µs
(interleaved), and the split stood, the 28 pipeline runs' median |error| 4.6 % (largest 37.4 %) with it against
16.5 % (54.0 %) without (:data:`distperf.analysis.time_model.PIPELINE_SPLIT`).
"""
from __future__ import annotations

import statistics
from dataclasses import replace

import pandas as pd

from ..cost.kernels import STEP_FIT_MODEL

SCHEDULES = ("gpipe", "1f1b", "interleaved", "2bw")
MICROBATCHES = (2, 8)
REPEATS = 3
EXPERIMENT = {  # the keys of an experiment file (distperf.runner.grid)
    "name": "calibration_pipelines",
    "command": "run",
    "timeout": 300,
    "env": {"OMP_NUM_THREADS": 1},  # one thread per rank, as the book's runs
    "base": {"model": STEP_FIT_MODEL, "layers": 4, "micro-batch": 2, "steps": 7, "warmup": 2},
    "grid": {"pp": [2], "schedule": list(SCHEDULES), "microbatches": list(MICROBATCHES)},
}


def fit(rows: pd.DataFrame) -> dict:
    """{schedule: w_s} from rows of :func:`~distperf.analysis.time_model.exposed_errors` (``schedule``,
    ``microbatches``, ``chunks``, ``measured_s``, ``predicted_s`` with the whole action as framework): the median
    over each schedule's rows of (measured − predicted) / (2·v·m), at least 0."""
    out = {}
    for schedule, part in rows.groupby("schedule"):
        per_action = (part.measured_s - part.predicted_s) / (2 * part.chunks.astype(float) * part.microbatches)
        out[str(schedule)] = max(statistics.median(per_action.tolist()), 0.0)
    return out


def fitted_waits(table: pd.DataFrame, hw) -> tuple[dict, pd.DataFrame]:
    """({schedule: seconds per action}, the rows fitted on) from the tiny preset's pipeline runs in ``table`` (the
    sweep of :data:`EXPERIMENT`), priced on ``hw`` with the whole action as framework."""
    from .time_model import exposed_errors

    bare = replace(hw, kernels=replace(hw.kernels, action_waits=()))
    rows = exposed_errors({EXPERIMENT["name"]: table}, bare, pipeline_split=False, held_out_only=False)
    rows = rows[(rows.model == STEP_FIT_MODEL) & (rows.kind == "pipeline_parallel")] if len(rows) else rows
    return (fit(rows) if len(rows) else {}), rows


def with_waits(hw, waits: dict):
    """``hw`` with the table ``action_waits`` set to ``waits`` ({schedule: seconds})."""
    return replace(hw, kernels=replace(hw.kernels, action_waits=tuple(sorted(waits.items()))))
