"""What the layer-timing chapter (``chapters/layer_timing.md``) computes: one Transformer layer's forward +
backward time predicted as FLOPs over the machine's fastest matrix-product rate, against the measured time.

- :func:`peak_rates`, :func:`with_prediction`: each machine's rate R and the prediction F / R beside each
  measured layer, with its signed error and the rate the layer achieved;
- :func:`error_table`, :func:`extremes`, :func:`under_predicted`: the chapter's table and the numbers its
  prose quotes;
- :func:`peak_fraction_trend`, :func:`trend_sentence`: whether the achieved fraction of R grows with the layer;
- :func:`statistics`: what the chapter's rule (:mod:`distperf.analysis.verdicts`) decides on;
- :func:`under_sentence`: how often the prediction is too low, and whether that is the expected sign;
- :func:`finding`: the one-line finding.
"""
from __future__ import annotations

import pandas as pd

from .. import results
from ..cost import flops

# Spearman ρ of the achieved fraction of R with FLOPs above which that fraction "grows with the layer's size".
TREND_RHO = 0.5
TABLE_FORMAT = {"GFLOP": "{:.3f}", "measured (ms)": "{:.2f}", "predicted (ms)": "{:.2f}", "signed error": "{:+.0%}",
                "achieved GFLOP/s": "{:.1f}"}


def peak_rates(gemm: pd.DataFrame) -> pd.Series:
    """Each machine's rate R: its fastest measured dense matrix product (FLOP/s), named ``peak_flops``."""
    return gemm.groupby("machine")["rate_flops"].max().rename("peak_flops")


def with_prediction(layers: pd.DataFrame, gemm: pd.DataFrame) -> pd.DataFrame:
    """The measured layers with ``peak_flops`` (R), ``flops`` = 3 · F_fwd (forward + backward,
    :func:`distperf.cost.flops.layer_forward_flops`), ``predicted_s`` = flops / R, the signed ``error``
    (predicted − measured)/measured, ``achieved_flops`` = flops / measured time, its ``fraction_of_peak`` and
    the plot's ``series`` (machine and sequence length)."""
    layers = layers.join(peak_rates(gemm), on="machine")
    layers["flops"] = [3 * flops.layer_forward_flops(r.batch, r.seq, r.hidden, r.ffn) for r in layers.itertuples()]
    layers["predicted_s"] = layers["flops"] / layers["peak_flops"]
    layers["error"] = results.signed_error(layers["predicted_s"], layers["time_s"])
    layers["achieved_flops"] = layers["flops"] / layers["time_s"]
    layers["fraction_of_peak"] = layers["achieved_flops"] / layers["peak_flops"]
    layers["series"] = layers["machine"] + ", s = " + layers["seq"].astype(str)
    return layers


def fresh_row(layers: pd.DataFrame) -> pd.Series:
    """The first layer measured by this build (``source`` fresh): its device and rate R."""
    return layers[layers.source == "fresh"].iloc[0]


def error_table(layers: pd.DataFrame) -> pd.DataFrame:
    """The chapter's table: shape, GFLOP, measured and predicted ms, signed error and achieved GFLOP/s
    (formats in :data:`TABLE_FORMAT`)."""
    table = layers[["machine", "hidden", "seq", "batch", "flops", "time_s", "predicted_s", "error",
                    "achieved_flops"]].copy()
    table = table.rename(columns={"time_s": "measured (ms)", "predicted_s": "predicted (ms)", "error": "signed error",
                                  "flops": "GFLOP", "achieved_flops": "achieved GFLOP/s"})
    table["measured (ms)"] *= 1e3
    table["predicted (ms)"] *= 1e3
    table["GFLOP"] /= 1e9
    table["achieved GFLOP/s"] /= 1e9
    return table


def extremes(layers: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The layers of largest and of smallest absolute error (worst, best)."""
    return layers.loc[layers.error.abs().idxmax()], layers.loc[layers.error.abs().idxmin()]


def error_text(row: pd.Series) -> str:
    """A layer's signed error and shape: ``-42% (h = 64, s = 32)``."""
    return f"{row.error:+.0%} (h = {row.hidden}, s = {row.seq})"


def under_predicted(layers: pd.DataFrame) -> int:
    """How many layers the prediction puts below the measured time (negative error)."""
    return int((layers.error < 0).sum())


def peak_fraction_trend(layers: pd.DataFrame) -> float:
    """Spearman's rank correlation of the achieved fraction of R with the layer's FLOPs."""
    return layers[["flops", "fraction_of_peak"]].corr(method="spearman").iloc[0, 1]


def trend_sentence(rho: float) -> str:
    """Whether the achieved fraction of R grows with the layer's size (ρ above :data:`TREND_RHO`)."""
    return "grows with the layer's size" if rho > TREND_RHO else "does not grow steadily with the layer's size"


def statistics(layers: pd.DataFrame) -> dict:
    """The rule's statistics over the layers this build measured: median and largest |signed error|."""
    errors = layers[layers.source == "fresh"].error.abs()
    return {"median_error": float(errors.median()), "largest_error": float(errors.max())}


def under_sentence(under: int, count: int) -> str:
    """Whether the prediction is mostly too low, as a model that leaves out all work but matrix products at the
    best rate should be, or not."""
    if count and under * 2 > count:
        return ("the sign expected of a model that leaves out all work that is not a matrix product (LayerNorm, "
                "GELU, softmax, memory traffic, framework overhead) and assumes every product runs at the fastest "
                "rate ever measured")
    return ("not the sign expected of a model that leaves out all work but the matrix products: here the layers "
            "ran faster than the best measured product rate allows, so R (one product's best rate) is below what "
            "the layer's products achieve")


def trend_reason(rho: float) -> str:
    """Why the achieved fraction of R grows with the layer (or that it does not), to follow :func:`trend_sentence`."""
    if rho > TREND_RHO:
        return (": small products cannot use the peak rate and the ignored element-wise work is a larger share of "
                "small layers")
    return ", so on this machine the shapes, not the size, set how close a layer comes to the peak rate"


def finding(best: pd.Series, worst: pd.Series, under: int, count: int) -> str:
    """The chapter's finding in one line: the range of signed errors and how often the model under-predicts."""
    return (f"FLOPs over the peak matrix rate predict a layer's time with signed errors from {best.error:+.0%} "
            f"to {worst.error:+.0%}, under-predicting in {under} of {count} sizes.")
