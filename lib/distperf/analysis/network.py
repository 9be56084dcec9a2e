"""The emulated cluster, for the chapter ``network``: ranks on emulated nodes joined by links shaped to a set
rate (:mod:`distperf.emulation`).

- :func:`measured_rows`, :func:`rate_text`: an experiment's measured rows (or why there are none), and link rates
  as text;
- :func:`link_calibrations`, :func:`calibration_rows`, :func:`calibration_texts`: the links' bandwidth measured
  under emulation against the set rate, and the α-β fits per rate;
- :func:`link_hardware`: this machine's profile with the emulated links, as calibrated;
- pipeline against data parallelism against the link rate (:func:`pp_vs_dp_rows`, :func:`predicted_ratio`,
  with the crossover of :func:`distperf.analysis.pp_vs_dp.crossover`), the DDP bucket size on a slow link
  (:func:`bucket_rows`), and the placement of a stage's replicas inside or across nodes
  (:func:`placement_rows`, :func:`placement_gain`); the sentences built from each, and the chapter's verdict.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import book, presets, results
from ..cost import predict
from ..emulation import spec as netspec
from .pp_vs_dp import DP_LAYOUT, PP_LAYOUT, crossover, layout_names, pp_over_dp
from .repeats import ratio_interval
from .rows import bucket_bytes, config_of_row, global_batch, ok, run_hardware
from .verdicts import share

PREDICTED_RATES = np.logspace(6, 10, 161)  # 1 Mbit/s to 10 Gbit/s, for the predicted curves
EXPOSED = "communication.exposed_s.data_parallel"
INSIDE, ACROSS = "replicas inside a node", "replicas across nodes"
CALIBRATION_FORMAT = {"MiB": "{:g}", "measured (Mbit/s)": "{:,.1f}", "signed error": "{:+.1%}"}
PLACEMENT_FORMAT = {"measured samples/s": "{:,.1f}", "predicted samples/s": "{:,.1f}", "signed error": "{:+.0%}"}
PP_KEYS = ("net-pp-model", "net-pp-measured-x", "net-pp-predicted-x", "net-pp-ratio", "net-pp-err", "net-pp-like")
BUCKET_KEYS = ("net-bucket-rate", "net-bucket-range", "net-bucket-predicted-best", "net-bucket-measured-best",
               "net-bucket-err", "net-bucket-exposed", "net-bucket-spread")


def measured_or_why(frame):
    """``(rows, "")`` with the rows that ran (status ``ok``), or ``(None, reason)`` where none did: the sweep's
    first message, else 'no configuration ran'."""
    good = ok(frame)
    if len(good):
        return good, ""
    reasons = frame.get("message", pd.Series(dtype=str)).dropna()
    return None, (reasons.iloc[0] if len(reasons) else "no configuration ran")


def measured_rows(experiment: str, scale: str | None = None, repeats: bool = False):
    """The experiment's measured rows (:func:`measured_or_why` of :func:`distperf.results.load`), and why there
    are none when there are none; a table that was never written says that the experiment notebook has not run.
    With ``repeats``, every row (each repeat, every status) of an experiment with at least one run that succeeded,
    for analyses that need the repeats themselves."""
    try:
        frame = results.load(experiment, scale)
    except FileNotFoundError:
        return None, "the experiment notebook has not run at this scale"
    good, why = measured_or_why(frame)
    if good is None:
        return None, why
    return (frame if repeats else good), ""


def rate_text(bits: float) -> str:
    """A rate in bit/s as text with three significant digits in the largest unit it reaches: '976 Mbit/s'."""
    for unit, size in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= size:
            return f"{bits / size:.3g} {unit}"
    return f"{bits:.3g} bit/s"


def not_measured_texts(keys, why: str) -> dict:
    """Every glue key of a section that could not be measured, with 'not measured (why)'."""
    return {key: f"not measured ({why})" for key in keys}


def link_calibrations(networks):
    """From the ``network`` sections of ``distperf calibrate --network`` results: one frame of all their
    measurements (``table``: set and measured bandwidth per collective and size) and the α-β fits of the
    inter-node link, ``{set rate in bit/s: {collective: {"alpha", "beta"}}}``."""
    table, fits = [], {}
    for net in networks:
        table.extend(net.get("table", []))
        if "fits" in net:
            fits[net["inter_bit_per_s"]] = net["fits"]["inter"]
    return pd.DataFrame(table), fits


def read_link_calibrations(directory):
    """:func:`link_calibrations` of the ``network_calibration_*.calibration.json`` files in ``directory``, in
    the order of their names."""
    return link_calibrations([json.loads(side.read_text()).get("network", {})
                              for side in sorted(directory.glob("network_calibration_*.calibration.json"))])


def calibration_provenance(calibration, scale: str, directory=None) -> str:
    """Where the link calibration came from: the machine, date and commit its files record (``directory``'s
    ``network_calibration_*.calibration.json``), labelled this build or reference data (a reader's build), and
    ``scale``; the cost model's provenance where nothing was calibrated."""
    if not len(calibration):
        return book.model_provenance()
    sides = [json.loads(p.read_text()).get("provenance", {})
             for p in sorted(Path(directory or results.book_dir(scale)).glob("network_calibration_*.calibration.json"))]
    origin = "reference data" if results.book_from() == "reference" else "this build"
    machine = sides[0].get("machine", results.machine_slug("cpu")) if sides else results.machine_slug("cpu")
    device = sides[0].get("device_name", results.device_name("cpu")) if sides else results.device_name("cpu")
    commits = ", ".join(dict.fromkeys(str(p.get("commit", "unknown")) for p in sides)) or results.git_commit()
    dates = sorted({str(p.get("date", ""))[:10] for p in sides} - {""})
    when = (f", {dates[0]}" if len(dates) == 1 else f", {dates[0]} to {dates[-1]}") if dates else ""
    return f"{device} ({machine}, {origin}), calibration under emulation{when}, commit {commits}, scale {scale}"


def link_hardware(hw, fits: dict, rate_bits: float, ranks_per_node: int):
    """``hw`` with emulated links of ``rate_bits``: the link's bandwidth is the set rate times what the nearest
    calibrated rate (in log) achieved of its set rate in the send/recv fit β (messages of 1 MiB and more), the
    latency that fit's α; without calibration the set rate and the profile's intra-node latency. Each of a
    node's ``ranks_per_node`` ranks gets 1/R of the link when all cross nodes at once, as in the planner's
    topology; inside a node, loopback (the profile's intra-node link)."""
    beta, alpha = rate_bits / 8, hw.intra_latency
    if fits:
        nearest = min(fits, key=lambda r: abs(np.log(r / rate_bits)))
        fit = fits[nearest]["send"]
        beta = rate_bits / 8 * fit["beta"] / (nearest / 8)
        alpha = fit["alpha"]
    return dataclasses.replace(hw, devices_per_node=ranks_per_node, inter_bandwidth=beta / ranks_per_node,
                               inter_latency=alpha)


def calibration_rows(calibration):
    """The calibration's messages of 1 MiB and more with their size in MiB, the set rate as text, the measured
    bandwidth in Mbit/s and the signed error measured/set − 1; None where nothing was calibrated."""
    if not len(calibration):
        return None
    big = calibration[calibration.bytes >= 2**20].copy()
    big["MiB"] = big.bytes / 2**20
    big["set rate"] = [rate_text(r) for r in big.set_bit_per_s]
    big["measured (Mbit/s)"] = big.bandwidth_bit_per_s / 1e6
    big["signed error"] = big.ratio - 1
    return big


def missing_table(why: str):
    """The one-cell table a section shows when it was not measured: why."""
    return pd.DataFrame({"not measured": [why]})


def calibration_table(big, why: str):
    """The columns of :func:`calibration_rows` the chapter's table shows; where nothing was calibrated
    (``big`` None), :func:`missing_table` with ``why`` the pipeline runs are missing, else 'no calibration under
    emulation'."""
    if big is None:
        return missing_table(why or "no calibration under emulation")
    return big[["set rate", "collective", "scope", "ranks", "MiB", "measured (Mbit/s)", "signed error"]]


def calibration_texts(big, fits: dict) -> dict:
    """The calibration's sentences, by glue key: the largest miss (``net-calib-worst``), how many measurements
    lie within 10% of the set rate (``net-calib-within``) and, per set rate, how far each fit's β is from it
    (``net-calib-beta``, β·8/rate − 1); 'not measured' ('none') where nothing was calibrated (``big`` None)."""
    if big is None:
        return {"net-calib-worst": "not measured", "net-calib-within": "none", "net-calib-beta": "not measured"}
    worst = big.loc[big["signed error"].abs().idxmax()]
    return {
        "net-calib-worst": f"{worst['signed error']:+.1%} ({worst.collective}, {worst.MiB:g} MiB at "
                           f"{worst['set rate']})",
        "net-calib-within": f"{int((big['signed error'].abs() <= 0.10).sum())} of {len(big)}",
        "net-calib-beta": "; ".join(f"{rate_text(rate)}: " + ", ".join(f"{coll} {fit['beta'] * 8 / rate - 1:+.1%}"
                                                                         for coll, fit in sorted(fit_set.items()))
                                    for rate, fit_set in sorted(fits.items())),
    }


def like_rates(like: dict) -> dict:
    """``{preset: rate in bit/s}`` from ``network_like.json``'s ``{preset: rate text}`` (the rates that give
    this machine a target cluster's FLOP per byte)."""
    return {preset: netspec.parse_rate(rate) for preset, rate in like.items()}


def read_like_rates(directory) -> dict:
    """:func:`like_rates` of ``directory``/network_like.json, empty where the file is missing."""
    path = directory / "network_like.json"
    return like_rates(json.loads(path.read_text()) if path.exists() else {})


def main_slice(pp):
    """The rows of the (model, global batch) swept over the most link rates: the experiment measures one slice
    down to the rates "like" target clusters, and the others (the map of claim 1, :mod:`.pp_dp_map`) over fewer
    rates; this chapter follows the first."""
    batch = global_batch(pp)
    rates = pp.groupby([pp["config.model.name"], batch])["network.inter_bit_per_s"].nunique()
    model, size = rates.idxmax()
    return pp[(pp["config.model.name"] == model) & (batch == size)].copy()


def pp_vs_dp_rows(pp, hw, fits: dict):
    """The pipeline-against-data runs with their link ``rate`` (bit/s), ``layout``, global batch ``samples``,
    ``measured`` and ``predicted`` samples/s (the cost model on :func:`link_hardware` of one rank per node) and
    the signed ``error``."""
    pp["rate"] = pp["network.inter_bit_per_s"].astype(float)
    pp["layout"] = layout_names(pp)
    pp["samples"] = global_batch(pp)
    pp["measured"] = pp.samples / pp["iteration_time_s.median"]
    pp["predicted"] = [r.samples / predict(config_of_row(r), run_hardware(link_hardware(hw, fits, r.rate, 1), r),
                                           bucket_bytes(r))["time_s"]["iteration"] for _, r in pp.iterrows()]
    pp["error"] = results.signed_error(pp.predicted, pp.measured)
    return pp


def measured_ratio(pp):
    """Measured PP/DP per link rate, ascending, at the rates where both layouts ran."""
    return pp_over_dp(pp.pivot_table(index="rate", columns="layout", values="measured")).dropna().sort_index()


def predicted_ratio(pp, hw, fits: dict, rates=PREDICTED_RATES):
    """The cost model's PP/DP (T_DP / T_PP) at each of ``rates`` for the runs' DP and PP configurations, on
    :func:`link_hardware` of one rank per node."""
    cfg_dp = config_of_row(pp[pp.layout == DP_LAYOUT].iloc[0])
    cfg_pp = config_of_row(pp[pp.layout == PP_LAYOUT].iloc[0])
    return np.array([predict(cfg_dp, link_hardware(hw, fits, r, 1))["time_s"]["iteration"] /
                     predict(cfg_pp, link_hardware(hw, fits, r, 1))["time_s"]["iteration"] for r in rates])


def crossovers(ratio, curve, rates=PREDICTED_RATES):
    """The measured and the predicted crossover (:func:`distperf.analysis.pp_vs_dp.crossover`): where the
    measured PP/DP per rate (``ratio``, ascending) and the predicted ``curve`` at ``rates`` cross 1; each None
    where it does not."""
    return crossover(ratio.index, ratio.values), crossover(rates, curve)


def draw_like_rates(ax, like_bits: dict) -> None:
    """A dotted vertical line at each target cluster's rate, labelled 'like PRESET'."""
    for preset, bits in like_bits.items():
        ax.axvline(bits, color="black", lw=0.7, ls=":")
        ax.annotate(f"like {preset}", (bits, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize="x-small")


def draw_pp_vs_dp(pp, ratio, curve, like_bits: dict, intervals=None, rates=PREDICTED_RATES):
    """Left: samples/s of each layout against the link rate, measured and predicted; right: PP/DP measured, with
    its 95 % interval over the repeats where given (:func:`ratio_intervals`), and predicted (``curve`` at
    ``rates``) with the line PP/DP = 1; both with the target clusters' rates."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9))
    for (layout, part), colour in zip(pp.sort_values("rate").groupby("layout"), ("C0", "C1")):
        axes[0].plot(part.rate, part.measured, "o", color=colour, label=f"{layout}, measured")
        axes[0].plot(part.rate, part.predicted, "--x", color=colour, label=f"{layout}, predicted")
    bounds = (intervals if intervals is not None else pd.DataFrame(columns=["low", "high"])).reindex(ratio.index)
    below = (ratio - bounds.low).clip(lower=0).fillna(0).values
    above = (bounds.high - ratio).clip(lower=0).fillna(0).values
    axes[1].errorbar(ratio.index, ratio.values, yerr=[below, above], fmt="o", color="C2", capsize=3,
                     label="measured (95 % interval)")
    axes[1].plot(rates, curve, "--", color="C2", label="predicted")
    axes[1].axhline(1, color="grey", lw=0.8)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("inter-node link rate (bit/s)")
        draw_like_rates(ax, like_bits)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("samples per second")
    axes[1].set_yscale("log")
    axes[1].yaxis.set_major_formatter(plt.FormatStrFormatter("%g"))
    axes[1].yaxis.set_minor_formatter(plt.NullFormatter())
    axes[1].set_ylabel("throughput PP / DP")
    axes[0].legend(fontsize="x-small")
    axes[1].legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def draw_not_measured(why: str):
    """A small empty figure that says the section was not measured, and why."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 1.5))
    ax.text(0.5, 0.5, f"not measured: {why}", ha="center", va="center", wrap=True)
    ax.axis("off")
    return fig


def pp_texts(pp, ratio, measured_x, predicted_x, like_bits: dict) -> dict:
    """The pipeline section's sentences, by glue key: the model and batch trained, the measured and predicted
    crossovers, PP/DP at the slowest and fastest rates, the throughput error (median and range, signed) and
    PP/DP at the target clusters' rates where measured."""
    model = pp["config.model.name"].iloc[0]
    like_text = [f"like {p} ({rate_text(b)}): PP/DP {ratio.get(b, float('nan')):.2f}" for p, b in like_bits.items()
                 if b in ratio.index]
    return {
        "net-pp-model": f"{model} ({presets.model(model).layers} layers, h = {presets.model(model).hidden}), "
                        f"global batch {int(pp.samples.iloc[0])}, "
                        f"microbatch {int(pp['config.layout.micro_batch'].iloc[0])}",
        "net-pp-measured-x": "none in the measured range" if measured_x is None else rate_text(measured_x),
        "net-pp-predicted-x": "none between 1 Mbit/s and 10 Gbit/s" if predicted_x is None else rate_text(predicted_x),
        "net-pp-ratio": f"{ratio.iloc[-1]:.2f} at {rate_text(ratio.index[-1])} and {ratio.iloc[0]:.2f} at "
                        f"{rate_text(ratio.index[0])}",
        "net-pp-err": f"{pp.error.median():+.0%} (from {pp.error.min():+.0%} to {pp.error.max():+.0%})",
        "net-pp-like": "; ".join(like_text) if like_text else "not measured",
    }


def bucket_rows(bucket, hw, fits: dict):
    """The bucket-size runs sorted by bucket size, with their link ``rate``, ``bucket_mb``, the cost model's
    ``predicted_s`` iteration and ``predicted_exposed_s`` communication with that bucket on
    :func:`link_hardware` of one rank per node, and the ``measured_s`` median iteration."""
    bucket["rate"] = bucket["network.inter_bit_per_s"].astype(float)
    bucket["bucket_mb"] = bucket["options.bucket_mb"].astype(float)
    bucket = bucket.sort_values("bucket_mb")
    preds = [predict(config_of_row(r), run_hardware(link_hardware(hw, fits, r.rate, 1), r),
                     bucket_bytes=r.bucket_mb * 2**20) for _, r in bucket.iterrows()]
    bucket["predicted_s"] = [p["time_s"]["iteration"] for p in preds]
    bucket["predicted_exposed_s"] = [p["time_s"]["communication_exposed"] for p in preds]
    bucket["measured_s"] = bucket["iteration_time_s.median"]
    return bucket


def draw_bucket(bucket):
    """Iteration time and exposed communication (measured where the runs have it) against the bucket size, in
    milliseconds, measured and predicted."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.9))
    ax.plot(bucket.bucket_mb, bucket.measured_s * 1e3, "o", color="C0", label="measured iteration")
    ax.plot(bucket.bucket_mb, bucket.predicted_s * 1e3, "--x", color="C0", label="predicted iteration")
    if EXPOSED in bucket:
        ax.plot(bucket.bucket_mb, bucket[EXPOSED] * 1e3, "o", color="C1", label="measured exposed communication")
    ax.plot(bucket.bucket_mb, bucket.predicted_exposed_s * 1e3, "--x", color="C1", label="predicted exposed")
    ax.set_xscale("log")
    ax.set_xlabel("DDP bucket (MiB)")
    ax.set_ylabel("milliseconds")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def bucket_texts(bucket) -> dict:
    """The bucket section's sentences, by glue key: the link rate, the fastest and slowest measured iteration
    and their buckets, the best bucket predicted and measured, the median signed error of the iteration, the
    step-to-step spread (p10–p90 over the median, median over buckets) and the median share of the iteration
    that is communication exposed after the backward pass ('not measured' where the runs lack it)."""
    fastest, slowest = bucket.loc[bucket.measured_s.idxmin()], bucket.loc[bucket.measured_s.idxmax()]
    predicted_best = bucket.loc[bucket.predicted_s.idxmin()]
    spread = ((bucket["iteration_time_s.p90"] - bucket["iteration_time_s.p10"]) / bucket.measured_s).median()
    share = (bucket[EXPOSED] / bucket.measured_s).median() if EXPOSED in bucket else float("nan")
    return {
        "net-bucket-rate": rate_text(bucket.rate.iloc[0]),
        "net-bucket-range": f"{fastest.measured_s * 1e3:,.0f} ms with {fastest.bucket_mb:g} MiB buckets to "
                            f"{slowest.measured_s * 1e3:,.0f} ms with {slowest.bucket_mb:g} MiB",
        "net-bucket-predicted-best": f"{predicted_best.bucket_mb:g} MiB",
        "net-bucket-measured-best": f"{fastest.bucket_mb:g} MiB",
        "net-bucket-err": f"{results.signed_error(bucket.predicted_s, bucket.measured_s).median():+.0%}",
        "net-bucket-spread": f"{spread:.0%}",
        "net-bucket-exposed": "not measured" if np.isnan(share) else f"{share:.0%}",
    }


def placed_hardware(hw, fits: dict, rate_bits: float, placement: str):
    """The links a pp = 2 × dp = 2 run on two nodes of two ranks sees. :data:`INSIDE`: the cost model's own
    placement (replicas on the node's links, stages across: :func:`link_hardware` of two ranks per node).
    :data:`ACROSS`: the roles swap, which is the same model with the intra- and inter-node links swapped."""
    link = link_hardware(hw, fits, rate_bits, 2)
    if placement == ACROSS:
        link = dataclasses.replace(link, intra_bandwidth=link.inter_bandwidth, intra_latency=link.inter_latency,
                                   inter_bandwidth=link.intra_bandwidth, inter_latency=link.intra_latency)
    return link


def placement_rows(place, hw, fits: dict):
    """The placement runs with their link ``rate``, ``placement`` (:data:`INSIDE` for mesh order ``pp,dp,tp``,
    else :data:`ACROSS`), global batch ``samples`` and ``measured`` and ``predicted`` samples/s
    (:func:`placed_hardware`)."""
    place["rate"] = place["network.inter_bit_per_s"].astype(float)
    place["placement"] = np.where(place["options.mesh_order"] == "pp,dp,tp", INSIDE, ACROSS)
    place["samples"] = global_batch(place)
    place["measured"] = place.samples / place["iteration_time_s.median"]
    place["predicted"] = [r.samples / predict(config_of_row(r),
                                              run_hardware(placed_hardware(hw, fits, r.rate, r.placement), r),
                                              bucket_bytes(r))["time_s"]["iteration"] for _, r in place.iterrows()]
    return place


def placement_gain(place):
    """Per link rate (as text): throughput with the replicas inside a node over across nodes, measured (the ratio
    of the geometric means of the repeats' median steps, at equal samples) with its 95 % interval ``low``,
    ``high`` over the repeats (:func:`.repeats.ratio_interval`; NaN with one run of either placement) and
    predicted; rates where one placement did not run are dropped."""
    out = []
    for rate, part in place.groupby("rate", sort=True):
        inside, across = part[part.placement == INSIDE], part[part.placement == ACROSS]
        if not len(inside) or not len(across):
            continue
        ratio, low, high = ratio_interval(across["iteration_time_s.median"], inside["iteration_time_s.median"])
        out.append({"link": rate_text(rate), "measured inside/across": ratio, "low": low, "high": high,
                    "predicted inside/across": inside.predicted.iloc[0] / across.predicted.iloc[0]})
    return pd.DataFrame(out, columns=["link", "measured inside/across", "low", "high", "predicted inside/across"])


def placement_table(place):
    """Each placement run: link rate as text, placement, measured and predicted samples/s and the signed error,
    sorted by rate and placement."""
    table = place[["rate", "placement", "measured", "predicted"]].sort_values(["rate", "placement"])
    table["rate"] = [rate_text(r) for r in table.rate]
    table["signed error"] = results.signed_error(table.predicted, table.measured)
    return table.rename(columns={"rate": "link", "measured": "measured samples/s", "predicted": "predicted samples/s"})


def placement_counts(gain) -> tuple[int, int, int]:
    """At how many rates keeping the replicas inside a node is measured faster beyond the repeats' interval
    (``inside_wins``: ``low`` above 1), at how many one placement wins either way (``decisive``), and at how many
    of those the framework predicts the winner (``right``): (right, inside_wins, decisive). One run decides
    nothing."""
    inside = gain["low"] > 1
    decisive = inside | (gain["high"] < 1)
    right = decisive & ((gain["measured inside/across"] > 1) == (gain["predicted inside/across"] > 1))
    return int(right.sum()), int(inside.sum()), int(decisive.sum())


def placement_gain_text(gain) -> str:
    """'rate: measured x× [low, high], predicted y×; ...' for each rate of :func:`placement_gain`."""
    def interval(r):
        return "" if r["low"] != r["low"] else f" [{r['low']:.2f}, {r['high']:.2f}]"

    return "; ".join(f"{r.link}: measured {r['measured inside/across']:.2f}×{interval(r)}, predicted "
                     f"{r['predicted inside/across']:.2f}×" for _, r in gain.iterrows())


def ratio_intervals(pp):
    """Per link rate, the 95 % interval of PP/DP over the repeats (``low``, ``high``: :func:`.repeats.ratio_interval`
    of DP's run medians over PP's), from every repeat's row of one (model, batch)."""
    pp = pp.assign(rate=pp["network.inter_bit_per_s"].astype(float), layout=layout_names(pp))
    out = {}
    for rate, part in pp.groupby("rate", sort=True):
        times = {k: g["iteration_time_s.median"].astype(float) for k, g in part.groupby("layout")}
        if DP_LAYOUT in times and PP_LAYOUT in times:
            out[rate] = ratio_interval(times[DP_LAYOUT], times[PP_LAYOUT])[1:]
    return pd.DataFrame(out.values(), index=list(out), columns=["low", "high"])


def pp_section(pp, why: str, hw, fits: dict, like_bits: dict):
    """The pipeline-against-data section from every repeat's row (:func:`measured_rows`): (rows with predictions, one
    per configuration, measured crossover, predicted crossover, figure, sentences by glue key, provenance); rows
    and crossovers None, and every sentence 'not measured (why)', when no run of it ran."""
    if pp is None:
        return None, None, None, draw_not_measured(why), not_measured_texts(PP_KEYS, why), book.model_provenance()
    every = main_slice(pp[pp["status"] == "ok"])
    pp = pp_vs_dp_rows(ok(every), hw, fits)
    ratio, curve = measured_ratio(pp), predicted_ratio(pp, hw, fits)
    measured_x, predicted_x = crossovers(ratio, curve)
    return (pp, measured_x, predicted_x, draw_pp_vs_dp(pp, ratio, curve, like_bits, ratio_intervals(every)),
            pp_texts(pp, ratio, measured_x, predicted_x, like_bits), book.provenance_caption(pp))


def bucket_section(bucket, why: str, hw, fits: dict):
    """The bucket section: (figure, sentences by glue key, provenance), or its 'not measured (why)' form."""
    if bucket is None:
        return draw_not_measured(why), not_measured_texts(BUCKET_KEYS, why), book.model_provenance()
    bucket = bucket_rows(bucket, hw, fits)
    return draw_bucket(bucket), bucket_texts(bucket), book.provenance_caption(bucket)


def statistics(measured_any: bool, measured_x, predicted_x, place_right: int, inside_wins: int, rates: int,
               decisive: int | None = None) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the factor between the measured and the predicted
    crossover link rates (infinite where either was not found; NaN without pipeline runs); the share of the
    ``decisive`` placement rates (default: all ``rates``) at which the framework names the faster placement, and
    the share of the placement runs' link ``rates`` at which replicas inside a node are faster beyond the
    repeats' interval (:func:`placement_counts`)."""
    if not measured_any:
        return {"crossover_factor": math.nan, "placement_right": math.nan, "inside_wins": math.nan}
    factor = (max(measured_x / predicted_x, predicted_x / measured_x) if measured_x is not None
              and predicted_x is not None else math.inf)
    return {"crossover_factor": float(factor), "placement_right": share(place_right, rates if decisive is None
                                                                        else decisive),
            "inside_wins": share(inside_wins, rates)}

def finding(measured_any: bool, measured_x, predicted_x, inside_wins: int, rates: int) -> str:
    """The chapter's one-line finding: the measured and predicted crossovers, and whether replicas inside a node
    won at every placement rate."""
    if not measured_any:
        return "emulated links need root; not measured here"
    return (f"PP/DP crosses 1 at {'no measured rate' if measured_x is None else rate_text(measured_x)} "
            f"(predicted {'none' if predicted_x is None else rate_text(predicted_x)}); replicas inside a node "
            f"{'won' if inside_wins == rates and rates else 'did not always win'} "
            f"({inside_wins} of {rates} rates)")
