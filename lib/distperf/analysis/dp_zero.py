"""Data parallelism and ZeRO (``chapters/dp_zero.md``): the runs of ``notebooks/dp_zero.ipynb`` — one rank and two
data-parallel ranks with ZeRO stages 0–3 (``dp_zero``), two-rank DDP at several gradient bucket sizes
(``dp_bucket``, on a model whose gradients span many buckets) and every rank's waiting (``dp_waiting``) — beside the
cost model, and the verdict on the claim that the communication block size and the waiting time matter.

- :func:`every_run`, :func:`with_predictions`, :func:`labelled`, :func:`model_line`: the runs, their
  predictions and labels;
- :func:`zero3_share`, :func:`share_text`, :func:`worst_state`: memory per rank;
- :func:`by_bucket`, :func:`bucket_sizes`, :func:`bucket_effect`, :func:`predicted_spread`, :func:`shape_sentence`,
  :func:`p_text`, :func:`exposed_sentence`, :func:`draw_bucket_times`, :func:`draw_bucket_communication`: the
  bucket sweep, every repeat of each size (and the same on the emulated slow link of ``network_bucket``);
- :func:`waiting`, :func:`waiting_summary`, :func:`largest_waiting`, :func:`draw_waiting`: every rank's waiting
  (``dp_waiting``: the same model as a two-stage pipeline);
- :func:`error_rows`, :func:`profiled_errors`, :func:`exposed_errors`, :func:`volume_errors`: the signed errors;
- :func:`statistics`, :func:`finding`: what the verdict's rule decides on, and its finding.
"""
from __future__ import annotations

import json
import math
from typing import NamedTuple

import pandas as pd

from ..config import DDP_BUCKET_MB
from . import repeats, rows
from .measured_vs_predicted import MiB, error_range, errors_of, memory_rows, model_state_rows, time_rows

BUCKET = "options.bucket_mb"
SENT = "communication.sent_bytes.data_parallel"
EXPOSED = "communication.exposed_s.data_parallel"
ALLREDUCE = "communication.time_s.data_parallel"
PER_RANK = "communication.per_rank"


MODEL_KEYS = ("config.model.name", "config.model.layers", "config.model.hidden", "config.model.seq",
              "config.layout.micro_batch")


def every_run(frame):
    """Every repeat that succeeded (status ``ok``), not folded: the bucket sweep's effect is judged on the spread
    between runs. A table that also holds rows of an earlier grid (another model: the resumable table keeps them)
    gives only the rows of the model its latest row trained, per machine and source."""
    runs = frame[frame["status"] == "ok"].copy()
    keys = [k for k in MODEL_KEYS if k in runs]
    if not keys or "date" not in runs or runs.empty:
        return runs
    groups = [k for k in ("machine", "source") if k in runs]
    model = runs[keys].astype(str).agg("|".join, axis=1)
    where = runs[groups].astype(str).agg("|".join, axis=1) if groups else pd.Series("", index=runs.index)
    latest = model.groupby(where).agg(lambda m: m.loc[runs.loc[m.index, "date"].idxmax()])
    return runs[model == where.map(latest)]


def with_predictions(frame, hw):
    """``frame`` with the cost model beside each run at the run's own bucket (:func:`.rows.with_predictions`), and
    ``predicted_dp_bytes``, the data-parallel bytes one rank sends per iteration."""
    frame = rows.with_predictions(frame, hw)
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
    """The bucket runs with ``bucket_mb`` (a number), sorted by it (none: an empty frame with that column)."""
    if BUCKET not in bucket:
        return bucket.assign(bucket_mb=pd.Series(dtype=float))
    bucket = bucket.assign(bucket_mb=bucket[BUCKET].astype(float))
    return bucket.sort_values("bucket_mb", kind="stable")


