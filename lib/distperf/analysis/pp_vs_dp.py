"""Pipeline against data parallelism on two devices, for the chapter ``pp_vs_dp`` (the first paper's first claim)
and the emulated-cluster chapter ``network`` (:mod:`distperf.analysis.network`), which measures the same trade
against the link rate.

- the two layouts' names and global batch of a sweep row (:func:`layout_names`; the global batch is :func:`.rows.global_batch`), and the
  pipeline's throughput relative to data parallelism (:func:`pp_over_dp`);
- the crossover where PP/DP crosses 1 (:func:`crossover`), and the highest link rate at which the pipeline still
  wins (:func:`last_pipeline_win`);
- the measured runs with their predictions and errors (:func:`measured_runs`), who wins each configuration
  beyond the repeats' 95 % interval (:func:`winner_table`, :func:`winner_counts`) and the sentences built from them;
- the framework's PP/DP on a two-node cluster across models, batches and link bandwidths
  (:func:`throughput_ratio`, :func:`cluster_grid`, :func:`bandwidth_sweep`) and the chapter's verdict.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from .. import presets, results
from ..config import Config, Layout, Training, validate
from ..cost import predict
from .repeats import ratio_interval
from .rows import PROFILED_ITERATION, bucket_bytes, config_of_row, global_batch, ok, run_hardware
from .verdicts import share

PP_LAYOUT, DP_LAYOUT = "PP 2 (1F1B)", "DP 2"
LAYOUT_COLOURS = {DP_LAYOUT: "C0", PP_LAYOUT: "C1"}
ERROR_TABLE_FORMAT = {"measured tokens/s": "{:,.0f}", "predicted tokens/s": "{:,.0f}", "signed error": "{:+.0%}"}
WINNER_TABLE_FORMAT = {"measured PP/DP": "{:.2f}", "predicted PP/DP": "{:.2f}", "low": "{:.2f}", "high": "{:.2f}",
                       "profiled PP/DP": "{:.2f}", "signed error of PP/DP": "{:+.0%}", "PP/DP memory": "{:.2f}"}


def layout_names(frame):
    """Each row's layout: :data:`PP_LAYOUT` where it has more than one pipeline stage, else :data:`DP_LAYOUT`."""
    return np.where(frame["config.layout.pp"] > 1, PP_LAYOUT, DP_LAYOUT)



def pp_over_dp(wide):
    """The pipeline's throughput relative to data parallelism, PP/DP, from a table with one column per layout
    (a ``pivot_table`` over ``layout``); above 1 the pipeline wins."""
    return wide[PP_LAYOUT] / wide[DP_LAYOUT]


def crossover(rates, ratios):
    """The rate where PP/DP crosses 1, or None: scanning ``rates`` in order (ascending in the book), the first
    rate whose ratio is exactly 1 (but the last), else the first pair of neighbouring rates between which
    log(PP/DP) changes sign, interpolated linearly in log(rate):

        x = exp(log r_i + f · (log r_{i+1} − log r_i)),   f = log ρ_i / (log ρ_i − log ρ_{i+1}).
    """
    rates, ratios = np.asarray(rates, float), np.log(np.asarray(ratios, float))
    for i in range(len(rates) - 1):
        if ratios[i] == 0 or ratios[i] * ratios[i + 1] < 0:
            f = ratios[i] / (ratios[i] - ratios[i + 1])
            return float(np.exp(np.log(rates[i]) + f * (np.log(rates[i + 1]) - np.log(rates[i]))))
    return None


def last_pipeline_win(rates, ratios):
    """The highest rate at which the pipeline still wins (PP/DP > 1), or None where it never does. On a sweep
    whose ratio falls with the rate this is the crossover's lower neighbour among the swept rates."""
    rates, ratios = np.asarray(rates), np.asarray(ratios)
    wins = rates[ratios > 1]
    return wins.max() if len(wins) else None


