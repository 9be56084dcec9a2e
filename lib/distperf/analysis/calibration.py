"""What the calibration chapter (``chapters/calibration.md``) computes from the calibration tables: each
machine's matrix-product rate R, the α-β fit of each collective and its errors, a layer's and a whole model's
time predicted analytically (FLOPs / R) and from profiled parts, and the verdict on whether these few numbers
describe the machine.

- :func:`fp32_rates`, :func:`provenance`, :func:`draw_gemm`: the rates R and the matrix-product figure;
- :func:`with_ring_fit`, :func:`fit_table`, :func:`draw_collectives` and the functions after them: the α-β
  model t = k(n)·α + c(n)·M/β beside each measured collective, and each fit's error;
- :func:`layer_predictions`, :func:`backward_ratio`: one layer's forward and backward against F/R and 2F/R;
- :func:`model_predictions`, :func:`model_table`, :func:`draw_model`: the whole model, profiled and analytical;
- :func:`criteria`, :func:`verdict`, :func:`finding`: the ±:data:`TOLERANCE` criterion and the verdict.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import book, plots, results
from ..cost import flops
from ..cost.collectives import ring_terms
from .verdicts import TIME_MAX
from .measured_vs_predicted import error_range  # noqa: F401 (the chapter quotes ranges through this module)

# A prediction is good within ±25 % of the measurement (an α-β fit: rms relative error ≤ 25 %): the book's
# largest error allowed to a time prediction (distperf.analysis.verdicts.TIME_MAX).
TOLERANCE = TIME_MAX
FIT_FORMAT = {"α (µs)": "{:.1f}", "β (GB/s)": "{:.2f}", "rms rel. error": "{:.0%}", "most negative error": "{:+.0%}",
              "most positive error": "{:+.0%}"}
MODEL_FORMAT = {"measured (ms)": "{:.2f}", "profiled (ms)": "{:.2f}", "analytical (ms)": "{:.2f}",
                "profiled error": "{:+.0%}", "analytical error": "{:+.0%}"}
FIT_CRITERION, PROFILED_CRITERION, ANALYTICAL_CRITERION = ("the α-β fits (rms)", "the profiled model times",
                                                           "the analytical model times")


def fresh_machine(frame: pd.DataFrame) -> str:
    """The machine of this build's rows (``source`` fresh)."""
    return frame[frame.source == "fresh"].machine.iloc[0]


def fp32_rates(gemm: pd.DataFrame, hw) -> pd.Series:
    """The fp32 rate R of each machine: this build's profile ``hw`` for this build's machine, and for a reference
    machine its fastest fp32 product (what its profile keeps), so that each machine is predicted with its own."""
    peak32 = gemm[gemm.dtype == "float32"].groupby("machine").flops_per_s.max()
    peak32[fresh_machine(gemm)] = hw.flops_fp32
    return peak32


def provenance(gemm: pd.DataFrame) -> str:
    """Where the calibration came from (:func:`distperf.book.provenance_caption`), marked when it was quick."""
    return book.provenance_caption(gemm) + (" (quick calibration)" if gemm.quick.any() else "")