def bucket_sizes(bucket):
    """One row per bucket size of the runs of :func:`by_bucket` (every repeat, after :func:`with_predictions`):
    ``repeats``, ``measured_s`` (the mean of the runs' median steps) with its 95 % t-interval ``ci_low_s`` and
    ``ci_high_s`` (:func:`.repeats.interval`), the means over the repeats of the measured exposed and all-reduce
    times where measured, and the predictions (``predicted_s``, ``predicted_exposed_s``, ``profiled_s``)."""
    out = []
    for size, runs in (bucket.groupby("bucket_mb", sort=True) if "bucket_mb" in bucket else ()):
        mean, low, high = repeats.interval(runs[repeats.TIME].astype(float).dropna())
        row = {"bucket_mb": size, "repeats": int(runs[repeats.TIME].notna().sum()), "measured_s": mean,
               "ci_low_s": low, "ci_high_s": high}
        for column in (EXPOSED, ALLREDUCE, "predicted_s", "predicted_exposed_s", "profiled_s"):
            row[column] = float(runs[column].astype(float).mean()) if column in runs else math.nan
        out.append(row)
    return pd.DataFrame(out)


class BucketEffect(NamedTuple):
    """How much the bucket size moves the iteration time (:func:`bucket_effect`)."""

    spread: float  # slowest over fastest bucket size (means of the run medians), − 1
    p: float  # permutation p-value of that spread (NaN without repeats)
    best: float  # the fastest bucket size (MiB)
    u_shape: bool  # fastest inside the sweep, both ends' intervals above the fastest's
    sizes: int  # bucket sizes measured


def bucket_effect(bucket) -> BucketEffect:
    """The effect of the bucket size on the iteration time, from every repeat of each size (columns ``bucket_mb``
    and the runs' median step ``iteration_time_s.median``): the spread of the sizes' means
    (:func:`.repeats.spread`), its permutation p-value (:func:`.repeats.permutation_p`: how often relabelling the
    runs gives as large a spread), the fastest size, and a U-shape when the fastest size is neither the smallest
    nor the largest and the lower ends of both end sizes' 95 % intervals lie above the upper end of the
    fastest's."""
    sizes = bucket_sizes(bucket)
    if sizes.empty:
        return BucketEffect(math.nan, math.nan, math.nan, False, 0)
    groups = [g[repeats.TIME].astype(float).dropna().tolist() for _, g in bucket.groupby("bucket_mb", sort=True)]
    fastest = int(sizes.measured_s.idxmin())
    top = sizes.ci_high_s[fastest]
    u_shape = 0 < fastest < len(sizes) - 1 and sizes.ci_low_s.iloc[0] > top and sizes.ci_low_s.iloc[-1] > top
    return BucketEffect(spread=repeats.spread(groups), p=repeats.permutation_p(groups),
                        best=float(sizes.bucket_mb[fastest]), u_shape=bool(u_shape), sizes=len(sizes))


def predicted_spread(sizes) -> float:
    """The framework's slowest over fastest predicted iteration time across the bucket sizes, − 1."""
    return sizes.predicted_s.max() / sizes.predicted_s.min() - 1


def shape_sentence(effect: BucketEffect) -> str:
    """What the sweep shows, in words: a U-shape, or none that stands out of the repeats' intervals."""
    if effect.u_shape:
        return ("a U-shape: the 95 % intervals of both the smallest and the largest bucket lie above that of the "
                f"fastest ({effect.best:g} MiB)")
    return "no U-shape that stands out of the repeats' 95 % intervals"


def p_text(p: float) -> str:
    """A permutation p-value in words ('p = 0.003'; 'no p-value (one run per size)' when NaN)."""
    return "no p-value (one run per size)" if p != p else f"p = {p:.2g}"


