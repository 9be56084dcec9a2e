"""Whole training steps measured on one GPU beside the framework's prediction (chapter "Against published step
times", section "One H200, measured").

The table ``gpu_step_time`` is written on a lent GPU by ``scripts/gpu_reference.py``: each configuration trains
on one device for a few steps (three repeats, each in fresh processes) with ``--hardware`` the device's preset, so
each row holds the framework's prediction at the datasheet rates. Two predictions stand beside the measurement:

- *datasheet*: :func:`distperf.cost.predict` on the preset (the same number the run printed);
- *fitted*: the same preset scaled by the three constants that :func:`distperf.analysis.published_time.fit` takes
  from Megatron-LM's Table 1 (:func:`distperf.analysis.published_time.scaled`): none of these rows is seen by the
  fit, and they lie far from its models (124 M and 355 M parameters on one device, against 1.7 B to 1 T on hundreds).

One device has no communication and no bubble, so a step is compute, memory-bound work and the framework's own
time. :func:`fixed_part` measures the part of a step that does not grow with the microbatch: the intercept at
b = 0 of the line through a configuration's two microbatch sizes, t₀ = (b₂·t₁ − b₁·t₂)/(b₂ − b₁), beside the
same intercept of the fitted prediction. A FLOP-based preset prices kernel launches and Python per step at zero,
so what the measured intercept holds beyond the predicted one is time the presets do not see.
"""
from __future__ import annotations

import statistics

from ..cost import predict
from ..hardware import PRESETS
from .published_time import scaled
from .repeats import fold
from .rows import config_of_row

EXPERIMENT = "gpu_step_time"
KEYS = ("machine", "model", "micro_batch", "precision", "recompute")
SMALL_FIXED = 0.2  # a step whose fixed part is under this share of it is priced by its FLOPs and bytes, if at all


def table(frame, constants: tuple[float, float, float]):
    """One row per configuration and machine of a ``gpu_step_time`` table, its repeats folded
    (:func:`distperf.analysis.repeats.fold`): its measured median step over the repeats with the 95 % interval, the
    datasheet and the fitted prediction with their signed errors, and repeat 0's measured peak memory with the run's
    own signed errors of the activations and of the total."""
    import pandas as pd

    out = []
    for _, row in fold(frame).iterrows():
        cfg = config_of_row(row)
        hw = PRESETS[row["arg.hardware"]]
        measured = row["iteration_time_s.median"]
        datasheet = _iteration(cfg, hw)
        fitted = _iteration(cfg, scaled(hw, *constants))
        out.append({"machine": row["machine"], "model": cfg.model.name, "micro_batch": cfg.layout.micro_batch,
                    "precision": cfg.training.precision, "recompute": cfg.layout.recompute, "repeats": row["repeats"],
                    "measured_s": measured, "ci_low_s": row["iteration_time_s.ci_low"],
                    "ci_high_s": row["iteration_time_s.ci_high"],
                    "datasheet_s": datasheet, "datasheet_error": datasheet / measured - 1,
                    "fitted_s": fitted, "fitted_error": fitted / measured - 1,
                    "memory_bytes": row["memory_bytes.total"],
                    "activations_error": row["error.memory_bytes.activations"],
                    "memory_error": row["error.memory_bytes.total"]})
    return pd.DataFrame(out).sort_values(list(KEYS), ignore_index=True)


def _iteration(cfg, hw) -> float:
    """The framework's iteration time of ``cfg`` on ``hw``, as ``distperf run`` predicts it beside its run."""
    return predict(cfg, hw, convention="trainer", backend="nccl")["time_s"]["iteration"]


def intercept(b1: float, t1: float, b2: float, t2: float) -> float:
    """The time at microbatch 0 of the line through (b₁, t₁) and (b₂, t₂): (b₂·t₁ − b₁·t₂)/(b₂ − b₁)."""
    return (b2 * t1 - b1 * t2) / (b2 - b1)


def fixed_part(steps):
    """Per machine, model, precision and recomputation with two microbatch sizes in :func:`table`'s ``steps``: the
    measured and the fitted prediction's part of a step that does not grow with the microbatch (:func:`intercept`,
    seconds) and the measured one's share of the smaller and of the larger microbatch's step."""
    import pandas as pd

    out = []
    for key, part in steps.groupby(["machine", "model", "precision", "recompute"], sort=True):
        if len(part) != 2:
            continue
        small, large = part.sort_values("micro_batch").to_dict("records")
        measured = intercept(small["micro_batch"], small["measured_s"], large["micro_batch"], large["measured_s"])
        fitted = intercept(small["micro_batch"], small["fitted_s"], large["micro_batch"], large["fitted_s"])
        out.append({**dict(zip(("machine", "model", "precision", "recompute"), key)),
                    "micro_batches": f"{small['micro_batch']}, {large['micro_batch']}",
                    "measured_fixed_s": measured, "fitted_fixed_s": fitted,
                    "share_of_small_step": measured / small["measured_s"],
                    "share_of_large_step": measured / large["measured_s"], "large_fitted_error": large["fitted_error"]})
    return pd.DataFrame(out)


def sentence(steps, fixed) -> str:
    """What the measured steps show, in numbers: the median and range of the signed errors of each prediction,
    the measured against the fitted part of a step that does not grow with the microbatch, and the fitted errors of
    the larger-microbatch steps whose fixed part is under :data:`SMALL_FIXED` of them."""
    if steps.empty:
        return "no GPU step was measured"

    def errors(column):
        values = steps[column].tolist()
        return (f"median |signed error| {statistics.median(abs(v) for v in values):.0%} "
                f"({min(values):+.0%} to {max(values):+.0%})")

    machines = ", ".join(sorted(steps["machine"].unique()))
    text = (f"over the {len(steps)} configurations measured on {machines}, the datasheet preset's prediction has "
            f"{errors('datasheet_error')}, the fitted constants' {errors('fitted_error')}")
    if fixed.empty:
        return text
    return (text + f"; the part of a step that does not grow with the microbatch measures "
            f"{fixed['measured_fixed_s'].min() * 1e3:.1f} to {fixed['measured_fixed_s'].max() * 1e3:.1f} ms "
            f"({fixed['share_of_small_step'].min():.0%} to {fixed['share_of_small_step'].max():.0%} of the smaller "
            f"microbatch's step), against {fixed['fitted_fixed_s'].min() * 1e3:.1f} to "
            f"{fixed['fitted_fixed_s'].max() * 1e3:.1f} ms in the fitted prediction; " + _small_fixed(fixed))


def _small_fixed(fixed) -> str:
    small = fixed[fixed["share_of_large_step"] < SMALL_FIXED]
    if small.empty:
        return f"no step's fixed part is under {SMALL_FIXED:.0%} of it"
    errors = small["large_fitted_error"]
    names = ", ".join(f"{r.model} {r.precision}" + (" recomputed" if r.recompute != "none" else "")
                      for r in small.itertuples())
    return (f"the {len(small)} larger-microbatch steps whose fixed part is under {SMALL_FIXED:.0%} of them "
            f"({names}) are predicted with the fitted constants within {errors.min():+.0%} to {errors.max():+.0%}")