def draw_gemm(gemm: pd.DataFrame, hw):
    """Matrix-product rate against size, one series per machine and dtype, with the profile's rates dashed."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    g = gemm.assign(series=gemm.machine + ", " + gemm.dtype, gflops=gemm.flops_per_s / 1e9)
    sns.lineplot(data=g, x="n", y="gflops", hue="series", style="series", markers=True, dashes=False, ax=ax)
    for value, dtype in ((hw.flops_fp32, "fp32"), (hw.flops_16bit, "bf16")):
        ax.axhline(value / 1e9, ls="--", color="grey", lw=1)
        ax.annotate(f"profile R ({dtype})", (g.n.min(), value / 1e9), fontsize="x-small", va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("n (n×n by n×n product)")
    ax.set_ylabel("GFLOP/s")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


# --- collectives: the α-β fit ------------------------------------------------------------------------------

def with_ring_fit(coll: pd.DataFrame) -> pd.DataFrame:
    """The measured collectives with the ring model's ``steps`` k(n) and ``volume`` c(n)·M
    (:func:`distperf.cost.collectives.ring_terms`), the fit's ``predicted_s`` = k·α + c·M/β and its signed
    ``error`` (predicted − measured)/measured."""
    coll = coll.copy()
    coll["steps"], coll["volume"] = zip(*[ring_terms(r.collective, r.ranks, r.bytes) for r in coll.itertuples()])
    coll["predicted_s"] = coll.steps * coll.alpha + coll.volume / coll.beta
    coll["error"] = results.signed_error(coll.predicted_s, coll.seconds)
    return coll


def draw_collectives(coll: pd.DataFrame):
    """One panel per collective: measured time against message size (points, one colour per machine and rank
    count) and the fitted α-β line (dashed)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    kinds = sorted(coll.collective.unique())
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.0 * len(kinds), 3.4), sharey=True)
    axes = np.atleast_1d(axes)
    colours = sns.color_palette(plots.PALETTE, coll.ranks.nunique() * coll.machine.nunique())
    for ax, kind in zip(axes, kinds):
        part = coll[coll.collective == kind]
        for colour, ((machine, n), sub) in zip(colours, part.groupby(["machine", "ranks"])):
            sub = sub.sort_values("bytes")
            ax.scatter(sub.bytes, sub.seconds * 1e6, color=colour, s=25, zorder=3, label=f"{machine}, {n} ranks")
            ax.plot(sub.bytes, sub.predicted_s * 1e6, ls="--", color=colour, lw=1.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(kind, fontsize="small")
        ax.set_xlabel("message (bytes)")
    axes[0].set_ylabel("time (µs)")
    axes[0].plot([], [], ls="--", color="grey", label="α-β fit")
    axes[0].legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def rms(errors) -> float:
    """Root mean square of relative errors, √(mean(e²))."""
    return float(np.sqrt(np.mean(errors**2)))


def fit_table(coll: pd.DataFrame) -> pd.DataFrame:
    """One row per machine, collective and rank count: α (µs), β (GB/s), the number of message sizes and the
    fit's rms, most negative and most positive signed error (formats in :data:`FIT_FORMAT`)."""
    fits = (coll.groupby(["machine", "collective", "ranks"])
            .agg(alpha=("alpha", "first"), beta=("beta", "first"), points=("error", "size"), rms=("error", rms),
                 lowest=("error", "min"), highest=("error", "max"))
            .reset_index())
    fits["alpha"] *= 1e6
    fits["beta"] /= 1e9
    return fits.rename(columns={"alpha": "α (µs)", "beta": "β (GB/s)", "rms": "rms rel. error",
                                "lowest": "most negative error", "highest": "most positive error"})


def fresh_fits(fits: pd.DataFrame, coll: pd.DataFrame) -> pd.DataFrame:
    """The fits of this build's machine."""
    return fits[fits.machine == fresh_machine(coll)]


def all_reduce_fit(fits: pd.DataFrame) -> pd.Series:
    """The (first) all-reduce fit: the one the profile keeps for every link."""
    return fits[fits.collective == "all-reduce"].iloc[0]


def rms_range(fits: pd.DataFrame) -> str:
    """The smallest to the largest rms relative error of the fits."""
    return f"{fits['rms rel. error'].min():.0%} to {fits['rms rel. error'].max():.0%}"


def worst_fit(fits: pd.DataFrame) -> str:
    """The collective whose fit has the largest rms relative error."""
    return f"{fits.loc[fits['rms rel. error'].idxmax()].collective}"


# --- layers and the whole model -----------------------------------------------------------------------------

def timed_parts(layers: pd.DataFrame) -> pd.DataFrame:
    """The timed parts that have FLOPs to divide: the layer and the head (the embedding is a lookup)."""
    return layers[layers.part != "embedding"].copy()


def layer_predictions(layers: pd.DataFrame, peak32: pd.Series) -> pd.DataFrame:
    """One row per part and pass: ``measured_s``, ``flops`` (F forward, 2F backward), ``predicted_s`` = flops / R
    of the part's machine, the signed ``error`` and the plot's ``series``; ``pass_`` names the pass."""
    parts = timed_parts(layers)
    parts["peak"] = parts.machine.map(peak32)
    long = pd.concat([
        parts.assign(pass_="forward", measured_s=parts.forward_s, flops=parts.forward_flops),
        parts.assign(pass_="backward", measured_s=parts.backward_s, flops=2 * parts.forward_flops),
    ], ignore_index=True)
    long["predicted_s"] = long.flops / long.peak
    long["error"] = results.signed_error(long.predicted_s, long.measured_s)
    long["series"] = long.model + " " + long.part + ", " + long.pass_
    return long


def median_error(long: pd.DataFrame, pass_: str) -> float:
    """The median signed error of one pass (``forward`` or ``backward``)."""
    return long[long.pass_ == pass_].error.median()


def backward_ratio(layers: pd.DataFrame) -> float:
    """The median of backward / forward time over the timed parts (FLOPs count 2)."""
    parts = timed_parts(layers)
    return (parts.backward_s / parts.forward_s).median()


def model_predictions(layers: pd.DataFrame, whole: pd.DataFrame, peak32: pd.Series) -> pd.DataFrame:
    """The measured whole models with ``profiled_s`` = layers × (layer forward + backward) + embedding + head,
    ``analytical_s`` = model FLOPs / R (:func:`distperf.cost.flops.model_flops`, f = 4h), the signed errors
    ``error_profiled`` and ``error_analytical``, and the plot's ``series`` (machine and model)."""
    fb = layers.assign(fb=layers.forward_s + layers.backward_s).pivot_table(
        index=["machine", "model", "micro_batch"], columns="part", values="fb").reset_index()
    w = whole.merge(fb, on=["machine", "model", "micro_batch"])
    w["profiled_s"] = w["layers"] * w["layer"] + w["embedding"] + w["head"]
    w["analytical_s"] = [flops.model_flops(r.micro_batch, r.layers, r.seq, r.hidden, 4 * r.hidden, r.vocab)
                         / peak32[r.machine] for r in w.itertuples()]
    w["error_profiled"] = results.signed_error(w.profiled_s, w.time_s)
    w["error_analytical"] = results.signed_error(w.analytical_s, w.time_s)
    w["series"] = w.machine + ", " + w.model
    return w


def draw_model(w: pd.DataFrame):
    """Whole-model forward + backward time against micro-batch, one colour per machine and model: measured
    (points), profiled (dashed) and analytical (dotted)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colours = sns.color_palette(plots.PALETTE, w.series.nunique())
    for colour, (series, sub) in zip(colours, w.groupby("series")):
        sub = sub.sort_values("micro_batch")
        ax.scatter(sub.micro_batch, sub.time_s * 1e3, color=colour, s=50, zorder=3, label=f"{series}, measured")
        ax.plot(sub.micro_batch, sub.profiled_s * 1e3, ls="--", color=colour, lw=1.5)
        ax.plot(sub.micro_batch, sub.analytical_s * 1e3, ls=":", color=colour, lw=1.5)
    ax.plot([], [], ls="--", color="grey", label="profiled (sum of parts)")
    ax.plot([], [], ls=":", color="grey", label="analytical (FLOPs / R)")
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("forward + backward (ms)")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def model_table(w: pd.DataFrame) -> pd.DataFrame:
    """Measured, profiled and analytical whole-model times in ms with the signed errors (formats in
    :data:`MODEL_FORMAT`)."""
    tbl = w[["machine", "model", "micro_batch", "time_s", "profiled_s", "error_profiled", "analytical_s",
             "error_analytical"]].copy()
    for c in ("time_s", "profiled_s", "analytical_s"):
        tbl[c] *= 1e3
    return tbl.rename(columns={"micro_batch": "b", "time_s": "measured (ms)", "profiled_s": "profiled (ms)",
                               "error_profiled": "profiled error", "analytical_s": "analytical (ms)",
                               "error_analytical": "analytical error"})


def fresh_models(w: pd.DataFrame) -> pd.DataFrame:
    """The whole models this build measured."""
    return w[w.source == "fresh"]



def smallest_model_error(wf: pd.DataFrame) -> str:
    """The profiled error range of the smallest model (least layers × h²), and its name."""
    size = wf.layers * wf.hidden**2
    smallest = wf[size == size.min()]
    return f"{error_range(smallest.error_profiled)} ({smallest.model.iloc[0]})"


# --- verdict ------------------------------------------------------------------------------------------------

def criteria(fits: pd.DataFrame, wf: pd.DataFrame, tolerance: float = TOLERANCE) -> dict[str, bool]:
    """Which predictions meet the criterion: every fit's rms relative error, every profiled and every analytical
    whole-model error within ±``tolerance``."""
    return {FIT_CRITERION: bool((fits["rms rel. error"] <= tolerance).all()),
            PROFILED_CRITERION: bool((wf.error_profiled.abs() <= tolerance).all()),
            ANALYTICAL_CRITERION: bool((wf.error_analytical.abs() <= tolerance).all())}


def statistics(fits: pd.DataFrame, wf: pd.DataFrame) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the α-β fits' largest rms relative error and
    the profiled whole-model times' largest |signed error| (the analytical times inform but do not decide)."""
    return {"fit_rms": float(fits["rms rel. error"].max()),
            "profiled_largest": float(wf.error_profiled.abs().max())}


def criteria_text(met: dict[str, bool], meets: bool) -> str:
    """The predictions that meet (``meets``) or miss the criterion, listed, or ``none``."""
    return ", ".join(name for name, ok in met.items() if ok == meets) or "none"


def finding(hw, ar: pd.Series, wf: pd.DataFrame) -> str:
    """The chapter's finding in one line: R, the all-reduce's α and β, and the ranges of the whole-model errors."""
    return (f"On this machine the fastest fp32 product runs at {hw.flops_fp32 / 1e9:.0f} GFLOP/s and an all-reduce "
            f"costs α = {ar['α (µs)']:.0f} µs plus 1/β with β = {ar['β (GB/s)']:.2f} GB/s; "
            f"summing profiled layer times misses a whole model's step by {error_range(wf.error_profiled)}, "
            f"FLOPs / R by {error_range(wf.error_analytical)}.")