def exposed_sentence(sizes, summary) -> str:
    """The share of each rank's measured step that data-parallel communication left exposed at DDP's default
    bucket, from the waiting summary (:func:`waiting_summary`, whose share divides a rank's exposed time by the
    step it was measured in, as for every rank's waiting); the framework's share where no run measured it."""
    label = f"dp 2, bucket {float(DDP_BUCKET_MB):g} MiB"
    part = summary[summary.label == label].dropna(subset=["share"]) if len(summary) else summary
    if len(part):
        ranks = ", ".join(f"{r.share:.0%} on rank {int(r.rank)}" for r in part.sort_values("rank").itertuples())
        return (f"exposed data-parallel communication at DDP's default {DDP_BUCKET_MB} MiB bucket took {ranks} "
                "of the measured step (mean over the repeats)")
    default = sizes[sizes.bucket_mb == float(DDP_BUCKET_MB)]
    share = (default.predicted_exposed_s / default.predicted_s).iloc[0] if len(default) else float("nan")
    return (f"the framework predicts exposed communication of {share:.0%} of the iteration at the default "
            f"{DDP_BUCKET_MB} MiB bucket (not measured in this build)")


def draw_bucket_times(ax, sizes) -> None:
    """Iteration time against the bucket size: the measured mean over the repeats with its 95 % interval, the
    prediction dashed, and the prediction from profiled layer times dotted where the runs have it."""
    import numpy as np

    err = np.array([sizes.measured_s - sizes.ci_low_s, sizes.ci_high_s - sizes.measured_s]) * 1e3
    ax.errorbar(sizes.bucket_mb, sizes.measured_s * 1e3, yerr=np.nan_to_num(err), fmt="o", color="C0", capsize=3,
                label="measured (mean of repeats, 95 % CI)")
    ax.plot(sizes.bucket_mb, sizes.predicted_s * 1e3, "--x", color="C0", label="predicted (FLOPs at peak rate)")
    if sizes.profiled_s.notna().any():
        ax.plot(sizes.bucket_mb, sizes.profiled_s * 1e3, ":+", color="C3", label="predicted (profiled layer times)")
    ax.set_xscale("log")
    ax.set_xlabel("DDP bucket size (MiB)")
    ax.set_ylabel("iteration time (ms)")
    ax.legend(fontsize="small")


def draw_bucket_communication(ax, sizes, exposed: bool) -> None:
    """Data-parallel communication per iteration against the bucket size: the measured exposed and all-reduce
    times where measured (``exposed``, means over the repeats), the predicted exposed time dashed."""
    if exposed:
        ax.plot(sizes.bucket_mb, sizes[EXPOSED] * 1e3, "o", color="C1", label="measured exposed")
        ax.plot(sizes.bucket_mb, sizes[ALLREDUCE] * 1e3, "s", color="C2", label="measured all-reduce time")
    ax.plot(sizes.bucket_mb, sizes.predicted_exposed_s * 1e3, "--x", color="C1", label="predicted exposed")
    ax.set_xscale("log")
    ax.set_xlabel("DDP bucket size (MiB)")
    ax.set_ylabel("communication per iteration (ms)")
    ax.legend(fontsize="small")


def waiting(frame, labels) -> pd.DataFrame:
    """Every rank's waiting in every run that measured it: one row per run (``label`` from ``labels``, a list as
    long as ``frame``), ``repeat`` and ``rank``, with ``waiting_s`` (the rank's exposed time: blocked in, or idle
    during, communication of any kind, pipeline receives included; :mod:`distperf.measure.comm`), ``window_s``
    (the measured step on that rank) and ``share`` = waiting_s / window_s, and the waiting by kind."""
    out = []
    for label, (_, run) in zip(labels, frame.iterrows()):
        ranks = run.get(PER_RANK)
        if not isinstance(ranks, str):
            continue
        for rank, comm in enumerate(json.loads(ranks)):
            window = float(comm.get("window_s") or math.nan)
            row = {"label": label, "repeat": run.get("repeat", 0), "rank": rank,
                   "waiting_s": float(comm["exposed_s"]["total"]), "window_s": window}
            row["share"] = row["waiting_s"] / window if window > 0 else math.nan
            out.append({**row, **{f"waiting_s.{k}": float(v) for k, v in comm["exposed_s"].items() if k != "total"}})
    return pd.DataFrame(out, columns=["label", "repeat", "rank", "waiting_s", "window_s", "share"] if not out else None)


