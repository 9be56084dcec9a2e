"""Data parallelism and ZeRO (``chapters/dp_zero.md``): the runs of ``notebooks/dp_zero.ipynb`` — one rank and two
data-parallel ranks with ZeRO stages 0–3 (``dp_zero``), two-rank DDP at several gradient bucket sizes
(``dp_bucket``) — beside the cost model, and the verdict on the claim that the communication block size matters.

- :func:`sweep_runs`, :func:`with_predictions`, :func:`labelled`, :func:`model_line`: the runs, their
  predictions and labels;
- :func:`zero3_share`, :func:`share_text`, :func:`worst_state`: memory per rank;
- :func:`by_bucket`, :func:`bucket_effect`, :func:`shape_sentence`, :func:`exposed_sentence`,
  :func:`draw_bucket_times`, :func:`draw_bucket_communication`: the bucket sweep;
- :func:`error_rows`, :func:`profiled_errors`, :func:`exposed_errors`, :func:`volume_errors`: the signed errors;
- :func:`statistics`, :func:`finding`, :func:`verdict_text`: what the verdict's rule decides on, and its sentences.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from ..config import DDP_BUCKET_MB
from . import rows
from .measured_vs_predicted import MiB, error_range, errors_of, memory_rows, model_state_rows, time_rows

BUCKET = "options.bucket_mb"
SENT = "communication.sent_bytes.data_parallel"
EXPOSED = "communication.exposed_s.data_parallel"


def sweep_runs(zero, bucket):
    """The runs that succeeded, (ZeRO runs, bucket runs); the bucket sweep's run at DDP's default bucket is the
    ZeRO experiment's two-rank DDP run (stage 0), which replaces any of its own."""
    zero, bucket = rows.ok(zero), rows.ok(bucket)
    ddp = zero[(zero["config.layout.dp"] == 2) & (zero["config.layout.zero"] == 0)]
    return zero, pd.concat([bucket[bucket[BUCKET].astype(float) != float(DDP_BUCKET_MB)], ddp], ignore_index=True)


def with_predictions(frame, hw):
    """``frame`` with the cost model beside each run at the run's own bucket (:func:`.rows.with_predictions`), and
    ``predicted_dp_bytes``, the data-parallel bytes one rank sends per iteration."""
    frame = rows.with_predictions(frame, hw, bucket_mb=frame[BUCKET].astype(float))
    frame["predicted_dp_bytes"] = [p["communication_bytes"]["data_parallel"] for p in frame.prediction]
    return frame


def labelled(zero):
    """The ZeRO runs with a ``label`` ('1 rank', 'dp 2, ZeRO k'), sorted by ranks and stage."""
    zero = zero.assign(label=["1 rank" if r["config.layout.dp"] == 1 else f"dp 2, ZeRO {r['config.layout.zero']}"
                              for _, r in zero.iterrows()])
    return zero.sort_values(["config.layout.dp", "config.layout.zero"])


def model_line(run) -> str:
    """The model trained, in words: name, parameters Ψ (millions) and its 4Ψ bytes of fp32 gradients (MiB)."""
    psi = run.prediction["parameters"]
    return f"{run['config.model.name']} ({psi / 1e6:.2f} M parameters, {4 * psi / MiB:.1f} MiB of fp32 gradients)"


def zero3_share(memory) -> float | None:
    """ZeRO-3's model states on the most loaded rank over two-rank DDP's (measured; first ZeRO-3 layout), from a
    :func:`.measured_vs_predicted.memory_by_category` table; None without either run."""
    states = model_state_rows(memory).groupby("label").measured.sum()
    zero3 = states.filter(like="ZeRO 3")
    if not len(zero3) or "dp 2, ZeRO 0" not in states.index:
        return None
    return zero3.iloc[0] / states["dp 2, ZeRO 0"]


def share_text(share: float | None) -> str:
    """A share as a whole percentage, 'n/a' where there is none."""
    return "n/a" if share is None else f"{share:.0%}"


def worst_state(memory) -> str:
    """The model-state category with the largest absolute signed error, and its run; 'none above 0.5 %' when
    every error is smaller."""
    states = model_state_rows(memory)
    if states.error.abs().max() > 0.005:
        worst = states.loc[states.error.abs().idxmax()]
        return f"{worst.error:+.0%} ({worst.category}, {worst.label})"
    return "none above 0.5 %"