def measured_runs(runs, hw):
    """The runs that succeeded, with ``layout``, ``model``, global batch ``B``, the cost model's ``prediction`` on
    ``hw`` (a hardware profile, or a function of the row that returns one: an emulated link's) at the run's own
    speed (:func:`~distperf.analysis.rows.run_hardware`), ``tokens`` per iteration (B · seq), ``measured`` and
    ``predicted`` tokens/s and their signed ``error``; ``profiled`` tokens/s and ``profiled_error`` from the
    run's own prediction with profiled layer times (NaN where it has none); ``spread``, the step-to-step p10–p90
    range over the median; ``repeat_times``, the median step of each of the configuration's repeats (the
    interval of :func:`winner_table` rests on them); and ``memory``, the peak bytes of the most loaded rank
    where measured (NaN otherwise)."""
    repeats = {}
    if "config_hash" in runs:
        for key, part in runs[runs["status"] == "ok"].groupby("config_hash"):
            repeats[key] = part["iteration_time_s.median"].astype(float).tolist()
    runs = ok(runs)
    runs["repeat_times"] = [repeats.get(h, [t]) for h, t in zip(runs.get("config_hash", [None] * len(runs)),
                                                                  runs["iteration_time_s.median"])]
    runs["memory"] = runs["memory_bytes.total"].astype(float) if "memory_bytes.total" in runs else np.nan
    runs["layout"] = layout_names(runs)
    runs["model"] = runs["config.model.name"]
    runs["B"] = global_batch(runs)
    hardware = hw if callable(hw) else lambda _: hw
    runs["prediction"] = [predict(config_of_row(r), run_hardware(hardware(r), r), bucket_bytes(r))
                          for _, r in runs.iterrows()]
    runs["tokens"] = runs.B * runs["config.model.seq"]
    runs["measured"] = runs.tokens_per_s
    runs["predicted"] = runs.tokens / [p["time_s"]["iteration"] for p in runs.prediction]
    runs["error"] = results.signed_error(runs.predicted, runs.measured)
    runs["profiled"] = runs.tokens / runs[PROFILED_ITERATION] if PROFILED_ITERATION in runs else np.nan
    runs["profiled_error"] = results.signed_error(runs.profiled, runs.measured)
    runs["spread"] = (runs["iteration_time_s.p90"] - runs["iteration_time_s.p10"]) / runs["iteration_time_s.median"]
    return runs


def model_order(runs) -> list[str]:
    """The models the runs trained, in the order of :data:`distperf.presets.MODELS` (smallest first)."""
    return [m for m in presets.MODELS if m in set(runs.model)]


def models_text(order) -> str:
    """'name (L layers, h = H), ...' for the models in ``order``."""
    return ", ".join(f"{m} ({presets.model(m).layers} layers, h = {presets.model(m).hidden})" for m in order)


def hardware_text(hw) -> str:
    """The profile's link latency α, bandwidth β and achieved matrix-product rate, in one line."""
    return (f"α = {hw.intra_latency * 1e6:.0f} µs, β = {hw.intra_bandwidth / 1e9:.2f} GB/s, "
            f"{hw.flops_fp32 * hw.flops_efficiency / 1e9:.0f} GFLOP/s")


def winner_table(runs, index=("model", "B")):
    """Per ``index`` (model and B; the map adds the link ``rate``): measured and predicted PP/DP (and profiled, where
    the runs have it), its 95 % interval over the repeats (``low``, ``high``: :func:`.repeats.ratio_interval` of
    DP's repeat times over PP's, the throughput ratio at equal tokens; NaN with a single run of either), the
    measured winner — 'PP' when the interval lies above 1, 'DP' when below, else 'tie' (also with a single run: one
    run decides nothing) —, the predicted winner, whether the framework is right ('–' for a tie), and ``PP/DP
    memory``, the most loaded rank's peak bytes of the pipeline over data parallelism's (NaN where not measured)."""
    index = list(index)
    wide = runs.pivot_table(index=index, columns="layout", values=["measured", "predicted", "profiled"], dropna=False)
    ratio = pd.DataFrame({"measured PP/DP": pp_over_dp(wide["measured"]),
                          "predicted PP/DP": pp_over_dp(wide["predicted"])}).dropna()
    times = {(*(getattr(r, k) for k in index), r.layout): r.repeat_times for r in runs.itertuples()}
    bounds = [ratio_interval(times[(*key, DP_LAYOUT)], times[(*key, PP_LAYOUT)])[1:] for key in ratio.index]
    ratio["low"], ratio["high"] = [lo for lo, _ in bounds], [hi for _, hi in bounds]
    if "profiled" in wide:
        ratio["profiled PP/DP"] = pp_over_dp(wide["profiled"])
    ratio["measured winner"] = np.where(ratio.low > 1, "PP", np.where(ratio.high < 1, "DP", "tie"))
    ratio["predicted winner"] = np.where(ratio["predicted PP/DP"] > 1, "PP", "DP")
    ratio["framework right"] = np.where(ratio["measured winner"] == "tie", "–",
                                        np.where(ratio["measured winner"] == ratio["predicted winner"], "yes", "no"))
    if "memory" in runs:
        ratio["PP/DP memory"] = pp_over_dp(runs.pivot_table(index=index, columns="layout", values="memory",
                                                            dropna=False)).reindex(ratio.index)
    return ratio