def waiting_summary(wait) -> pd.DataFrame:
    """One row per configuration and rank of :func:`waiting`: ``runs``, the mean waiting ``share`` of the step
    and its 95 % t-interval (``low``, ``high``) over the repeats, and the mean waiting by kind (seconds)."""
    out = []
    kinds = [c for c in wait.columns if c.startswith("waiting_s.")]
    for (label, rank), runs in wait.groupby(["label", "rank"], sort=False):
        mean, low, high = repeats.interval(runs.share.dropna())
        out.append({"label": label, "rank": int(rank), "runs": len(runs), "share": mean, "low": low, "high": high,
                    **{k: float(runs[k].mean()) for k in kinds}})
    return pd.DataFrame(out)


def draw_waiting(ax, summary) -> None:
    """Each rank's waiting share of its step, per configuration, with its 95 % interval over the repeats."""
    import numpy as np

    labels = list(dict.fromkeys(summary.label))
    width = 0.8 / max(1, summary["rank"].nunique())
    for rank, part in summary.groupby("rank"):
        x = np.array([labels.index(label) for label in part.label]) + (rank - 0.5) * width
        err = np.nan_to_num(np.array([part.share - part.low, part.high - part.share]))
        ax.bar(x, part.share * 100, width, yerr=err * 100, capsize=3, label=f"rank {rank}")
    ax.set_xticks(range(len(labels)), labels, rotation=15, ha="right", fontsize="small")
    ax.set_ylabel("waiting, % of the step")
    ax.legend(fontsize="small")


def largest_waiting(summary, configurations) -> tuple[float, str]:
    """(share, 'configuration, rank r'): the largest mean waiting share among the ranks of ``configurations``;
    (NaN, '') when none was measured."""
    part = summary[summary.label.isin(configurations)].dropna(subset=["share"])
    if part.empty:
        return math.nan, ""
    worst = part.loc[part.share.idxmax()]
    return float(worst.share), f"{worst.label}, rank {int(worst['rank'])}"


def error_rows(memory, zero, bucket) -> list[dict]:
    """The rows of the signed-error table: memory per category, then for each ZeRO run and each bucket size
    (``bucket``: one row per size, :func:`.rows.ok`) the iteration time and, for two ranks where measured, the
    data-parallel bytes sent (MiB) and the exposed communication (ms)."""
    table = memory_rows(memory)
    both = pd.concat([zero, bucket.assign(label=[f"dp 2, bucket {mb:g} MiB" for mb in bucket.bucket_mb])])
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


def statistics(loopback: BucketEffect, slow: BucketEffect, waiting_share: float) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): how far the bucket size moves the iteration time
    and the permutation p-value of that, on this machine's loopback and on the emulated slow link, and the largest
    share of its step that a rank spends waiting."""
    return {"bucket_spread": float(loopback.spread), "bucket_p": float(loopback.p),
            "slow_spread": float(slow.spread), "slow_p": float(slow.p), "waiting_share": float(waiting_share)}


def finding(loopback: BucketEffect, slow: BucketEffect, waiting_share: float, who: str) -> str:
    """The verdict's finding, from the statistics."""
    text = (f"Across {loopback.sizes} bucket sizes DDP's step changed by {loopback.spread:.0%} ({p_text(loopback.p)}; "
            f"fastest at {loopback.best:g} MiB)")
    if slow.sizes:
        text += f", on the emulated slow link by {slow.spread:.0%} ({p_text(slow.p)}; fastest at {slow.best:g} MiB)"
    if waiting_share == waiting_share:
        text += f"; the rank that waits most ({who}) waits {waiting_share:.0%} of its step"
    return text