def by_bucket(bucket):
    """The bucket runs with ``bucket_mb`` (a number), sorted by it."""
    bucket = bucket.assign(bucket_mb=bucket[BUCKET].astype(float))
    return bucket.sort_values("bucket_mb")


class BucketEffect(NamedTuple):
    """How much the bucket size moves the iteration time (:func:`bucket_effect`)."""

    spread: float  # slowest over fastest median step, − 1
    noise: float  # median over runs of (p90 − p10)/median of the timed steps
    best: pd.Series  # the fastest run
    u_shape: bool  # fastest inside the sweep, both ends slower than it by more than the noise
    predicted_spread: float  # the framework's slowest over fastest, − 1


def bucket_effect(bucket) -> BucketEffect:
    """The effect of the bucket size on the median iteration time t against the step-to-step spread, over the
    runs of :func:`by_bucket` in bucket order (spread = max t / min t − 1; a U-shape when the fastest bucket is
    neither the smallest nor the largest and both ends exceed the fastest by more than noise × min t)."""
    t = bucket.measured_s
    noise = ((bucket["iteration_time_s.p90"] - bucket["iteration_time_s.p10"]) / t).median()
    interior = 0 < list(bucket.index).index(t.idxmin()) < len(bucket) - 1
    u_shape = interior and t.iloc[0] - t.min() > noise * t.min() and t.iloc[-1] - t.min() > noise * t.min()
    return BucketEffect(spread=t.max() / t.min() - 1, noise=noise, best=bucket.loc[t.idxmin()], u_shape=bool(u_shape),
                        predicted_spread=bucket.predicted_s.max() / bucket.predicted_s.min() - 1)


def shape_sentence(u_shape: bool) -> str:
    """What the sweep shows, in words: a U-shape, or none that stands out of the noise."""
    if u_shape:
        return ("a U-shape: both the smallest and the largest bucket are slower than the best by more than the "
                "spread of the timed steps")
    return "no U-shape that stands out of the spread of the timed steps"


def exposed_sentence(bucket, exposed: bool) -> str:
    """The share of the iteration that data-parallel communication left exposed at DDP's default bucket: measured
    where the runs measured it (``exposed``), else the framework's."""
    default = bucket[bucket.bucket_mb == float(DDP_BUCKET_MB)]
    if exposed and len(default):
        share = (default[EXPOSED] / default.measured_s).iloc[0]
        return (f"exposed data-parallel communication was {share:.0%} of the iteration at DDP's default "
                f"{DDP_BUCKET_MB} MiB bucket")
    share = (default.predicted_exposed_s / default.predicted_s).iloc[0] if len(default) else float("nan")
    return (f"the framework predicts exposed communication of {share:.0%} of the iteration at the default "
            f"{DDP_BUCKET_MB} MiB bucket (not measured in this build)")


def draw_bucket_times(ax, bucket) -> None:
    """Iteration time against the bucket size: the measured median with its p10–p90 range, the prediction dashed,
    and the prediction from profiled layer times dotted where the runs have it."""
    import numpy as np

    err = [bucket.measured_s - bucket["iteration_time_s.p10"], bucket["iteration_time_s.p90"] - bucket.measured_s]
    ax.errorbar(bucket.bucket_mb, bucket.measured_s * 1e3, yerr=np.array(err) * 1e3, fmt="o", color="C0",
                capsize=3, label="measured (median, p10–p90)")
    ax.plot(bucket.bucket_mb, bucket.predicted_s * 1e3, "--x", color="C0", label="predicted (FLOPs at peak rate)")
    if bucket.profiled_s.notna().any():
        ax.plot(bucket.bucket_mb, bucket.profiled_s * 1e3, ":+", color="C3", label="predicted (profiled layer times)")
    ax.set_xscale("log")
    ax.set_xlabel("DDP bucket size (MiB)")
    ax.set_ylabel("iteration time (ms)")
    ax.legend(fontsize="small")


