"""The time model's goals on one build's own measurements, printed: the table of the chapter "Where the time goes".

    make data SCALE=cpu && .venv/bin/python scripts/time_goals.py [--scale cpu]

Reads the book's own tables of the timed experiments (``data/fresh/<scale>/``, or the archive with
``DISTPERF_FROM=reference``) and their hardware profile, and prints: how many rounds its calibration ran of the noisy
probes and whether they settled, and both modes priced with that profile and with the one the earlier rule gives from
the same calibration; whether the issued all-reduce's fit takes its point at DDP's bucket
(:func:`distperf.analysis.time_model.bucket_point_rule`); whether a layer's contention ratio stands
(:func:`distperf.analysis.time_model.layer_contention_rule`); the runs that recompute with and without the checkpoint's
constants; the FSDP2 unit table's and the waits for the slowest rank's rules; how far the rounds of the tensor-parallel
path constants and of the pipeline action constants move those runs' profiled errors; whether DTensor's cost per byte
of a collective's message stands (:func:`distperf.analysis.time_model.tp_bytes_rule`) and whether its split into a part
inside the collectives and one outside stands, and the pipeline engines'
(:func:`~distperf.analysis.time_model.wait_rule`); whether the exposed communication reads each run's five breakdown
steps or its first (:func:`~distperf.analysis.time_model.breakdown_steps_rule`) and finds the rank that ends the
iteration step by step (:func:`~distperf.analysis.time_model.step_ending_rule`); whether the analytical mode follows
each run's speed probe halfway (:func:`~distperf.analysis.time_model.elasticity_rule`); the median and largest
|signed error| of the analytical and profiled modes over the held-out configurations and of the exposed communication
per kind, against the goals (:func:`distperf.analysis.time_model.goal_table`); how far the profiled mode's error moves between
the repeats of a configuration; what a perfect model would score against these measurements
(:mod:`distperf.analysis.goal_floor`) and which misses lie outside their measured median's interval
(:func:`distperf.analysis.time_model.beyond_noise`); how the two instruments of exposed communication compare; the
exposed communication's errors per kind; each strategy's median signed error in both modes; and both modes' median and
largest |error| in the chapter's variants that price each run at the calibration's speed or with its own contention.
The chapter itself reads a default build's long studies from the archive; this reads only what the build measured, and
names the tables it lacks (a default build at ``cpu`` leaves the long studies out: ``make data LONG=measure`` measures
them).
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd

from distperf import results
from distperf.analysis import goal_floor, round_drift
from distperf.analysis import time_breakdown as tb
from distperf.analysis import time_model as tm
from distperf.config import ConfigError
from distperf.hardware import load_profile
from distperf.measure.profiles import read_sidecar


def report(tables: dict, hw) -> str:
    """The goals, instruments, exposed communication per kind and per-strategy errors, as text."""
    errs, exposed = tm.errors(tables, hw), tm.exposed_errors(tables, hw)
    goals = tm.goal_table(errs, exposed)
    shown = goals.assign(**{c: goals[c].map(lambda x: f"{x:.1%}" if x == x else "-")
                            for c in ("median |error|", "largest |error|")})
    spread = tm.repeat_spread_sentence(tm.repeat_spread(tables, hw))
    time_goals = {mode: goal for mode, goal in tm.GOALS.items() if mode != "exposed communication"}
    floor = goal_floor.floor_sentence(goal_floor.floor_table(goal_floor.repeat_times(tables), time_goals), time_goals)
    exposed_goal = {"exposed communication": tm.GOALS["exposed communication"]}
    exposed_floor = goal_floor.floor_sentence(goal_floor.floor_table(tm.goal_repeats(tables, exposed),
                                                                     exposed_goal), exposed_goal)
    parts = [shown.to_string(index=False), "", f"Repeats: {spread}.", "", f"A perfect model: {floor}.", "",
             f"A perfect model of the exposed communication: {exposed_floor}.", "",
             f"One breakdown step or five: {tm.breakdown_steps_rule_sentence(tables, exposed)}.", "",
             f"The wait clock: {tm.wait_clock_rule_sentence(tables, exposed)}.", "",
             f"The ending rank step by step: {tm.step_ending_rule_sentence(tables, exposed)}.", "",
             f"Following the run's speed halfway: {tm.elasticity_rule_sentence(tables, hw)}.", "",
             f"Misses beyond the noise: {tm.beyond_noise_sentence(tm.beyond_noise(tables, errs))}.", "",
             "Exposed communication: " + tm.instruments_sentence(exposed) + "."]
    if len(exposed):
        kinds = exposed.assign(e=exposed.error.abs()).groupby("kind").e.agg(["count", "median", "max"])
        parts += ["", kinds.rename(columns={"count": "configurations", "median": "median |error|",
                                            "max": "largest |error|"}).to_string(float_format="{:.1%}".format)]
    if len(errs):
        parts += ["", errs.groupby("strategy")[["analytical", "profiled"]].median().to_string(
            float_format="{:+.1%}".format)]
        variants = {"each run at its own speed (the rule)": errs,
                    "at the calibration's speed": tm.errors(tables, hw, speed=False),
                    "with each run's contention": tm.errors(tables, hw, contention=True)}
        parts += ["", "Median / largest |error| of the chapter's variants (section \"The machine's speed\"):"]
        parts += [f"  {name}: " + "; ".join(f"{mode} {e[mode].abs().median():.1%} / {e[mode].abs().max():.1%}"
                                            for mode in tm.MODES) for name, e in variants.items()]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu", help="the build's scale (default cpu)")
    args = parser.parse_args(argv)
    profile = results.book_dir(args.scale) / "hardware.json"
    if not profile.exists():
        print(f"error: {profile} is missing: run `make data SCALE={args.scale}` first", file=sys.stderr)
        return 2
    try:
        hw = load_profile(profile)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tables, missing = {}, []
    for name in tb.EXPERIMENTS:
        try:
            tables[name] = results.load(name, args.scale)
        except FileNotFoundError:
            missing.append(name)
    if not tables:
        print(f"error: no table of {', '.join(tb.EXPERIMENTS)} in {profile.parent}", file=sys.stderr)
        return 2
    print(f"{profile.parent}: {', '.join(tables)}" + (f" (not in this build: {', '.join(missing)})" if missing else ""))
    side = read_sidecar(profile)
    print("Calibration's noisy probes: " + tm.rounds_sentence(side) + ".")
    print("The path probes from round to round: " + round_drift.sentence(side) + ".")
    print("The two rules: " + tm.rounds_rule_sentence(tables, hw, side) + ".")
    print("The two overlap probes: " + tm.overlap_rule_sentence(tables, hw, side) + ".")
    print("The all-reduce at DDP's bucket: " + tm.bucket_point_rule_sentence(tables, hw, side) + ".")
    print("A receive from a computing sender: " + tm.stall_rule_sentence(tables, hw, side) + ".")
    print("DDP's slopes: " + tm.ddp_slopes_rule_sentence(tables, hw) + ".")
    print("A layer's contention: " + tm.layer_contention_rule_sentence(tables, hw, side) + ".")
    print("The run's own all-reduce: " + tm.allreduce_probe_rule_sentence(tables, hw) + ".")
    print("Recomputation's checkpoint: " + tm.recompute_rule_sentence(tables, hw) + ".")
    print("FSDP2's units by size: " + tm.fsdp_units_rule_sentence(tables, hw, side) + ".")
    print("Waiting for the slowest rank: " + tm.skew_rule_sentence(tables, hw, side) + ".")
    spread = tm.path_rounds(side, hw)
    print("The tensor-parallel path constants' rounds: " + tm.path_sensitivity(tables, hw, spread) + ".")
    print("The pipeline action constants' rounds: " + tm.path_sensitivity(tables, hw, spread, "pipeline") + ".")
    print("DTensor's cost per byte: " + tm.tp_bytes_rule_sentence(tables, hw, side) + ".")
    print("The profiled mode at the run's speed: " + tm.profiled_speed_rule_sentence(tables, hw) + ".")
    for kind in tm.WAIT_SPLITS:
        print(f"Inside and outside communication, {kind}: " + tm.wait_rule_sentence(tables, hw, kind) + ".")
    with pd.option_context("display.width", 200):
        print(report(tables, hw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