def winner_counts(ratio) -> dict:
    """How many configurations the pipeline wins (``pp_wins``), data parallelism wins (``dp_wins``), are ties
    (``ties``), are decisive (``decisive``: not ties), and whose winner the framework names (``agree``)."""
    pp_wins = int((ratio["measured winner"] == "PP").sum())
    dp_wins = int((ratio["measured winner"] == "DP").sum())
    return {"pp_wins": pp_wins, "dp_wins": dp_wins, "ties": len(ratio) - pp_wins - dp_wins,
            "decisive": int((ratio["measured winner"] != "tie").sum()),
            "agree": int((ratio["framework right"] == "yes").sum())}


def profiled_text(ratio, runs, decisive: int) -> str:
    """The sentence on the predictions from profiled layer times: in how many decisive cases they name the winner,
    and their median throughput error; empty where no run has such a prediction."""
    if "profiled PP/DP" not in ratio or not ratio["profiled PP/DP"].notna().any():
        return ""
    prof_winner = np.where(ratio["profiled PP/DP"] > 1, "PP", "DP")
    prof_agree = int(((ratio["measured winner"] == prof_winner) & (ratio["measured winner"] != "tie")).sum())
    return (f"With profiled layer times instead of FLOPs at the peak rate (dotted), the framework names "
            f"the winner in {prof_agree} of {decisive} decisive cases, with a median throughput error of "
            f"{runs.profiled_error.median():+.0%}.")


def error_by_model_text(runs, order) -> str:
    """The median signed throughput error per model, 'model +x%, ...' in ``order``."""
    per_model = runs.groupby("model").error.median()
    return ", ".join(f"{m} {per_model[m]:+.0%}" for m in order)


def why_text(runs) -> str:
    """What the framework says DP exposes and PP idles at the largest measured configuration (most tokens per
    iteration): DP's exposed all-reduce, PP's bubble and PP's exposed communication, as shares of the iteration."""
    big = runs.sort_values(["tokens"]).groupby("layout").last()
    dp_time = big.loc[DP_LAYOUT].prediction["time_s"]
    pp_time = big.loc[PP_LAYOUT].prediction["time_s"]
    return (f"for {big.loc[DP_LAYOUT].model} at B = {big.loc[DP_LAYOUT].B} the framework puts DP's exposed "
            f"all-reduce at {dp_time['communication_exposed'] / dp_time['iteration']:.0%} of its iteration, PP's "
            f"bubble at {pp_time['bubble'] / pp_time['iteration']:.0%} and its communication at "
            f"{pp_time['communication_exposed'] / pp_time['iteration']:.0%}")


def error_table(runs):
    """Each run's measured and predicted tokens/s and signed error, sorted by model, B and layout."""
    errors = runs[["model", "B", "layout", "measured", "predicted", "error"]].sort_values(["model", "B", "layout"])
    return errors.rename(columns={"measured": "measured tokens/s", "predicted": "predicted tokens/s",
                                  "error": "signed error"})


def ratio_table(ratio):
    """The winner table with (model, B) as columns and the signed error of the predicted PP/DP."""
    table = ratio.reset_index()
    table["signed error of PP/DP"] = results.signed_error(table["predicted PP/DP"], table["measured PP/DP"])
    return table