def draw_bucket_communication(ax, bucket, exposed: bool) -> None:
    """Data-parallel communication per iteration against the bucket size: the measured exposed and all-reduce
    times where measured (``exposed``), the predicted exposed time dashed."""
    if exposed:
        ax.plot(bucket.bucket_mb, bucket[EXPOSED] * 1e3, "o", color="C1", label="measured exposed")
        ax.plot(bucket.bucket_mb, bucket["communication.time_s.data_parallel"] * 1e3, "s", color="C2",
                label="measured all-reduce time")
    ax.plot(bucket.bucket_mb, bucket.predicted_exposed_s * 1e3, "--x", color="C1", label="predicted exposed")
    ax.set_xscale("log")
    ax.set_xlabel("DDP bucket size (MiB)")
    ax.set_ylabel("communication per iteration (ms)")
    ax.legend(fontsize="small")


def error_rows(memory, zero, bucket) -> list[dict]:
    """The rows of the signed-error table: memory per category, then for each ZeRO run and each bucket run other
    than the default (labelled by its bucket) the iteration time and, for two ranks where measured, the
    data-parallel bytes sent (MiB) and the exposed communication (ms)."""
    table = memory_rows(memory)
    others = bucket[bucket.bucket_mb != float(DDP_BUCKET_MB)]
    both = pd.concat([zero, others.assign(label=[f"dp 2, bucket {mb:g} MiB" for mb in others.bucket_mb])])
    sent, exposed = rows.has(both, SENT), rows.has(both, EXPOSED)
    for _, run in both.iterrows():
        table += time_rows(run)
        if sent and run["config.layout.dp"] > 1:
            table.append(dict(quantity="data-parallel bytes sent", configuration=run.label, measured=run[SENT] / MiB,
                              predicted=run.predicted_dp_bytes / MiB, unit="MiB"))
        if exposed and run["config.layout.dp"] > 1:
            table.append(dict(quantity="exposed communication", configuration=run.label, measured=run[EXPOSED] * 1e3,
                              predicted=run.predicted_exposed_s * 1e3, unit="ms"))
    return table


def profiled_errors(table) -> str:
    """The clause on the time predicted from profiled layer times (its error range); empty where none was made."""
    errors = errors_of(table, "iteration time (profiled)")
    if not len(errors):
        return ""
    return ("; with compute from profiled layer times (the run's second prediction) it ranges from "
            f"{error_range(errors)}")


def exposed_errors(table) -> str:
    """The exposed communication's error range, in words, or that it was not measured."""
    errors = errors_of(table, "exposed communication")
    return f"its signed error ranges from {error_range(errors)}" if len(errors) else "it was not measured in this build"


def volume_errors(table) -> str:
    """The signed error of the data-parallel bytes sent, per run ('label: +e%; …'), or that they were not
    measured."""
    volume = table[table.quantity == "data-parallel bytes sent"].dropna(subset=["error"])
    if not len(volume):
        return "not measured in this build"
    return "; ".join(f"{r.configuration}: {r.error:+.0%}" for r in volume.itertuples())


def statistics(effect: BucketEffect) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): how far the bucket size moves the median iteration
    time, and that change over the step-to-step spread."""
    return {"bucket_spread": float(effect.spread),
            "over_noise": float(effect.spread / effect.noise) if effect.noise > 0 else math.inf}

def finding(effect: BucketEffect, zero3: float | None) -> str:
    """The verdict's finding: the bucket size's effect and, where measured, ZeRO-3's share of DDP's model states."""
    if zero3 is None:
        return f"Bucket size changed two-rank DDP's iteration time by {effect.spread:.0%}"
    return (f"Bucket size changed two-rank DDP's iteration time by {effect.spread:.0%} (fastest at "
            f"{effect.best.bucket_mb:g} MiB, step-to-step spread {effect.noise:.0%}); ZeRO-3 kept {zero3:.0%} of "
            "DDP's model states per rank")


def verdict_text(verdict: str, hw) -> str:
    """The verdict on the third claim in words; where the bucket does not matter, why (α of the profile ``hw``)."""
    if verdict == "reproduced":
        return ("the bucket size moves the iteration time by more than the spread of the steps, so the communication "
                "block size matters here too")
    if verdict == "depends":
        return ("the bucket size moves the iteration time, but either by little or not clearly beyond the spread "
                "of the steps, so the block size matters here only at the margin")
    return ("on this machine the bucket size moves the iteration time by little or no more than the spread of the steps: with "
            f"α ≈ {hw.intra_latency * 1e6:.0f} µs and gradients of a few MiB, the all-reduce is short beside the "
            "backward pass, so neither the block size nor the waiting time can matter much")