def draw_throughput(runs, order):
    """One panel per model: tokens/s against the global batch, measured (points), predicted (dashed crosses)
    and, where the runs have it, predicted from profiled layer times (dotted), per layout."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(order), figsize=(3.6 * len(order), 3.6), squeeze=False)
    for ax, model in zip(axes[0], order):
        for layout, part in runs[runs.model == model].sort_values("B").groupby("layout"):
            colour = LAYOUT_COLOURS[layout]
            ax.plot(part.B, part.measured, "o", color=colour, label=f"{layout}, measured")
            ax.plot(part.B, part.predicted, "--x", color=colour, label=f"{layout}, predicted")
            if part.profiled.notna().any():
                ax.plot(part.B, part.profiled, ":+", color=colour, label=f"{layout}, profiled")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(model, fontsize="medium")
        ax.set_xlabel("global batch B (sequences)")
    axes[0][0].set_ylabel("tokens per second")
    axes[0][0].legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def throughput_ratio(model: str, batch: int, hardware, micro_batch: int):
    """The framework's PP/DP throughput, T_DP / T_PP, of ``model`` at global batch ``batch`` on two devices of
    ``hardware`` (mixed precision, Adam, microbatch ``micro_batch``; DP runs B/(2b) microbatches per rank, the
    two-stage 1F1B pipeline B/b), and whether each layout fits in memory: (ratio, dp_fits, pp_fits). The
    chapter's "Theory" gives T_DP and T_PP."""
    spec = presets.model(model)
    out = {}
    for name, lay in (("dp", Layout(dp=2, micro_batch=micro_batch, microbatches=batch // (2 * micro_batch))),
                      ("pp", Layout(pp=2, schedule="1f1b", micro_batch=micro_batch,
                                    microbatches=batch // micro_batch))):
        out[name] = predict(validate(Config(model=spec, layout=lay, training=Training("mixed", "adam"))), hardware)
    return out["dp"]["time_s"]["iteration"] / out["pp"]["time_s"]["iteration"], out["dp"]["fits"], out["pp"]["fits"]


def cluster_grid(models, batches, hardware, micro_batch: int):
    """:func:`throughput_ratio` for every model and global batch: columns model, B, ratio, dp_fits, pp_fits."""
    return pd.DataFrame([(m, B, *throughput_ratio(m, B, hardware, micro_batch)) for m in models for B in batches],
                        columns=["model", "B", "ratio", "dp_fits", "pp_fits"])


def with_bandwidth(hardware, gbit: float):
    """``hardware`` with its inter-node link set to ``gbit`` Gbit/s (bytes/s = gbit · 10⁹ / 8)."""
    return dataclasses.replace(hardware, inter_bandwidth=gbit * 1e9 / 8)


def bandwidth_sweep(models, gbits, batch: int, hardware, micro_batch: int):
    """PP/DP of every model at global batch ``batch`` with the inter-node bandwidth set to each of ``gbits``
    Gbit/s: columns model, gbit, ratio."""
    return pd.DataFrame([(m, g, throughput_ratio(m, batch, with_bandwidth(hardware, g), micro_batch)[0])
                         for m in models for g in gbits], columns=["model", "gbit", "ratio"])


def draw_cluster(grid, sweep, models, batches, batch: int):
    """Left: the grid's PP/DP as a log₂ heat map over model and batch, each cell labelled with its ratio (* where
    data parallelism does not fit); right: PP/DP against the inter-node bandwidth at global batch ``batch``."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    heat = grid.pivot(index="model", columns="B", values="ratio").loc[models]
    im = axes[0].imshow(np.log2(heat.values), cmap="RdBu", vmin=-1.5, vmax=1.5, aspect="auto")
    for i, m in enumerate(models):
        for j, B in enumerate(batches):
            row = grid[(grid.model == m) & (grid.B == B)].iloc[0]
            axes[0].text(j, i, f"{row.ratio:.2f}" + ("" if row.dp_fits else "*"), ha="center", va="center",
                         fontsize="x-small")
    axes[0].set_xticks(range(len(batches)), batches)
    axes[0].set_yticks(range(len(models)), models)
    axes[0].set_xlabel("global batch B (sequences)")
    axes[0].grid(False)
    fig.colorbar(im, ax=axes[0], label="log₂ (PP / DP throughput)")
    for m, part in sweep.groupby("model", sort=False):
        axes[1].plot(part.gbit, part.ratio, "-o", ms=3, label=m)
    axes[1].axhline(1, color="grey", lw=1)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("inter-node bandwidth (Gbit/s)")
    axes[1].set_ylabel(f"PP / DP throughput, B = {batch}")
    axes[1].legend(fontsize="small")
    fig.tight_layout()
    return fig


def no_fit_text(grid) -> str:
    """In how many cells data parallelism does not fit in memory (and for which models), and the pipeline."""
    no_fit = grid[~grid.dp_fits]
    return (f"{(~grid.dp_fits).sum()} of {len(grid)} cells ({', '.join(dict.fromkeys(no_fit.model)) or 'none'}), "
            f"the pipeline in {(~grid.pp_fits).sum()}")


def crossover_text(sweep) -> str:
    """Per model, the highest swept bandwidth at which the pipeline still wins (:func:`last_pipeline_win`):
    'model: x Gbit/s; ...', 'never' for a model where it never wins."""
    cross = {}
    for m, part in sweep.groupby("model", sort=False):
        rate = last_pipeline_win(part.gbit, part.ratio)
        cross[m] = "never" if rate is None else f"{rate:g} Gbit/s"
    return "; ".join(f"{m}: {c}" for m, c in cross.items())


def batch_wins_text(grid, batch: int) -> str:
    """'k of n models at B = batch': the models for which the pipeline wins at global batch ``batch``."""
    part = grid[grid.B == batch]
    return f"{(part.ratio > 1).sum()} of {len(part)} models at B = {batch}"


def statistics(counts: dict, configurations: int, cluster_wins: int, cells: int,
               map_counts: dict | None = None) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the share of measured cells the pipeline wins
    (its 95 % interval above 1: :func:`winner_table`), over the loopback configurations and the cells of the
    emulated-link map (``map_counts``, :func:`.pp_dp_map.boundary_counts`; None without the map); the share of the
    map's decisive cells whose winner the framework names (NaN without the map); and the share of a cluster's cells
    in which the framework has the pipeline win."""
    map_counts = map_counts or {"cells": 0, "pp_wins": 0, "decisive": 0, "agree": 0}
    return {"measured_share": share(counts["pp_wins"] + map_counts["pp_wins"], configurations + map_counts["cells"]),
            "boundary_agree": share(map_counts["agree"], map_counts["decisive"]),
            "predicted_share": share(cluster_wins, cells)}


def finding(ratio, counts: dict, cluster_wins: int, cells: int, map_counts: dict | None = None) -> str:
    """The chapter's one-line finding: measured wins and ties on loopback and on the map, the framework's
    agreement and the cluster cells where it predicts the pipeline wins."""
    on_map = ("" if not map_counts else
              f"; on emulated links PP won {map_counts['pp_wins']} of {map_counts['cells']} cells, DP "
              f"{map_counts['dp_wins']}, the framework naming the winner of {map_counts['agree']} of "
              f"{map_counts['decisive']} decisive cells")
    return (f"on loopback PP 2 beat DP 2 in {counts['pp_wins']} of {len(ratio)} configurations, DP in "
            f"{counts['dp_wins']}, {counts['ties']} ties (PP/DP {ratio['measured PP/DP'].min():.2f}–"
            f"{ratio['measured PP/DP'].max():.2f}){on_map}; the framework predicts PP wins on 25 Gbit/s links in "
            f"{cluster_wins} of {cells} cells")


def verdict_text(verdict_: str, counts: dict, configurations: int, cluster_wins: int, cells: int,
                 map_counts: dict | None = None, region: str = "") -> str:
    """The verdict's sentence, with the measured and the predicted wins it rests on and, with the map, the region
    where the pipeline wins."""
    numbers = (f"on loopback the measurements have the pipeline win {counts['pp_wins']} of {configurations} "
               f"configurations (data parallelism {counts['dp_wins']}, {counts['ties']} ties)")
    if map_counts:
        numbers += (f", on emulated links {map_counts['pp_wins']} of {map_counts['cells']} cells (data parallelism "
                    f"{map_counts['dp_wins']}, {map_counts['ties']} ties), the framework naming the winner of "
                    f"{map_counts['agree']} of {map_counts['decisive']} decisive cells")
    numbers += f"; the framework has the pipeline win {cluster_wins} of {cells} cells of a 25 Gbit/s cluster"
    where = f" Where it wins: {region}." if region else ""
    if verdict_ == "reproduced":
        return f"the pipeline's advantage holds in most cases and the framework places its boundary: {numbers}.{where}"
    if verdict_ == "depends":
        return f"the pipeline's advantage holds in part of the map, or the framework misplaces it: {numbers}.{where}"
    if verdict_ == "not measured":
        return "nothing was measured"
    return f"the pipeline's advantage does not show and the framework misplaces where it would: {numbers}.{where}"
